//! The SQLite ledger's second file: a database for the read models kept outside the append
//! transactions (`opledger.db` → `opledger.read-models.db`, beside it; [`path_for`]).
//!
//! SQLite locks a whole file: read models written in the ledger's own file take its write lock
//! for every page they apply, and every append waits behind them (ADR 0014). In their own file
//! they lock only themselves. What lives there is disposable (everything in it is a fold of
//! the ledger), so its commits do not wait for the disk (`synchronous=NORMAL`): a power loss
//! loses the last pages applied together with the checkpoints that count them, never one
//! without the other.
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
) -> Result<(SqlitePool, PathBuf), OpenError> {
    let path = path_for(ledger.get_filename());
    let connect = crate::sqlite::writer_options(
        ledger
            .clone()
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
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
            Binding::Ours => return Ok((pool, path)),
            Binding::Foreign => {
                pool.close().await;
                return Err(OpenError::ForeignReadModels { path });
            }
            Binding::Stale if !discarded => {
                pool.close().await;
                tracing::warn!(
                    path = %path.display(),
                    "the read models' file belongs to another ledger, and this one has no \
                     event yet (it was deleted and started again?); discarding the file"
                );
                for suffix in ["", "-wal", "-shm"] {
                    let mut file = path.as_os_str().to_owned();
                    file.push(suffix);
                    match std::fs::remove_file(&file) {
                        Ok(()) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => return Err(unusable(&path, sqlx::Error::Io(e))),
                    }
                }
                discarded = true;
            }
            Binding::Stale => {
                pool.close().await;
                return Err(OpenError::ForeignReadModels { path });
            }
        }
    }
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
}
