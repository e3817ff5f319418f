//! Fault-injecting relays on the links between replicas: how the nemesis
//! cuts, stalls, resets and slows the peer traffic of real replica
//! processes, with no privilege, and the only way to delay it on a kernel
//! without `netem`.
//!
//! A replica behind a relay listens for its peers on an address of its own
//! (`psmr replica --peer-listen`) while the configuration names the
//! relay's, so every peer connection to it passes through the relay. The
//! relay tells who dialled by the connection's source address: each
//! replica has an address of its own and dials from it (`psmr cluster
//! --hosts`). A *link* is one direction, the bytes from one replica to
//! another; a connection from `a` to `b` carries link `a → b` one way and
//! `b → a` the other, so a fault on a link holds on every connection
//! between the two, whoever dialled.
//!
//! * [`Fault::Held`] (a partition, or one direction of a one-way fault):
//!   the relay stops reading that direction. The sender's socket fills and
//!   its writes block, as over a link that drops every packet; what was
//!   sent arrives once the link heals, unless either side gave up on the
//!   connection first. A connection dialled over a held link is accepted
//!   but not carried on until it heals, as if its handshake were lost.
//! * [`Fault::Delay`]: each chunk is written that long after it was read
//!   (a delay line: latency, not a lower rate).
//! * [`Links::reset`]: every open connection between two replicas is
//!   closed abortively (RST on both sides), losing what was in flight.
//!
//! TCP (and TLS over it) hides loss, duplication and reordering: loss
//! shows as a stall or a reset, and the others stay in the simulator.

use parking_lot::{Condvar, Mutex};
use psmr_replica::Member;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Bytes a relay moves per read.
const CHUNK: usize = 64 << 10;
/// Chunks a delayed direction holds in its delay line, at most.
const LINE_CHUNKS: usize = 256;

/// What happens to the bytes of one link.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Fault {
    /// Carried at once.
    #[default]
    Up,
    /// Not carried until the link heals.
    Held,
    /// Carried this long after they were read.
    Delay(Duration),
}

/// One open connection through a relay, between two replicas.
struct Open {
    between: (u64, u64),
    sockets: [TcpStream; 2],
}

#[derive(Default)]
struct State {
    /// The faults on each link, by who set them: faults that overlap in
    /// time (the nemesis's, several at once) each lift only their own.
    faults: HashMap<(u64, u64), BTreeMap<u64, Fault>>,
    open: HashMap<u64, Open>,
    next: u64,
    /// Replicas whose relays stopped: their connections' pumps go.
    stopped: HashSet<u64>,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    /// Replica by the address it dials from.
    hosts: HashMap<IpAddr, u64>,
    /// Bytes carried per link.
    carried: Mutex<HashMap<(u64, u64), Arc<AtomicU64>>>,
    /// Connections the relays accepted, from replicas or not.
    accepted: AtomicU64,
}

/// The links of one cluster and their faults; the relays share them.
#[derive(Clone)]
pub struct Links {
    shared: Arc<Shared>,
}

impl Links {
    /// Links among the replicas of `hosts`: the address each dials from.
    pub fn new(hosts: HashMap<IpAddr, u64>) -> Self {
        let shared = Shared {
            state: Mutex::default(),
            changed: Condvar::new(),
            hosts,
            carried: Mutex::default(),
            accepted: AtomicU64::new(0),
        };
        Self { shared: Arc::new(shared) }
    }

    /// Sets the fault of link `from → to` (as owner 0: see
    /// [`Links::add`]).
    pub fn set(&self, from: u64, to: u64, fault: Fault) {
        self.add(0, from, to, fault);
    }

    /// Puts `fault` on link `from → to` for `owner`, replacing what that
    /// owner had put there. A link with faults from several owners holds
    /// if any holds it, else delays by the longest delay.
    pub fn add(&self, owner: u64, from: u64, to: u64, fault: Fault) {
        self.shared.state.lock().faults.entry((from, to)).or_default().insert(owner, fault);
        self.shared.changed.notify_all();
    }

