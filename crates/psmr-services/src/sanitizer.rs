//! The conflict sanitizer: catches a scheduler running two conflicting
//! commands at the same time, at the moment it happens.
//!
//! Every command registers in the regions (list shards, kv keys) it is
//! about to touch, as a reader or a writer, before it takes any data lock:
//! the data locks serialize conflicting commands, so a check made after
//! taking them would never see an overlap. A writer overlapping anyone, or
//! anyone overlapping a writer, panics in the thread of the command that
//! arrived second, naming both commands and the region.

use parking_lot::Mutex;
use psmr_model::Command;
use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Stripes of the region table. Regions hash into stripes so that commands
/// on different regions rarely contend on the sanitizer's own locks.
const STRIPES: usize = 64;

/// One command inside a region.
struct Occupant {
    /// Tells entries apart when a (buggy) workload repeats (client, seq).
    ticket: u64,
    writer: bool,
    who: Arc<str>,
}

/// The commands inside each busy region of one stripe.
type Stripe = Mutex<HashMap<u64, Vec<Occupant>>>;

/// Which commands are inside which region right now.
pub(crate) struct Regions {
    /// What a region is, for messages: "shard" or "key".
    what: &'static str,
    stripes: Box<[Stripe]>,
    next_ticket: AtomicU64,
}

/// Proof that a command is registered in some regions; leaving them when
/// dropped. Returned by the services' `occupy` methods.
#[must_use = "the command leaves its regions when the occupancy is dropped"]
pub struct Occupancy<'a> {
    regions: &'a Regions,
    entries: Vec<(u64, u64)>,
}

impl Regions {
    /// An empty table whose regions are called `what` in messages.
    pub(crate) fn new(what: &'static str) -> Self {
        Self { what, stripes: (0..STRIPES).map(|_| Mutex::default()).collect(), next_ticket: AtomicU64::new(0) }
    }

    /// Registers `command` in `regions` (as a writer if `writer`), panicking
    /// if a conflicting command is inside one of them.
    pub(crate) fn enter<O: Debug>(
        &self,
        command: &Command<O>,
        writer: bool,
        regions: impl IntoIterator<Item = u64>,
    ) -> Occupancy<'_> {
        self.enter_each(command, regions.into_iter().map(|region| (region, writer)))
    }

    /// Registers `command` in each region of `regions`, as a writer when
    /// its flag says so, panicking if a conflicting command is inside one
    /// of them.
    pub(crate) fn enter_each<O: Debug>(
        &self,
        command: &Command<O>,
        regions: impl IntoIterator<Item = (u64, bool)>,
    ) -> Occupancy<'_> {
        let who: Arc<str> = format!(
            "command (client {}, seq {}, class {}, op {:?})",
            command.client, command.seq, command.class.0, command.op
        )
        .into();
        let mut occupancy = Occupancy { regions: self, entries: Vec::new() };
        for (region, writer) in regions {
            let ticket = self.next_ticket.fetch_add(1, Ordering::Relaxed);
            let mut stripe = self.stripes[stripe_of(region)].lock();
            let inside = stripe.entry(region).or_default();
            if let Some(other) = inside.iter().find(|o| o.writer || writer) {
                let message = format!(
                    "conflict sanitizer: {who} {} {} {region} while {} {} it: two conflicting commands overlap in time",
                    verb(writer),
                    self.what,
                    other.who,
                    verb(other.writer),
                );
                drop(stripe);
                // Unwinding drops `occupancy`, so the regions entered so far
                // are left and the report does not cascade into other threads.
                panic!("{message}");
            }
            inside.push(Occupant { ticket, writer, who: who.clone() });
            occupancy.entries.push((region, ticket));
        }
        occupancy
    }
}

