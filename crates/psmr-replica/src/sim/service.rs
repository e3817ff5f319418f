//! The simulated service: a handful of registers (keys `u64` to values
//! `u64`), read and written one key at a time. Small on purpose: its whole
//! state is digested after every applied entry, and a key space of a few
//! keys makes clients conflict all the time.

use parking_lot::Mutex;
use psmr_model::{
    decode_snapshot, encode_snapshot, Access, App, ClassId, ClassModel, Command, Refused, SerdeCodec, Service,
    SnapshotError,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// An operation on the registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RegOp {
    /// Reads a key.
    Read {
        /// The key.
        key: u64,
    },
    /// Writes a value to a key.
    Write {
        /// The key.
        key: u64,
        /// The value (unique per write in the simulation).
        value: u64,
    },
}

impl RegOp {
    /// The key the operation touches.
    pub fn key(&self) -> u64 {
        match *self {
            RegOp::Read { key } | RegOp::Write { key, .. } => key,
        }
    }
}

/// The reply to a [`RegOp`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RegReply {
    /// A read: the value, or `None` if the key was never written.
    Value(Option<u64>),
    /// A write: whether the key had a value before.
    Written {
        /// The key existed.
        existed: bool,
    },
}

/// The registers: a sorted map, so that snapshots (and so digests) are a
/// function of the state alone.
#[derive(Debug, Default)]
pub struct Registers {
    state: Mutex<BTreeMap<u64, u64>>,
}

impl Registers {
    /// Empty registers.
    pub fn new() -> Self {
        Self::default()
    }
}

/// Class of reads in [`Registers::class_model`].
const READ: ClassId = ClassId(0);
/// Class of writes.
const WRITE: ClassId = ClassId(1);

impl Service for Registers {
    type Op = RegOp;
    type Reply = RegReply;

    fn execute(&self, command: &Command<RegOp>) -> RegReply {
        let mut state = self.state.lock();
        match command.op {
            RegOp::Read { key } => RegReply::Value(state.get(&key).copied()),
            RegOp::Write { key, value } => RegReply::Written { existed: state.insert(key, value).is_some() },
        }
    }

    fn snapshot(&self) -> Vec<u8> {
        encode_snapshot(&*self.state.lock())
    }

    fn restore(&self, snapshot: &[u8]) -> Result<(), SnapshotError> {
        let state: BTreeMap<u64, u64> = decode_snapshot(snapshot)?;
        *self.state.lock() = state;
        Ok(())
    }
}

impl App for Registers {
    type Codec = SerdeCodec<RegOp, RegReply>;

    fn class_model(&self) -> ClassModel {
        ClassModel::builder("registers")
            .class("R")
            .class("W")
            .conflict("R", "W")
            .conflict("W", "W")
            .build()
            .expect("two declared classes")
    }

    fn access(&self, op: &RegOp) -> Result<Access, Refused> {
        Ok(match *op {
            RegOp::Read { key } => Access::read(READ, [key]),
            RegOp::Write { key, .. } => Access::write(WRITE, [key]),
        })
    }
}
