//! The conformance suite on the PostgreSQL backend: one fresh database per test, dropped after.

use opledger_store::{GroupCommitOptions, PgOptions, PgStore};
use sqlx::{Connection, Executor};

use super::{Backend, conformance_suite};
use crate::support::postgres::TestDatabase;

pub(crate) struct PgBackend {
    database: TestDatabase,
}

impl Backend for PgBackend {
    type Store = PgStore;

    async fn create() -> Option<Self> {
        Some(Self {
            database: TestDatabase::create().await?,
        })
    }

    async fn open(&self, group_commit: GroupCommitOptions) -> PgStore {
        let options = PgOptions {
            group_commit,
            ..PgOptions::default()
        };
        PgStore::open(self.database.url(), options)
            .await
            .expect("open the PostgreSQL ledger")
    }

    async fn close(store: PgStore) {
        store.close().await;
    }

    async fn execute_raw(&self, sql: &str) -> Result<u64, sqlx::Error> {
        let mut connection = self.database.connect().await;
        let result = connection.execute(sqlx::AssertSqlSafe(sql)).await;
        connection.close().await?;
        Ok(result?.rows_affected())
    }

    fn url(&self) -> String {
        self.database.url().to_owned()
    }
}

conformance_suite!(PgBackend);
