//! A seeded, mutation-based fuzzer for psmr's decoders (`psmr fuzz`).
//!
//! Everything psmr reads from a socket or a disk goes through a decoder
//! that must refuse bad bytes with an error: never panic, and never
//! allocate more than the bytes it was given warrant. Each [`Target`] runs
//! one decoder on one input and discards the result:
//!
//! | target | decoder |
//! | --- | --- |
//! | `wire-client` | `wire::read_frame` then `ClientMsg::from_frame` |
//! | `wire-server` | `wire::read_frame` then `ServerMsg::from_frame` |
//! | `entry` | `psmr_core::entry::entry_commands` (log entries) |
//! | `kv-op`, `kv-reply` | `KvCodec::decode_op`, `KvCodec::decode_reply` |
//! | `list-op`, `list-reply` | `ListCodec::decode_op`, `ListCodec::decode_reply` |
//! | `snapshot-kv`, `snapshot-list` | `Service::restore` on a fresh store |
//! | `raft` | `psmr_transport::peer::decode_raft` (a peer's raft message) |
//! | `membership` | `psmr_core::membership::Membership::decode` (the members a snapshot holds) |
//! | `conf-change` | `psmr_core::membership::Change::from_entry` (a conf-change log entry) |
//! | `resp` | `psmr_resp::RequestParser::next`, the bytes fed in 1 to 3 pieces |
//! | `serde` | `SerdeCodec::decode_op` and `decode_reply` (postcard) |
//!
//! Inputs come from a [`Mutator`]: a corpus of valid encodings made by the
//! crates' own encoders, or random bytes, with 1 to 4 mutations applied
//! (bit flips, bytes set to 0x00, 0xff or random, truncation, random bytes
//! appended, a slice duplicated, 4 or 8 bytes overwritten with a huge
//! length in either byte order, two corpus entries spliced). The random
//! stream is ChaCha8 from a seed, so a run is repeated exactly by its seed;
//! each target derives its own stream from the seed and its name, so one
//! target alone sees the inputs it saw in a run of all.
//!
//! Each input runs under `catch_unwind` with the panic hook silenced: a
//! panic is a crash, kept (as hex) with its message. Allocation is measured
//! through an [`AllocMeter`], a count of bytes allocated so far that the
//! caller's global allocator keeps (the `psmr` binary wraps its allocator in
//! `cap::Cap`; this crate has no allocator of its own). The bytes allocated
//! while one input runs, counted cumulatively, bound both that input's peak
//! and its largest single allocation from above; an input whose count
//! exceeds `alloc_factor` × its length + `alloc_slack` is a finding. The
//! count is process-wide, so it is exact only while nothing else allocates,
//! as in the single-threaded `psmr fuzz`.

use psmr_core::entry::{encode_entry, entry_commands, EntryCommand};
use psmr_core::membership::{founding_entries, Change, Membership};
use psmr_core::Member;
use psmr_model::wire::{read_frame, ClientMsg, OpCodec, Outcome, ReplicaStatus, ServerMsg, ThreadStat, WireCommand};
use psmr_model::wire::{MemberChange, MemberInfo};
use psmr_model::wire::{WorkerSample, FRAME_MAX_DEFAULT};
use psmr_model::{SerdeCodec, Service};
use psmr_resp::{encode_request, Limits, RequestParser};
use psmr_services::kv::{Deadline, ExpireCond, KvCodec, KvError, KvOp, KvReply, KvService, SetWhen, Ttl, TtlCmd};
use psmr_services::list::{ListCodec, ListOp, ListReply, ListService};
use psmr_services::Cost;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::cell::{Cell, RefCell};
use std::fmt::Write as _;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Once;
use std::time::Instant;

/// Longest input the mutator makes; longer ones are cut.
pub const INPUT_MAX: usize = 64 << 10;

/// Crashing (or over-bound) inputs kept per target; the rest are counted.
pub const FINDINGS_KEPT: usize = 5;

/// Bytes allocated so far by the whole process, counted cumulatively
/// (frees do not subtract): what a global allocator wrapper such as
/// `cap::Cap::total_allocated` reports.
pub type AllocMeter = fn() -> usize;

/// One decoder under test.
#[derive(Clone, Copy)]
pub struct Target {
    /// Its name on the command line.
    pub name: &'static str,
    /// Runs the decoder on one input and discards the result.
    pub run: fn(&[u8]),
    /// Valid encodings to mutate.
    pub corpus: fn() -> Vec<Vec<u8>>,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target").field("name", &self.name).finish_non_exhaustive()
    }
}

