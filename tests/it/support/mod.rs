//! Shared helpers of the black-box tests: running the real `opledger` binary, and test
//! databases.

pub(crate) mod aiogram;
pub(crate) mod app;
pub(crate) mod fake_bot;
pub(crate) mod fake_service;
pub(crate) mod fake_telegram;
pub(crate) mod postgres;
pub(crate) mod serving;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The `opledger` binary built for these tests.
pub(crate) fn opledger_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_opledger"))
}

/// Runs `opledger` with `args` against the ledger at `database_url`, with a clean environment so
/// the developer's own `OPLEDGER_*` variables cannot leak in.
pub(crate) fn opledger(database_url: &str, args: &[&str]) -> Output {
    opledger_command(database_url, args)
        .output()
        .expect("run opledger")
}

pub(crate) fn opledger_command(database_url: &str, args: &[&str]) -> Command {
    let mut command = Command::new(opledger_bin());
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .arg("--database-url")
        .arg(database_url)
        .args(args);
    command
}

/// `sqlite://` URL of a file.
pub(crate) fn sqlite_url(path: &Path) -> String {
    format!("sqlite://{}", path.display())
}

pub(crate) fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).expect("stdout is UTF-8")
}

pub(crate) fn stderr(output: &Output) -> String {
    String::from_utf8(output.stderr.clone()).expect("stderr is UTF-8")
}
