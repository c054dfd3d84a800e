//! The SQLite ledger's files as this process opened them ([`LedgerFiles`]): the database, its
//! write-ahead log and its shared-memory index, each remembered by device and inode.
//!
//! A file deleted (or replaced by another one) under a running process does not stop SQLite:
//! the open descriptors still work, appends commit into a file that no one will open again, and
//! everything acknowledged since is gone at the next start. So the writer looks at the paths
//! before every batch and again after its commit, before anything is acknowledged: three
//! `stat` calls per batch, not per request. Once a file is found lost, every later batch is
//! refused without touching the database; readiness reports it too.
//!
//! SQLite itself deletes the log only when the last connection to the database closes; the
//! store keeps one connection open for as long as it lives, so the log it opened stays the log
//! of the database.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::StoreError;

/// A file's identity: its device and inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Identity {
    device: u64,
    inode: u64,
}

pub(crate) fn identity(path: &Path) -> std::io::Result<Identity> {
    let metadata = std::fs::metadata(path)?;
    Ok(Identity {
        device: metadata.dev(),
        inode: metadata.ino(),
    })
}

/// The ledger's files as opened; see the module documentation.
#[derive(Debug)]
pub(crate) struct LedgerFiles {
    files: Vec<(PathBuf, Identity)>,
    /// The first loss found; it stays, since the store cannot get the file back by itself.
    lost: OnceLock<StoreError>,
    /// Set when the store closes: SQLite then deletes the log itself, and appends fail anyway.
    closed: AtomicBool,
}

impl LedgerFiles {
    /// Remembers the database at `database` and, where they exist, its `-wal` and `-shm` files
    /// (they do once a connection in WAL mode has opened the database).
    pub(crate) fn remember(database: &Path) -> std::io::Result<Self> {
        let mut files = vec![(database.to_owned(), identity(database)?)];
        for suffix in ["-wal", "-shm"] {
            let mut path = database.as_os_str().to_owned();
            path.push(suffix);
            let path = PathBuf::from(path);
            if let Ok(id) = identity(&path) {
                files.push((path, id));
            }
        }
        Ok(Self {
            files,
            lost: OnceLock::new(),
            closed: AtomicBool::new(false),
        })
    }

    /// `Ok` while every file is still the one opened; else the error that says which file was
    /// deleted or replaced, now and from then on.
    pub(crate) fn check(&self) -> Result<(), StoreError> {
        if let Some(lost) = self.lost.get() {
            return Err(lost.clone());
        }
        if self.closed.load(Ordering::SeqCst) {
            return Ok(());
        }
        for (path, opened) in &self.files {
            let change = match identity(path) {
                Ok(now) if now == *opened => continue,
                Ok(_) => "replaced by another file",
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => "deleted",
                // A path that cannot be looked at right now (e.g. a permission changed) is not
                // known to be lost; the database's own errors report real trouble.
                Err(_) => continue,
            };
            let error = StoreError::LedgerFileLost {
                path: path.clone(),
                change,
                pid: std::process::id(),
            };
            tracing::error!(%error, "the ledger's file is gone; refusing every append");
            return Err(self.lost.get_or_init(|| error).clone());
        }
        Ok(())
    }

    /// The store is closing: its files are no longer watched (a loss found before stays).
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deleted_or_replaced_file_is_lost_for_good() {
        let dir = tempfile::tempdir().unwrap();
        let database = dir.path().join("ledger.db");
        let wal = dir.path().join("ledger.db-wal");
        std::fs::write(&database, b"db").unwrap();
        std::fs::write(&wal, b"wal").unwrap();
        let files = LedgerFiles::remember(&database).unwrap();
        files.check().unwrap();

        // Replaced: another inode at the same path.
        std::fs::write(dir.path().join("new"), b"wal").unwrap();
        std::fs::rename(dir.path().join("new"), &wal).unwrap();
        let error = files.check().unwrap_err().to_string();
        assert!(
            error.contains(&format!("{} was replaced", wal.display())),
            "{error}"
        );

        // Lost for good, even if the file came back.
        let fresh = LedgerFiles::remember(&database).unwrap();
        std::fs::remove_file(&database).unwrap();
        let error = fresh.check().unwrap_err().to_string();
        assert!(
            error.contains(&format!("{} was deleted", database.display())),
            "{error}"
        );
        std::fs::write(&database, b"db").unwrap();
        assert!(fresh.check().is_err());
        assert!(files.check().is_err());
    }
}