/// Every target, in a fixed order.
pub fn targets() -> Vec<Target> {
    vec![
        Target { name: "wire-client", run: run_wire_client, corpus: corpus_wire_client },
        Target { name: "wire-server", run: run_wire_server, corpus: corpus_wire_server },
        Target { name: "entry", run: run_entry, corpus: corpus_entry },
        Target { name: "kv-op", run: run_kv_op, corpus: corpus_kv_op },
        Target { name: "kv-reply", run: run_kv_reply, corpus: corpus_kv_reply },
        Target { name: "list-op", run: run_list_op, corpus: corpus_list_op },
        Target { name: "list-reply", run: run_list_reply, corpus: corpus_list_reply },
        Target { name: "snapshot-kv", run: run_snapshot_kv, corpus: corpus_snapshot_kv },
        Target { name: "snapshot-list", run: run_snapshot_list, corpus: corpus_snapshot_list },
        Target { name: "raft", run: run_raft, corpus: corpus_raft },
        Target { name: "membership", run: run_membership, corpus: corpus_membership },
        Target { name: "conf-change", run: run_conf_change, corpus: corpus_conf_change },
        Target { name: "resp", run: run_resp, corpus: corpus_resp },
        Target { name: "serde", run: run_serde, corpus: corpus_serde },
    ]
}

/// The targets named, in the order given; an unknown name is an error that
/// lists the known ones.
pub fn select(names: &[String]) -> Result<Vec<Target>, String> {
    let all = targets();
    if names.is_empty() || names.iter().any(|n| n == "all") {
        return Ok(all);
    }
    names
        .iter()
        .map(|n| {
            all.iter().find(|t| t.name == n).copied().ok_or_else(|| {
                let known: Vec<&str> = all.iter().map(|t| t.name).collect();
                format!("unknown fuzz target {n:?} (known: {}, or all)", known.join(", "))
            })
        })
        .collect()
}

/// How a run goes.
#[derive(Clone, Debug, Serialize)]
pub struct FuzzConfig {
    /// Inputs per target.
    pub inputs: u64,
    /// Seed of the random streams.
    pub seed: u64,
    /// The allocation bound per input: this many times its length ...
    pub alloc_factor: usize,
    /// ... plus this many bytes.
    pub alloc_slack: usize,
}

impl Default for FuzzConfig {
    fn default() -> Self {
        Self { inputs: 100_000, seed: 0, alloc_factor: 4, alloc_slack: 1 << 20 }
    }
}

/// A seed from the clock, for runs not given one (printed, so that they
/// can be repeated).
pub fn fresh_seed() -> u64 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    (nanos as u64) ^ ((nanos >> 64) as u64) ^ u64::from(std::process::id()).rotate_left(32)
}

/// One input that crashed a decoder or allocated over the bound.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// The input, in hex.
    pub input_hex: String,
    /// The panic's message and location, or the bytes allocated.
    pub detail: String,
}

/// What one target's run found.
#[derive(Clone, Debug, Serialize)]
pub struct TargetReport {
    /// The target.
    pub target: String,
    /// Inputs run.
    pub inputs: u64,
    /// Wall-clock seconds.
    pub secs: f64,
    /// Inputs per second.
    pub inputs_per_sec: f64,
    /// Inputs that panicked.
    pub crashes: u64,
    /// The first [`FINDINGS_KEPT`] of them.
    pub crash_inputs: Vec<Finding>,
    /// Most bytes allocated while one input ran (cumulative within that
    /// input: an upper bound on its peak); `None` without a meter.
    pub max_alloc_per_input: Option<usize>,
    /// The length of the input that allocated them.
    pub max_alloc_input_len: Option<usize>,
    /// Inputs that allocated more than the bound.
    pub over_bound: u64,
    /// The first [`FINDINGS_KEPT`] of them.
    pub over_bound_inputs: Vec<Finding>,
}

/// What a run found.
#[derive(Clone, Debug, Serialize)]
pub struct FuzzReport {
    /// The run's configuration (its seed repeats it).
    pub config: FuzzConfig,
    /// Whether allocation was measured.
    pub alloc_measured: bool,
    /// Per target.
    pub targets: Vec<TargetReport>,
    /// Inputs run, all targets.
    pub total_inputs: u64,
    /// Crashes, all targets.
    pub total_crashes: u64,
    /// Inputs over the allocation bound, all targets.
    pub total_over_bound: u64,
}

impl FuzzReport {
    /// No crash and no input over the allocation bound.
    pub fn clean(&self) -> bool {
        self.total_crashes == 0 && self.total_over_bound == 0
    }

    /// A table per target, the findings, and the totals.
    pub fn text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "fuzz seed {}: {} inputs per target", self.config.seed, self.config.inputs);
        let _ = writeln!(
            s,
            "{:<14} {:>10} {:>11} {:>8} {:>24} {:>11}",
            "target", "inputs", "inputs/s", "crashes", "max alloc/input", "over bound"
        );
        for t in &self.targets {
            let alloc = match (t.max_alloc_per_input, t.max_alloc_input_len) {
                (Some(a), Some(len)) => format!("{a} B ({len} B in)"),
                _ => "-".into(),
            };
            let over = if self.alloc_measured { t.over_bound.to_string() } else { "-".into() };
            let _ = writeln!(
                s,
                "{:<14} {:>10} {:>11.0} {:>8} {:>24} {:>11}",
                t.target, t.inputs, t.inputs_per_sec, t.crashes, alloc, over
            );
        }
        for t in &self.targets {
            for f in &t.crash_inputs {
                let _ = writeln!(s, "crash in {}: {}\n  input: {}", t.target, f.detail, f.input_hex);
            }
            for f in &t.over_bound_inputs {
                let _ =
                    writeln!(s, "over the allocation bound in {}: {}\n  input: {}", t.target, f.detail, f.input_hex);
            }
        }
        let bound = if self.alloc_measured {
            format!(
                "{} inputs over the allocation bound ({} x input + {} B)",
                self.total_over_bound, self.config.alloc_factor, self.config.alloc_slack
            )
        } else {
            "allocation not measured".into()
        };
        let _ = writeln!(s, "total: {} inputs, {} crashes, {bound}", self.total_inputs, self.total_crashes);
        s
    }
}

