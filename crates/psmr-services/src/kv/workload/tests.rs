use super::*;
use crate::kv::{class_model, key_hash, KvService, ALL};
use crate::{Cost, Spread, KEYS_MAX};
use psmr_model::{ClientId, Service};

fn cfg(shards: usize, write_pct: f64, spread: Spread, seed: u64) -> WorkloadConfig {
    WorkloadConfig {
        commands: 6_000,
        seed,
        shards,
        spread,
        mix: crate::Mix::writes(write_pct),
        keys: 1_000,
        clients: 5,
        ..WorkloadConfig::default()
    }
}

/// The number `n` of key `key_bytes(n)`.
fn number(key: &[u8]) -> u64 {
    std::str::from_utf8(key).unwrap().parse().unwrap()
}

fn first_key(op: &KvOp) -> &[u8] {
    op.keys().next().unwrap()
}

#[test]
fn workloads_are_reproducible_and_respect_the_mix() {
    let c = cfg(3, 30.0, Spread::Uniform, 4);
    let a = generate(KvModel::Sharded, &c).unwrap();
    assert_eq!(a, generate(KvModel::Sharded, &c).unwrap());
    assert_ne!(a, generate(KvModel::Sharded, &WorkloadConfig { seed: 5, ..c.clone() }).unwrap());
    let reads = a.iter().filter(|x| x.op.is_read()).count();
    assert_eq!(reads, 4_200);
    let count = |f: fn(&KvOp) -> bool| a.iter().filter(|x| f(&x.op)).count() as f64;
    for n in [
        count(|o| matches!(o, KvOp::Create { .. })),
        count(|o| matches!(o, KvOp::Update { .. })),
        count(|o| matches!(o, KvOp::Delete { .. })),
    ] {
        assert!((n - 600.0).abs() < 90.0, "{n}");
    }
    for (j, x) in a.iter().enumerate() {
        let key = first_key(&x.op);
        assert!(number(key) < 1_000);
        assert_eq!(key, key_bytes(number(key)));
        assert_eq!((x.client, x.seq), (ClientId(j as u64 % 5), j as u64 / 5 + 1));
        let hash = key_hash(key);
        let shard = shard_of(hash, 3);
        if x.op.is_read() {
            let mut reads = vec![hash, ALL];
            reads.sort_unstable();
            assert_eq!((x.reads.to_vec(), x.writes.len(), x.class.index()), (reads, 0, shard));
        } else {
            assert_eq!((x.reads.to_vec(), x.writes.to_vec(), x.class.index()), (vec![ALL], vec![hash], 3 + shard));
        }
    }
    let e = generate(KvModel::ReadersWriters, &cfg(1, 30.0, Spread::Exponential, 1)).unwrap();
    let writes = e.iter().filter(|x| !x.op.is_read()).count() as f64;
    assert!((writes - 1_800.0).abs() < 150.0, "{writes}");
    assert!(e.iter().all(|x| x.class.index() == usize::from(!x.op.is_read())));
}

#[test]
fn class_models_cover_every_conflict_and_a_wrong_one_is_caught() {
    for gen in [generate, generate_redis] {
        for model in KvModel::ALL {
            for shards in [1, 2, 5] {
                for keys in [3, 1_000] {
                    let c = WorkloadConfig { keys, ..cfg(shards, 40.0, Spread::Exponential, 8) };
                    let cmds = gen(model, &c).unwrap();
                    class_model(model, shards).check_commands(&cmds).unwrap();
                }
            }
        }
        // Classes by a shard count other than the model's: two commands on
        // one key land in non-conflicting classes.
        let cmds = gen(KvModel::Sharded, &cfg(3, 40.0, Spread::Uniform, 8)).unwrap();
        assert!(class_model(KvModel::Sharded, 4).check_commands(&cmds).is_err());
    }
    // Whole-store commands in read-only classes are caught: they write ALL.
    let mut cmds = generate_redis(KvModel::ReadersWriters, &cfg(1, 40.0, Spread::Uniform, 8)).unwrap();
    let flush = cmds.iter_mut().find(|c| matches!(c.op, KvOp::FlushDb | KvOp::DbSize)).unwrap();
    flush.class = psmr_model::ClassId(0);
    let e = class_model(KvModel::ReadersWriters, 1).check_commands(&cmds).unwrap_err();
    assert_eq!(e.key, ALL);
}

#[test]
fn redis_workloads_hold_every_operation_and_keep_to_one_shard() {
    let rw = generate_redis(KvModel::ReadersWriters, &cfg(1, 50.0, Spread::Uniform, 3)).unwrap();
    let mut names: Vec<&str> = rw.iter().map(|c| c.op.name()).collect();
    names.sort_unstable();
    names.dedup();
    // Every operation but the one-key SETEX family, which is SET with a
    // deadline, and EXPIRE, EXPIREAT, PEXPIREAT, which differ from PEXPIRE
    // only in how a client says the deadline.
    assert_eq!(names.len(), 98, "{names:?}");
    let c = WorkloadConfig { skew: 0.5, ..cfg(4, 50.0, Spread::Uniform, 3) };
    let sharded = generate_redis(KvModel::Sharded, &c).unwrap();
    assert!(sharded.iter().all(|c| !c.op.is_whole()));
    let multi =
        sharded.iter().filter(|c| c.op.keys().map(key_hash).collect::<std::collections::HashSet<_>>().len() > 1);
    assert!(multi.clone().count() > 100);
    for c in multi {
        let shard = shard_of(key_hash(first_key(&c.op)), 4);
        assert!(c.op.keys().all(|k| shard_of(key_hash(k), 4) == shard), "{:?}", c.op);
    }
    // Executing one gives the same replies twice over.
    let (a, b) = (KvService::new(1_000, Cost::Light), KvService::new(1_000, Cost::Light));
    let replies: Vec<_> = rw.iter().map(|c| a.execute(c)).collect();
    assert!(replies.iter().any(|r| matches!(r, crate::kv::KvReply::Int(n) if *n != 0)));
    assert_eq!(replies, rw.iter().map(|c| b.execute(c)).collect::<Vec<_>>());
}

