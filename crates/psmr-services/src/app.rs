//! The built-in services as [`psmr_model::App`]s, and the `[service]`
//! section of a replica configuration that picks one.
//!
//! They plug into a replica exactly as a user's service does: the replica
//! is generic over `App` and never names them.

use crate::kv::{self, KvCodec, KvModel, KvService};
use crate::list::{self, ListCodec, ListModel, ListService};
use crate::{Cost, WorkloadError, SHARDS_MAX};
use psmr_model::{Access, App, ClassModel, Command, Digest, Mapping, Refused, Service, SnapshotError};
use serde::{Deserialize, Serialize};

/// The largest number of keys the kv store may start with.
pub const START_KEYS_MAX: u64 = 100_000_000;

/// Which built-in service a configuration asks for, and how it is set up:
/// the `[service]` section of a replica configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServiceConfig {
    /// `kv` (the key-value store) or `list` (the sharded linked list).
    pub kind: String,
    /// Class model. kv: `readers-writers` or `sharded`; list:
    /// `readers-writers`, `sharded-snapshot` or `sharded-global`.
    pub model: String,
    /// Shards of the kv key space (`sharded` model) or of the list.
    pub shards: usize,
    /// kv: keys the store starts with (`"0"`, `"1"`, ... in decimal, each
    /// with its number's 8 little-endian bytes as value).
    pub keys: u64,
    /// Execution cost: `light`, `moderate` or `heavy` (list: 1, 1k or 10k
    /// entries per shard).
    pub cost: String,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        Self { kind: "kv".into(), model: "readers-writers".into(), shards: 1, keys: 0, cost: "light".into() }
    }
}

/// A built-in service, checked: what [`ServiceConfig::check`] returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BuiltIn {
    /// The key-value store with its class model.
    Kv(KvModel),
    /// The sharded list with its class model.
    List(ListModel),
}

impl ServiceConfig {
    /// Checks every value and names the first that is wrong.
    pub fn check(&self) -> Result<BuiltIn, WorkloadError> {
        self.cost.parse::<Cost>()?;
        if !(1..=SHARDS_MAX).contains(&self.shards) {
            return Err(WorkloadError::Shards(self.shards));
        }
        if self.keys > START_KEYS_MAX {
            return Err(WorkloadError::Keys(self.keys));
        }
        match self.kind.as_str() {
            "kv" => Ok(BuiltIn::Kv(self.model.parse()?)),
            "list" => Ok(BuiltIn::List(self.model.parse()?)),
            other => Err(WorkloadError::UnknownName { what: "service", name: other.into(), valid: "kv, list" }),
        }
    }

    /// The class model of the configured service.
    pub fn class_model(&self) -> Result<ClassModel, WorkloadError> {
        Ok(match self.check()? {
            BuiltIn::Kv(model) => kv::class_model(model, self.shards),
            BuiltIn::List(model) => list::class_model(model, self.shards),
        })
    }

    fn parts(&self) -> Result<(usize, Cost), WorkloadError> {
        self.check()?;
        Ok((self.shards, self.cost.parse()?))
    }
}

/// Implements [`Service`] for an app that wraps a service in its
/// `service` field: the replica executes the app.
macro_rules! delegate_service {
    ($app:ty, $service:ty) => {
        impl Service for $app {
            type Op = <$service as Service>::Op;
            type Reply = <$service as Service>::Reply;

            fn execute(&self, command: &Command<Self::Op>) -> Self::Reply {
                self.service.execute(command)
            }

            fn snapshot(&self) -> Vec<u8> {
                self.service.snapshot()
            }

            fn freeze(&self) -> psmr_model::Frozen {
                self.service.freeze()
            }

            fn restore(&self, snapshot: &[u8]) -> Result<(), SnapshotError> {
                self.service.restore(snapshot)
            }

            fn restore_from(&self, source: &mut dyn std::io::Read) -> Result<(), SnapshotError> {
                self.service.restore_from(source)
            }

            fn check_snapshot(&self, source: &mut dyn std::io::Read) -> Result<(), SnapshotError> {
                self.service.check_snapshot(source)
            }

            fn digest(&self) -> Digest {
                self.service.digest()
            }

            fn freeze_digest(&self) -> psmr_model::FrozenDigest {
                self.service.freeze_digest()
            }
        }
    };
}