impl Drop for Occupancy<'_> {
    fn drop(&mut self) {
        for &(region, ticket) in &self.entries {
            let mut stripe = self.regions.stripes[stripe_of(region)].lock();
            if let Some(inside) = stripe.get_mut(&region) {
                inside.retain(|o| o.ticket != ticket);
                if inside.is_empty() {
                    // Keeps the table as small as the set of busy regions.
                    stripe.remove(&region);
                }
            }
        }
    }
}

fn verb(writer: bool) -> &'static str {
    if writer {
        "writes"
    } else {
        "reads"
    }
}

fn stripe_of(region: u64) -> usize {
    // Fibonacci hashing: consecutive regions (list shards) land in
    // different stripes, and the top bits are the well-mixed ones.
    (region.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize % STRIPES
}

#[cfg(test)]
mod tests {
    use crate::kv::{KvOp, KvService};
    use crate::list::{ListOp, ListService};
    use crate::Cost;
    use psmr_model::{ClassId, ClientId, Command, KeySet, Service};
    use std::any::Any;
    use std::thread;

    fn cmd<O>(client: u64, seq: u64, class: u16, op: O) -> Command<O> {
        Command {
            client: ClientId(client),
            seq,
            class: ClassId(class),
            reads: KeySet::new(),
            writes: KeySet::new(),
            op,
            stamp: Default::default(),
        }
    }

    fn message(payload: Box<dyn Any + Send>) -> String {
        payload.downcast::<String>().map(|s| *s).unwrap_or_else(|p| p.downcast_ref::<&str>().unwrap().to_string())
    }

    /// Holds `first` inside its regions on this thread while `second`
    /// executes on another, and returns that thread's panic message, if any.
    fn overlap<S: Service>(
        occupy: impl FnOnce() -> crate::Occupancy<'static>,
        service: &'static S,
        second: Command<S::Op>,
    ) -> Option<String>
    where
        S::Op: Send,
    {
        let held = occupy();
        let outcome = thread::spawn(move || service.execute(&second)).join();
        drop(held);
        outcome.err().map(message)
    }

    fn leak<T>(t: T) -> &'static T {
        Box::leak(Box::new(t))
    }

    #[test]
    fn a_writer_overlapping_a_reader_is_reported_with_both_commands() {
        let list = leak(ListService::new(2, 4));
        let writer = cmd(3, 7, 2, ListOp::Add { shard: 0, value: 9 });
        let reader = cmd(4, 1, 0, ListOp::Contains { shard: 0, value: 9 });
        let msg = overlap(|| list.occupy(&writer), list, reader.clone()).expect("overlap went unnoticed");
        assert!(msg.contains("conflict"), "{msg}");
        assert!(
            msg.contains("command (client 4, seq 1, class 0, op Contains { shard: 0, value: 9 }) reads shard 0"),
            "{msg}"
        );
        assert!(msg.contains("command (client 3, seq 7, class 2, op Add { shard: 0, value: 9 }) writes it"), "{msg}");
        // The panicking thread left its regions: the same command now runs.
        assert_eq!(list.execute(&reader), crate::list::ListReply::Found(false));
    }

    #[test]
    fn global_commands_collide_with_local_ones_on_any_shard() {
        let list = leak(ListService::new(3, 4));
        let reader = cmd(1, 1, 2, ListOp::Contains { shard: 2, value: 1 });
        let msg = overlap(|| list.occupy(&reader), list, cmd(2, 1, 7, ListOp::AddAll { value: 5 })).unwrap();
        assert!(msg.contains("op AddAll { value: 5 }) writes shard 2 while command (client 1"), "{msg}");
        let writer = cmd(1, 2, 3, ListOp::Add { shard: 1, value: 1 });
        assert!(overlap(|| list.occupy(&writer), list, cmd(2, 2, 6, ListOp::ContainsAll { value: 5 })).is_some());
    }

    #[test]
    fn readers_together_and_writers_apart_are_fine() {
        let list = leak(ListService::new(2, 50));
        let reader = cmd(1, 1, 0, ListOp::Contains { shard: 0, value: 1 });
        assert_eq!(overlap(|| list.occupy(&reader), list, cmd(2, 1, 0, ListOp::ContainsAll { value: 3 })), None);
        let writer = cmd(1, 2, 2, ListOp::Add { shard: 0, value: 1 });
        assert_eq!(overlap(|| list.occupy(&writer), list, cmd(2, 2, 3, ListOp::Add { shard: 1, value: 3 })), None);
        // A bad shard touches nothing, so it overlaps nothing.
        assert_eq!(overlap(|| list.occupy(&writer), list, cmd(2, 3, 3, ListOp::Add { shard: 9, value: 3 })), None);
        // Many threads reading every shard at once.
        thread::scope(|s| {
            for t in 0..4 {
                s.spawn(move || {
                    for i in 0..2_000 {
                        let op = if i % 3 == 0 {
                            ListOp::ContainsAll { value: i }
                        } else {
                            ListOp::Contains { shard: (i % 2) as u32, value: i }
                        };
                        list.execute(&cmd(t, i as u64, 0, op));
                    }
                });
            }
        });
    }

    #[test]
    fn kv_overlaps_are_per_key() {
        use crate::kv::key_hash;
        let kv = leak(KvService::new(10, Cost::Light));
        let k = |s: &str| s.as_bytes().to_vec();
        let update = cmd(1, 1, 1, KvOp::Update { key: k("5"), value: vec![1] });
        let msg = overlap(|| kv.occupy(&update), kv, cmd(2, 1, 0, KvOp::Read { key: k("5") })).unwrap();
        let five = key_hash(b"5");
        assert!(
            msg.contains(&format!("reads conflict key {five} while command (client 1, seq 1, class 1, op Update")),
            "{msg}"
        );
        assert_eq!(overlap(|| kv.occupy(&update), kv, cmd(2, 2, 0, KvOp::Delete { key: k("6") })), None);
        let read = cmd(1, 2, 0, KvOp::Read { key: k("5") });
        assert_eq!(overlap(|| kv.occupy(&read), kv, cmd(2, 3, 0, KvOp::Read { key: k("5") })), None);
        assert!(overlap(|| kv.occupy(&read), kv, cmd(2, 4, 1, KvOp::Create { key: k("5"), value: vec![] })).is_some());
        // A multi-key write meets a reader of any of its keys.
        let mset = cmd(2, 5, 1, KvOp::MSet { pairs: vec![(k("1"), vec![]), (k("5"), vec![])] });
        assert!(overlap(|| kv.occupy(&read), kv, mset).is_some());
    }

    #[test]
    fn kv_whole_store_commands_meet_everything_and_reads_of_all_meet_nothing() {
        use crate::kv::ALL;
        let kv = leak(KvService::new(10, Cost::Light));
        let k = |s: &str| s.as_bytes().to_vec();
        let read = cmd(1, 1, 0, KvOp::Read { key: k("5") });
        let msg = overlap(|| kv.occupy(&read), kv, cmd(2, 1, 1, KvOp::DbSize)).unwrap();
        assert!(msg.contains(&format!("op DbSize) writes conflict key {ALL} while")), "{msg}");
        let put = cmd(1, 2, 1, KvOp::Put { key: k("7"), value: vec![] });
        assert!(overlap(|| kv.occupy(&put), kv, cmd(2, 2, 1, KvOp::FlushDb)).is_some());
        let flush = cmd(1, 3, 1, KvOp::FlushDb);
        assert!(overlap(|| kv.occupy(&flush), kv, cmd(2, 3, 0, KvOp::Strlen { key: k("1") })).is_some());
        // Every command reads ALL: unrelated commands still run together.
        assert_eq!(overlap(|| kv.occupy(&put), kv, cmd(2, 4, 1, KvOp::Incr { key: k("8"), by: 1 })), None);
    }
}