/// Runs every target in `targets` for `config.inputs` inputs.
pub fn run(targets: &[Target], config: &FuzzConfig, meter: Option<AllocMeter>) -> FuzzReport {
    let reports: Vec<TargetReport> = targets.iter().map(|t| fuzz_target(t, config, meter)).collect();
    FuzzReport {
        config: config.clone(),
        alloc_measured: meter.is_some(),
        total_inputs: reports.iter().map(|r| r.inputs).sum(),
        total_crashes: reports.iter().map(|r| r.crashes).sum(),
        total_over_bound: reports.iter().map(|r| r.over_bound).sum(),
        targets: reports,
    }
}

/// Runs one target for `config.inputs` inputs.
pub fn fuzz_target(target: &Target, config: &FuzzConfig, meter: Option<AllocMeter>) -> TargetReport {
    install_quiet_hook();
    let mut mutator = Mutator::new(target_seed(config.seed, target.name), (target.corpus)());
    let mut report = TargetReport {
        target: target.name.to_string(),
        inputs: 0,
        secs: 0.0,
        inputs_per_sec: 0.0,
        crashes: 0,
        crash_inputs: Vec::new(),
        max_alloc_per_input: meter.map(|_| 0),
        max_alloc_input_len: meter.map(|_| 0),
        over_bound: 0,
        over_bound_inputs: Vec::new(),
    };
    let mut input = Vec::with_capacity(INPUT_MAX);
    let run = target.run;
    let start = Instant::now();
    QUIET.with(|q| q.set(true));
    for _ in 0..config.inputs {
        mutator.next_input(&mut input);
        let before = meter.map_or(0, |m| m());
        let outcome = panic::catch_unwind(AssertUnwindSafe(|| run(&input)));
        let allocated = meter.map_or(0, |m| m()).saturating_sub(before);
        report.inputs += 1;
        if let Err(payload) = outcome {
            report.crashes += 1;
            if report.crash_inputs.len() < FINDINGS_KEPT {
                let mut detail = panic_message(payload.as_ref());
                if let Some(at) = LAST_PANIC.with(|p| p.borrow_mut().take()) {
                    let _ = write!(detail, " at {at}");
                }
                report.crash_inputs.push(Finding { input_hex: hex(&input), detail });
            }
        }
        if meter.is_some() {
            if report.max_alloc_per_input.is_some_and(|m| allocated > m) {
                report.max_alloc_per_input = Some(allocated);
                report.max_alloc_input_len = Some(input.len());
            }
            let bound = config.alloc_factor.saturating_mul(input.len()).saturating_add(config.alloc_slack);
            if allocated > bound {
                report.over_bound += 1;
                if report.over_bound_inputs.len() < FINDINGS_KEPT {
                    report.over_bound_inputs.push(Finding {
                        input_hex: hex(&input),
                        detail: format!("{allocated} bytes allocated for {} bytes of input", input.len()),
                    });
                }
            }
        }
    }
    QUIET.with(|q| q.set(false));
    report.secs = start.elapsed().as_secs_f64();
    report.inputs_per_sec = if report.secs > 0.0 { report.inputs as f64 / report.secs } else { 0.0 };
    report
}

/// The target's own stream: the run's seed mixed with its name.
fn target_seed(seed: u64, name: &str) -> u64 {
    seed ^ fnv(name.as_bytes())
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// Bytes as lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::with_capacity(2 * bytes.len()), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

thread_local! {
    /// Set while this thread fuzzes: its panics are findings, not output.
    static QUIET: Cell<bool> = const { Cell::new(false) };
    /// Where this thread's last quiet panic happened.
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Wraps the panic hook once: panics on a fuzzing thread are recorded, not
/// printed; every other panic goes to the hook that was there before.
fn install_quiet_hook() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if QUIET.with(Cell::get) {
                let at = info.location().map(|l| format!("{}:{}", l.file(), l.line()));
                LAST_PANIC.with(|p| *p.borrow_mut() = at);
            } else {
                previous(info);
            }
        }));
    });
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".into()
    }
}

/// Makes inputs: a corpus entry or random bytes, then 1 to 4 mutations,
/// all from one seeded stream.
pub struct Mutator {
    rng: ChaCha8Rng,
    corpus: Vec<Vec<u8>>,
}

/// Huge lengths that mutations write over 4 or 8 bytes.
const HUGE_32: [u32; 5] = [u32::MAX, u32::MAX - 1, 1 << 31, 1 << 24, 0x0010_0001];
const HUGE_64: [u64; 5] = [u64::MAX, 1 << 40, 1 << 32, (1 << 32) - 1, 1 << 62];

