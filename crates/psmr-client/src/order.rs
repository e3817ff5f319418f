//! A request's outcomes, handed on in command order as they come, holding
//! only what arrives ahead of its turn, and only as much of that as the
//! receiver allows.
//!
//! Workers execute a request's commands in parallel, so their replies
//! arrive in any order; a Redis gateway must still write them in the order
//! the commands came. Collecting a whole request's outcomes before writing
//! the first would hold every reply of a pipeline at once (500 `GET`s of a
//! 1 MB value: 500 MB, and as much again encoded). Here the next outcome in
//! order goes to the [`Deliver`] at once, and the receiver may make that
//! wait (a client that reads slowly); one that comes early is held only if
//! the receiver grants its bytes ([`Deliver::hold`]), and is otherwise
//! *forgotten*: its command is asked for again, and the reply cache
//! answers it without executing it twice (a read simply runs again).

use psmr_model::wire::Outcome;
use std::collections::BTreeMap;
use std::future::Future;

/// Takes a request's outcomes, in command order.
pub trait Deliver: Send {
    /// The outcome of the request's next command. May wait, for as long as
    /// the receiver needs to make room (a slow reader); meanwhile no
    /// further reply is taken from the cluster.
    fn deliver(&mut self, outcome: Outcome) -> impl Future<Output = ()> + Send;

    /// Whether an outcome of `bytes` that came ahead of its turn may be
    /// held until then; if not, it is forgotten and asked for again. Every
    /// grant is given back with [`Deliver::release`].
    fn hold(&mut self, bytes: usize) -> bool {
        let _ = bytes;
        true
    }

    /// Bytes granted by [`Deliver::hold`] that are held no longer.
    fn release(&mut self, bytes: usize) {
        let _ = bytes;
    }
}

/// Collects every outcome: for callers that want the whole request's
/// outcomes at once, and bound it themselves (by the size of the request).
impl Deliver for Vec<Outcome> {
    async fn deliver(&mut self, outcome: Outcome) {
        self.push(outcome);
    }
}

/// What became of an outcome offered to [`InOrder::offer`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Offered {
    /// Kept: delivered by the next [`InOrder::flush`], or held until its
    /// turn.
    Kept,
    /// Came ahead of its turn and the receiver would not hold it: its
    /// command must be asked for again.
    Forgotten,
    /// Not a command of this request, or one delivered or held already.
    Ignored,
}

/// One round of asking for some of a request's commands: how many are
/// still unanswered, and how many outcomes were kept.
#[derive(Clone, Copy, Debug)]
pub struct Round {
    asked: usize,
    unanswered: usize,
    kept: usize,
}

impl Round {
    /// A round that asked for `asked` commands.
    pub fn new(asked: usize) -> Self {
        Self { asked, unanswered: asked, kept: 0 }
    }

    /// Offers command `seq`'s outcome to `order` and counts what became of
    /// it (a forgotten command answered twice counts once).
    pub fn take<D: Deliver>(&mut self, order: &mut InOrder, seq: u64, outcome: Outcome, to: &mut D) {
        let offered = order.offer(seq, outcome, to);
        self.kept += usize::from(offered == Offered::Kept);
        if offered != Offered::Ignored {
            self.unanswered = self.unanswered.saturating_sub(1);
        }
    }

    /// Commands asked for and not answered yet.
    pub fn unanswered(&self) -> usize {
        self.unanswered
    }

    /// Commands asked for.
    pub fn asked(&self) -> usize {
        self.asked
    }

    /// Outcomes kept so far.
    pub fn kept(&self) -> usize {
        self.kept
    }
}

/// The commands `first..first + len` of one request: which outcomes were
/// delivered, which are held ahead of their turn, which are still missing.
#[derive(Debug)]
pub struct InOrder {
    first: u64,
    len: usize,
    /// Index of the next command to deliver.
    next: usize,
    /// Outcomes ahead of their turn, with the bytes granted for each.
    held: BTreeMap<usize, (Outcome, usize)>,
    /// Commands to ask for in one round ([`InOrder::to_ask`]).
    window: usize,
}

