//! The world a simulated cluster runs in: the event queue and the clock,
//! the network, the clients, the faults and the administrator who asks
//! for membership changes; and the checks at the end.

use crate::checks::{Checks, Trace};
use crate::client::{Action, Client, ClientEnv};
use crate::config::SimConfig;
use crate::net::{Addr, InFlight, Net, NetParams, Packet, Payload};
use crate::node::{sim_member, Env, Node, NodeSettings};
use crate::outcome::{FaultCounts, OpKind, OpStatus, SimError, SimOp, SimOutcome, SimStats, ViolationKind};
use psmr_core::{CacheLimits, Config};
use raft::StateRole;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

mod admin;
mod faults;
mod trace;

use admin::Goal;

/// The nominal raft tick, µs.
const TICK_US: u64 = 10_000;
/// How far a replica's wall clock may be off under `skew`, ms: a new
/// leader's clock may be seconds behind the last one's, and stamps must
/// not go back all the same.
const WALL_SKEW_MS: i64 = 5_000;
/// Faults are considered this often during the load, µs.
const CHAOS_EVERY_US: u64 = 20_000;
/// Convergence is looked for this often in the quiet phase, µs.
const CHECK_EVERY_US: u64 = 20_000;
/// First client id (replicas are 1..=n).
const CLIENT_ID_BASE: u64 = 1_001;
/// The shares of writes a client's commands may have (drawn per client).
const WRITE_SHARES: [f64; 5] = [0.5, 0.5, 0.25, 0.1, 0.02];
/// Replicas that may join a run with membership changes on, beyond its
/// founders.
const SPARES: usize = 2;

pub(crate) enum Event {
    Deliver(InFlight),
    Tick {
        node: usize,
        incarnation: u64,
    },
    /// A node's protocol has a turn due.
    Flush {
        node: usize,
        incarnation: u64,
    },
    Issue {
        client: usize,
    },
    ClientTimer {
        client: usize,
        seq: u64,
        attempt: u32,
    },
    Chaos,
    /// A torn crash that found no synced write to strike becomes a plain
    /// one.
    Crash {
        node: usize,
        incarnation: u64,
    },
    Restart {
        node: usize,
    },
    /// Space frees up on a node's full disk.
    DiskFree {
        node: usize,
    },
    Heal,
    /// A paused node goes on.
    Resume {
        node: usize,
        incarnation: u64,
    },
    /// The administrator asks again about the membership change.
    Admin,
    EndLoad,
    Check,
}

struct Scheduled {
    at: u64,
    order: u64,
    event: Event,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.order) == (other.at, other.order)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.order).cmp(&(other.at, other.order))
    }
}

/// The fault rates of a run, drawn from its seed.
pub(crate) struct Rates {
    /// Chance per chaos round that a replica crashes.
    crash: f64,
    /// Chance per chaos round that a partition starts (when none is on).
    partition: f64,
    /// Chance per chaos round that a replica's disk fills up.
    disk_full: f64,
    /// Chance that a crashed replica's log is damaged before it restarts.
    damage: f64,
    /// Chance per chaos round that a replica pauses.
    pause: f64,
    /// Chance per chaos round that a membership change starts.
    member: f64,
    /// How long a crashed replica stays down, µs.
    down_us: (u64, u64),
    /// How long a partition lasts, µs.
    partition_us: (u64, u64),
}

pub(crate) struct World {
    config: SimConfig,
    seed: u64,
    rng: ChaCha8Rng,
    now: u64,
    order: u64,
    queue: BinaryHeap<Reverse<Scheduled>>,
    net: Net,
    settings: NodeSettings,
    nodes: Vec<Node>,
    ids: Vec<u64>,
    clients: Vec<Client>,
    history: Vec<SimOp>,
    checks: Checks,
    trace: Trace,
    counts: FaultCounts,
    stats: SimStats,
    rates: Rates,
    /// The load (and the faults) go on.
    active: bool,
    quiet_deadline: u64,
    done: bool,
    /// (role, term) of each replica after its last turn, to trace changes.
    roles: Vec<(StateRole, u64)>,
    /// Per node, while it is paused: the events that reached it meanwhile.
    paused: Vec<Option<Vec<Event>>>,
    /// The membership change the administrator wants.
    goal: Option<Goal>,
    next_ticket: u64,
}

