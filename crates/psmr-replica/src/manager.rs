//! The service manager thread (002 §V-D): drives the replica's
//! [`psmr_core::apply::Applier`] with the work the protocol thread hands
//! out, in order, and with the requests of clients that need the state
//! (status, a scheduler switch). It tells the protocol thread what it
//! applied, and hands the snapshots the apply loop freezes to the
//! snapshot side pool ([`crate::snapshot`]).

use crate::handles::{Applied, Scheduling};
use crate::metrics::Metrics;
use crate::snapshot::Snapshotter;
use psmr_core::apply::{Applier, ApplyEvent, ApplyIo};
use psmr_core::protocol::Apply;
use psmr_core::state::Taken;
use psmr_model::App;
use psmr_transport::life::Life;
use psmr_transport::msg::{Decision, Inbound};
use psmr_transport::queue::{Receiver, Sender};
use std::sync::Arc;
use tracing::error;

/// The service manager thread.
pub(crate) struct Manager<A: App> {
    pub(crate) applier: Applier<A>,
    pub(crate) decisions: Receiver<Decision>,
    pub(crate) io: ManagerIo,
}

/// Where the apply loop's effects go.
pub(crate) struct ManagerIo {
    pub(crate) life: Arc<Life>,
    pub(crate) applied: Arc<Applied>,
    pub(crate) scheduling: Arc<Scheduling>,
    pub(crate) metrics: Arc<Metrics>,
    /// The protocol thread's queue, to wake it.
    pub(crate) protocol: Sender<Inbound>,
    pub(crate) snapshots: Snapshotter,
}

impl<A: App> Manager<A> {
    pub(crate) fn run(mut self) {
        while let Ok(d) = self.decisions.recv() {
            if let Err(why) = self.decide(d) {
                self.io.life.fail(why);
                return;
            }
        }
        if let Err(e) = self.applier.finish() {
            error!("scheduler: {e}");
        }
    }

    fn decide(&mut self, d: Decision) -> Result<(), String> {
        match d {
            Decision::Apply(Apply::Entries(entries)) => {
                fail::fail_point!("manager-apply");
                self.applier.entries(entries, &mut self.io)
            }
            Decision::Apply(Apply::Snapshot(snap, file)) => {
                let opened = psmr_core::state::open(&snap, file)?;
                self.applier.restore(opened, &mut self.io)
            }
            Decision::Apply(Apply::Reads(reads, at)) => self.applier.reads(reads, at, &mut self.io),
            Decision::Reconfigure(config, reply) => {
                let answer = self.applier.reconfigure(config, &mut self.io)?;
                let _ = reply.send(answer);
                Ok(())
            }
            Decision::Status(reply) => {
                // A failed replica has no state worth reporting: the
                // request is dropped and ClientIO answers that it stops.
                if let Some(status) = self.applier.status() {
                    let _ = reply.send(status);
                }
                Ok(())
            }
        }
    }
}

impl ApplyIo for ManagerIo {
    fn applied(&mut self, index: u64, clock: u64) {
        self.applied.set(index, clock, &self.protocol);
    }

    fn snapshot_busy(&self) -> bool {
        self.snapshots.busy()
    }

    fn snapshot(&mut self, taken: Taken) {
        self.snapshots.finish(taken);
    }

    fn event(&mut self, event: ApplyEvent) {
        let metrics = &self.metrics;
        match event {
            ApplyEvent::Switched(stall) => metrics.scheduler_switched(stall),
            ApplyEvent::Decided(stall) => metrics.scheduler_decided(stall),
            ApplyEvent::SnapshotPaused(paused) => metrics.snapshots.pause.observe_duration(paused),
            ApplyEvent::Restored => metrics.snapshots.restored(),
            ApplyEvent::CacheHit => {}
            ApplyEvent::Scheduler { describe, decision, metrics } => self.scheduling.set(describe, decision, metrics),
        }
    }
}
