//! The faults of a run: their rates, drawn from the seed, and one round of
//! injection every [`super::CHAOS_EVERY_US`].

use super::{Event, Rates, World};
use crate::config::Faults;
use crate::net::{Addr, NetParams};
use crate::outcome::SimError;
use rand::seq::SliceRandom;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// How long a full disk stays full, µs.
const FULL_US: (u64, u64) = (20_000, 400_000);
/// How long a pause lasts, µs.
const PAUSE_US: (u64, u64) = (30_000, 500_000);
/// How long a torn crash waits for a synced write to strike, µs.
const TORN_WAIT_US: u64 = 40_000;

/// The network of a run: benign, but for the fault kinds switched on.
pub(super) fn net_params(rng: &mut ChaCha8Rng, f: &Faults) -> NetParams {
    let mut params = NetParams::benign();
    if f.loss {
        params.loss = rng.gen_range(0.0..0.15);
    }
    if f.duplicate {
        params.duplicate = rng.gen_range(0.0..0.08);
    }
    if f.delay {
        params.long_delay = rng.gen_range(0.0..0.08);
        params.long_delay_max_us = 100_000;
    }
    if f.reorder {
        params.fifo = false;
        params.delay_max_us = rng.gen_range(1_500..5_000);
    }
    params
}

/// The fault rates of a run.
pub(super) fn rates(rng: &mut ChaCha8Rng, f: &Faults) -> Rates {
    Rates {
        crash: if f.crash { rng.gen_range(0.0..0.08) } else { 0.0 },
        partition: if f.partition || f.one_way { rng.gen_range(0.0..0.08) } else { 0.0 },
        disk_full: if f.disk_full { rng.gen_range(0.0..0.03) } else { 0.0 },
        damage: if f.damage { rng.gen_range(0.0..1.0) } else { 0.0 },
        pause: if f.pause { rng.gen_range(0.0..0.05) } else { 0.0 },
        member: if f.membership { rng.gen_range(0.0..0.1) } else { 0.0 },
        down_us: (10_000, rng.gen_range(50_000..600_000)),
        partition_us: (20_000, rng.gen_range(50_000..600_000)),
    }
}

impl World {
    /// One round of fault injection.
    pub(super) fn chaos(&mut self) -> Result<(), SimError> {
        self.start_goal();
        self.crash_one();
        self.partition();
        self.fill_a_disk();
        self.pause_one();
        Ok(())
    }

    /// Pauses a replica, the leader half the time.
    fn pause_one(&mut self) {
        if self.rates.pause == 0.0 || !self.rng.gen_bool(self.rates.pause) {
            return;
        }
        let up: Vec<usize> = self.up().into_iter().filter(|&i| self.paused[i].is_none()).collect();
        let Some(i) = self.leader_or_any(up) else { return };
        self.paused[i] = Some(Vec::new());
        self.counts.pauses += 1;
        let lasts = self.rng.gen_range(PAUSE_US.0..=PAUSE_US.1);
        let (id, incarnation) = (self.nodes[i].id, self.nodes[i].incarnation);
        self.trace.event(self.now, &[0x9A05, id, lasts], || format!("r{id} pauses for {} ms", lasts / 1000));
        self.schedule(self.now + lasts, Event::Resume { node: i, incarnation });
    }

    /// What reached a paused replica, in the order it takes it when it
    /// goes on: each connection's in the order it came (TCP), the
    /// connections interleaved at random (each has its thread, and which
    /// resumes first is anybody's guess).
    fn interleave(&mut self, deferred: Vec<Event>) -> Vec<Event> {
        let mut by_source: Vec<(Option<Addr>, std::collections::VecDeque<Event>)> = Vec::new();
        for event in deferred {
            let source = match &event {
                Event::Deliver(f) => Some(f.packet.from),
                _ => None,
            };
            match by_source.iter_mut().find(|(s, _)| *s == source) {
                Some((_, events)) => events.push_back(event),
                None => by_source.push((source, std::collections::VecDeque::from([event]))),
            }
        }
        let mut out = Vec::new();
        while !by_source.is_empty() {
            let k = self.rng.gen_range(0..by_source.len());
            out.extend(by_source[k].1.pop_front());
            if by_source[k].1.is_empty() {
                by_source.remove(k);
            }
        }
        out
    }

    /// A paused replica goes on: what reached it meanwhile comes in, in
    /// order, and its clock ticks again.
    pub(super) fn resume(&mut self, i: usize, incarnation: u64) {
        if self.nodes[i].incarnation != incarnation {
            return;
        }
        let Some(deferred) = self.paused[i].take() else { return };
        let id = self.nodes[i].id;
        self.trace.event(self.now, &[0x9A06, id, deferred.len() as u64], || format!("r{id} goes on"));
        for event in self.interleave(deferred) {
            self.schedule(self.now, event);
        }
        if self.nodes[i].is_up() {
            self.schedule(self.now, Event::Tick { node: i, incarnation });
        }
    }

    fn up(&self) -> Vec<usize> {
        (0..self.nodes.len()).filter(|&i| self.nodes[i].is_up()).collect()
    }

    /// Among `nodes`, the leader half the time, else any.
    fn leader_or_any(&mut self, nodes: Vec<usize>) -> Option<usize> {
        let leader = nodes.iter().copied().find(|&i| self.nodes[i].view().is_some_and(|v| v.is_leader()));
        match leader {
            Some(l) if self.rng.gen_bool(0.5) => Some(l),
            _ => nodes.choose(&mut self.rng).copied(),
        }
    }