/// The replicas' configuration for a run: the founders, and the values a
/// seed draws (the batching delay, snapshots, how reads are served).
fn settings(rng: &mut ChaCha8Rng, founders: usize, config: &SimConfig) -> NodeSettings {
    let mut c = Config { replicas: (1..=founders as u64).map(sim_member).collect(), ..Config::default() };
    c.snapshot_every = rng.gen_range(4..40);
    c.snapshot_every_bytes = *[2u64 << 10, 1 << 30].choose(rng).expect("two choices");
    // Small chunks, so that the kv store's snapshots go in many.
    c.snapshot_chunk_bytes = *[256usize, 4 << 10, 64 << 10].choose(rng).expect("three choices");
    c.snapshot_window_chunks = rng.gen_range(1..=4);
    c.snapshot_sync_bytes = c.snapshot_chunk_bytes as u64 * rng.gen_range(1..=4);
    c.snapshot_transfers_max = rng.gen_range(1..=2);
    c.snapshot_stall_ms = rng.gen_range(1_000..10_000);
    c.batch_delay_us = rng.gen_range(0..3_000);
    c.reads_through_log = config.reads_through_log.unwrap_or_else(|| rng.gen_bool(0.5));
    let window = *[2u64, 8, 1_024].choose(rng).expect("three choices");
    NodeSettings { cache: CacheLimits { window, ..CacheLimits::of(&c) }, config: c }
}