    /// Lifts every fault `owner` put on any link.
    pub fn lift(&self, owner: u64) {
        let mut state = self.shared.state.lock();
        state.faults.values_mut().for_each(|f| {
            f.remove(&owner);
        });
        state.faults.retain(|_, f| !f.is_empty());
        drop(state);
        self.shared.changed.notify_all();
    }

    /// The fault of link `from → to`: what its owners' faults add up to.
    pub fn fault(&self, from: u64, to: u64) -> Fault {
        self.shared.fault(from, to)
    }

    /// Every link up.
    pub fn heal(&self) {
        self.shared.state.lock().faults.clear();
        self.shared.changed.notify_all();
    }

    /// Closes every open connection between `a` and `b` abortively; the
    /// number closed.
    pub fn reset(&self, a: u64, b: u64) -> usize {
        let mut state = self.shared.state.lock();
        let cut: Vec<u64> = state.open.iter().filter(|(_, o)| same_pair(o.between, (a, b))).map(|(&k, _)| k).collect();
        for k in &cut {
            if let Some(o) = state.open.remove(k) {
                o.sockets.iter().for_each(abort);
            }
        }
        cut.len()
    }

    /// Connections the relays have accepted and dealt with so far: dropped
    /// (not from a replica), or handed on (waiting while their link is
    /// held).
    pub fn accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Bytes carried so far over link `from → to`.
    pub fn carried(&self, from: u64, to: u64) -> u64 {
        self.shared.carried.lock().get(&(from, to)).map_or(0, |c| c.load(Ordering::SeqCst))
    }

    /// A relay for replica `to`, listening on `listener` (the address the
    /// configuration names) and carrying to `target` (where the replica
    /// listens for its peers).
    pub fn relay(&self, to: u64, listener: TcpListener, target: SocketAddr) -> io::Result<Relay> {
        let addr = listener.local_addr()?;
        let shared = self.shared.clone();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("relay-{to}"))
            .spawn(move || accept_loop(&shared, to, &listener, target, &stopping))?;
        Ok(Relay { to, addr, stop, thread: Some(thread), links: self.clone() })
    }
}

fn same_pair(x: (u64, u64), y: (u64, u64)) -> bool {
    x == y || x == (y.1, y.0)
}

/// Closes `s` with a reset: no graceful end, and what was queued is lost.
fn abort(s: &TcpStream) {
    let _ = socket2::SockRef::from(s).set_linger(Some(Duration::ZERO));
    let _ = s.shutdown(Shutdown::Both);
}

impl State {
    /// The fault of link `from → to`: held if any owner holds it, else the
    /// longest delay, else up.
    fn fault(&self, from: u64, to: u64) -> Fault {
        let Some(faults) = self.faults.get(&(from, to)) else { return Fault::Up };
        faults.values().fold(Fault::Up, |sum, &f| match (sum, f) {
            (Fault::Held, _) | (_, Fault::Held) => Fault::Held,
            (Fault::Delay(a), Fault::Delay(b)) => Fault::Delay(a.max(b)),
            (Fault::Up, f) | (f, Fault::Up) => f,
        })
    }
}

impl Shared {
    fn fault(&self, from: u64, to: u64) -> Fault {
        self.state.lock().fault(from, to)
    }

    /// Waits while link `from → to` is held; false once the relay of
    /// replica `relay` stops.
    fn wait_carried(&self, relay: u64, from: u64, to: u64) -> bool {
        let mut state = self.state.lock();
        while !state.stopped.contains(&relay) && state.fault(from, to) == Fault::Held {
            self.changed.wait(&mut state);
        }
        !state.stopped.contains(&relay)
    }

