//! The SQLite ledger's second file: a database for the read models kept outside the append
//! transactions (`opledger.db` → `opledger.read-models.db`, beside it; [`path_for`]).
//!
//! SQLite locks a whole file: read models written in the ledger's own file take its write lock
//! for every page they apply, and every append waits behind them (ADR 0014). In their own file
//! they lock only themselves. What lives there is disposable (everything in it is a fold of
//! the ledger), so nothing in it waits for the disk (`synchronous=OFF`): neither its commits
//! nor its checkpoints sync. A sync of this file forced the ledger's own syncs (one journal on
//! the file system) to wait behind it: with everything running, the intake's p99 at a quarter
//! of its closed-loop rate went from about 9.3 ms to about 6.6 ms without them (ADR 0018).
//!
//! A process crash loses nothing of a file that is never synced (the kernel keeps what was
//! written); an operating-system crash or a power loss can leave it damaged. So before its
//! first unsynced write a process records that it writes unsynced, with the machine's boot id,
//! in a marker beside the file ([`Unsynced`]), synced, and removes the marker when it closes
//! after a synced checkpoint. A marker from another boot means the machine went down while the
//! file was unsynced: the file is discarded at open and the read models are rebuilt from the
//! ledger. Where no boot id can be read (not Linux), the file is synced as before
//! (`synchronous=NORMAL`: a power loss loses the last pages applied together with the
//! checkpoints that count them, never one without the other).
//!
//! The file is bound to its ledger by the ledger's random identity (`ledger_identity`, drawn by
//! migration 3), recorded when the file is created: a read-model file beside another ledger is
//! refused at open ([`OpenError::ForeignReadModels`]) rather than served as if it were this
//! ledger's; one beside a ledger with no event yet (deleted and started again) is discarded.
//!
//! Readers see both files as one: every connection of the store's read pool (and of a
//! [`crate::LedgerReader`]) attaches it read-only as the schema [`SCHEMA`], so an unqualified
//! table name finds a read model's table in either file (SQLite looks in `main` first).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection, SqlitePool, SqlitePoolOptions};
use sqlx::sqlite::{SqliteJournalMode, SqliteSynchronous};
use sqlx::{AssertSqlSafe, Connection};

use crate::error::OpenError;
use crate::ledger_files::{Identity, identity};
use crate::sqlite::open_error;

/// The schema name the read-model file is attached as on reading connections.
pub const SCHEMA: &str = "read_models";

/// The read-model file of the ledger at `ledger`: its extension becomes `read-models.<ext>`
/// (`opledger.db` → `opledger.read-models.db`); a name without one gains `.read-models.db`.
pub fn path_for(ledger: &Path) -> PathBuf {
    match ledger.extension().and_then(|e| e.to_str()) {
        Some(extension) => ledger.with_extension(format!("read-models.{extension}")),
        None => {
            let mut name = ledger.as_os_str().to_owned();
            name.push(".read-models.db");
            PathBuf::from(name)
        }
    }
}

/// Who the file belongs to: one row, its ledger's identity.
const BINDING: &str = "CREATE TABLE IF NOT EXISTS read_model_ledger (\
     id INTEGER PRIMARY KEY CHECK (id = 1), ledger_id BLOB NOT NULL)";

