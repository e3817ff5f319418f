//! A replicated bank: deposits and balances of accounts in different shards
//! run in parallel on every replica, transfers run alone. `cargo run
//! --example bank` starts three replicas in this process and drives them.

use psmr::prelude::*;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicI64, Ordering::Relaxed};

/// Account `a` is in shard `a % SHARDS`.
pub const SHARDS: u16 = 4;

/// An operation on accounts (numbered 0 to 65535).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Op {
    /// Adds an amount (negative: takes it) to an account.
    Deposit(u16, i64),
    /// Moves an amount from the first account to the second.
    Transfer(u16, u16, i64),
    /// Reads an account.
    Balance(u16),
}

/// The balance of every account, 0 to 65535 (so that no operation names
/// an account that does not exist).
pub struct Bank(pub Vec<AtomicI64>);

impl Service for Bank {
    type Op = Op;
    /// The balance of each account the operation names, after it.
    type Reply = Vec<i64>;
    fn execute(&self, c: &Command<Op>) -> Vec<i64> {
        let add = |a: u16, n: i64| self.0[usize::from(a)].fetch_add(n, Relaxed) + n;
        match c.op {
            Op::Deposit(a, n) => vec![add(a, n)],
            Op::Transfer(from, to, n) => vec![add(from, -n), add(to, n)],
            Op::Balance(a) => vec![self.0[usize::from(a)].load(Relaxed)],
        }
    }
    fn snapshot(&self) -> Vec<u8> {
        encode_snapshot(&self.0)
    }
    fn restore(&self, bytes: &[u8]) -> Result<(), SnapshotError> {
        let saved: Vec<i64> = decode_snapshot(bytes)?;
        let wrong = |_| SnapshotError::Malformed("not a snapshot of 65536 accounts".into());
        let saved: &[i64; 65536] = saved.as_slice().try_into().map_err(wrong)?;
        saved.iter().zip(&self.0).for_each(|(&s, b)| b.store(s, Relaxed));
        Ok(())
    }
}

impl App for Bank {
    type Codec = SerdeCodec<Op, Vec<i64>>;
    /// Classes 0..SHARDS: the accounts of one shard; class SHARDS: transfers.
    fn class_model(&self) -> ClassModel {
        let shards = (0..SHARDS).map(|s| format!("shard {s}"));
        let model = shards.fold(ClassModel::builder("bank"), |m, s| m.class(&s).conflict(&s, &s));
        model.class("transfer").conflicts_with_all("transfer").build().expect("a valid class model")
    }
    fn access(&self, op: &Op) -> Result<Access, Refused> {
        Ok(match *op {
            Op::Deposit(a, _) => Access::write(ClassId(a % SHARDS), [a.into()]),
            Op::Balance(a) => Access::read(ClassId(a % SHARDS), [a.into()]),
            Op::Transfer(from, to, _) => Access::write(ClassId(SHARDS), [from.into(), to.into()]),
        })
    }
}

/// Three replicas in this process (the `early` scheduler, two workers
/// each), and a client.
pub fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cluster = LocalCluster::builder().start(|_| Bank((0..=u16::MAX).map(|_| AtomicI64::new(0)).collect()))?;
    let mut client = ServiceClient::for_app::<Bank>(cluster.client_addrs())?;
    let replies = client.call_all(&[Op::Deposit(1, 100), Op::Transfer(1, 2, 30), Op::Balance(2)])?;
    println!("deposit, transfer, balance: {replies:?}");
    Ok(())
}