    /// Waits until a chunk read at `read_at` is due over link `from →
    /// to`: not while the link is held, nor before its delay has passed
    /// (a heal releases it at once); false once `relay` stops.
    fn wait_due(&self, relay: u64, (from, to): (u64, u64), read_at: Instant) -> bool {
        let mut state = self.state.lock();
        loop {
            if state.stopped.contains(&relay) {
                return false;
            }
            match state.fault(from, to) {
                Fault::Held => self.changed.wait(&mut state),
                Fault::Delay(d) if Instant::now() < read_at + d => {
                    let _ = self.changed.wait_until(&mut state, read_at + d);
                }
                _ => return true,
            }
        }
    }

    fn counter(&self, from: u64, to: u64) -> Arc<AtomicU64> {
        self.carried.lock().entry((from, to)).or_default().clone()
    }
}

/// A relay in front of one replica's peer port; stops when dropped.
pub struct Relay {
    to: u64,
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    links: Links,
}

impl Relay {
    /// Where the relay listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accepting thread, which then sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let shared = &self.links.shared;
        let mut state = shared.state.lock();
        state.stopped.insert(self.to);
        for o in state.open.values().filter(|o| o.between.1 == self.to) {
            o.sockets.iter().for_each(abort);
        }
        shared.changed.notify_all();
    }
}

/// Counts one when dropped.
struct Counted<'a>(&'a AtomicU64);

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn accept_loop(shared: &Arc<Shared>, to: u64, listener: &TcpListener, target: SocketAddr, stop: &AtomicBool) {
    while let Ok((client, peer)) = listener.accept() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        // Counted once decided: a stranger is dropped, and a replica's
        // connection over a held link waits before it reaches its target.
        let _counted = Counted(&shared.accepted);
        let Some(&from) = shared.hosts.get(&peer.ip()) else {
            // Not a replica of this cluster: nothing to relay for it.
            continue;
        };
        let shared = shared.clone();
        let _ = std::thread::Builder::new()
            .name(format!("relay-{from}-{to}"))
            .spawn(move || connection(&shared, (from, to), client, target));
    }
}

/// Carries one connection from replica `from` to replica `to`.
fn connection(shared: &Arc<Shared>, (from, to): (u64, u64), client: TcpStream, target: SocketAddr) {
    if !shared.wait_carried(to, from, to) {
        return;
    }
    let Ok(server) = TcpStream::connect_timeout(&target, Duration::from_secs(1)) else {
        abort(&client);
        return;
    };
    let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else { return };
    let key = {
        let mut state = shared.state.lock();
        let key = state.next;
        state.next += 1;
        state.open.insert(key, Open { between: (from, to), sockets: [c2, s2] });
        key
    };
    let (up_src, up_dst) = (client.try_clone(), server.try_clone());
    let up = match (up_src, up_dst) {
        (Ok(src), Ok(dst)) => {
            let shared = shared.clone();
            let name = format!("relay-{from}>{to}");
            std::thread::Builder::new().name(name).spawn(move || pump(&shared, to, (from, to), src, dst))
        }
        _ => Err(io::Error::other("cannot clone a socket")),
    };
    pump(shared, to, (to, from), server, client);
    if let Ok(up) = up {
        let _ = up.join();
    }
    if let Some(o) = shared.state.lock().open.remove(&key) {
        o.sockets.iter().for_each(|s| {
            let _ = s.shutdown(Shutdown::Both);
        });
    }
}

