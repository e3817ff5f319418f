//! One closed-loop client of a load: its stream of commands, its loop and
//! what it counts.

use super::gaps::Completions;
use super::recorder::Recorder;
use super::{LoadError, LoadSpec, Ops};
use crate::kv_stream::{self, XorShift};
use hdrhistogram::Histogram;
use psmr_client::Client;
use psmr_model::wire::OpCodec;
use psmr_services::kv::{self, KvCodec, KvOp};
use psmr_services::list::{ListCodec, ListOp, OpStream};
use psmr_services::WorkloadConfig;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest latency the histograms hold, in µs (a minute); longer ones are
/// clamped to it rather than lost.
const LATENCY_MAX_US: u64 = 60_000_000;

/// An empty latency histogram, µs.
pub(super) fn histogram() -> Result<Histogram<u64>, LoadError> {
    Histogram::new_with_bounds(1, LATENCY_MAX_US, 3).map_err(LoadError::histogram)
}

/// When a load runs: warm-up from `start`, then the measured window of
/// `buckets` seconds (the last one possibly shorter), cut into `phases`
/// equal parts.
#[derive(Clone, Copy, Debug)]
pub(super) struct Window {
    pub start: Instant,
    pub measure_from: Instant,
    pub measure_to: Instant,
    pub buckets: usize,
    pub phases: usize,
}

impl Window {
    pub fn new(start: Instant, spec: &LoadSpec) -> Self {
        let measure_from = start + spec.warmup;
        let buckets = (spec.duration.as_secs_f64().ceil() as usize).max(1);
        let phases = spec.phases.len() + 1;
        Self { start, measure_from, measure_to: measure_from + spec.duration, buckets, phases }
    }

    /// The phase running at `t`: 0 during the warm-up, the last one after
    /// the window.
    pub fn phase(&self, t: Instant) -> usize {
        let window = self.measure_to.duration_since(self.measure_from).as_secs_f64();
        let into = t.saturating_duration_since(self.measure_from).as_secs_f64();
        ((into / window * self.phases as f64) as usize).min(self.phases - 1)
    }

    /// The second of the window `t` falls in; `measure_to` itself, one
    /// past the end, counts in the last.
    fn second(&self, t: Instant) -> usize {
        (t.duration_since(self.measure_from).as_secs() as usize).min(self.buckets - 1)
    }
}

/// What one client thread brings back.
pub(super) struct ClientTally {
    pub errors: u64,
    pub commands: u64,
    pub requests: u64,
    pub latency: BTreeMap<&'static str, Histogram<u64>>,
    pub request: Histogram<u64>,
    pub timeline: Vec<u64>,
}

impl ClientTally {
    fn new(buckets: usize) -> Result<Self, LoadError> {
        Ok(Self {
            errors: 0,
            commands: 0,
            requests: 0,
            latency: BTreeMap::new(),
            request: histogram()?,
            timeline: vec![0; buckets],
        })
    }

    /// Counts a request of `kinds` that took `us` and completed in
    /// `second` of the window.
    fn record(&mut self, kinds: &[&'static str], us: u64, second: usize) -> Result<(), LoadError> {
        let n = kinds.len() as u64;
        self.commands += n;
        self.requests += 1;
        self.request.saturating_record(us);
        for kind in kinds {
            let h = match self.latency.entry(kind) {
                std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::btree_map::Entry::Vacant(e) => e.insert(histogram()?),
            };
            h.saturating_record(us);
        }
        self.timeline[second] += n;
        Ok(())
    }
}

/// One client's source of commands.
pub(super) enum Generator {
    /// `value_bytes`: `None` for the number in decimal as it is.
    Kv {
        keys: u64,
        write_pct: u64,
        value_bytes: Option<usize>,
        prefix: Vec<u8>,
        x: XorShift,
    },
    List(Box<OpStream>),
}

/// One request's commands, encoded, with their kinds (and the kv
/// operations, for the history).
pub(super) struct Request {
    pub encoded: Vec<Vec<u8>>,
    pub kinds: Vec<&'static str>,
    pub kv: Vec<KvOp>,
}

impl Generator {
    /// Client `client`'s generator for each phase of `spec`, each phase
    /// its own stream.
    pub fn phases(spec: &LoadSpec, client: usize) -> Result<Vec<Self>, LoadError> {
        std::iter::once(&spec.ops)
            .chain(&spec.phases)
            .enumerate()
            .map(|(k, ops)| Generator::new(ops, spec.seed.wrapping_add(k as u64), client))
            .collect()
    }

    pub fn new(ops: &Ops, seed: u64, client: usize) -> Result<Self, LoadError> {
        // Each client its own stream, the same seed the same streams.
        let mixed = kv_stream::client_seed(seed, client);
        Ok(match ops {
            Ops::Kv { keys, write_pct, value_bytes, prefix } => Generator::Kv {
                keys: *keys,
                write_pct: u64::from(*write_pct),
                value_bytes: *value_bytes,
                prefix: prefix.clone().into_bytes(),
                x: XorShift::new(mixed),
            },
            Ops::List { model, workload, list_size } => {
                let cfg = WorkloadConfig { seed: mixed, ..workload.clone() };
                Generator::List(Box::new(OpStream::new(*model, &cfg, *list_size)?))
            }
        })
    }

