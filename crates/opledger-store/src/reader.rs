//! A read-only view of a ledger, for audits, exports, timelines and point-in-time replays.
//!
//! [`LedgerReader`] runs no migration, starts no writer and never writes: a SQLite ledger is
//! opened read-only (its file is left byte for byte as it was, even its write-ahead log is never
//! checkpointed by us), a PostgreSQL one with `default_transaction_read_only`. So an auditor can
//! point it at a live ledger, a copy, or a standby, and reading cannot change what is read; and
//! the commands that only read (`opledger events`, `ops`, …) never create a ledger at a mistyped
//! path nor migrate someone else's database: it opens only an existing opledger ledger whose
//! schema this binary knows.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::ConnectOptions;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};
use tokio::sync::mpsc;

use crate::backend::{Either, ReadPool};
use crate::either;
use crate::error::{OpenError, StoreError};
use crate::model::{Head, Position, RecordedEvent, StreamId, StreamInfo, StreamVersion};
use crate::{postgres, read, sqlite};

/// How long to wait for a connection or a busy SQLite file.
const WAIT: Duration = Duration::from_secs(10);

/// A read-only connection pool on a ledger of either backend. Cheap to clone.
pub type LedgerReader = Either<SqlitePool, PgPool>;

impl LedgerReader {
    /// Opens the ledger at `url` read-only. It must exist and be an opledger ledger: nothing is
    /// created or migrated.
    pub async fn open(url: &str) -> Result<Self, OpenError> {
        let reader = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let connect = PgConnectOptions::from_str(url)
                .map_err(|e| OpenError::BadUrl {
                    reason: postgres::redacted_reason(&e),
                })?
                .application_name("opledger-reader")
                .options([("default_transaction_read_only", "on")])
                // A scan of the whole ledger is one long statement by design, not a slow one.
                .disable_statement_logging();
            let pool = PgPoolOptions::new()
                .max_connections(4)
                .acquire_timeout(WAIT)
                .connect_with(connect)
                .await
                .map_err(postgres::open_error)?;
            Either::Postgres(pool)
        } else if url.starts_with("sqlite:") {
            if url.contains(":memory:") || url.contains("mode=memory") {
                return Err(OpenError::BadUrl {
                    reason: "an in-memory database holds no ledger".into(),
                });
            }
            let connect = SqliteConnectOptions::from_str(url).map_err(|e| OpenError::BadUrl {
                reason: e.to_string(),
            })?;
            // Said before SQLite's own "unable to open database file", which names nothing.
            let path = connect.get_filename();
            let read_models = std::sync::Arc::new(crate::read_models::path_for(path));
            if !path.exists() {
                return Err(OpenError::Missing {
                    path: path.to_owned(),
                });
            }
            let mut wal = path.as_os_str().to_owned();
            wal.push("-wal");
            let wal = Path::new(&wal).exists();
            let connect = connect
                .read_only(true)
                .create_if_missing(false)
                .busy_timeout(WAIT)
                // A scan of the whole ledger is one long statement by design, not a slow one.
                .disable_statement_logging();
            if !wal {
                // Without a write-ahead log beside it, the file alone holds every commit: check
                // it on an immutable connection first, which creates no file, so that a
                // database that is no ledger of ours is refused before a read-only connection
                // to a WAL-mode file leaves `-wal` and `-shm` files beside it.
                let probe = SqlitePoolOptions::new()
                    .max_connections(1)
                    .acquire_timeout(WAIT)
                    .connect_with(connect.clone().immutable(true))
                    .await
                    .map_err(sqlite::open_error)?;
                let probe = LedgerReader::Sqlite(probe);
                let checked = probe.check().await;
                probe.close().await;
                checked?;
            }
            let pool = SqlitePoolOptions::new()
                .max_connections(4)
                .acquire_timeout(WAIT)
                .after_connect(move |connection, _| {
                    let read_models = std::sync::Arc::clone(&read_models);
                    Box::pin(async move {
                        crate::read_models::attach(connection, &read_models).await;
                        Ok(())
                    })
                })
                .connect_with(connect)
                .await
                .map_err(sqlite::open_error)?;
            Either::Sqlite(pool)
        } else {
            let scheme = url.split_once(':').map_or("none", |(scheme, _)| scheme);
            return Err(OpenError::BadUrl {
                reason: format!("unsupported scheme `{scheme}`"),
            });
        };
        reader.check().await?;
        Ok(reader)
    }

    /// Refuses a database without the ledger's tables (a wrong path or name), and a ledger that
    /// a newer opledger migrated: its tables may mean something this binary does not know (the
    /// writers' open refuses it the same way).
    async fn check(&self) -> Result<(), OpenError> {
        const NEWEST: &str = "SELECT max(version) FROM _sqlx_migrations";
        // A SQLite ledger in WAL mode also needs its shared-memory file, which a read-only
        // directory may not let SQLite create: that is said as such.
        read::pool_head(self.pool())
            .await
            .map_err(|source| match self {
                LedgerReader::Sqlite(_) => match sqlite::open_error(source) {
                    OpenError::Unreachable { source } => OpenError::NotALedger { source },
                    other => other,
                },
                LedgerReader::Postgres(_) => OpenError::NotALedger { source },
            })?;
        let (found, migrator) = match self {
            LedgerReader::Sqlite(pool) => (
                sqlx::query_scalar(NEWEST).fetch_one(pool).await,
                &sqlite::MIGRATOR,
            ),
            LedgerReader::Postgres(pool) => (
                sqlx::query_scalar(NEWEST).fetch_one(pool).await,
                &postgres::MIGRATOR,
            ),
        };
        let found: Option<i64> = found.map_err(|source| OpenError::NotALedger { source })?;
        let known = migrator.iter().map(|m| m.version).max().unwrap_or(0);
        match found {
            Some(found) if found > known => Err(OpenError::SchemaTooNew { found, known }),
            _ => Ok(()),
        }
    }

    /// The ledger's file, for a SQLite ledger: callers that write files beside it (replays)
    /// must never write onto it or its journal.
    pub fn sqlite_file(&self) -> Option<PathBuf> {
        match self {
            LedgerReader::Sqlite(pool) => Some(pool.connect_options().get_filename().to_owned()),
            LedgerReader::Postgres(_) => None,
        }
    }

    /// The pool, for read models that live in the ledger's database (`operation_status`).
    pub fn pool(&self) -> ReadPool<'_> {
        self.as_ref()
    }

    /// Releases every connection.
    pub async fn close(&self) {
        either!(self, pool => pool.close().await)
    }

    /// Sorts a database error into "retry later" and "bug or corruption".
    pub(crate) fn classify(&self, operation: &'static str, error: sqlx::Error) -> StoreError {
        read::classify(self.backend(), operation, error)
    }

    /// The last committed position and hash, as the `ledger_head` row says.
    pub async fn head(&self) -> Result<Head, StoreError> {
        read::head(self.pool()).await
    }

    /// Events with `from <= position <= to`, in position order, at most `limit`.
    pub async fn read_range(
        &self,
        from: Position,
        to: Position,
        limit: usize,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        read::read_range(self.pool(), from, to, limit).await
    }

    /// Events `from..=to` in pages of at most `page` events, read by a task of its own a few
    /// pages ahead of the caller, so that reading and processing overlap. The pages come in
    /// position order; an error ends them, and so does the ledger's end (a caller that needs
    /// every position up to `to` checks the last one it got).
    pub fn read_ahead(
        &self,
        from: Position,
        to: Position,
        page: usize,
    ) -> mpsc::Receiver<Result<Vec<RecordedEvent>, StoreError>> {
        /// Pages read ahead of the one being processed.
        const AHEAD: usize = 2;
        let (sender, receiver) = mpsc::channel(AHEAD);
        let reader = self.clone();
        tokio::spawn(async move {
            let mut next = from;
            while next <= to {
                let result = reader.read_range(next, to, page).await;
                let last = match &result {
                    Ok(events) => match events.last() {
                        Some(last) => Some(last.position),
                        None => return,
                    },
                    Err(_) => None,
                };
                if sender.send(result).await.is_err() {
                    return;
                }
                let Some(last) = last else { return };
                next = last + 1;
            }
        });
        receiver
    }

    /// Events with `position >= from`, in position order, at most `limit`.
    pub async fn read_all(
        &self,
        from: Position,
        limit: usize,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        self.read_range(from, Position::MAX, limit).await
    }

    /// Events of one stream with `version >= from_version`, in version order, at most `limit`.
    pub async fn read_stream(
        &self,
        stream: &StreamId,
        from_version: StreamVersion,
        limit: usize,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        read::read_stream(self.pool(), stream, from_version, limit).await
    }

    /// Streams in id order, starting after `after`, at most `limit`.
    pub async fn list_streams(
        &self,
        after: Option<&StreamId>,
        limit: usize,
    ) -> Result<Vec<StreamInfo>, StoreError> {
        read::list_streams(self.pool(), after, limit).await
    }

    /// The first event at or after `position`: its position and when it was recorded.
    async fn time_at(
        &self,
        position: Position,
    ) -> Result<Option<(Position, DateTime<Utc>)>, StoreError> {
        read::time_at(self.pool(), position).await
    }

    /// The last position recorded at or before `time` (0 if the first event is later), among
    /// positions up to `head`. `recorded_at` never decreases along positions (the store
    /// guarantees it and `audit verify` checks it), so this is a binary search of a few point
    /// reads, not a scan.
    pub async fn last_position_at(
        &self,
        time: DateTime<Utc>,
        head: Position,
    ) -> Result<Position, StoreError> {
        // Invariant: every position <= `low` was recorded at or before `time`; every position
        // > `high` after it.
        let (mut low, mut high) = (0, head);
        while low < high {
            let middle = low + (high - low).div_ceil(2);
            match self.time_at(middle).await? {
                Some((found, at)) if found <= high && at <= time => low = found.max(middle),
                _ => high = middle - 1,
            }
        }
        Ok(low)
    }
}