/// Opens (creating it if missing) the read-model file beside the ledger that `ledger` connects
/// to, checks that it belongs to this ledger (by the ledger's identity, read on `writer`), and
/// returns a pool of one writable connection on it: its writers (the
/// projections' runners in this process) take turns without busy-waiting on each other.
///
/// A file bound to another ledger is refused. One bound to a ledger while this one has no event
/// yet (the ledger was deleted and started again) can only hold what is gone: it is discarded
/// and created again, with a warning.
pub(crate) async fn open(
    ledger: &SqliteConnectOptions,
    writer: &mut SqliteConnection,
) -> Result<(SqlitePool, PathBuf, Option<Unsynced>), OpenError> {
    let path = path_for(ledger.get_filename());
    let unsynced = Unsynced::begin(&path).map_err(|e| unusable(&path, sqlx::Error::Io(e)))?;
    let synchronous = match unsynced {
        Some(_) => SqliteSynchronous::Off,
        None => SqliteSynchronous::Normal,
    };
    let connect = crate::sqlite::writer_options(
        ledger
            .clone()
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(synchronous)
            .foreign_keys(true),
    );
    let ledger_id: Vec<u8> =
        sqlx::query_scalar("SELECT ledger_id FROM ledger_identity WHERE id = 1")
            .fetch_one(&mut *writer)
            .await
            .map_err(open_error)?;
    let empty: bool = sqlx::query_scalar("SELECT last_position = 0 FROM ledger_head")
        .fetch_one(&mut *writer)
        .await
        .map_err(open_error)?;
    let mut discarded = false;
    loop {
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .after_release(|connection, _| Box::pin(crate::sqlite::ended_cleanly(connection)))
            .connect_with(connect.clone())
            .await
            .map_err(|source| unusable(&path, source))?;
        let binding = bind(&pool, &ledger_id, empty)
            .await
            .map_err(|source| unusable(&path, source))?;
        match binding {
            Binding::Ours => return Ok((pool, path, unsynced)),
            Binding::Foreign => {
                // Refused before anything was written in it: no marker is left behind that
                // would discard another ledger's file after the next boot.
                pool.close().await;
                if let Some(unsynced) = unsynced {
                    unsynced.end();
                }
                return Err(OpenError::ForeignReadModels { path });
            }
            Binding::Stale if !discarded => {
                pool.close().await;
                tracing::warn!(
                    path = %path.display(),
                    "the read models' file belongs to another ledger, and this one has no \
                     event yet (it was deleted and started again?); discarding the file"
                );
                discard(&path).map_err(|e| unusable(&path, sqlx::Error::Io(e)))?;
                discarded = true;
            }
            Binding::Stale => {
                pool.close().await;
                if let Some(unsynced) = unsynced {
                    unsynced.end();
                }
                return Err(OpenError::ForeignReadModels { path });
            }
        }
    }
}

/// Deletes the read-model file at `path` with its log and shared-memory index.
fn discard(path: &Path) -> std::io::Result<()> {
    for suffix in ["", "-wal", "-shm"] {
        let mut file = path.as_os_str().to_owned();
        file.push(suffix);
        remove_if_present(Path::new(&file))?;
    }
    Ok(())
}

