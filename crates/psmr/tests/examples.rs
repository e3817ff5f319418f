//! Every example in `examples/` runs, and the parallel execution of its
//! service equals sequential execution under the differential harness.
//! Seeds are printed; `PSMR_TEST_SEED` replays.

#[path = "../../../examples/bank.rs"]
mod bank;

use psmr::prelude::*;
use psmr::sched::check::{self, CheckError, Options};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::atomic::AtomicI64;

/// The examples this file covers, by file name.
const COVERED: [&str; 1] = ["bank"];

fn seed() -> u64 {
    let s = std::env::var("PSMR_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random);
    eprintln!("PSMR_TEST_SEED={s}");
    s
}

#[test]
fn every_example_is_covered_here_and_built_by_cargo() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let manifest =
        std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml")).unwrap();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        assert!(COVERED.contains(&name.as_str()), "examples/{name}.rs has no test in tests/examples.rs");
        assert!(manifest.contains(&format!("path = \"../../examples/{name}.rs\"")), "{name} is not an [[example]]");
    }
}

#[test]
fn the_bank_example_runs() {
    bank::main().unwrap();
}

fn new_bank() -> bank::Bank {
    bank::Bank((0..=u16::MAX).map(|_| AtomicI64::new(0)).collect())
}

/// Operations on 12 accounts, so that conflicts are frequent.
fn bank_ops(seed: u64, n: usize) -> Vec<bank::Op> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let account = |rng: &mut ChaCha8Rng| rng.gen_range(0..12u16);
            match rng.gen_range(0..10) {
                0..=3 => bank::Op::Deposit(account(&mut rng), rng.gen_range(-50..100)),
                4..=5 => bank::Op::Transfer(account(&mut rng), account(&mut rng), rng.gen_range(1..40)),
                _ => bank::Op::Balance(account(&mut rng)),
            }
        })
        .collect()
}

#[test]
fn the_bank_in_parallel_equals_the_bank_in_sequence() {
    let seed = seed();
    let options = Options::default();
    let runs = check::against_sequential(new_bank, &bank_ops(seed, 4_000), &options).unwrap();
    assert_eq!(runs, options.schedulers.len() * options.workers.len());
}

/// The bank with transfers in the payer's shard class: they miss their
/// conflict with the payee's shard.
struct Careless(bank::Bank);

impl Service for Careless {
    type Op = bank::Op;
    type Reply = Vec<i64>;
    fn execute(&self, c: &Command<bank::Op>) -> Vec<i64> {
        self.0.execute(c)
    }
    fn snapshot(&self) -> Vec<u8> {
        self.0.snapshot()
    }
    fn restore(&self, bytes: &[u8]) -> Result<(), SnapshotError> {
        self.0.restore(bytes)
    }
}

impl App for Careless {
    type Codec = <bank::Bank as App>::Codec;
    fn class_model(&self) -> ClassModel {
        self.0.class_model()
    }
    fn access(&self, op: &bank::Op) -> Result<Access, Refused> {
        match *op {
            bank::Op::Transfer(from, to, _) => {
                Ok(Access::write(ClassId(from % bank::SHARDS), [u64::from(from), u64::from(to)]))
            }
            _ => self.0.access(op),
        }
    }
}

#[test]
fn the_harness_catches_a_class_model_that_misses_a_conflict() {
    let careless = || Careless(new_bank());
    let ops = [bank::Op::Transfer(0, 1, 5), bank::Op::Deposit(1, 1)];
    let e = check::against_sequential(careless, &ops, &Options::default()).unwrap_err();
    assert!(matches!(e, CheckError::Model(_)), "{e}");
    assert!(e.to_string().contains("misses a conflict"), "{e}");
}
