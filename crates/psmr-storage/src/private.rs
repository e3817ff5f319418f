//! raft-engine's file system, except that every file it creates is
//! private (0600) from the start: the log files it adds as the log
//! rotates included, whatever the process umask.

use raft_engine::env::{DefaultFileSystem, FileSystem, Permission};
use std::fs::Permissions;
use std::io::Result;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

/// The log engine as psmr opens it.
pub(crate) type Engine = raft_engine::Engine<PrivateFs>;

/// Opens the engine on the private file system.
pub(crate) fn open(config: raft_engine::Config) -> raft_engine::Result<Engine> {
    raft_engine::Engine::open_with_file_system(config, Arc::new(PrivateFs(DefaultFileSystem)))
}

/// See the module documentation.
pub(crate) struct PrivateFs(DefaultFileSystem);

type Inner = DefaultFileSystem;

impl FileSystem for PrivateFs {
    type Handle = <Inner as FileSystem>::Handle;
    type Reader = <Inner as FileSystem>::Reader;
    type Writer = <Inner as FileSystem>::Writer;

    fn create<P: AsRef<Path>>(&self, path: P) -> Result<Self::Handle> {
        let handle = self.0.create(path.as_ref())?;
        // Before a byte is written to it.
        std::fs::set_permissions(path, Permissions::from_mode(0o600))?;
        Ok(handle)
    }

    fn open<P: AsRef<Path>>(&self, path: P, perm: Permission) -> Result<Self::Handle> {
        self.0.open(path, perm)
    }

    fn delete<P: AsRef<Path>>(&self, path: P) -> Result<()> {
        self.0.delete(path)
    }

    fn rename<P: AsRef<Path>>(&self, src_path: P, dst_path: P) -> Result<()> {
        self.0.rename(src_path, dst_path)
    }

    fn reuse<P: AsRef<Path>>(&self, src_path: P, dst_path: P) -> Result<()> {
        self.0.reuse(src_path, dst_path)
    }

    fn delete_metadata<P: AsRef<Path>>(&self, path: P) -> Result<()> {
        self.0.delete_metadata(path)
    }

    fn exists_metadata<P: AsRef<Path>>(&self, path: P) -> bool {
        self.0.exists_metadata(path)
    }

    fn new_reader(&self, handle: Arc<Self::Handle>) -> Result<Self::Reader> {
        self.0.new_reader(handle)
    }

    fn new_writer(&self, handle: Arc<Self::Handle>) -> Result<Self::Writer> {
        self.0.new_writer(handle)
    }
}