impl Mutator {
    /// A mutator of `corpus` (which may be empty: then every input starts
    /// as random bytes).
    pub fn new(seed: u64, corpus: Vec<Vec<u8>>) -> Self {
        Self { rng: ChaCha8Rng::seed_from_u64(seed), corpus }
    }

    /// Replaces `out` with the next input.
    pub fn next_input(&mut self, out: &mut Vec<u8>) {
        out.clear();
        if self.corpus.is_empty() || self.rng.gen_ratio(1, 10) {
            let n = self.rng.gen_range(0..=256);
            out.extend((0..n).map(|_| self.rng.gen::<u8>()));
        } else {
            let i = self.rng.gen_range(0..self.corpus.len());
            out.extend_from_slice(&self.corpus[i]);
        }
        for _ in 0..self.rng.gen_range(1..=4) {
            self.mutate(out);
        }
        out.truncate(INPUT_MAX);
    }

    fn mutate(&mut self, out: &mut Vec<u8>) {
        let rng = &mut self.rng;
        let len = out.len();
        match rng.gen_range(0..9) {
            0 if len > 0 => {
                let i = rng.gen_range(0..len);
                out[i] ^= 1 << rng.gen_range(0..8);
            }
            1 if len > 0 => {
                let i = rng.gen_range(0..len);
                out[i] = match rng.gen_range(0..3) {
                    0 => 0x00,
                    1 => 0xff,
                    _ => rng.gen(),
                };
            }
            2 if len > 0 => out.truncate(rng.gen_range(0..len)),
            3 if len > 0 => {
                let a = rng.gen_range(0..len);
                let b = rng.gen_range(a..=len.min(a + 64));
                let at = rng.gen_range(0..=len);
                let slice = out[a..b].to_vec();
                out.splice(at..at, slice);
            }
            4 | 5 if len >= 4 => {
                let little = rng.gen_bool(0.5);
                let bytes: Vec<u8> = if len >= 8 && rng.gen_bool(0.5) {
                    let v = HUGE_64[rng.gen_range(0..HUGE_64.len())];
                    if little {
                        v.to_le_bytes().to_vec()
                    } else {
                        v.to_be_bytes().to_vec()
                    }
                } else {
                    let v = HUGE_32[rng.gen_range(0..HUGE_32.len())];
                    if little {
                        v.to_le_bytes().to_vec()
                    } else {
                        v.to_be_bytes().to_vec()
                    }
                };
                let at = rng.gen_range(0..=len - bytes.len());
                out[at..at + bytes.len()].copy_from_slice(&bytes);
            }
            6 if !self.corpus.is_empty() => {
                let other = &self.corpus[rng.gen_range(0..self.corpus.len())];
                let cut = rng.gen_range(0..=len);
                let from = rng.gen_range(0..=other.len());
                out.truncate(cut);
                out.extend_from_slice(&other[from..]);
            }
            _ => {
                let n = rng.gen_range(1..=64);
                out.extend((0..n).map(|_| rng.gen::<u8>()));
            }
        }
    }
}

// ---- targets ----

fn run_wire_client(bytes: &[u8]) {
    if let Ok(frame) = read_frame(&mut &bytes[..], FRAME_MAX_DEFAULT) {
        let _ = ClientMsg::from_frame(&frame);
    }
}

fn run_wire_server(bytes: &[u8]) {
    if let Ok(frame) = read_frame(&mut &bytes[..], FRAME_MAX_DEFAULT) {
        let _ = ServerMsg::from_frame(&frame);
    }
}

fn run_entry(bytes: &[u8]) {
    let _ = entry_commands(bytes);
}

fn run_raft(bytes: &[u8]) {
    let _ = psmr_transport::peer::decode_raft(bytes.to_vec());
}

fn run_membership(bytes: &[u8]) {
    let _ = Membership::decode(bytes);
}

fn run_conf_change(bytes: &[u8]) {
    let mut e = raft::prelude::Entry::default();
    e.set_entry_type(raft::prelude::EntryType::EntryConfChangeV2);
    e.data = bytes.to_vec().into();
    let _ = Change::from_entry(&e);
}

fn run_kv_op(bytes: &[u8]) {
    let _ = KvCodec.decode_op(bytes);
}

fn run_kv_reply(bytes: &[u8]) {
    let _ = KvCodec.decode_reply(bytes);
}

fn run_list_op(bytes: &[u8]) {
    let _ = ListCodec.decode_op(bytes);
}

fn run_list_reply(bytes: &[u8]) {
    let _ = ListCodec.decode_reply(bytes);
}

fn run_snapshot_kv(bytes: &[u8]) {
    let _ = KvService::new(0, Cost::Light).restore(bytes);
}

/// Shards of the list the `snapshot-list` target restores into.
const LIST_SHARDS: usize = 2;

fn run_snapshot_list(bytes: &[u8]) {
    let _ = ListService::new(LIST_SHARDS, 0).restore(bytes);
}

