//! The differential harness for a user's service: its operations executed
//! by every parallel scheduler, at several worker counts, give the same
//! replies and the same final state as `sequential`.
//!
//! A class model or an [`App::access`] that misses a conflict shows up
//! here as a wrong reply or a different digest (when the workload makes
//! the missed conflict race), long before it shows up as replicas that
//! diverge. [`ClassModel::check_commands`] runs first and names the two
//! commands whose conflict the classes miss.

use crate::{CollectSink, SchedConfig, SchedError, Scheduler, SchedulerKind, Switchable};
use psmr_model::{App, Batch, ClassModel, ClientId, Command, Mapping, Service, BITMAP_BITS_DEFAULT};
use std::collections::HashMap;
use std::sync::Arc;
use thiserror::Error;

/// What the harness runs.
#[derive(Clone, Debug)]
pub struct Options {
    /// Schedulers compared with `sequential`.
    pub schedulers: Vec<SchedulerKind>,
    /// Worker counts each runs with.
    pub workers: Vec<usize>,
    /// Commands per batch (log entry).
    pub batch: usize,
}

impl Default for Options {
    /// Every parallel scheduler with 1, 2, 3 and 4 workers, batches of 50.
    fn default() -> Self {
        let schedulers = SchedulerKind::ALL.into_iter().filter(|&k| k != SchedulerKind::Sequential).collect();
        Self { schedulers, workers: vec![1, 2, 3, 4], batch: 50 }
    }
}

/// How a run differed from sequential execution, or why it could not run.
#[derive(Debug, Error)]
pub enum CheckError {
    /// `App::access` refused an operation of the workload.
    #[error("operation {index} is refused: {why}")]
    Refused {
        /// Its position in the workload.
        index: usize,
        /// Why.
        why: String,
    },
    /// The class model misses a conflict between two commands.
    #[error("the class model misses a conflict: {0}")]
    Model(String),
    /// A scheduler could not be built or failed.
    #[error("{run}: {source}")]
    Scheduler {
        /// Scheduler and workers.
        run: String,
        /// What failed.
        source: SchedError,
    },
    /// A reply differs from sequential execution's.
    #[error("{run}: operation {index} replied {got}, sequential execution replied {want}")]
    Reply {
        /// Scheduler and workers.
        run: String,
        /// The operation's position in the workload.
        index: usize,
        /// The reply, debug-printed.
        got: String,
        /// Sequential execution's reply.
        want: String,
    },
    /// Some command was executed more than once.
    #[error("{run}: {count} commands replied more than once")]
    Duplicates {
        /// Scheduler and workers.
        run: String,
        /// Replies beyond the first.
        count: usize,
    },
    /// The final states differ.
    #[error("{run}: the final state differs from sequential execution's ({got} against {want})")]
    State {
        /// Scheduler and workers.
        run: String,
        /// The digest reached.
        got: String,
        /// Sequential execution's.
        want: String,
    },
}

/// Runs `ops` (in this order, one client) on fresh services made by `make`
/// under every scheduler and worker count of `options` and compares each
/// with `sequential`. Returns the number of runs compared.
///
/// Early schedulers use the app's default mapping, or the naive mapping of
/// 003 §6.5 when it has none (the optimizer's would do as well: any mapping
/// that obeys R.1-R.5 must give sequential's results).
pub fn against_sequential<A: App>(make: impl Fn() -> A, ops: &[A::Op], options: &Options) -> Result<usize, CheckError>
where
    A::Op: Clone,
{
    let probe = make();
    let model = probe.class_model();
    let commands = commands(&probe, ops)?;
    model.check_commands(&commands).map_err(|e| CheckError::Model(e.to_string()))?;
    let batches: Vec<Batch<A::Op>> =
        commands.chunks(options.batch.max(1)).map(|c| Batch::new(c.to_vec(), BITMAP_BITS_DEFAULT)).collect();
    let want = run_app(make(), &model, SchedulerKind::Sequential, 1, None, &batches)
        .map_err(|source| CheckError::Scheduler { run: "sequential".into(), source })?;
    let mut runs = 0;
    for &kind in &options.schedulers {
        for &workers in &options.workers {
            let label = format!("{kind} with {workers} workers");
            let mapping = kind.needs_mapping().then(|| mapping(&probe, &model, workers));
            let got = run_app(make(), &model, kind, workers, mapping, &batches)
                .map_err(|source| CheckError::Scheduler { run: label.clone(), source })?;
            if got.duplicates > 0 {
                return Err(CheckError::Duplicates { run: label, count: got.duplicates });
            }
            compare(&label, &want.replies, &got.replies)?;
            if got.digest != want.digest {
                let (got, want) = (got.digest.to_string(), want.digest.to_string());
                return Err(CheckError::State { run: label, got, want });
            }
            runs += 1;
        }
    }
    Ok(runs)
}