    pub fn request(&mut self, n: usize) -> Request {
        let mut r = Request { encoded: Vec::with_capacity(n), kinds: Vec::with_capacity(n), kv: Vec::new() };
        match self {
            Generator::Kv { keys, write_pct, value_bytes, prefix, x } => {
                // The etcd driver of the peers scenario draws the same
                // three numbers per put: keep them in step.
                let mut next = || x.next();
                for _ in 0..n {
                    let mut key = prefix.clone();
                    key.extend_from_slice(&kv::key_bytes(next() % *keys));
                    let op = if next() % 100 < *write_pct {
                        let n = next();
                        let value =
                            value_bytes.map_or_else(|| n.to_string().into_bytes(), |b| kv_stream::sized_value(n, b));
                        KvOp::Put { key, value }
                    } else {
                        KvOp::Read { key }
                    };
                    r.kinds.push(if matches!(op, KvOp::Read { .. }) { "read" } else { "write" });
                    r.encoded.push(KvCodec.encode_op(&op));
                    r.kv.push(op);
                }
            }
            Generator::List(stream) => {
                for _ in 0..n {
                    let op = stream.next_op();
                    r.kinds.push(match op {
                        ListOp::Contains { .. } => "local-read",
                        ListOp::Add { .. } => "local-write",
                        ListOp::ContainsAll { .. } => "global-read",
                        ListOp::AddAll { .. } => "global-write",
                    });
                    r.encoded.push(ListCodec.encode_op(&op));
                }
            }
        }
        r
    }
}

/// One client thread: requests back to back until the window ends, each
/// from the generator of the phase it starts in.
pub(super) struct Driver {
    pub client: Client,
    pub generators: Vec<Generator>,
    pub per: usize,
    pub window: Window,
    pub recorder: Option<Arc<Recorder>>,
    pub completions: Arc<Completions>,
}

impl Driver {
    pub fn run(mut self) -> Result<ClientTally, LoadError> {
        let mut tally = ClientTally::new(self.window.buckets)?;
        loop {
            let now = Instant::now();
            if now >= self.window.measure_to {
                return Ok(tally);
            }
            let Request { encoded, kinds, kv } = self.generators[self.window.phase(now)].request(self.per);
            let outcome = self.client.submit(encoded);
            let done = Instant::now();
            if let Some(r) = &self.recorder {
                r.request(self.client.id(), &kv, &outcome, now, done)?;
            }
            if let Err(e) = outcome {
                // The cluster may be changing leaders or be down (a fault
                // on purpose, or not): count it, go on, and do not spin if
                // the failure is immediate.
                tracing::debug!(client = self.client.id(), "request failed: {e}");
                tally.errors += 1;
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            self.completions.record(done);
            if now >= self.window.measure_from && done <= self.window.measure_to {
                let us = done.duration_since(now).as_micros().clamp(1, u128::from(LATENCY_MAX_US)) as u64;
                tally.record(&kinds, us, self.window.second(done))?;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_cut_the_window_into_equal_parts() {
        let spec = LoadSpec {
            clients: 1,
            per_request: 1,
            warmup: Duration::from_secs(1),
            duration: Duration::from_secs(8),
            ops: Ops::Kv { keys: 10, write_pct: 0, value_bytes: None, prefix: String::new() },
            phases: vec![Ops::Kv { keys: 10, write_pct: 100, value_bytes: None, prefix: String::new() }; 3],
            history: None,
            seed: 1,
        };
        let start = Instant::now();
        let w = Window::new(start, &spec);
        let at = |s: f64| w.phase(start + Duration::from_secs_f64(s));
        assert_eq!(
            [at(0.0), at(1.5), at(2.99), at(3.01), at(5.5), at(8.99), at(9.0), at(30.0)],
            [0, 0, 0, 1, 2, 3, 3, 3]
        );
        let mut generators = Generator::phases(&spec, 0).unwrap();
        assert_eq!(generators.len(), 4);
        assert!(generators[0].request(20).kv.iter().all(|op| matches!(op, KvOp::Read { .. })));
        assert!(generators[3].request(20).kv.iter().all(|op| matches!(op, KvOp::Put { .. })));
    }

    #[test]
    fn sized_loads_put_values_of_exactly_their_size() {
        let mut g =
            Generator::new(&Ops::Kv { keys: 10, write_pct: 100, value_bytes: Some(64), prefix: String::new() }, 1, 0)
                .unwrap();
        let r = g.request(20);
        let small = |key: &[u8]| std::str::from_utf8(key).is_ok_and(|k| k.parse::<u64>().is_ok_and(|n| n < 10));
        assert!(r.kv.iter().all(|op| matches!(op, KvOp::Put { key, value } if small(key) && value.len() == 64)));
        let ops = Ops::Kv { keys: 10, write_pct: 50, value_bytes: None, prefix: "load:".into() };
        let r = Generator::new(&ops, 1, 0).unwrap().request(20);
        let own = |key: &[u8]| key.strip_prefix(b"load:").is_some_and(small);
        assert!(r.kv.iter().all(|op| matches!(op, KvOp::Put { key, .. } | KvOp::Read { key } if own(key))));
    }
}
