//! The history of a kv load: every operation its clients send, with its
//! outcome and times, one JSON line each ([`crate::history::Operation`]).

use super::LoadError;
use crate::history::{OpKind, Operation, Status};
use psmr_client::ClientError;
use psmr_model::wire::{OpCodec, Outcome};
use psmr_services::kv::{KvCodec, KvOp, KvReply};
use std::io::{BufWriter, Write as _};
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

/// Where the load's client threads append their operations.
pub(super) struct Recorder {
    out: Mutex<BufWriter<std::fs::File>>,
    /// Times are ns since this instant.
    origin: Instant,
}

impl Recorder {
    /// A recorder writing to a new file at `path`.
    pub fn create(path: &Path, origin: Instant) -> Result<Self, LoadError> {
        let file = std::fs::File::create(path)
            .map_err(|source| LoadError::HistoryCreate { path: path.to_path_buf(), source })?;
        Ok(Self { out: Mutex::new(BufWriter::new(file)), origin })
    }

    fn ns(&self, t: Instant) -> u64 {
        t.duration_since(self.origin).as_nanos() as u64
    }

    /// Records one request: its operations, their outcomes (or why the
    /// request as a whole failed) and its times.
    pub fn request(
        &self,
        client: u64,
        ops: &[KvOp],
        outcome: &Result<Vec<Outcome>, ClientError>,
        invoked: Instant,
        completed: Instant,
    ) -> Result<(), LoadError> {
        let mut lines = String::new();
        for (i, op) in ops.iter().enumerate() {
            let (kind, key, value) = match op {
                KvOp::Read { key } => (OpKind::Read, key, None),
                KvOp::Put { key, value } => (OpKind::Write, key, Some(String::from_utf8_lossy(value).into_owned())),
                KvOp::Delete { key } => (OpKind::Delete, key, None),
                other => return Err(LoadError::Unexpected(format!("the load does not issue {other:?}"))),
            };
            let (status, result) = match outcome.as_ref().map(|r| &r[i]) {
                Ok(Outcome::Ok(reply)) => match KvCodec.decode_reply(reply) {
                    Ok(reply) => (Status::Ok, result_of(op, reply)?),
                    Err(_) => (Status::Fail, serde_json::Value::Null),
                },
                Ok(Outcome::Rejected(_refused)) => (Status::Fail, serde_json::Value::Null),
                Err(_) => (Status::Unknown, serde_json::Value::Null),
            };
            let record = Operation {
                client,
                op: kind,
                // The load's keys are decimal digits, so the text is exact.
                key: String::from_utf8_lossy(key).into_owned(),
                value,
                result,
                invoke_ns: self.ns(invoked),
                complete_ns: if status == Status::Ok { self.ns(completed) } else { 0 },
                status,
            };
            lines.push_str(&serde_json::to_string(&record).map_err(|e| LoadError::Unexpected(e.to_string()))?);
            lines.push('\n');
        }
        self.lock()?.write_all(lines.as_bytes()).map_err(LoadError::HistoryWrite)
    }

    /// Writes out what is buffered.
    pub fn flush(&self) -> Result<(), LoadError> {
        self.lock()?.flush().map_err(LoadError::HistoryWrite)
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, BufWriter<std::fs::File>>, LoadError> {
        self.out.lock().map_err(|_| LoadError::Panicked)
    }
}

/// The history's `result` of `op` from its reply.
fn result_of(op: &KvOp, reply: KvReply) -> Result<serde_json::Value, LoadError> {
    match reply {
        KvReply::Value(v) => {
            Ok(v.as_ref().map_or(serde_json::Value::Null, |v| String::from_utf8_lossy(v).into_owned().into()))
        }
        KvReply::Done(existed) => Ok(existed.into()),
        other => Err(LoadError::Unexpected(format!("{} got the reply {other:?}, which it never gets", op.name()))),
    }
}