/// Removes the file at `path`; one already gone is no error.
fn remove_if_present(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// This store writes the read-model file unsynced: its marker, `<file>-unsynced-<pid>-<n>`,
/// holds the machine's boot id (see the module documentation).
#[derive(Debug)]
pub(crate) struct Unsynced {
    marker: PathBuf,
}

impl Unsynced {
    /// Where the machine has a boot id: discards the file at `path` if a marker beside it is
    /// from another boot (or unreadable), then records this process's marker, synced with its
    /// folder, so that the file may be written unsynced. `None` where there is no boot id: the
    /// file is then synced as usual.
    pub(crate) fn begin(path: &Path) -> std::io::Result<Option<Self>> {
        let Some(boot) = boot_id() else {
            return Ok(None);
        };
        Self::begin_on(path, &boot).map(Some)
    }

    fn begin_on(path: &Path, boot: &str) -> std::io::Result<Self> {
        let folder = match path.parent() {
            Some(folder) if !folder.as_os_str().is_empty() => folder,
            _ => Path::new("."),
        };
        let prefix = marker_prefix(path);
        let mut stale = Vec::new();
        match std::fs::read_dir(folder) {
            Ok(entries) => {
                for entry in entries {
                    let entry = entry?;
                    let name = entry.file_name();
                    if !name.to_string_lossy().starts_with(&prefix) {
                        continue;
                    }
                    let from = std::fs::read_to_string(entry.path()).unwrap_or_default();
                    if from.trim() != boot {
                        stale.push(entry.path());
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        if !stale.is_empty() {
            tracing::warn!(
                path = %path.display(),
                "the read models' file was being written unsynced when the machine went down \
                 (a power loss or an operating-system crash); discarding it: the read models are \
                 rebuilt from the ledger"
            );
            discard(path)?;
            for marker in &stale {
                remove_if_present(marker)?;
            }
        }
        // One marker per store: two stores of one process on one file end apart. Written
        // under another name and renamed, so that no reader finds it half written.
        static STORES: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "{prefix}{}-{}",
            std::process::id(),
            STORES.fetch_add(1, Ordering::Relaxed)
        );
        let marker = folder.join(&name);
        let written = folder.join(format!(".{name}"));
        let mut file = std::fs::File::create(&written)?;
        std::io::Write::write_all(&mut file, boot.as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&written, &marker)?;
        std::fs::File::open(folder)?.sync_all()?;
        Ok(Self { marker })
    }

    /// After a synced checkpoint that left nothing in the log: nothing of this process's is
    /// unsynced any more.
    fn end(self) {
        if let Err(error) = std::fs::remove_file(&self.marker) {
            tracing::debug!(%error, marker = %self.marker.display(), "cannot remove the marker");
        }
    }
}

/// The markers' common file-name prefix for the read-model file at `path`.
fn marker_prefix(path: &Path) -> String {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    format!("{}-unsynced-", name.unwrap_or_default())
}

/// The boot id the kernel draws at every boot (Linux).
fn boot_id() -> Option<String> {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let id = id.trim();
    (!id.is_empty()).then(|| id.to_owned())
}

/// Closes the read models' pool. A file written unsynced is synced first (a `TRUNCATE`
/// checkpoint with syncs on: the log, then the database file); only if that left the log empty
/// is the marker removed. Otherwise (another process still reads the log, a full disk) the
/// marker stays, and a machine crash before the next clean close discards the file.
pub(crate) async fn close(pool: &SqlitePool, unsynced: Option<Unsynced>) {
    let Some(unsynced) = unsynced else {
        pool.close().await;
        return;
    };
    let synced = sync(pool).await;
    pool.close().await;
    match synced {
        Ok(true) => unsynced.end(),
        Ok(false) => {}
        Err(error) => {
            tracing::debug!(%error, "cannot sync the read models' file; its marker stays");
        }
    }
}

/// A synced `TRUNCATE` checkpoint on the pool's connection; `true` if it emptied the log. It
/// waits at most a quarter of a second for another process's readers and writer of the file
/// (a close is not held up for `busy_timeout`); if they are still busy, the marker stays.
async fn sync(pool: &SqlitePool) -> Result<bool, sqlx::Error> {
    let mut connection = pool.acquire().await?;
    sqlx::raw_sql("PRAGMA synchronous = NORMAL; PRAGMA busy_timeout = 250")
        .execute(&mut *connection)
        .await?;
    let (busy, frames, _): (i64, i64, i64) = sqlx::query_as("PRAGMA wal_checkpoint(TRUNCATE)")
        .fetch_one(&mut *connection)
        .await?;
    Ok(busy == 0 && frames <= 0)
}

/// The file cannot serve: not a database, not writable, or in a folder where it cannot be
/// created.
fn unusable(path: &Path, source: sqlx::Error) -> OpenError {
    OpenError::ReadModelsUnusable {
        path: path.to_owned(),
        source,
    }
}

/// Whose the read models' file is.
enum Binding {
    /// This ledger's (bound to it now, if the file is new).
    Ours,
    /// Another ledger's, beside a ledger that has events.
    Foreign,
    /// Another ledger's, beside a ledger without any event.
    Stale,
}

/// Reads (and, in a new file, records) the ledger the file on `pool` belongs to.
async fn bind(pool: &SqlitePool, ledger_id: &[u8], empty: bool) -> Result<Binding, sqlx::Error> {
    let mut connection = pool.acquire().await?;
    let mut tx = connection.begin_with("BEGIN IMMEDIATE").await?;
    sqlx::raw_sql(BINDING).execute(&mut *tx).await?;
    let bound: Option<Vec<u8>> =
        sqlx::query_scalar("SELECT ledger_id FROM read_model_ledger WHERE id = 1")
            .fetch_optional(&mut *tx)
            .await?;
    let binding = match bound {
        Some(bound) if bound == ledger_id => Binding::Ours,
        Some(_) if empty => Binding::Stale,
        Some(_) => Binding::Foreign,
        None => {
            sqlx::query("INSERT INTO read_model_ledger (id, ledger_id) VALUES (1, $1)")
                .bind(ledger_id)
                .execute(&mut *tx)
                .await?;
            Binding::Ours
        }
    };
    tx.commit().await?;
    Ok(binding)
}

/// Attaches the read-model file at `path` read-only as [`SCHEMA`] on `connection`, if it
/// exists. A file that cannot be attached (deleted, unreadable) leaves the connection as it
/// is: the ledger's own tables stay readable whatever happens to the read models.
pub(crate) async fn attach(connection: &mut SqliteConnection, path: &Path) {
    if !path.exists() {
        return;
    }
    let uri = format!("file:{}?mode=ro", uri_escape(&path.to_string_lossy()));
    let sql = format!("ATTACH DATABASE '{}' AS {SCHEMA}", uri.replace('\'', "''"));
    if let Err(error) = sqlx::raw_sql(AssertSqlSafe(sql))
        .execute(&mut *connection)
        .await
    {
        // Said where it matters: a read of a read model then names the missing table.
        tracing::debug!(%error, path = %path.display(), "cannot attach the read models' file");
    }
}

/// The read models' file as opened: its path, device and inode.
#[derive(Debug)]
pub(crate) struct ReadModelFile {
    path: PathBuf,
    opened: Identity,
}

impl ReadModelFile {
    pub(crate) fn remember(path: PathBuf) -> std::io::Result<Self> {
        let opened = identity(&path)?;
        Ok(Self { path, opened })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// `None` while the file at the path is the one opened; else how it was lost.
    pub(crate) fn lost(&self) -> Option<&'static str> {
        match identity(&self.path) {
            Ok(now) if now == self.opened => None,
            Ok(_) => Some("replaced by another file"),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Some("deleted"),
            Err(_) => None,
        }
    }
}

/// A path as the path of a `file:` URI: `%`, `?` and `#` escaped.
fn uri_escape(path: &str) -> String {
    path.replace('%', "%25")
        .replace('?', "%3f")
        .replace('#', "%23")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_read_model_file_sits_beside_the_ledger() {
        assert_eq!(
            path_for(Path::new("/var/lib/opledger.db")),
            Path::new("/var/lib/opledger.read-models.db")
        );
        assert_eq!(
            path_for(Path::new("data/ledger")),
            Path::new("data/ledger.read-models.db")
        );
        assert_eq!(uri_escape("/a?b#c%d"), "/a%3fb%23c%25d");
    }

    fn files(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .expect("list the folder")
            .map(|e| {
                e.expect("an entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        names.sort();
        names
    }

    /// A marker from another boot: the machine went down while the file was written unsynced,
    /// so the file (with its log and index) is discarded and the stale marker with it.
    #[test]
    fn a_marker_from_another_boot_discards_the_file() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let file = dir.path().join("ledger.read-models.db");
        for suffix in ["", "-wal", "-shm"] {
            std::fs::write(format!("{}{suffix}", file.display()), b"pages").expect("write");
        }
        let stale = dir.path().join("ledger.read-models.db-unsynced-7-0");
        std::fs::write(&stale, "the-boot-before").expect("write the marker");
        std::fs::write(dir.path().join("ledger.db"), b"the ledger").expect("write");

        let unsynced = Unsynced::begin_on(&file, "this-boot").expect("begin");

        let name = unsynced
            .marker
            .file_name()
            .expect("a name")
            .to_string_lossy();
        assert_eq!(
            files(dir.path()),
            vec!["ledger.db".to_owned(), name.into_owned()]
        );
        assert_eq!(
            std::fs::read_to_string(&unsynced.marker).expect("read"),
            "this-boot"
        );
        unsynced.end();
        assert_eq!(files(dir.path()), vec!["ledger.db".to_owned()]);
    }

    /// A marker from this boot (a process killed, the machine still up; or one still running)
    /// leaves the file as it is: the kernel still holds what was written.
    #[test]
    fn a_marker_from_this_boot_keeps_the_file() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let file = dir.path().join("ledger.read-models.db");
        std::fs::write(&file, b"pages").expect("write");
        let other = dir.path().join("ledger.read-models.db-unsynced-7-0");
        std::fs::write(&other, "this-boot").expect("write the marker");

        let unsynced = Unsynced::begin_on(&file, "this-boot").expect("begin");

        assert_eq!(std::fs::read(&file).expect("read"), b"pages");
        assert!(other.exists());
        assert_ne!(unsynced.marker, other);
        unsynced.end();
        assert!(other.exists());
    }
}
