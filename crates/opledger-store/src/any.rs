//! Choosing the backend from a database URL: `sqlite://…` or `postgres://…`.

use crate::error::{OpenError, StoreError};
use crate::group_commit::GroupCommitOptions;
use crate::inline::InlineProjections;
use crate::model::{
    AppendRequest, Appended, Head, Position, RecordedEvent, StreamId, StreamInfo, StreamVersion,
};
use crate::postgres::{PgOptions, PgStore};
use crate::sqlite::{SqliteOptions, SqliteStore};
use crate::store::{EventStore, HeadWatch};

/// A store of whichever backend its URL names, for callers (the CLI, tools) that pick the
/// backend at run time. Code that knows its backend uses [`SqliteStore`] or [`PgStore`].
#[derive(Clone, Debug)]
pub enum AnyStore {
    Sqlite(SqliteStore),
    Postgres(PgStore),
}

/// What both backends take when the URL picks one; the rest are each backend's defaults.
#[derive(Clone, Debug, Default)]
pub struct AnyOptions {
    pub group_commit: GroupCommitOptions,
    /// Read models updated inside every append transaction.
    pub inline: InlineProjections,
}

/// A connection pool of whichever backend, for read models that live in the ledger's database:
/// the read pool ([`AnyStore::reader`]) or the projections' writable one
/// ([`AnyStore::projection_pool`]).
#[derive(Clone, Copy, Debug)]
pub enum ReadPool<'a> {
    Sqlite(&'a sqlx::SqlitePool),
    Postgres(&'a sqlx::PgPool),
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
            Ok(Self::Postgres(PgStore::open(url, options).await?))
        } else if url.starts_with("sqlite:") {
            let options = SqliteOptions {
                group_commit,
                inline,
                ..SqliteOptions::default()
            };
            Ok(Self::Sqlite(SqliteStore::open(url, options).await?))
        } else {
            let scheme = url.split_once(':').map_or("none", |(scheme, _)| scheme);
            Err(OpenError::BadUrl {
                reason: format!("unsupported scheme `{scheme}`"),
            })
        }
    }

    /// The newest schema version this binary knows for the backend.
    pub fn schema_version(&self) -> i64 {
        let migrator = match self {
            AnyStore::Sqlite(_) => &crate::sqlite::MIGRATOR,
            AnyStore::Postgres(_) => &crate::postgres::MIGRATOR,
        };
        migrator.iter().map(|m| m.version).max().unwrap_or(0)
    }

    /// The read pool, for read models in the same database.
    pub fn reader(&self) -> ReadPool<'_> {
        match self {
            AnyStore::Sqlite(store) => ReadPool::Sqlite(store.reader()),
            AnyStore::Postgres(store) => ReadPool::Postgres(store.reader()),
        }
    }

    /// Writable connections for read models kept outside the append transactions (see
    /// [`SqliteStore::projection_pool`], [`PgStore::projection_pool`]).
    pub fn projection_pool(&self) -> ReadPool<'_> {
        match self {
            AnyStore::Sqlite(store) => ReadPool::Sqlite(store.projection_pool()),
            AnyStore::Postgres(store) => ReadPool::Postgres(store.projection_pool()),
        }
    }

    /// Commits what is queued and releases every connection.
    pub async fn close(&self) {
        match self {
            AnyStore::Sqlite(store) => store.close().await,
            AnyStore::Postgres(store) => store.close().await,
        }
    }
}

/// Forwards a call to the backend inside.
macro_rules! forward {
    ($self:ident, $store:ident => $call:expr) => {
        match $self {
            AnyStore::Sqlite($store) => $call,
            AnyStore::Postgres($store) => $call,
        }
    };
}

impl EventStore for AnyStore {
    async fn append(&self, requests: Vec<AppendRequest>) -> Result<Appended, StoreError> {
        forward!(self, store => store.append(requests).await)
    }

    async fn read_stream(
        &self,
        stream: &StreamId,
        from_version: StreamVersion,
        limit: usize,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        forward!(self, store => store.read_stream(stream, from_version, limit).await)
    }

    async fn read_all(
        &self,
        from: Position,
        limit: usize,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        forward!(self, store => store.read_all(from, limit).await)
    }

    async fn head(&self) -> Result<Head, StoreError> {
        forward!(self, store => store.head().await)
    }

    async fn stream_version(&self, stream: &StreamId) -> Result<StreamVersion, StoreError> {
        forward!(self, store => store.stream_version(stream).await)
    }

    async fn list_streams(
        &self,
        after: Option<&StreamId>,
        limit: usize,
    ) -> Result<Vec<StreamInfo>, StoreError> {
        forward!(self, store => store.list_streams(after, limit).await)
    }

    fn subscribe(&self) -> HeadWatch {
        forward!(self, store => store.subscribe())
    }
}