impl World {
    pub(crate) fn new(seed: u64, config: &SimConfig) -> Result<Self, SimError> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let n =
            if config.replicas == 0 { *[3usize, 5].choose(&mut rng).expect("two choices") } else { config.replicas };
        let params = faults::net_params(&mut rng, &config.faults);
        let rates = faults::rates(&mut rng, &config.faults);
        let spares = if config.faults.membership { SPARES } else { 0 };
        let ids: Vec<u64> = (1..=(n + spares) as u64).collect();
        let settings = settings(&mut rng, n, config);
        // Wall clocks come from a generator of their own, so that runs
        // keep the draws they had before clocks were simulated.
        let mut clocks = ChaCha8Rng::seed_from_u64(seed ^ 0xC10C_C10C_C10C_C10C);
        let nodes = ids
            .iter()
            .map(|&id| {
                let skewed = config.faults.skew;
                let tick_us = if skewed { (TICK_US as f64 * rng.gen_range(0.7..1.4)) as u64 } else { TICK_US };
                let offset_ms = if skewed { clocks.gen_range(-WALL_SKEW_MS..=WALL_SKEW_MS) } else { 0 };
                Node::new(id, id as usize <= n, tick_us, offset_ms)
            })
            .collect();
        let clients = (0..config.clients as u64)
            .map(|i| Client::new(CLIENT_ID_BASE + i, *WRITE_SHARES.choose(&mut rng).expect("shares")))
            .collect();
        let mut world = World {
            config: config.clone(),
            seed,
            rng,
            now: 0,
            order: 0,
            queue: BinaryHeap::new(),
            net: Net::new(params),
            settings,
            nodes,
            ids,
            clients,
            history: Vec::new(),
            checks: Checks::default(),
            trace: Trace::new(config.trace),
            counts: FaultCounts::default(),
            stats: SimStats::default(),
            rates,
            active: true,
            quiet_deadline: 0,
            done: false,
            roles: vec![(StateRole::Follower, 0); n + spares],
            paused: (0..n + spares).map(|_| None).collect(),
            goal: None,
            next_ticket: 0,
        };
        world.describe();
        for i in 0..n {
            world.start(i)?;
        }
        for c in 0..world.clients.len() {
            let at = world.rng.gen_range(0..50_000);
            world.schedule(at, Event::Issue { client: c });
        }
        world.schedule(CHAOS_EVERY_US, Event::Chaos);
        world.schedule(config.steps * 1_000, Event::EndLoad);
        Ok(world)
    }

    pub(crate) fn schedule(&mut self, at: u64, event: Event) {
        self.order += 1;
        self.queue.push(Reverse(Scheduled { at, order: self.order, event }));
    }

    pub(crate) fn run(&mut self) -> Result<(), SimError> {
        let limit = (self.config.steps + self.config.quiet_ms) * 1_000 + CHECK_EVERY_US;
        while let Some(Reverse(s)) = self.queue.pop() {
            if s.at > limit {
                break;
            }
            self.now = s.at;
            self.stats.events += 1;
            self.handle(s.event)?;
            if self.done {
                break;
            }
        }
        Ok(())
    }

    /// The node a paused replica's event is for, if it is paused.
    fn paused_target(&self, event: &Event) -> Option<usize> {
        let node = match event {
            Event::Deliver(f) => match f.packet.to {
                Addr::Replica(id) => (id - 1) as usize,
                Addr::Client(_) => return None,
            },
            Event::Tick { node, .. } | Event::Flush { node, .. } => *node,
            _ => return None,
        };
        self.paused[node].is_some().then_some(node)
    }

    fn handle(&mut self, event: Event) -> Result<(), SimError> {
        if let Some(node) = self.paused_target(&event) {
            // Its clock does not tick meanwhile: the tick chain starts
            // again when it goes on.
            if !matches!(event, Event::Tick { .. }) {
                self.paused[node].get_or_insert_with(Vec::new).push(event);
            }
            return Ok(());
        }
        match event {
            Event::Deliver(p) => self.deliver(p),
            Event::Tick { node, incarnation } => self.tick(node, incarnation),
            Event::Flush { node, incarnation } => {
                if self.nodes[node].incarnation == incarnation {
                    self.with_node(node, |n, s, env| n.flush(s, env));
                }
            }
            Event::Issue { client } => self.issue(client),
            Event::ClientTimer { client, seq, attempt } => {
                let actions = self.client(client, |c, env| c.timer(seq, attempt, env));
                self.client_actions(client, actions);
            }
            Event::Chaos => {
                if self.active {
                    self.chaos()?;
                    self.schedule(self.now + CHAOS_EVERY_US, Event::Chaos);
                }
            }
            Event::Crash { node, incarnation } => {
                let n = &self.nodes[node];
                if n.incarnation == incarnation && n.is_up() {
                    n.store.disarm();
                    self.crash(node, "no synced write came: a plain crash");
                }
            }
            Event::Restart { node } => self.restart(node)?,
            Event::DiskFree { node } => self.disk_free(node)?,
            Event::Heal => {
                if self.net.partitioned() {
                    self.net.heal();
                    self.trace.event(self.now, &[0x4EA1], || "partition healed".into());
                }
            }
            Event::Resume { node, incarnation } => self.resume(node, incarnation),
            Event::Admin => self.ask_admin(),
            Event::EndLoad => self.end_load()?,
            Event::Check => self.check(),
        }
        Ok(())
    }

    fn tick(&mut self, node: usize, incarnation: u64) {
        if self.nodes[node].incarnation != incarnation || !self.nodes[node].is_up() {
            return;
        }
        self.with_node(node, |n, s, env| n.tick(s, env));
        if self.nodes[node].is_up() {
            let next = self.now + self.nodes[node].tick_us;
            self.schedule(next, Event::Tick { node, incarnation });
        }
    }

    /// Runs `f` on node `i` with the world's services, then sends what it
    /// sent, takes the answers to the administrator and traces a change
    /// of role.
    pub(crate) fn with_node(&mut self, i: usize, f: impl FnOnce(&mut Node, &NodeSettings, &mut Env<'_>)) {
        let (mut out, mut answers) = (Vec::new(), Vec::new());
        let mut env = Env {
            now: self.now,
            rng: &mut self.rng,
            checks: &mut self.checks,
            trace: &mut self.trace,
            counts: &mut self.counts,
            out: &mut out,
            answers: &mut answers,
            bug: self.config.bug,
            wake: None,
        };
        f(&mut self.nodes[i], &self.settings, &mut env);
        if let Some(at) = env.wake {
            let incarnation = self.nodes[i].incarnation;
            self.schedule(at.max(self.now + 1), Event::Flush { node: i, incarnation });
        }
        for p in out {
            self.send(p);
        }
        for (ticket, msg) in answers {
            self.admin_answer(ticket, msg);
        }
        self.trace_role(i);
    }

    fn send(&mut self, p: Packet) {
        let (incarnation, from_incarnation) = (self.incarnation(p.to), self.incarnation(p.from));
        for at in self.net.route(self.now, p.from, p.to, &mut self.rng, &mut self.counts) {
            self.schedule(at, Event::Deliver(InFlight { packet: p.clone(), incarnation, from_incarnation }));
        }
    }

    /// The incarnation of a replica (0 for a client).
    fn incarnation(&self, addr: Addr) -> u64 {
        match addr {
            Addr::Replica(id) => self.nodes[(id - 1) as usize].incarnation,
            Addr::Client(_) => 0,
        }
    }

    fn deliver(&mut self, flight: InFlight) {
        let p = flight.packet;
        if self.net.is_cut(p.from, p.to) {
            self.counts.cut += 1;
            return;
        }
        if self.incarnation(p.to) != flight.incarnation || self.incarnation(p.from) != flight.from_incarnation {
            return;
        }
        self.stats.delivered += 1;
        self.trace_delivery(&p);
        match (p.to, p.from, p.payload) {
            (Addr::Replica(to), _, payload) => {
                let i = (to - 1) as usize;
                if !self.nodes[i].is_up() {
                    return;
                }
                match (p.from, payload) {
                    (_, Payload::Raft(m)) => self.with_node(i, |n, s, env| n.receive_raft(*m, s, env)),
                    (Addr::Replica(from), Payload::Snap(m)) => {
                        self.with_node(i, |n, s, env| n.receive_snap(from, *m, s, env))
                    }
                    (Addr::Client(c), Payload::Request { seq, ops }) => {
                        self.with_node(i, |n, s, env| n.receive_request(c, seq, ops, s, env))
                    }
                    _ => {}
                }
            }
            (Addr::Client(c), Addr::Replica(from), Payload::Reply { seq, answer }) => {
                let k = (c - CLIENT_ID_BASE) as usize;
                let outstanding = self.clients[k].current.as_ref().map(|o| o.seq);
                let actions = self.client(k, |client, env| client.answer(from, seq, answer, env));
                if let (Some(first), None) = (outstanding, &self.clients[k].current) {
                    self.trace_done(k, first);
                }
                self.client_actions(k, actions);
            }
            (Addr::Client(c), Addr::Replica(from), Payload::Redirect { leader }) => {
                let k = (c - CLIENT_ID_BASE) as usize;
                let actions = self.client(k, |client, env| client.redirect(from, leader, env));
                self.client_actions(k, actions);
            }
            _ => {}
        }
    }

    /// Runs `f` on client `k` with the world's services.
    fn client<R>(&mut self, k: usize, f: impl FnOnce(&mut Client, &mut ClientEnv<'_>) -> R) -> R {
        let mut env = ClientEnv {
            now: self.now,
            replicas: &self.ids,
            rng: &mut self.rng,
            history: &mut self.history,
            active: self.active,
        };
        f(&mut self.clients[k], &mut env)
    }

    fn issue(&mut self, client: usize) {
        if !self.active || self.clients[client].current.is_some() {
            return;
        }
        let keys = self.config.keys;
        let before = self.history.len();
        let actions = self.client(client, |c, env| c.issue(keys, env));
        self.trace_issue(before);
        self.client_actions(client, actions);
    }

    fn client_actions(&mut self, client: usize, actions: Vec<Action>) {
        for a in actions {
            match a {
                Action::Send(p) => self.send(p),
                Action::Timer { at, seq, attempt } => self.schedule(at, Event::ClientTimer { client, seq, attempt }),
                Action::IssueAt(at) => self.schedule(at, Event::Issue { client }),
            }
        }
    }

    pub(crate) fn start(&mut self, i: usize) -> Result<(), SimError> {
        let mut result = Ok(());
        self.with_node(i, |n, s, env| result = n.start(s, env));
        result?;
        let node = &self.nodes[i];
        let (id, incarnation, tick) = (node.id, node.incarnation, node.tick_us);
        if incarnation > 1 {
            self.counts.restarts += 1;
        }
        let applied = node.applied().unwrap_or(0);
        self.trace.event(self.now, &[0x57A, id, incarnation, applied], || {
            format!("r{id} starts (incarnation {incarnation}) from its disk, state restored at index {applied}")
        });
        let first = self.now + self.rng.gen_range(0..tick);
        self.schedule(first, Event::Tick { node: i, incarnation });
        if self.nodes[i].view().is_some_and(|v| v.repaired) {
            // Its new links say so in their handshakes.
            let others: Vec<usize> = (0..self.nodes.len()).filter(|&o| o != i && self.nodes[o].is_up()).collect();
            for other in others {
                self.with_node(other, |n, s, env| n.peer_repaired(id, s, env));
            }
        }
        Ok(())
    }

    pub(crate) fn crash(&mut self, i: usize, how: &str) {
        self.paused[i] = None;
        self.nodes[i].crash();
        self.counts.crashes += 1;
        let id = self.nodes[i].id;
        self.trace.event(self.now, &[0xC4A5, id], || format!("r{id} crashes ({how})"));
    }

    /// The end of the load: every fault healed, every replica up, clients
    /// finish what they have outstanding.
    fn end_load(&mut self) -> Result<(), SimError> {
        self.active = false;
        self.net.heal();
        self.net.params = NetParams::benign();
        self.trace.event(self.now, &[0xE4D], || "load over: faults healed, quiet phase".into());
        for i in 0..self.nodes.len() {
            let incarnation = self.nodes[i].incarnation;
            self.resume(i, incarnation);
            self.nodes[i].store.disarm();
            self.nodes[i].store.set_full(false);
            // A joiner that never started is not part of the run.
            let node = &self.nodes[i];
            if !node.is_up() && !node.removed && node.incarnation > 0 {
                self.start(i)?;
            }
        }
        self.quiet_deadline = self.now + self.config.quiet_ms * 1_000;
        self.schedule(self.now + CHECK_EVERY_US, Event::Check);
        Ok(())
    }

    /// In the quiet phase: once every replica has applied everything the
    /// only leader committed, compares their states and ends the run.
    fn check(&mut self) {
        self.stop_non_members();
        if let Some(applied) = self.converged() {
            let members = self.members().unwrap_or_default();
            let states: Vec<_> =
                self.nodes.iter().filter(|n| members.contains(&n.id)).map(|n| (n.id, n.digests())).collect();
            if states.iter().any(|(_, d)| *d != states[0].1) {
                let listed: Vec<String> = states
                    .iter()
                    .map(|(id, d)| match d {
                        Some((a, s, c)) => format!("r{id}: applied {a}, state {s}, reply cache {c}"),
                        None => format!("r{id}: down"),
                    })
                    .collect();
                let why = format!("after the quiet phase the replicas differ: {}", listed.join("; "));
                self.checks.violation(ViolationKind::StateMismatch, why);
            }
            self.trace.event(self.now, &[0xD04E, applied], || {
                format!("converged: every replica applied {applied} with the same state")
            });
            self.done = true;
            return;
        }
        if self.now >= self.quiet_deadline {
            self.no_convergence();
            self.done = true;
            return;
        }
        self.schedule(self.now + CHECK_EVERY_US, Event::Check);
    }

    fn no_convergence(&mut self) {
        let listed: Vec<String> = self
            .nodes
            .iter()
            .map(|n| match (n.view(), n.applied()) {
                (Some(v), Some(applied)) => format!(
                    "r{}: {:?} in term {}, last index {}, commit {}, applied {applied}",
                    n.id, v.role, v.term, v.last_index, v.commit
                ),
                _ => format!("r{}: down", n.id),
            })
            .collect();
        let waiting = self.clients.iter().filter(|c| c.current.is_some()).count();
        let why = format!(
            "{} ms after the faults healed the replicas have not caught up ({waiting} clients still waiting): {}",
            self.config.quiet_ms,
            listed.join("; ")
        );
        self.checks.violation(ViolationKind::NoConvergence, why);
    }

    /// The index every replica applied, if they all caught up with the one
    /// leader and no client waits.
    fn converged(&self) -> Option<u64> {
        if self.clients.iter().any(|c| c.current.is_some()) || self.goal.is_some() {
            return None;
        }
        let members = self.members()?;
        let nodes: Vec<&Node> = self.nodes.iter().filter(|n| members.contains(&n.id)).collect();
        let views: Vec<_> = nodes.iter().map(|n| n.view().zip(n.applied())).collect::<Option<_>>()?;
        let mut leaders = views.iter().filter(|(v, _)| v.is_leader());
        let (leader, _) = leaders.next()?;
        if leaders.next().is_some() {
            return None;
        }
        let committed = leader.commit;
        (committed == leader.last_index && views.iter().all(|(_, applied)| *applied == committed)).then_some(committed)
    }

    /// The members as the leader of the highest term sees them, if a
    /// replica leads.
    fn members(&self) -> Option<Vec<u64>> {
        let leader = self
            .nodes
            .iter()
            .filter(|n| n.view().is_some_and(|v| v.is_leader()))
            .max_by_key(|n| n.view().map_or(0, |v| v.term))?;
        Some(leader.membership()?.members().map(|m| m.id).collect())
    }

    /// Stops, for good, the running replicas the members no longer count
    /// (removed while cut off, they never committed their removal): as a
    /// real one is told at its next handshake. Not while a change is under
    /// way (its joiner is no member yet).
    fn stop_non_members(&mut self) {
        let Some(members) = self.members().filter(|_| self.goal.is_none()) else { return };
        for n in self.nodes.iter_mut().filter(|n| n.is_up() && !members.contains(&n.id)) {
            n.live = None;
            n.removed = true;
            let id = n.id;
            self.trace.event(self.now, &[0x4E31, id], || format!("r{id} is told it was removed and stops"));
        }
    }

    /// The run cannot go on: records why, at the end of the trace.
    pub(crate) fn stopped(&mut self, kind: ViolationKind, why: String) {
        let why = format!("at {:.3} ms: {why}", self.now as f64 / 1_000.0);
        self.trace.event(self.now, &[0x5709, kind as u64], || format!("the run stops: {why}"));
        self.checks.violation(kind, why);
    }

    pub(crate) fn finish(mut self) -> SimOutcome {
        // Reads still outstanding had no effect.
        for op in &mut self.history {
            if op.status == OpStatus::Unknown && op.kind == OpKind::Read {
                op.status = OpStatus::Fail;
            }
        }
        let answered = self.history.iter().filter(|o| o.status == OpStatus::Ok).map(|o| (o.client, o.seq)).collect();
        self.checks.client_order(&answered);
        let mut stats = std::mem::take(&mut self.stats);
        stats.sim_ms = self.now / 1_000;
        stats.cache_answers = self.checks.cache_answers;
        stats.reads_without_log = self.checks.reads_without_log;
        stats.snapshot_chunks = self.checks.snapshot_chunks;
        stats.snapshots_installed = self.checks.snapshots_installed;
        stats.transfer_refusals = self.checks.transfer_refusals;
        stats.applied = self.checks.highest_applied();
        for op in &self.history {
            match op.status {
                OpStatus::Ok => stats.ops_ok += 1,
                OpStatus::Unknown => stats.ops_unknown += 1,
                OpStatus::Fail => stats.ops_fail += 1,
            }
        }
        SimOutcome {
            seed: self.seed,
            replicas: self.nodes.len(),
            history: std::mem::take(&mut self.history),
            trace_hash: self.trace.hash(),
            trace: self.trace.take_lines(),
            violations: std::mem::take(&mut self.checks.violations),
            violations_found: self.checks.found,
            refused: std::mem::take(&mut self.checks.refused),
            faults: self.counts,
            stats,
        }
    }
}
