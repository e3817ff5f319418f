//! What the replica needs from the service it replicates: the service
//! itself, its class model and default mapping, and how its operations and
//! replies travel on the wire.

use crate::config::ServiceConfig;
use psmr_model::wire::{OpCodec, WireError};
use psmr_model::{ClassModel, ClientId, Command, Mapping, Service};
use psmr_services::kv::{self, KvCodec, KvModel, KvService};
use psmr_services::list::{self, ListCodec, ListModel, ListService};
use psmr_services::Cost;
use std::sync::Arc;

/// A service as a replica runs it.
pub trait App: Send + Sync + 'static {
    /// The service.
    type S: Service;
    /// The service instance.
    fn service(&self) -> &Arc<Self::S>;
    /// Its class model.
    fn model(&self) -> &ClassModel;
    /// Its default class-to-threads mapping for `workers` threads.
    fn default_mapping(&self, workers: usize) -> Mapping;
    /// The command for an operation received from a client; an error for
    /// bytes that do not decode.
    fn command(&self, client: ClientId, seq: u64, op: &[u8]) -> Result<Command<<Self::S as Service>::Op>, WireError>;
    /// A reply, encoded for the wire.
    fn encode_reply(&self, reply: &<Self::S as Service>::Reply) -> Vec<u8>;
}

/// The key-value store.
pub struct KvApp {
    service: Arc<KvService>,
    model: KvModel,
    shards: usize,
    classes: ClassModel,
}

impl KvApp {
    /// The store a configuration describes (checked by
    /// [`crate::Config::validate`]; unparsable names fall back to defaults).
    pub fn new(config: &ServiceConfig) -> Self {
        let model: KvModel = config.model.parse().unwrap_or(KvModel::ReadersWriters);
        let cost: Cost = config.cost.parse().unwrap_or(Cost::Light);
        let shards = config.shards.max(1);
        Self {
            service: Arc::new(KvService::new(config.keys, cost)),
            model,
            shards,
            classes: kv::class_model(model, shards),
        }
    }
}

impl App for KvApp {
    type S = KvService;

    fn service(&self) -> &Arc<KvService> {
        &self.service
    }

    fn model(&self) -> &ClassModel {
        &self.classes
    }

    fn default_mapping(&self, workers: usize) -> Mapping {
        kv::default_mapping(self.model, self.shards, workers)
    }

    fn command(&self, client: ClientId, seq: u64, op: &[u8]) -> Result<Command<kv::KvOp>, WireError> {
        let op = KvCodec.decode_op(op)?;
        Ok(kv::command(self.model, self.shards, client, seq, op))
    }

    fn encode_reply(&self, reply: &kv::KvReply) -> Vec<u8> {
        KvCodec.encode_reply(reply)
    }
}

/// The sharded linked list: `shards` lists of `cost.list_size()` entries
/// each (1, 1k or 10k for light, moderate and heavy).
pub struct ListApp {
    service: Arc<ListService>,
    model: ListModel,
    shards: usize,
    classes: ClassModel,
}

impl ListApp {
    /// The list a configuration describes (checked by
    /// [`crate::Config::validate`]; unparsable names fall back to defaults).
    pub fn new(config: &ServiceConfig) -> Self {
        let model: ListModel = config.model.parse().unwrap_or(ListModel::ReadersWriters);
        let cost: Cost = config.cost.parse().unwrap_or(Cost::Light);
        let shards = config.shards.max(1);
        Self {
            service: Arc::new(ListService::new(shards, cost.list_size())),
            model,
            shards,
            classes: list::class_model(model, shards),
        }
    }
}

impl App for ListApp {
    type S = ListService;

    fn service(&self) -> &Arc<ListService> {
        &self.service
    }

    fn model(&self) -> &ClassModel {
        &self.classes
    }

    fn default_mapping(&self, workers: usize) -> Mapping {
        list::default_mapping(self.model, self.shards, workers)
    }

    fn command(&self, client: ClientId, seq: u64, op: &[u8]) -> Result<Command<list::ListOp>, WireError> {
        let op = ListCodec.decode_op(op)?;
        list::command(self.model, self.shards, client, seq, op)
            .map_err(|e| WireError::Malformed { what: "list operation", why: e.to_string() })
    }

    fn encode_reply(&self, reply: &list::ListReply) -> Vec<u8> {
        ListCodec.encode_reply(reply)
    }
}
