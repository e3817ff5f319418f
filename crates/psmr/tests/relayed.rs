//! Faults injected into real replica processes through the relays between
//! them (`psmr_harness::relay`): replicas on addresses of their own, a
//! leader cut off from its peers, the cluster going on without it and
//! taking it back once the links heal.

use psmr::client::ServiceClient;
use psmr::harness::clock::Clocks;
use psmr::harness::disk::{SmallDisks, DISK_BYTES};
use psmr::harness::launch::{ClusterDir, ClusterSpec, ProcessCluster, Spawn};
use psmr::harness::probe::Probe;
use psmr::harness::relay::{Fault, Relays};
use psmr::replica::Storage;
use psmr::services::kv::{key_bytes, KvCodec, KvOp};
use std::path::Path;
use std::time::{Duration, Instant};

fn put(client: &mut ServiceClient<KvCodec>, key: u64) {
    let op = KvOp::Put { key: key_bytes(key), value: b"v".to_vec() };
    client.call(op).unwrap_or_else(|e| panic!("put {key}: {e}"));
}

/// Waits until `ok` holds of the replicas' statuses.
fn until(probe: &Probe, what: &str, ok: impl Fn(&[psmr::model::wire::ReplicaStatus]) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let st: Vec<_> = probe.statuses(Duration::from_secs(2)).into_iter().filter_map(Result::ok).collect();
        if ok(&st) {
            return;
        }
        assert!(Instant::now() < deadline, "never {what}: {st:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A relayed cluster; dropped in order: the processes, the relays, the
/// small disks, then the directory with their data and clocks.
struct Relayed {
    cluster: ProcessCluster,
    relays: Relays,
    disks: Option<SmallDisks>,
    clocks: Clocks,
    _dir: ClusterDir,
}

/// Three replicas on 127.0.0.`first`, `first + 1` and `first + 2`, each
/// behind a relay and on a clock of its own (and with `small_disks`, on a
/// small disk of its own), ready.
fn relayed(first: u8, storage: Storage, small_disks: bool) -> Relayed {
    let dir = ClusterDir::scratch("psmr-relayed-test-").unwrap();
    let hosts = (first..first + 3).map(|i| format!("127.0.0.{i}")).collect();
    let mut spec = ClusterSpec { hosts, ..ClusterSpec::default() };
    spec.base.storage = storage;
    let config = spec.config(dir.path()).unwrap();
    let file = dir.write(&config).unwrap();
    let disks = small_disks.then(|| SmallDisks::mount(&config.data_dir, &[1, 2, 3], DISK_BYTES).unwrap());
    let relays = Relays::new(&config.replicas).unwrap();
    let exe = Path::new(env!("CARGO_BIN_EXE_psmr"));
    let logs = dir.path().join("logs");
    let clocks = Clocks::new(&dir.path().join("clocks")).unwrap();
    let spawn = Spawn { logs: Some(logs), peer_listen: relays.listen(), clocks: Some(clocks.clone()) };
    let mut cluster = ProcessCluster::start_with(exe, (&file, &config), spawn).unwrap();
    cluster.wait_ready(Duration::from_secs(30)).unwrap();
    Relayed { cluster, relays, disks, clocks, _dir: dir }
}

#[test]
fn a_leader_cut_off_by_its_links_is_replaced_and_catches_up_once_they_heal() {
    let mut r = relayed(41, Storage::Memory, false);
    let (cluster, relays) = (&r.cluster, &r.relays);
    let mut client = ServiceClient::connect(cluster.addrs().to_vec(), KvCodec).unwrap();
    for k in 0..10 {
        put(&mut client, k);
    }

    let old = cluster.leader().expect("a leader");
    let links = relays.links();
    for other in (1..=3).filter(|&r| r != old) {
        links.set(old, other, Fault::Held);
        links.set(other, old, Fault::Held);
    }
    let carried = links.carried(old, 1 + old % 3);
    // The other two elect one of them, and writes go on there.
    let probe = Probe::new(cluster.addrs()).unwrap();
    until(&probe, "a new leader", |st| st.iter().any(|s| s.id != old && s.leader != 0 && s.leader != old));
    for k in 10..20 {
        put(&mut client, k);
    }
    assert_eq!(links.carried(old, 1 + old % 3), carried, "nothing crossed the cut");

    links.heal();
    put(&mut client, 20);
    until(&probe, "equal states", |st| {
        st.len() == 3 && st.windows(2).all(|w| w[0].digest == w[1].digest && w[0].applied == w[1].applied)
    });
    assert!(r.cluster.exited().is_empty());
}

/// What the test writes under key `k`: 4 KiB, so that a log outgrows
/// what it had allocated within a few hundred writes.
fn value(k: u64) -> Vec<u8> {
    format!("{k:>4096}").into_bytes()
}

/// Fills the leader's disk and writes until the leader stops on it, with
/// its reason; then empties the disk and restarts the replica as it is,
/// without `--repair`.
fn full_disk_stops_the_leader_until_it_is_emptied(
    cluster: &mut ProcessCluster,
    disks: &SmallDisks,
    addrs: &[std::net::SocketAddr],
    acked: &mut Vec<u64>,
) {
    let leader = cluster.leader().expect("a leader");
    disks.fill(leader).unwrap();
    let mut client = ServiceClient::connect(addrs.to_vec(), KvCodec).unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut k = acked.iter().max().map_or(0, |m| m + 1);
    while cluster.exit_of(leader).is_none() {
        assert!(Instant::now() < deadline, "the full disk never stopped replica {leader}");
        if client.call(KvOp::Put { key: key_bytes(k), value: value(k) }).is_ok() {
            acked.push(k);
        }
        k += 1;
    }
    let why = cluster.last_error(leader).unwrap_or_default();
    assert!(why.contains("cannot persist the log"), "stopped with its reason: {why}");
    disks.empty(leader).unwrap();
    cluster.restart(leader).unwrap();
}

fn every_acknowledged_write_is_there_and_the_replicas_agree(addrs: &[std::net::SocketAddr], acked: &[u64]) {
    let mut client = ServiceClient::connect(addrs.to_vec(), KvCodec).unwrap();
    for &k in acked {
        let got = client.call(KvOp::Read { key: key_bytes(k) }).unwrap();
        assert_eq!(got, psmr::services::kv::KvReply::Value(Some(value(k))), "key {k}");
    }
    let probe = Probe::new(addrs).unwrap();
    until(&probe, "equal states", |st| {
        st.len() == 3 && st.windows(2).all(|w| w[0].digest == w[1].digest && w[0].applied == w[1].applied)
    });
}

#[test]
fn every_kind_of_fault_is_injected_into_real_processes_and_nothing_acknowledged_is_lost() {
    use psmr::harness::nemesis::{self, Drawn, Kind, Step, Target, Victims};
    let r = relayed(51, Storage::Disk, true);
    let addrs = r.cluster.addrs().to_vec();
    let Relayed { cluster, relays, disks, clocks, _dir } = r;
    let cluster = std::sync::Mutex::new(cluster);

    // One fault of each kind, the leader's where a kind can take it. A
    // full disk stops a replica once its log outgrows the space it
    // allocated before (2 MiB at most): 4 KiB values for 3 s exceed it.
    let steps = [
        Step::Isolate(Target::Leader),
        Step::OneWay(Target::Leader, Target::Replica(1)),
        Step::Reset(1, 2),
        Step::Delay(2, 100),
        Step::Pause(Target::Leader),
        Step::Kill(Target::Leader),
        Step::FillDisk(Target::Leader),
        Step::Clock(Target::Leader, -20),
    ];
    let s = Duration::from_millis;
    let drawn: Vec<Drawn> = steps
        .into_iter()
        .enumerate()
        .map(|(i, step)| {
            let hold = if step.kind() == Kind::DiskFull { s(3000) } else { s(1500) };
            Drawn { lane: 0, at: s(500 + 2500 * i as u64), hold, step }
        })
        .collect();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let start = Instant::now();
    let victims = Victims {
        cluster: &cluster,
        links: relays.links(),
        disks: disks.as_ref(),
        clocks: Some(&clocks),
        replicas: &[1, 2, 3],
    };
    let (windows, acked) = std::thread::scope(|scope| {
        let writer = scope.spawn(|| {
            let mut client = ServiceClient::connect(addrs.clone(), KvCodec).unwrap();
            let mut acked = Vec::new();
            for k in 0.. {
                if stop.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                if client.call(KvOp::Put { key: key_bytes(k), value: value(k) }).is_ok() {
                    acked.push(k);
                }
            }
            acked
        });
        let windows = nemesis::run(&victims, &drawn, (start, &stop));
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        (windows, writer.join().unwrap())
    });
    let kinds: Vec<Kind> = windows.iter().map(|w| w.kind).collect();
    assert_eq!(kinds, Kind::ALL.to_vec(), "{windows:?}");
    for w in &windows {
        assert!(w.error.is_none(), "{w:?}");
    }
    // Whether the nemesis's full disk stopped its replica depends on how
    // much it wrote in the hold; either way the window says which.
    let full = &windows[6].what;
    assert!(full.contains("and was restarted") || full.contains("carried on"), "{full}");
    assert!(acked.len() > 10, "writes went on: {}", acked.len());
    let mut cluster = cluster.into_inner().unwrap();
    let disks = disks.expect("small disks");
    let mut acked = acked;
    full_disk_stops_the_leader_until_it_is_emptied(&mut cluster, &disks, &addrs, &mut acked);

    every_acknowledged_write_is_there_and_the_replicas_agree(&addrs, &acked);
    assert!(cluster.exited().is_empty());
    // The processes stop before their disks go, and those before the data.
    drop(cluster);
    drop(relays);
    drop(disks);
    drop(_dir);
}
