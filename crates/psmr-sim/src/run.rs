//! Running one simulation.

use crate::config::SimConfig;
use crate::outcome::{SimError, SimOutcome, ViolationKind};
use crate::world;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs one simulation.
pub fn run(seed: u64, config: &SimConfig) -> Result<SimOutcome, SimError> {
    config.validate()?;
    // The simulated replicas' own log lines are not the caller's: the
    // trace says what happened.
    tracing::subscriber::with_default(tracing::subscriber::NoSubscriber::default(), || run_quietly(seed, config))
}

fn run_quietly(seed: u64, config: &SimConfig) -> Result<SimOutcome, SimError> {
    let mut world = world::World::new(seed, config)?;
    // What stops the run early is a finding about the system under test:
    // the outcome keeps the trace up to that point, to replay it.
    match catch_unwind(AssertUnwindSafe(|| world.run())) {
        Ok(Ok(())) => {}
        Ok(Err(e)) => world.stopped(ViolationKind::Stopped, e.to_string()),
        Err(payload) => {
            world.stopped(ViolationKind::Panic, format!("panicked: {}", psmr_sched::panic_message(payload.as_ref())))
        }
    }
    Ok(world.finish())
}