/// When the commands of a check start on the log's clock, ms since the
/// epoch.
const CHECK_EPOCH_MS: u64 = 1_767_225_600_000;

fn commands<A: App>(app: &A, ops: &[A::Op]) -> Result<Vec<Command<A::Op>>, CheckError>
where
    A::Op: Clone,
{
    ops.iter()
        .enumerate()
        .map(|(index, op)| {
            let access = app.access(op).map_err(|e| CheckError::Refused { index, why: e.to_string() })?;
            let (class, reads, writes) = (access.class, access.reads, access.writes);
            Ok(Command {
                client: ClientId(1),
                seq: index as u64,
                class,
                reads,
                writes,
                op: op.clone(),
                // A log's clock: a few ms from command to command, so
                // that deadlines a few hundred ms away pass in a run.
                stamp: psmr_model::Stamp { time_ms: CHECK_EPOCH_MS + 3 * index as u64, seed: index as u64 },
            })
        })
        .collect()
}

fn mapping<A: App>(app: &A, model: &ClassModel, workers: usize) -> Mapping {
    app.default_mapping(workers).unwrap_or_else(|| {
        let problem = crate::optimizer::Problem::new(model.clone(), workers);
        problem.map(|p| crate::optimizer::naive(&p)).unwrap_or_else(|_| Mapping::new(workers, Vec::new()))
    })
}

type Replies<R> = HashMap<(ClientId, u64), R>;

/// What one run of a workload produced.
#[derive(Debug)]
pub struct Run<R> {
    /// The reply to each command, by (client, sequence number).
    pub replies: Replies<R>,
    /// Replies beyond the first for some command (0 when correct).
    pub duplicates: usize,
    /// The service's state after the run.
    pub digest: psmr_model::Digest,
}

/// Runs `batches` on `service` with the scheduler `config` describes,
/// to the end.
pub fn run<S: Service>(
    config: &SchedConfig,
    service: S,
    model: &ClassModel,
    batches: &[Batch<S::Op>],
) -> Result<Run<S::Reply>, SchedError>
where
    S::Op: Clone,
{
    run_switching(config, &[], service, model, batches)
}

/// Like [`run`], but switches to the scheduler `switches[i].1` describes
/// right before batch `switches[i].0` (a [`Switchable`]); the switches in
/// rising batch order. Every other switch overlaps the old scheduler's
/// last commands ([`Switchable::switch_overlapped`]), the others drain it
/// first ([`Switchable::switch`]).
pub fn run_switching<S: Service>(
    config: &SchedConfig,
    switches: &[(usize, SchedConfig)],
    service: S,
    model: &ClassModel,
    batches: &[Batch<S::Op>],
) -> Result<Run<S::Reply>, SchedError>
where
    S::Op: Clone,
{
    let service = Arc::new(service);
    let workers = switches.iter().map(|(_, c)| c.workers).fold(config.workers, usize::max);
    let sink = Arc::new(CollectSink::new(workers));
    let mut scheduler = Box::new(Switchable::new(config.clone(), service.clone(), model, sink.clone())?);
    let mut next = switches.iter().enumerate().peekable();
    for (i, b) in batches.iter().enumerate() {
        while let Some((k, (_, config))) = next.next_if(|(_, (at, _))| *at <= i) {
            match k % 2 {
                0 => scheduler.switch(config.clone())?,
                _ => scheduler.switch_overlapped(config.clone())?,
            };
        }
        scheduler.submit(b.clone())?;
    }
    scheduler.finish()?;
    let (replies, duplicates) = sink.take();
    Ok(Run { replies, duplicates: duplicates.len(), digest: service.digest() })
}

fn run_app<A: App>(
    app: A,
    model: &ClassModel,
    kind: SchedulerKind,
    workers: usize,
    mapping: Option<Mapping>,
    batches: &[Batch<A::Op>],
) -> Result<Run<A::Reply>, SchedError>
where
    A::Op: Clone,
{
    let mut config = SchedConfig::new(kind, workers);
    config.mapping = mapping;
    run(&config, app, model, batches)
}

fn compare<R: PartialEq + std::fmt::Debug>(run: &str, want: &Replies<R>, got: &Replies<R>) -> Result<(), CheckError> {
    let mut seqs: Vec<u64> = want.keys().chain(got.keys()).map(|&(_, s)| s).collect();
    seqs.sort_unstable();
    seqs.dedup();
    for seq in seqs {
        let key = (ClientId(1), seq);
        if want.get(&key) != got.get(&key) {
            let show = |r: Option<&R>| r.map_or_else(|| "nothing".to_string(), |r| format!("{r:?}"));
            let (got, want) = (show(got.get(&key)), show(want.get(&key)));
            return Err(CheckError::Reply { run: run.to_string(), index: seq as usize, got, want });
        }
    }
    Ok(())
}