    fn crash_one(&mut self) {
        if self.rates.crash == 0.0 || !self.rng.gen_bool(self.rates.crash) {
            return;
        }
        // The leader half the time (as Jepsen kills primaries).
        let Some(i) = self.leader_or_any(self.up()) else { return };
        let down = self.rng.gen_range(self.rates.down_us.0..=self.rates.down_us.1);
        if self.config.faults.torn && self.rng.gen_bool(0.5) {
            // Strikes its next synced write; a plain crash if none comes.
            self.nodes[i].arm_torn(&mut self.rng);
            let (id, incarnation) = (self.nodes[i].id, self.nodes[i].incarnation);
            self.trace.event(self.now, &[0x7042, id], || format!("r{id} will crash in its next synced write"));
            self.schedule(self.now + TORN_WAIT_US, Event::Crash { node: i, incarnation });
            self.schedule(self.now + TORN_WAIT_US + down, Event::Restart { node: i });
        } else {
            self.crash(i, "between two writes");
            self.schedule(self.now + down, Event::Restart { node: i });
        }
    }

    fn partition(&mut self) {
        let n = self.ids.len();
        if n < 2 || self.rates.partition == 0.0 || self.net.partitioned() || !self.rng.gen_bool(self.rates.partition) {
            return;
        }
        // The leader alone half the time (as Jepsen's nemesis isolates
        // primaries), else a random non-empty proper subset on one side.
        let leader = self.nodes.iter().find(|node| node.view().is_some_and(|v| v.is_leader())).map(|node| node.id);
        let mask = match leader {
            Some(id) if self.rng.gen_bool(0.5) => 1u32 << (id - 1),
            _ => self.rng.gen_range(1..(1u32 << n) - 1),
        };
        let side: Vec<u64> = self.ids.iter().copied().filter(|&id| mask >> (id - 1) & 1 == 1).collect();
        let other: Vec<u64> = self.ids.iter().copied().filter(|&id| mask >> (id - 1) & 1 == 0).collect();
        let f = self.config.faults;
        let one_way = match (f.partition, f.one_way) {
            (true, true) => self.rng.gen_bool(0.5),
            (false, true) => true,
            _ => false,
        };
        for &a in &side {
            for &b in &other {
                self.net.cut(a, b);
                if !one_way {
                    self.net.cut(b, a);
                }
            }
        }
        if one_way {
            self.counts.one_way_partitions += 1;
        } else {
            self.counts.partitions += 1;
        }
        let lasts = self.rng.gen_range(self.rates.partition_us.0..=self.rates.partition_us.1);
        self.trace.event(self.now, &[0x9A47, u64::from(mask), u64::from(one_way), lasts], || {
            let arrow = if one_way { "-/->" } else { "<-/->" };
            format!("partition {side:?} {arrow} {other:?} for {} ms", lasts / 1000)
        });
        self.schedule(self.now + lasts, Event::Heal);
    }

    fn fill_a_disk(&mut self) {
        if self.rates.disk_full == 0.0 || !self.rng.gen_bool(self.rates.disk_full) {
            return;
        }
        let Some(&i) = self.up().choose(&mut self.rng) else { return };
        if self.nodes[i].store.full() {
            return;
        }
        self.nodes[i].store.set_full(true);
        let lasts = self.rng.gen_range(FULL_US.0..=FULL_US.1);
        let id = self.nodes[i].id;
        self.trace.event(self.now, &[0xF111, id, lasts], || format!("r{id}'s disk is full for {} ms", lasts / 1000));
        self.schedule(self.now + lasts, Event::DiskFree { node: i });
    }

    /// Space frees up: a replica its full disk stopped restarts.
    pub(super) fn disk_free(&mut self, i: usize) -> Result<(), SimError> {
        self.nodes[i].store.set_full(false);
        let id = self.nodes[i].id;
        self.trace.event(self.now, &[0xF1EE, id], || format!("r{id}'s disk has space again"));
        let node = &self.nodes[i];
        if self.active && !node.is_up() && !node.removed && node.incarnation > 0 {
            self.start(i)?;
        }
        Ok(())
    }

    /// Whether the cluster tolerates one more replica that lost data: none
    /// is repaired and behind, and the replicas that run agree on the
    /// members, none of whom is gone for good (a removed replica stops as
    /// soon as it commits its removal, while the others may not know yet
    /// that it is committed: they still need a quorum that counts it).
    fn tolerates_damage(&self) -> bool {
        let mut members = self.nodes.iter().filter_map(|n| n.membership());
        let Some(first) = members.next() else { return false };
        let gone = first.members().any(|m| self.nodes[(m.id - 1) as usize].removed);
        !gone && !self.nodes.iter().any(|n| n.store.repaired()) && members.all(|m| m == first)
    }

    /// A crashed replica comes back, its log damaged now and then (then
    /// recovery refuses it, and it is repaired) when the cluster tolerates
    /// it.
    pub(super) fn restart(&mut self, i: usize) -> Result<(), SimError> {
        let node = &self.nodes[i];
        if node.is_up() || node.removed || node.store.full() {
            return Ok(());
        }
        let damage = self.rates.damage > 0.0 && self.tolerates_damage() && self.rng.gen_bool(self.rates.damage);
        let node = &self.nodes[i];
        if self.active && damage {
            let (start, synced) = (node.store.log_start(), node.store.synced_index());
            if synced >= start {
                let keep = self.rng.gen_range(start.saturating_sub(1)..synced);
                node.store.damage(keep);
                let id = node.id;
                self.trace.event(self.now, &[0xDA3A, id, keep], || {
                    format!("r{id}'s log loses the synced entries after {keep} (up to {synced})")
                });
            }
        }
        self.start(i)
    }
}
