//! Several pools in one process, reached by name (001 §4.4.2): a task of
//! one pool spawns into another, and each pool keeps its own policy.

use crate::config::PoolConfig;
use crate::pool::{Handle, Pool};
use crate::stats::PoolStats;
use crate::RtError;

/// Named pools, started together and stopped together.
pub struct Runtime {
    pools: Vec<Pool>,
}

impl Runtime {
    /// Starts a pool per config; names must differ.
    pub fn start(configs: Vec<PoolConfig>) -> Result<Runtime, RtError> {
        for (i, c) in configs.iter().enumerate() {
            if configs[..i].iter().any(|o| o.name == c.name) {
                return Err(RtError::Config { pool: c.name.clone(), why: "two pools have this name".into() });
            }
        }
        let pools = configs.into_iter().map(Pool::start).collect::<Result<Vec<_>, _>>()?;
        Ok(Runtime { pools })
    }

    /// The pool called `name`.
    pub fn pool(&self, name: &str) -> Option<Handle> {
        self.pools.iter().find(|p| p.name() == name).map(Pool::handle)
    }

    /// Every pool, in the order started.
    pub fn handles(&self) -> Vec<Handle> {
        self.pools.iter().map(Pool::handle).collect()
    }

    /// Stops every pool (each after its queued tasks, in order); their
    /// final counters, or the first pool's panics.
    pub fn shutdown(self) -> Result<Vec<PoolStats>, RtError> {
        let mut stats = Vec::with_capacity(self.pools.len());
        let mut first_error = None;
        for p in self.pools {
            match p.shutdown() {
                Ok(s) => stats.push(s),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(stats), Err)
    }
}