/// The key-value store as a replica runs it: the store, its class model
/// and its shards.
pub struct KvApp {
    service: KvService,
    model: KvModel,
    shards: usize,
}

impl KvApp {
    /// The store `config` describes; an error names a wrong value.
    pub fn new(config: &ServiceConfig) -> Result<Self, WorkloadError> {
        let BuiltIn::Kv(model) = config.check()? else {
            return Err(WorkloadError::UnknownName { what: "service", name: config.kind.clone(), valid: "kv" });
        };
        let (shards, cost) = config.parts()?;
        Ok(Self { service: KvService::new(config.keys, cost), model, shards })
    }

    /// The store itself.
    pub fn store(&self) -> &KvService {
        &self.service
    }
}

delegate_service!(KvApp, KvService);

impl App for KvApp {
    type Codec = KvCodec;

    fn class_model(&self) -> ClassModel {
        kv::class_model(self.model, self.shards)
    }

    fn access(&self, op: &kv::KvOp) -> Result<Access, Refused> {
        kv::access(self.model, self.shards, op).map_err(|e| Refused(e.to_string()))
    }

    fn default_mapping(&self, workers: usize) -> Option<Mapping> {
        Some(kv::default_mapping(self.model, self.shards, workers))
    }

    fn privileged(&self, op: &kv::KvOp) -> bool {
        match op {
            kv::KvOp::Exec { ops, .. } => ops.iter().any(|op| self.privileged(op)),
            op => matches!(op, kv::KvOp::FlushDb),
        }
    }

    fn sweep(&self, now_ms: u64) -> Option<kv::KvOp> {
        self.service.sweep(now_ms)
    }
}

/// The sharded linked list as a replica runs it: `shards` lists of
/// `cost.list_size()` entries each (1, 1k or 10k for light, moderate and
/// heavy), and the class model.
pub struct ListApp {
    service: ListService,
    model: ListModel,
    shards: usize,
}

impl ListApp {
    /// The list `config` describes; an error names a wrong value.
    pub fn new(config: &ServiceConfig) -> Result<Self, WorkloadError> {
        let BuiltIn::List(model) = config.check()? else {
            return Err(WorkloadError::UnknownName { what: "service", name: config.kind.clone(), valid: "list" });
        };
        let (shards, cost) = config.parts()?;
        Ok(Self { service: ListService::new(shards, cost.list_size()), model, shards })
    }
}

delegate_service!(ListApp, ListService);

impl App for ListApp {
    type Codec = ListCodec;

    fn class_model(&self) -> ClassModel {
        list::class_model(self.model, self.shards)
    }

    fn access(&self, op: &list::ListOp) -> Result<Access, Refused> {
        list::access(self.model, self.shards, op).map_err(|e| Refused(e.to_string()))
    }

    fn default_mapping(&self, workers: usize) -> Option<Mapping> {
        Some(list::default_mapping(self.model, self.shards, workers))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_values_are_named() {
        let bad = |f: fn(&mut ServiceConfig)| {
            let mut c = ServiceConfig::default();
            f(&mut c);
            c.check().unwrap_err().to_string()
        };
        assert!(bad(|c| c.kind = "queue".into()).contains("unknown service \"queue\""));
        assert!(bad(|c| c.model = "sharded-global".into()).contains("sharded-global"));
        assert!(bad(|c| c.cost = "cheap".into()).contains("cheap"));
        assert!(bad(|c| c.shards = 0).contains("shards"));
        assert!(bad(|c| c.keys = START_KEYS_MAX + 1).contains("keys"));
        let list = ServiceConfig { kind: "list".into(), ..ServiceConfig::default() };
        assert!(KvApp::new(&list).is_err());
        assert!(ListApp::new(&list).is_ok());
    }

    #[test]
    fn the_default_mappings_are_valid() {
        let kv = KvApp::new(&ServiceConfig { model: "sharded".into(), shards: 4, ..ServiceConfig::default() }).unwrap();
        for workers in 1..=8 {
            kv.default_mapping(workers).unwrap().validate(&kv.class_model()).unwrap();
        }
    }
}
