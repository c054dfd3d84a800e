//! The conformance suite on the SQLite backend: one temporary directory and file per test.

use opledger_store::{GroupCommitOptions, SqliteOptions, SqliteStore};
use sqlx::{ConnectOptions, Connection, Executor};
use tempfile::TempDir;

use super::{Backend, conformance_suite};

pub(crate) struct SqliteBackend {
    dir: TempDir,
}

impl SqliteBackend {
    fn path(&self) -> std::path::PathBuf {
        self.dir.path().join("ledger.db")
    }
}

impl Backend for SqliteBackend {
    type Store = SqliteStore;

    async fn create() -> Option<Self> {
        Some(Self {
            dir: tempfile::tempdir().expect("temporary directory"),
        })
    }

    async fn open(&self, group_commit: GroupCommitOptions) -> SqliteStore {
        let options = SqliteOptions {
            group_commit,
            ..SqliteOptions::default()
        };
        SqliteStore::open(&self.url(), options)
            .await
            .expect("open the SQLite ledger")
    }

    async fn close(store: SqliteStore) {
        store.close().await;
    }

    async fn execute_raw(&self, sql: &str) -> Result<u64, sqlx::Error> {
        let mut connection = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(self.path())
            .connect()
            .await?;
        let result = connection.execute(sqlx::AssertSqlSafe(sql)).await;
        connection.close().await?;
        Ok(result?.rows_affected())
    }

    fn url(&self) -> String {
        format!("sqlite://{}", self.path().display())
    }
}

conformance_suite!(SqliteBackend);