#[test]
fn skew_targets_the_first_shard() {
    for keys in [1_000, ENUMERATE_KEYS_MAX + 1] {
        let c = WorkloadConfig { skew: 0.7, keys, ..cfg(4, 20.0, Spread::Uniform, 2) };
        let cmds = generate(KvModel::Sharded, &c).unwrap();
        let first =
            cmds.iter().filter(|x| shard_of(key_hash(first_key(&x.op)), 4) == 0).count() as f64 / cmds.len() as f64;
        assert!((first - 0.7).abs() < 0.03, "{keys} keys: {first}");
    }
    // Key "0" alone is in one shard of 2: the other owns nothing.
    let owner = shard_of(key_hash(b"0"), 2);
    let target = if owner == 0 { "the other shards" } else { "the first shard" };
    let c = WorkloadConfig { skew: 0.5, keys: 1, ..cfg(2, 20.0, Spread::Uniform, 2) };
    let e = generate(KvModel::Sharded, &c).unwrap_err();
    assert!(e.to_string().contains(&format!("sends commands to {target}, but none of the 1 keys")), "{e}");
}

/// The schedulers' differential tests skew workloads of 4 keys over up to
/// 5 shards: those keys must reach the first shard and another.
#[test]
fn four_keys_reach_both_sides_of_up_to_five_shards() {
    for shards in 2..=5 {
        let c = WorkloadConfig { skew: 0.5, write_skew: Some(0.7), keys: 4, ..cfg(shards, 50.0, Spread::Uniform, 1) };
        generate(KvModel::Sharded, &c).unwrap_or_else(|e| panic!("{shards} shards: {e}"));
    }
}

#[test]
fn global_operations_are_refused() {
    let c = WorkloadConfig { mix: "10-5-0".parse().unwrap(), ..cfg(1, 0.0, Spread::Uniform, 1) };
    let e = generate(KvModel::ReadersWriters, &c).unwrap_err();
    assert_eq!(e.to_string(), "the key-value store has no global operations: β must be 0, got 5");
    let c = WorkloadConfig { keys: KEYS_MAX + 1, ..cfg(1, 0.0, Spread::Uniform, 1) };
    assert_eq!(generate(KvModel::ReadersWriters, &c).unwrap_err(), WorkloadError::Keys(KEYS_MAX + 1));
}

/// No reply and no digest depends on the order a store's maps iterate in:
/// the Redis workload (`KEYS`, `SCAN`, `SMEMBERS`, `SPOP`, `RANDOMKEY`,
/// deadlines passing mid-run included) gives the same replies and states
/// on stores whose maps hash with different seeds.
#[test]
fn replies_do_not_depend_on_the_stores_hash_seed() {
    use crate::Cost;
    use psmr_model::Service;
    for (model, shards) in [(KvModel::ReadersWriters, 1), (KvModel::Sharded, 3)] {
        let mut commands = generate_redis(model, &cfg(shards, 60.0, Spread::Uniform, 16)).unwrap();
        // Without FLUSHDB, so that the keys preloaded stay for SCAN.
        commands.retain(|c| c.op != KvOp::FlushDb);
        for (i, c) in commands.iter_mut().enumerate() {
            c.stamp = psmr_model::Stamp { time_ms: 1_000_000 + 3 * i as u64, seed: i as u64 };
        }
        // Preloaded with enough keys that SCAN's slots hold several.
        let stores = [1u64, 2, 0xdead_beef].map(|seed| crate::kv::KvService::with_hash_seed(60_000, Cost::Light, seed));
        let runs: Vec<Vec<_>> = stores.iter().map(|s| commands.iter().map(|c| s.execute(c)).collect()).collect();
        for (i, c) in commands.iter().enumerate() {
            assert_eq!(runs[0][i], runs[1][i], "{model}: command {i}, {:?}", c.op);
            assert_eq!(runs[0][i], runs[2][i], "{model}: command {i}, {:?}", c.op);
        }
        assert_eq!(stores[0].digest(), stores[1].digest());
        assert_eq!(stores[0].snapshot(), stores[2].snapshot());
        let expired = runs[0]
            .iter()
            .zip(&commands)
            .filter(|(r, c)| matches!(c.op, KvOp::Ttl { .. }) && **r == crate::kv::KvReply::Int(-2));
        assert!(expired.count() > 0, "{model}: keys expired during the run");
    }
}