impl InOrder {
    /// A request of `len` commands numbered from `first`.
    pub fn new(first: u64, len: usize) -> Self {
        Self { first, len, next: 0, held: BTreeMap::new(), window: len.max(1) }
    }

    /// The sequence number of the request's first command.
    pub fn first(&self) -> u64 {
        self.first
    }

    /// Every command's outcome was delivered.
    pub fn done(&self) -> bool {
        self.next == self.len
    }

    /// Commands delivered so far.
    pub fn delivered(&self) -> usize {
        self.next
    }

    /// Indexes of the commands whose outcome is neither delivered nor held,
    /// in order: what to ask the cluster for.
    pub fn missing(&self) -> impl Iterator<Item = usize> + '_ {
        (self.next..self.len).filter(|i| !self.held.contains_key(i))
    }

    /// The commands to ask for in the next round: the first missing ones,
    /// as many as the window allows. The window starts at the whole
    /// request; a round whose replies were dropped (the replica's outbox
    /// for them was full) shrinks it to what got through, so that the
    /// next round's replies fit and the next command in order is among
    /// them; a round answered whole doubles it.
    pub fn to_ask(&self) -> Vec<usize> {
        self.missing().take(self.window).collect()
    }

    /// A round of asking ended: `kept` of its outcomes were kept, and
    /// `whole` says whether every command asked for was answered.
    pub fn asked(&mut self, kept: usize, whole: bool) {
        self.window = if whole { self.window.saturating_mul(2) } else { kept.max(1) };
    }

    /// Takes the outcome of command `seq`. The next one in order is always
    /// kept (so every round of asking makes progress); a later one only if
    /// `to` grants its bytes.
    pub fn offer<D: Deliver>(&mut self, seq: u64, outcome: Outcome, to: &mut D) -> Offered {
        let Some(i) = seq.checked_sub(self.first).and_then(|i| usize::try_from(i).ok()) else {
            return Offered::Ignored;
        };
        if i < self.next || i >= self.len || self.held.contains_key(&i) {
            return Offered::Ignored;
        }
        let granted = if i == self.next {
            0
        } else {
            let bytes = outcome.payload_len();
            if !to.hold(bytes) {
                return Offered::Forgotten;
            }
            bytes
        };
        self.held.insert(i, (outcome, granted));
        Offered::Kept
    }

    /// Delivers every outcome whose turn has come, in order.
    pub async fn flush<D: Deliver>(&mut self, to: &mut D) {
        while let Some((outcome, granted)) = self.held.remove(&self.next) {
            self.next += 1;
            if granted > 0 {
                to.release(granted);
            }
            to.deliver(outcome).await;
        }
    }

    /// Delivers `outcome` for every command not delivered yet, in order
    /// (the request failed as a whole), giving back what was held.
    pub async fn fail_rest<D: Deliver>(&mut self, outcome: Outcome, to: &mut D) {
        for (_, (_, granted)) in std::mem::take(&mut self.held) {
            to.release(granted);
        }
        while self.next < self.len {
            self.next += 1;
            to.deliver(outcome.clone()).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A receiver that grants at most `room` bytes ahead of their turn.
    #[derive(Default)]
    struct Tight {
        got: Vec<Outcome>,
        room: usize,
        granted: usize,
    }

    impl Deliver for Tight {
        async fn deliver(&mut self, outcome: Outcome) {
            self.got.push(outcome);
        }
        fn hold(&mut self, bytes: usize) -> bool {
            let ok = self.granted + bytes <= self.room;
            self.granted += if ok { bytes } else { 0 };
            ok
        }
        fn release(&mut self, bytes: usize) {
            self.granted -= bytes;
        }
    }

    fn ok(b: &[u8]) -> Outcome {
        Outcome::Ok(b.to_vec())
    }

    fn run(f: impl Future<Output = ()>) {
        tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
    }

    #[test]
    fn a_round_counts_answers_once_and_kept_outcomes_apart() {
        let mut to = Tight { room: 1, ..Tight::default() };
        let mut order = InOrder::new(10, 3);
        let mut round = Round::new(3);
        // Ahead of its turn, within the room: kept; the next one is
        // forgotten (no room), yet answered.
        round.take(&mut order, 11, ok(b"b"), &mut to);
        round.take(&mut order, 12, ok(b"cc"), &mut to);
        assert_eq!((round.unanswered(), round.kept()), (1, 1));
        // Another request's command and a repeat change nothing.
        round.take(&mut order, 99, ok(b"x"), &mut to);
        round.take(&mut order, 11, ok(b"b"), &mut to);
        assert_eq!((round.unanswered(), round.kept()), (1, 1));
        round.take(&mut order, 10, ok(b"a"), &mut to);
        assert_eq!((round.unanswered(), round.kept(), round.asked()), (0, 2, 3));
        run(order.flush(&mut to));
        assert_eq!(to.got, [ok(b"a"), ok(b"b")]);
        assert!(!order.done(), "the forgotten one is still missing");
    }

    #[test]
    fn outcomes_go_on_in_order_whatever_order_they_come_in() {
        let mut to = Tight { room: usize::MAX, ..Tight::default() };
        let mut order = InOrder::new(10, 3);
        run(async {
            assert_eq!(order.offer(12, ok(b"c"), &mut to), Offered::Kept);
            order.flush(&mut to).await;
            assert!(to.got.is_empty(), "the third waits for the first two");
            assert_eq!(order.offer(10, ok(b"a"), &mut to), Offered::Kept);
            order.flush(&mut to).await;
            assert_eq!(to.got, vec![ok(b"a")]);
            assert_eq!(order.offer(10, ok(b"again"), &mut to), Offered::Ignored);
            assert_eq!(order.offer(9, ok(b"before"), &mut to), Offered::Ignored);
            assert_eq!(order.offer(13, ok(b"after"), &mut to), Offered::Ignored);
            assert_eq!(order.offer(11, ok(b"b"), &mut to), Offered::Kept);
            order.flush(&mut to).await;
        });
        assert_eq!(to.got, vec![ok(b"a"), ok(b"b"), ok(b"c")]);
        assert!(order.done());
        assert_eq!(to.granted, 0, "every grant was given back");
    }

    #[test]
    fn what_comes_early_beyond_the_grant_is_forgotten_and_asked_for_again() {
        let mut to = Tight { room: 4, ..Tight::default() };
        let mut order = InOrder::new(0, 4);
        run(async {
            assert_eq!(order.offer(1, ok(b"bbb"), &mut to), Offered::Kept);
            assert_eq!(order.offer(2, ok(b"ccc"), &mut to), Offered::Forgotten);
            assert_eq!(order.missing().collect::<Vec<_>>(), vec![0, 2, 3]);
            assert_eq!(order.to_ask(), vec![0, 2, 3]);
            // Replies were dropped: one got through, so one is asked for.
            order.asked(1, false);
            assert_eq!(order.to_ask(), vec![0]);
            // The next in order is kept whatever its size.
            assert_eq!(order.offer(0, ok(b"a big one"), &mut to), Offered::Kept);
            order.flush(&mut to).await;
            assert_eq!(order.missing().collect::<Vec<_>>(), vec![2, 3]);
            order.asked(1, true);
            assert_eq!(order.to_ask(), vec![2, 3], "a whole round doubles the window");
            assert_eq!(to.granted, 0);
            assert_eq!(order.offer(2, ok(b"ccc"), &mut to), Offered::Kept);
            order.flush(&mut to).await;
            order.fail_rest(Outcome::Rejected("gone".into()), &mut to).await;
        });
        let last = Outcome::Rejected("gone".into());
        assert_eq!(to.got, vec![ok(b"a big one"), ok(b"bbb"), ok(b"ccc"), last]);
        assert!(order.done());
    }
}