/// Moves the bytes of link `from → to` from `src` to `dst` until either
/// end closes or `relay`'s relay stops: a reader that stops while the
/// link is held, and a writer that keeps each chunk for the link's delay.
fn pump(shared: &Arc<Shared>, relay: u64, (from, to): (u64, u64), mut src: TcpStream, dst: TcpStream) {
    let (tx, rx) = crossbeam::channel::bounded::<(Instant, Vec<u8>)>(LINE_CHUNKS);
    let counter = shared.counter(from, to);
    let writer = {
        let shared = shared.clone();
        let mut dst = dst.try_clone();
        std::thread::Builder::new().name(format!("relay-w-{from}>{to}")).spawn(move || {
            let Ok(dst) = dst.as_mut() else { return };
            for (read_at, chunk) in rx {
                if !shared.wait_due(relay, (from, to), read_at) {
                    return;
                }
                // Counted before it is written: whoever reads it finds it
                // counted.
                counter.fetch_add(chunk.len() as u64, Ordering::SeqCst);
                if dst.write_all(&chunk).is_err() {
                    return;
                }
            }
            let _ = dst.shutdown(Shutdown::Write);
        })
    };
    let mut buf = vec![0u8; CHUNK];
    while shared.wait_carried(relay, from, to) {
        match src.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if tx.send((Instant::now(), buf[..n].to_vec())).is_err() {
                    break;
                }
            }
        }
    }
    drop(tx);
    if let Ok(w) = writer {
        let _ = w.join();
    }
    let _ = dst.shutdown(Shutdown::Write);
}

/// The relays of a local cluster whose replicas each have an address of
/// their own: one at every replica's configured peer address, carrying to
/// where the replica listens instead ([`Relays::listen`]).
pub struct Relays {
    links: Links,
    listen: BTreeMap<u64, SocketAddr>,
    _relays: Vec<Relay>,
}

