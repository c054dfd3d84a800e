//! A fresh PostgreSQL database per test on the test server, dropped when the test ends.
//!
//! The server comes from `OPLEDGER_TEST_PG_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`). When it cannot be reached, tests are skipped
//! with a message on stderr, except under CI (`CI` set), where that is a failure: a green run
//! must mean the PostgreSQL tests ran.

use std::sync::atomic::{AtomicU64, Ordering};

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Connection, Executor};

/// The default test server: the machine's local PostgreSQL with trust authentication.
const DEFAULT_ADMIN_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

pub(crate) fn admin_url() -> String {
    std::env::var("OPLEDGER_TEST_PG_URL").unwrap_or_else(|_| DEFAULT_ADMIN_URL.to_owned())
}

/// One database of the test server, created for one test and dropped with this value.
#[derive(Debug)]
pub(crate) struct TestDatabase {
    admin: PgConnectOptions,
    name: String,
    url: String,
}

impl TestDatabase {
    /// Creates an empty database, or returns `None` after saying on stderr that the PostgreSQL
    /// tests were skipped because the server is unreachable (a panic under CI).
    pub(crate) async fn create() -> Option<Self> {
        let admin_url = admin_url();
        let admin: PgConnectOptions = admin_url.parse().expect("OPLEDGER_TEST_PG_URL is a URL");
        let mut connection = match admin.connect().await {
            Ok(connection) => connection,
            Err(error) => {
                assert!(
                    std::env::var_os("CI").is_none(),
                    "PostgreSQL is unreachable at {admin_url} under CI: {error}"
                );
                eprintln!(
                    "SKIPPED: PostgreSQL is unreachable at {admin_url} ({error}); start it or set \
                     OPLEDGER_TEST_PG_URL to run the PostgreSQL tests"
                );
                return None;
            }
        };
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("the clock is after 1970")
            .subsec_nanos();
        let name = format!(
            "opledger_test_{}_{}_{nanos}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        );
        connection
            .execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .await
            .expect("create the test database");
        connection.close().await.ok();
        let url = url_with_database(&admin_url, &name);
        Some(Self { admin, name, url })
    }

    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    pub(crate) async fn connect(&self) -> PgConnection {
        self.admin
            .clone()
            .database(&self.name)
            .connect()
            .await
            .expect("connect to the test database")
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let admin = self.admin.clone();
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        // Drop cannot await: drop the database from a thread with its own small runtime.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let mut connection = admin.connect().await?;
                connection.execute(sqlx::AssertSqlSafe(sql)).await?;
                connection.close().await
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("could not drop test database {}: {dropped:?}", self.name);
        }
    }
}

/// `admin_url` with its database replaced by `database`.
pub(crate) fn url_with_database(admin_url: &str, database: &str) -> String {
    let (base, query) = admin_url
        .split_once('?')
        .map_or((admin_url, None), |(b, q)| (b, Some(q)));
    let rest = base.split_once("://").map_or(base, |(_, rest)| rest);
    let base = match rest.rfind('/') {
        Some(slash) => &base[..base.len() - (rest.len() - slash)],
        None => base,
    };
    match query {
        Some(query) => format!("{base}/{database}?{query}"),
        None => format!("{base}/{database}"),
    }
}

#[test]
fn database_urls_are_rewritten() {
    assert_eq!(
        url_with_database("postgres://postgres@127.0.0.1:5432/postgres", "x"),
        "postgres://postgres@127.0.0.1:5432/x"
    );
    assert_eq!(
        url_with_database("postgres://u:p@h/db?sslmode=disable", "x"),
        "postgres://u:p@h/x?sslmode=disable"
    );
    assert_eq!(url_with_database("postgres://h", "x"), "postgres://h/x");
}

/// A PostgreSQL server of the test's own, in a temporary directory on a free port, so that a
/// test can stop and restart it without disturbing the tests that share the machine's server.
#[derive(Debug)]
pub(crate) struct PrivateCluster {
    dir: tempfile::TempDir,
    bin: std::path::PathBuf,
    port: u16,
}

impl PrivateCluster {
    /// Creates and starts the cluster, or returns `None` after saying why on stderr when the
    /// PostgreSQL server binaries are not installed (a panic under CI).
    pub(crate) fn start() -> Option<Self> {
        let Some(bin) = server_binaries() else {
            assert!(
                std::env::var_os("CI").is_none(),
                "PostgreSQL server binaries (initdb, pg_ctl) are missing under CI"
            );
            eprintln!("SKIPPED: no PostgreSQL server binaries (initdb, pg_ctl) found");
            return None;
        };
        let dir = tempfile::tempdir().expect("temporary directory");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let cluster = Self { dir, bin, port };
        if running_as_root() {
            // The server refuses to run as root: hand the directory to the postgres user.
            let status = std::process::Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(cluster.dir.path())
                .status()
                .expect("run chown");
            assert!(status.success(), "chown the cluster directory");
        }
        let data = cluster.data();
        cluster.run(
            "initdb",
            &["-D", &data, "-U", "postgres", "-A", "trust", "--no-sync"],
        );
        cluster.start_server();
        Some(cluster)
    }

    pub(crate) fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Stops the server (fast shutdown: connections are cut, in-flight transactions roll back).
    pub(crate) fn stop(&self) {
        let data = self.data();
        self.run("pg_ctl", &["-D", &data, "-m", "fast", "-w", "stop"]);
    }

    pub(crate) fn start_server(&self) {
        let data = self.data();
        let log = self.dir.path().join("server.log").display().to_string();
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1",
            self.port,
            self.dir.path().display()
        );
        self.run(
            "pg_ctl",
            &["-D", &data, "-l", &log, "-o", &options, "-w", "start"],
        );
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    fn run(&self, program: &str, args: &[&str]) {
        let program = self.bin.join(program);
        let mut command = if running_as_root() {
            let mut command = std::process::Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(&program);
            command
        } else {
            std::process::Command::new(&program)
        };
        let output = command.args(args).output().expect("run a PostgreSQL tool");
        assert!(
            output.status.success(),
            "{} {args:?} failed: {}",
            program.display(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        let data = self.data();
        let program = self.bin.join("pg_ctl");
        let mut command = if running_as_root() {
            let mut command = std::process::Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(&program);
            command
        } else {
            std::process::Command::new(&program)
        };
        let _ = command
            .args(["-D", &data, "-m", "immediate", "stop"])
            .output();
    }
}

fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// The directory holding `initdb` and `pg_ctl`: Debian's layout, or the PATH.
fn server_binaries() -> Option<std::path::PathBuf> {
    let mut candidates: Vec<std::path::PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path().join("bin"))
        .collect();
    candidates.sort();
    candidates.reverse();
    candidates.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    candidates
        .into_iter()
        .find(|dir| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file())
}