/// The RESP target's limits: 1 MiB per argument and per request.
fn resp_limits() -> Limits {
    Limits { bulk_max: 1 << 20, request_max: 1 << 20, ..Limits::default() }
}

/// Feeds the bytes in 1 to 3 pieces, cut where a hash of the bytes says
/// (so the input alone repeats the run), taking every request each piece
/// completes.
fn run_resp(bytes: &[u8]) {
    let h = fnv(bytes);
    let pieces = 1 + (h % 3) as usize;
    let mut cuts = [0, bytes.len(), bytes.len(), bytes.len()];
    if !bytes.is_empty() {
        for (i, cut) in cuts.iter_mut().enumerate().take(pieces).skip(1) {
            *cut = ((h >> (16 * i)) as usize) % (bytes.len() + 1);
        }
        cuts[1..pieces].sort_unstable();
    }
    let mut parser = RequestParser::new(resp_limits());
    let mut buf = bytes::BytesMut::new();
    for i in 0..pieces {
        let end = if i + 1 == pieces { bytes.len() } else { cuts[i + 1] };
        buf.extend_from_slice(&bytes[cuts[i]..end]);
        loop {
            match parser.next(&mut buf) {
                Ok(Some(_)) => continue,
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
}

/// A small service's operations, for the `serde` target.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum SerdeOp {
    /// A key and a value.
    Put {
        /// The key.
        key: String,
        /// The value.
        value: Vec<u8>,
    },
    /// A key.
    Get(String),
    /// Numbers and optional names.
    Batch(Vec<(u64, Option<String>)>),
    /// Signed and float fields.
    Add(i64, f64),
    /// Nothing.
    Clear,
}

type SerdeFuzzCodec = SerdeCodec<SerdeOp, Vec<String>>;

fn run_serde(bytes: &[u8]) {
    let _ = SerdeFuzzCodec::new().decode_op(bytes);
    let _ = SerdeFuzzCodec::new().decode_reply(bytes);
}

// ---- corpora ----

fn corpus_wire_client() -> Vec<Vec<u8>> {
    let commands = vec![
        WireCommand { seq: 1, op: KvCodec.encode_op(&KvOp::Read { key: b"k".to_vec() }) },
        WireCommand { seq: 2, op: vec![] },
    ];
    [
        ClientMsg::Request { client: 7, commands },
        ClientMsg::Request { client: u64::MAX, commands: vec![] },
        ClientMsg::Status,
        ClientMsg::Stats,
        ClientMsg::Metrics,
        ClientMsg::Members,
        ClientMsg::ChangeMembership(MemberChange::Add {
            id: 4,
            client: "127.0.0.1:7004".into(),
            peer: "[::1]:8004".into(),
        }),
        ClientMsg::ChangeMembership(MemberChange::Remove { id: 2 }),
        ClientMsg::Reconfigure { scheduler: "early".into(), workers: 2, mapping: "R=conc:0,1;W=seq:0-1".into() },
        ClientMsg::Auth { user: "admin".into(), password: "secret".into() },
    ]
    .iter()
    .map(ClientMsg::to_frame)
    .collect()
}

fn corpus_wire_server() -> Vec<Vec<u8>> {
    [
        ServerMsg::Replies {
            client: 3,
            replies: vec![(1, Outcome::Ok(vec![1, 2, 3])), (2, Outcome::Rejected("no".into()))],
        },
        ServerMsg::Redirect { leader: 2, addr: "127.0.0.1:7000".into() },
        ServerMsg::Error("ERR bad".into()),
        ServerMsg::Status(ReplicaStatus {
            id: 1,
            addr: "127.0.0.1:7001".into(),
            pid: 42,
            leader: 1,
            term: 3,
            applied: 99,
            digest: "00ff".into(),
            scheduler: "auto: sequential".into(),
            decision: String::new(),
            transfers: "sending the snapshot at 9 to replica 4: 1.0 of 2.0 MiB, 3.0 MiB/s".into(),
            cpus: String::new(),
        }),
        ServerMsg::Stats {
            at_ns: 5,
            threads: vec![ThreadStat { name: "exec".into(), tid: 9, cpu_ns: 10, runq_ns: 11 }],
            workers: vec![WorkerSample { executed: 4, dequeues: 2, ..WorkerSample::default() }],
            scheduler: "auto: sequential".into(),
            decision: String::new(),
        },
        ServerMsg::Metrics("# EOF\n".into()),
        ServerMsg::Members(vec![
            MemberInfo { id: 1, client: "127.0.0.1:7001".into(), peer: "127.0.0.1:8001".into(), voter: true },
            MemberInfo { id: 4, client: "c".into(), peer: "p".into(), voter: false },
        ]),
        ServerMsg::Reconfigured { scheduler: "sequential".into(), workers: 1, stall_ns: 1_000 },
        ServerMsg::Authenticated { user: "admin".into(), role: "admin".into() },
        ServerMsg::Denied("NOPERM User default has no permissions to run the 'flushdb' command".into()),
    ]
    .iter()
    .map(ServerMsg::to_frame)
    .collect()
}

/// Members 1 to `n`, as a founding replica's log makes them.
fn founded(n: u64) -> Membership {
    let members: Vec<Member> = (1..=n)
        .map(|id| Member::new(id, ([127, 0, 0, 1], 7000 + id as u16).into(), ([127, 0, 0, 1], 8000 + id as u16).into()))
        .collect();
    let mut m = Membership::default();
    for e in founding_entries(&members) {
        m.apply(&Change::from_entry(&e).expect("a founding entry")).expect("applies");
    }
    m
}

fn corpus_raft() -> Vec<Vec<u8>> {
    use protobuf::Message as _;
    use raft::prelude::{Entry, Message, MessageType, Snapshot};
    let msg = |t: MessageType| {
        let mut m = Message { from: 2, to: 1, term: 3, index: 7, log_term: 2, commit: 6, ..Default::default() };
        m.set_msg_type(t);
        m
    };
    let mut append = msg(MessageType::MsgAppend);
    let entry = |index: u64, data: Vec<u8>| Entry { index, term: 3, data: data.into(), ..Default::default() };
    let batch = encode_entry(&[EntryCommand { client: 1, seq: 2, op: vec![3, 4] }]);
    append.set_entries(vec![entry(8, batch), entry(9, corpus_conf_change()[0].clone())].into());
    let mut snapshot = msg(MessageType::MsgSnapshot);
    let mut snap = Snapshot { data: vec![1, 2, 3].into(), ..Default::default() };
    snap.mut_metadata().index = 6;
    snap.mut_metadata().set_conf_state(founded(3).conf_state());
    snapshot.set_snapshot(snap);
    let mut heartbeat = msg(MessageType::MsgHeartbeat);
    heartbeat.context = vec![0, 0, 0, 0, 0, 0, 0, 9].into();
    [append, snapshot, heartbeat, msg(MessageType::MsgRequestPreVote), msg(MessageType::MsgAppendResponse)]
        .iter()
        .map(|m| m.write_to_bytes().expect("encodes"))
        .collect()
}

fn corpus_membership() -> Vec<Vec<u8>> {
    let mut changed = founded(3);
    let mut four = Member::new(4, ([10, 0, 0, 4], 7004).into(), ([10, 0, 0, 4], 8004).into());
    four.redis = Some(([10, 0, 0, 4], 6379).into());
    changed.apply(&Change::Add { member: four, voter: false }).expect("applies");
    changed.apply(&Change::Remove(2)).expect("applies");
    vec![Membership::default().encode(), founded(1).encode(), founded(5).encode(), changed.encode()]
}

fn corpus_conf_change() -> Vec<Vec<u8>> {
    use protobuf::Message as _;
    let four = Member::new(4, ([127, 0, 0, 1], 7004).into(), ([127, 0, 0, 1], 8004).into());
    let changes = [Change::Add { member: four.clone(), voter: false }, Change::Add { member: four, voter: true }];
    let mut out: Vec<Vec<u8>> = changes.iter().map(|c| c.to_conf_change().write_to_bytes().expect("encodes")).collect();
    out.push(Change::Remove(3).to_conf_change().write_to_bytes().expect("encodes"));
    out.extend(
        founding_entries(&[Member::new(1, ([127, 0, 0, 1], 1).into(), ([127, 0, 0, 1], 2).into())])
            .into_iter()
            .map(|e| e.data.to_vec()),
    );
    out
}

fn corpus_entry() -> Vec<Vec<u8>> {
    vec![
        encode_entry(&[]),
        encode_entry(&[EntryCommand { client: 1, seq: 2, op: vec![3, 4] }]),
        encode_entry(&[
            EntryCommand { client: 1, seq: 1, op: KvCodec.encode_op(&KvOp::DbSize) },
            EntryCommand { client: 2, seq: 9, op: vec![0; 20] },
            EntryCommand { client: 3, seq: 4, op: vec![] },
        ]),
    ]
}

fn kv_ops() -> Vec<KvOp> {
    let k = |s: &str| s.as_bytes().to_vec();
    vec![
        KvOp::Create { key: k("a"), value: k("1") },
        KvOp::Read { key: k("a") },
        KvOp::Update { key: k("a"), value: k("2") },
        KvOp::Delete { key: k("a") },
        KvOp::Put { key: k("b"), value: vec![0; 16] },
        KvOp::Set { key: k("c"), value: k("v"), when: SetWhen::IfAbsent, get: true, ttl: Ttl::Clear },
        KvOp::Set {
            key: k("c"),
            value: k("w"),
            when: SetWhen::IfPresent,
            get: false,
            ttl: Ttl::Expire(Deadline::In(1_000)),
        },
        KvOp::Expire { key: k("c"), deadline: Deadline::At(5), cond: ExpireCond::Gt, cmd: TtlCmd::ExpireAt },
        KvOp::Scan { cursor: 3, pattern: Some(k("c*")), count: 10, kind: None },
        KvOp::Incr { key: k("n"), by: -3 },
        KvOp::Append { key: k("s"), value: k("xyz") },
        KvOp::Strlen { key: k("s") },
        KvOp::MGet { keys: vec![k("a"), k("b"), k("")] },
        KvOp::MSet { pairs: vec![(k("a"), k("1")), (k("b"), k("2"))] },
        KvOp::Del { keys: vec![k("a")] },
        KvOp::Exists { keys: vec![k("a"), k("a")] },
        KvOp::DbSize,
        KvOp::FlushDb,
    ]
}

fn corpus_kv_op() -> Vec<Vec<u8>> {
    kv_ops().iter().map(|op| KvCodec.encode_op(op)).collect()
}

fn corpus_kv_reply() -> Vec<Vec<u8>> {
    [
        KvReply::Value(None),
        KvReply::Value(Some(b"value".to_vec())),
        KvReply::Done(true),
        KvReply::Int(-12),
        KvReply::Values(vec![Some(b"x".to_vec()), None, Some(vec![])]),
        KvReply::Error(KvError::NotInteger),
        KvReply::Error(KvError::ReplyTooLarge),
    ]
    .iter()
    .map(|r| KvCodec.encode_reply(r))
    .collect()
}

fn corpus_list_op() -> Vec<Vec<u8>> {
    [
        ListOp::Contains { shard: 1, value: 5 },
        ListOp::Add { shard: 0, value: -5 },
        ListOp::ContainsAll { value: 7 },
        ListOp::AddAll { value: i64::MIN },
    ]
    .iter()
    .map(|op| ListCodec.encode_op(op))
    .collect()
}

fn corpus_list_reply() -> Vec<Vec<u8>> {
    [ListReply::Found(true), ListReply::Count(3), ListReply::BadShard(9)]
        .iter()
        .map(|r| ListCodec.encode_reply(r))
        .collect()
}

fn corpus_snapshot_kv() -> Vec<Vec<u8>> {
    [0, 1, 5, 20].iter().map(|&n| KvService::new(n, Cost::Light).snapshot()).collect()
}

fn corpus_snapshot_list() -> Vec<Vec<u8>> {
    [(LIST_SHARDS, 0), (LIST_SHARDS, 1), (LIST_SHARDS, 6), (1, 2)]
        .iter()
        .map(|&(shards, size)| ListService::new(shards, size).snapshot())
        .collect()
}

fn corpus_resp() -> Vec<Vec<u8>> {
    let requests: [&[&str]; 5] = [
        &["PING"],
        &["SET", "key", "value"],
        &["MGET", "a", "b", "c"],
        &["SET", "k", "", "NX", "GET"],
        &["INCRBY", "counter", "-42"],
    ];
    let mut corpus: Vec<Vec<u8>> = requests
        .iter()
        .map(|args| {
            let mut out = Vec::new();
            encode_request(args, &mut out);
            out
        })
        .collect();
    let mut two = Vec::new();
    encode_request(&["GET", "a"], &mut two);
    encode_request(&["DEL", "a", "b"], &mut two);
    corpus.push(two);
    corpus.push(b"PING\r\nSET \"a b\" 'c'\r\n\r\n".to_vec());
    corpus
}

fn corpus_serde() -> Vec<Vec<u8>> {
    let codec = SerdeFuzzCodec::new();
    let mut corpus: Vec<Vec<u8>> = [
        SerdeOp::Put { key: "k".into(), value: vec![1, 2, 3] },
        SerdeOp::Get("key".into()),
        SerdeOp::Batch(vec![(1, Some("a".into())), (u64::MAX, None)]),
        SerdeOp::Add(-1, 0.5),
        SerdeOp::Clear,
    ]
    .iter()
    .map(|op| codec.encode_op(op))
    .collect();
    corpus.push(codec.encode_reply(&vec!["x".into(), String::new()]));
    corpus
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(inputs: u64) -> FuzzConfig {
        FuzzConfig { inputs, seed: 0x5eed, ..FuzzConfig::default() }
    }

    fn no_crash(name: &str) {
        let target = select(&[name.to_string()]).unwrap()[0];
        let r = fuzz_target(&target, &config(20_000), None);
        assert_eq!(r.inputs, 20_000);
        assert_eq!(r.crashes, 0, "{name}: {:?}", r.crash_inputs);
    }

    #[test]
    fn fuzz_wire_client() {
        no_crash("wire-client");
    }

    #[test]
    fn fuzz_wire_server() {
        no_crash("wire-server");
    }

    #[test]
    fn fuzz_entry() {
        no_crash("entry");
    }

    #[test]
    fn fuzz_kv_op() {
        no_crash("kv-op");
    }

    #[test]
    fn fuzz_kv_reply() {
        no_crash("kv-reply");
    }

    #[test]
    fn fuzz_list_op() {
        no_crash("list-op");
    }

    #[test]
    fn fuzz_list_reply() {
        no_crash("list-reply");
    }

    #[test]
    fn fuzz_snapshot_kv() {
        no_crash("snapshot-kv");
    }

    #[test]
    fn fuzz_snapshot_list() {
        no_crash("snapshot-list");
    }

    #[test]
    fn fuzz_raft() {
        no_crash("raft");
    }

    #[test]
    fn fuzz_membership() {
        no_crash("membership");
    }

    #[test]
    fn fuzz_conf_change() {
        no_crash("conf-change");
    }

    #[test]
    fn fuzz_resp() {
        no_crash("resp");
    }

    #[test]
    fn fuzz_serde() {
        no_crash("serde");
    }

    #[test]
    fn fuzz_corpora_decode() {
        // The corpora are valid encodings, so mutation starts from inputs
        // that reach deep into each decoder.
        let ok = |b: &[u8]| read_frame(&mut &b[..], FRAME_MAX_DEFAULT).is_ok();
        assert!(corpus_wire_client().iter().all(|b| ok(b)));
        assert!(corpus_wire_server().iter().all(|b| ok(b)));
        assert!(corpus_entry().iter().all(|b| entry_commands(b).is_ok()));
        assert!(corpus_kv_op().iter().all(|b| KvCodec.decode_op(b).is_ok()));
        assert!(corpus_kv_reply().iter().all(|b| KvCodec.decode_reply(b).is_ok()));
        assert!(corpus_snapshot_kv().iter().all(|b| KvService::new(0, Cost::Light).restore(b).is_ok()));
        assert!(corpus_membership().iter().all(|b| Membership::decode(b).is_ok()));
        assert!(corpus_raft().iter().all(|b| psmr_transport::peer::decode_raft(b.clone()).is_ok()));
        let entry = |b: &Vec<u8>| {
            let mut e = raft::prelude::Entry::default();
            e.set_entry_type(raft::prelude::EntryType::EntryConfChangeV2);
            e.data = b.clone().into();
            e
        };
        assert!(corpus_conf_change().iter().all(|b| Change::from_entry(&entry(b)).is_ok()));
        assert!(corpus_serde()[..5].iter().all(|b| SerdeFuzzCodec::new().decode_op(b).is_ok()));
        let mut buf = bytes::BytesMut::from(&corpus_resp()[1][..]);
        assert!(RequestParser::new(resp_limits()).next(&mut buf).unwrap().is_some());
    }

    fn panics_on_ff(bytes: &[u8]) {
        assert!(!bytes.contains(&0xff), "found 0xff");
    }

    #[test]
    fn fuzz_a_panicking_target_is_a_crash() {
        let target = Target { name: "panics", run: panics_on_ff, corpus: || vec![vec![1, 2, 3]] };
        let r = run(&[target], &config(2_000), None);
        assert!(r.total_crashes > 0 && !r.clean());
        let f = &r.targets[0].crash_inputs[0];
        assert!(f.detail.contains("found 0xff") && f.detail.contains("fuzz.rs"), "{f:?}");
        assert!(f.input_hex.contains("ff"));
        assert!(r.text().contains("crash in panics: found 0xff"));
    }

    thread_local! {
        static FAKE_ALLOCATED: Cell<usize> = const { Cell::new(0) };
    }

    fn fake_meter() -> usize {
        FAKE_ALLOCATED.with(Cell::get)
    }

    /// "Allocates" 10 MiB on inputs starting with 0, 10 bytes otherwise.
    fn greedy(bytes: &[u8]) {
        let n = if bytes.first() == Some(&0) { 10 << 20 } else { 10 };
        FAKE_ALLOCATED.with(|a| a.set(a.get() + n));
    }

    #[test]
    fn fuzz_an_input_over_the_allocation_bound_is_a_finding() {
        let target = Target { name: "greedy", run: greedy, corpus: || vec![vec![0, 1], vec![1, 1]] };
        let r = run(&[target], &config(1_000), Some(fake_meter));
        let t = &r.targets[0];
        assert!(t.over_bound > 0 && t.over_bound < 1_000 && !r.clean());
        assert_eq!(t.max_alloc_per_input, Some(10 << 20));
        assert!(t.over_bound_inputs.iter().all(|f| f.input_hex.starts_with("00")));
        assert!(r.text().contains("over the allocation bound in greedy"));
    }

    #[test]
    fn fuzz_mutator_is_deterministic() {
        let corpus = corpus_kv_op();
        let stream = |seed| {
            let mut m = Mutator::new(seed, corpus.clone());
            let mut out = Vec::new();
            (0..2_000)
                .map(|_| {
                    m.next_input(&mut out);
                    out.clone()
                })
                .collect::<Vec<_>>()
        };
        let a = stream(1);
        assert_eq!(a, stream(1));
        assert_ne!(a, stream(2));
        assert!(a.iter().all(|i| i.len() <= INPUT_MAX));
        // Mutations do change inputs, and most differ from one another.
        assert!(a.iter().filter(|i| !corpus.contains(i)).count() > 1_500);
    }

    #[test]
    fn fuzz_reports_repeat_by_seed_and_select_refuses_unknown_names() {
        let t = select(&["list-op".into()]).unwrap();
        let a = run(&t, &config(500), None);
        assert_eq!(a.total_inputs, 500);
        assert_eq!(select(&[]).unwrap().len(), targets().len());
        let err = select(&["nope".into()]).unwrap_err();
        assert!(err.contains("unknown fuzz target \"nope\"") && err.contains("kv-op"), "{err}");
    }
}