impl Relays {
    /// Relays for `members`, each replica to listen for its peers on a
    /// free port of its own host. Members that share an address are an
    /// error: a relay tells replicas apart by the address they dial from.
    pub fn new(members: &[Member]) -> io::Result<Self> {
        let hosts: HashMap<IpAddr, u64> = members.iter().map(|m| (m.peer.ip(), m.id)).collect();
        if hosts.len() != members.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "relayed replicas need an address each (psmr cluster --hosts)",
            ));
        }
        let links = Links::new(hosts);
        let (mut listen, mut relays) = (BTreeMap::new(), Vec::new());
        for m in members {
            let behind = crate::launch::hold_free_ports(&m.peer.ip().to_string(), 1)?.remove(0).local_addr()?;
            relays.push(links.relay(m.id, TcpListener::bind(m.peer)?, behind)?);
            listen.insert(m.id, behind);
        }
        Ok(Self { links, listen, _relays: relays })
    }

    /// The links' faults.
    pub fn links(&self) -> &Links {
        &self.links
    }

    /// Where each replica listens for its peers, behind its relay
    /// (`psmr replica --peer-listen`).
    pub fn listen(&self) -> BTreeMap<u64, SocketAddr> {
        self.listen.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Replica 1 dials from 127.0.0.21 through the relay of replica 2.
    struct Pair {
        links: Links,
        _relay: Relay,
        one: TcpStream,
        two: TcpStream,
        target: TcpListener,
    }

    fn dial_from(ip: &str, to: SocketAddr) -> TcpStream {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        s.bind(&SocketAddr::new(ip.parse().unwrap(), 0).into()).unwrap();
        s.connect(&to.into()).unwrap();
        s.into()
    }

    fn pair() -> Pair {
        let hosts = HashMap::from([("127.0.0.21".parse().unwrap(), 1), ("127.0.0.22".parse().unwrap(), 2)]);
        let links = Links::new(hosts);
        let target = TcpListener::bind("127.0.0.22:0").unwrap();
        let relay = links.relay(2, TcpListener::bind("127.0.0.1:0").unwrap(), target.local_addr().unwrap()).unwrap();
        let one = dial_from("127.0.0.21", relay.addr());
        let (two, _) = target.accept().unwrap();
        for s in [&one, &two] {
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        }
        Pair { links, _relay: relay, one, two, target }
    }

    fn send(mut s: &TcpStream, b: &[u8]) {
        s.write_all(b).unwrap();
    }

    fn recv(mut s: &TcpStream, n: usize) -> Vec<u8> {
        let mut buf = vec![0; n];
        s.read_exact(&mut buf).unwrap();
        buf
    }

    /// Waits (at most 30 s) until the relays have dealt with `n`
    /// connections: after that, one they did not hand on never will be.
    fn handled(links: &Links, n: u64) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while links.accepted() < n {
            assert!(Instant::now() < deadline, "the relay took {} connections of {n}", links.accepted());
            std::thread::yield_now();
        }
    }

    /// Nothing arrives on `s` within a while (the only way to see that a
    /// link carries nothing; what is held is then checked to arrive).
    fn silent(mut s: &TcpStream) {
        s.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
        let mut b = [0u8; 1];
        let got = s.read(&mut b);
        assert!(matches!(&got, Err(e) if e.kind() == io::ErrorKind::WouldBlock), "{got:?}");
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    }

    #[test]
    fn a_held_link_carries_nothing_until_it_heals_and_only_its_direction() {
        let p = pair();
        send(&p.one, b"a");
        assert_eq!(recv(&p.two, 1), b"a");
        p.links.set(1, 2, Fault::Held);
        send(&p.one, b"b");
        silent(&p.two);
        // One-way: the other direction still carries.
        send(&p.two, b"c");
        assert_eq!(recv(&p.one, 1), b"c");
        p.links.heal();
        assert_eq!(recv(&p.two, 1), b"b", "what was held arrives once healed");
        assert_eq!((p.links.carried(1, 2), p.links.carried(2, 1)), (2, 1));
    }

    #[test]
    fn a_connection_dialled_over_a_held_link_waits_for_the_heal() {
        let p = pair();
        p.links.set(1, 2, Fault::Held);
        let late = dial_from("127.0.0.21", p._relay.addr());
        handled(&p.links, 2);
        p.target.set_nonblocking(true).unwrap();
        assert!(p.target.accept().is_err(), "not carried on while held");
        p.target.set_nonblocking(false).unwrap();
        p.links.set(1, 2, Fault::Up);
        let (far, _) = p.target.accept().unwrap();
        send(&late, b"x");
        assert_eq!(recv(&far, 1), b"x");
    }

    #[test]
    fn a_delayed_link_holds_bytes_for_the_delay_and_a_heal_releases_them() {
        let p = pair();
        p.links.set(2, 1, Fault::Delay(Duration::from_secs(3600)));
        send(&p.two, b"late");
        silent(&p.one);
        assert_eq!(p.links.carried(2, 1), 0);
        p.links.heal();
        assert_eq!(recv(&p.one, 4), b"late");
    }

    #[test]
    fn overlapping_faults_each_lift_only_their_own() {
        let p = pair();
        p.links.add(1, 1, 2, Fault::Held);
        p.links.add(2, 1, 2, Fault::Delay(Duration::from_secs(3600)));
        p.links.add(2, 2, 1, Fault::Delay(Duration::from_millis(5)));
        assert_eq!(p.links.fault(1, 2), Fault::Held, "a hold wins over a delay");
        send(&p.one, b"x");
        p.links.lift(1);
        assert_eq!(p.links.fault(1, 2), Fault::Delay(Duration::from_secs(3600)));
        silent(&p.two);
        p.links.lift(2);
        assert_eq!((p.links.fault(1, 2), p.links.fault(2, 1)), (Fault::Up, Fault::Up));
        assert_eq!(recv(&p.two, 1), b"x", "carried once the last fault lifts");
    }

    #[test]
    fn a_reset_breaks_both_ends_of_every_connection_between_the_two() {
        let p = pair();
        send(&p.one, b"a");
        assert_eq!(recv(&p.two, 1), b"a");
        assert_eq!(p.links.reset(2, 1), 1);
        let mut b = [0u8; 1];
        for mut s in [&p.one, &p.two] {
            let got = s.read(&mut b);
            assert!(matches!(got, Ok(0) | Err(_)), "the connection ends: {got:?}");
        }
    }

    #[test]
    fn a_stranger_is_not_relayed() {
        let p = pair();
        let _stranger = dial_from("127.0.0.99", p._relay.addr());
        handled(&p.links, 2);
        p.target.set_nonblocking(true).unwrap();
        assert!(p.target.accept().is_err(), "an address no replica dials from");
    }
}
