//! A fresh PostgreSQL database per test, dropped at the end; under CI an unreachable server
//! fails the test instead of skipping it.

use sqlx::{Connection, Executor, PgConnection};

const DEFAULT_ADMIN_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

pub(crate) struct Database {
    admin_url: String,
    name: String,
    pub(crate) url: String,
}

impl Database {
    pub(crate) async fn create() -> Option<Database> {
        let admin_url =
            std::env::var("OPLEDGER_TEST_PG_URL").unwrap_or_else(|_| DEFAULT_ADMIN_URL.to_owned());
        let mut admin = match PgConnection::connect(&admin_url).await {
            Ok(connection) => connection,
            Err(error) => {
                assert!(
                    std::env::var_os("CI").is_none(),
                    "PostgreSQL is unreachable at {admin_url} under CI: {error}"
                );
                eprintln!("SKIPPED: PostgreSQL is unreachable at {admin_url} ({error})");
                return None;
            }
        };
        let name = format!("opledger_embedded_{}", uuid::Uuid::new_v4().simple());
        admin
            .execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .await
            .expect("create the test database");
        let (base, _) = admin_url.rsplit_once('/').expect("a URL with a database");
        let url = format!("{base}/{name}");
        Some(Database {
            admin_url,
            name,
            url,
        })
    }

    pub(crate) async fn drop(self) {
        let mut admin = PgConnection::connect(&self.admin_url)
            .await
            .expect("connect to drop the test database");
        admin
            .execute(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            )))
            .await
            .expect("drop the test database");
    }
}
