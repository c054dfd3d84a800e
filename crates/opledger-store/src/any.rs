//! Choosing the backend from a database URL: `sqlite://…` or `postgres://…`.

use crate::backend::{Backend, Either, ReadPool};
use crate::either;
use crate::error::{OpenError, StoreError};
use crate::group_commit::GroupCommitOptions;
use crate::inline::InlineProjections;
use crate::model::{AppendRequest, Appended};
use crate::postgres::{PgOptions, PgStore};
use crate::read;
use crate::sqlite::{SqliteOptions, SqliteStore};
use crate::store::{EventStore, HeadWatch};

/// A store of whichever backend its URL names, for callers (the CLI, tools) that pick the
/// backend at run time. Code that knows its backend uses [`SqliteStore`] or [`PgStore`].
pub type AnyStore = Either<SqliteStore, PgStore>;

/// What both backends take when the URL picks one; the rest are each backend's defaults.
#[derive(Clone, Debug, Default)]
pub struct AnyOptions {
    pub group_commit: GroupCommitOptions,
    /// Read models updated inside every append transaction.
    pub inline: InlineProjections,
}

impl AnyStore {
    /// Opens the ledger at `url` with each backend's defaults and the given options.
    pub async fn open(url: &str, options: AnyOptions) -> Result<Self, OpenError> {
        let AnyOptions {
            group_commit,
            inline,
        } = options;
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let options = PgOptions {
                group_commit,
                inline,
                ..PgOptions::default()
            };
            Ok(Either::Postgres(PgStore::open(url, options).await?))
        } else if url.starts_with("sqlite:") {
            let options = SqliteOptions {
                group_commit,
                inline,
                ..SqliteOptions::default()
            };
            Ok(Either::Sqlite(SqliteStore::open(url, options).await?))
        } else {
            let scheme = url.split_once(':').map_or("none", |(scheme, _)| scheme);
            Err(OpenError::BadUrl {
                reason: format!("unsupported scheme `{scheme}`"),
            })
        }
    }

    /// The attachment `name` of `stream` (written by an append's [`AppendRequest::attach`] and
    /// not yet deleted by a later one's `detach`), if there is one.
    pub async fn attachment(
        &self,
        stream: &crate::StreamId,
        name: &str,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        crate::attachments::read(self.reader(), stream, name).await
    }

    /// The newest schema version this binary knows for the backend.
    pub fn schema_version(&self) -> i64 {
        let migrator = match self.backend() {
            Backend::Sqlite => &crate::sqlite::MIGRATOR,
            Backend::Postgres => &crate::postgres::MIGRATOR,
        };
        migrator.iter().map(|m| m.version).max().unwrap_or(0)
    }

    /// The read pool, for read models in the same database.
    pub fn reader(&self) -> ReadPool<'_> {
        either!(map self, store => store.reader())
    }

    /// The same ledger for background work on a runtime of its own (the read models' runner on
    /// its thread, ADRs 0023, 0024): on PostgreSQL its reads go through connections of their own (see
    /// [`PgStore::for_background`]); SQLite's connections run on threads of their own and are
    /// woken by no runtime, so on SQLite it is a clone.
    pub fn for_background(&self) -> AnyStore {
        match self {
            Either::Sqlite(store) => Either::Sqlite(store.clone()),
            Either::Postgres(store) => Either::Postgres(store.for_background()),
        }
    }

    /// The worker's queue reads (which operations are due): on PostgreSQL, connections whose
    /// plans stay on the queue's index whatever the table's statistics say; on SQLite, the
    /// read pool.
    pub fn queue_reader(&self) -> ReadPool<'_> {
        either!(map self, store => store.queue_reader())
    }

    /// This process's foreground work before its background work on this store (see
    /// [`Priority`](crate::Priority)).
    pub fn priority(&self) -> &crate::Priority {
        either!(self, store => store.priority())
    }

    /// Where this store's appends spent their time in this process (see
    /// [`AppendTimings`](crate::AppendTimings)).
    pub fn append_timings(&self) -> &crate::AppendTimings {
        either!(self, store => store.append_timings())
    }

    /// Writable connections for read models kept outside the append transactions (see
    /// [`SqliteStore::projection_pool`], [`PgStore::projection_pool`]).
    pub fn projection_pool(&self) -> ReadPool<'_> {
        either!(map self, store => store.projection_pool())
    }

    /// Writable connections for the asynchronous read models: on SQLite the one on their own
    /// file beside the ledger ([`SqliteStore::read_model_pool`]), on PostgreSQL the projection
    /// pool (the same database).
    pub fn read_model_pool(&self) -> ReadPool<'_> {
        match self {
            Either::Sqlite(store) => Either::Sqlite(store.read_model_pool()),
            Either::Postgres(store) => Either::Postgres(store.projection_pool()),
        }
    }

    /// `None` unless the read models' file of a SQLite ledger was deleted or replaced under
    /// this process (see [`SqliteStore::read_model_file_lost`]); then a sentence saying so.
    pub fn read_model_file_lost(&self) -> Option<String> {
        match self {
            Either::Sqlite(store) => store.read_model_file_lost().map(|(path, change)| {
                format!(
                    "the read models' file {} was {change}; the ledger goes on, and the read \
                     models are rebuilt in a new file when opledger restarts",
                    path.display()
                )
            }),
            Either::Postgres(_) => None,
        }
    }

    /// `Ok` unless a file of a SQLite ledger was deleted or replaced under this process (see
    /// [`SqliteStore::check_files`]); PostgreSQL has no file to lose.
    pub fn check_files(&self) -> Result<(), StoreError> {
        match self {
            Either::Sqlite(store) => store.check_files(),
            Either::Postgres(_) => Ok(()),
        }
    }

    /// Commits what is queued and releases every connection.
    pub async fn close(&self) {
        either!(self, store => store.close().await)
    }
}

impl EventStore for AnyStore {
    async fn append(&self, requests: Vec<AppendRequest>) -> Result<Appended, StoreError> {
        either!(self, store => store.append(requests).await)
    }

    read::event_store_reads!(self => self.reader());

    fn subscribe(&self) -> HeadWatch {
        either!(self, store => store.subscribe())
    }
}
