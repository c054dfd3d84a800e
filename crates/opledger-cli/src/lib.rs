//! The `opledger` command line: operators' and developers' entry point to a ledger.
//!
//! Only this crate reads the environment and the command line; it builds plain option structs
//! and hands them to the library crates. Errors are printed as one line on stderr with a non-zero
//! exit code: 1 for a failure at run time, 2 for a usage error.

mod cmd;
mod database;
mod output;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The default ledger: a SQLite file in the current directory, created if missing.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://opledger.db";

/// opledger: an event-sourced operation ledger that makes every Telegram update produce each
/// business side effect at most once, and proves it afterwards.
#[derive(Debug, Parser)]
#[command(name = "opledger", version, propagate_version = true)]
pub(crate) struct Cli {
    /// The ledger: sqlite://PATH (created if missing) or postgres://USER@HOST/DB.
    #[arg(
        long,
        global = true,
        env = "OPLEDGER_DATABASE_URL",
        default_value = DEFAULT_DATABASE_URL,
        hide_env_values = true
    )]
    database_url: String,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Create the ledger if needed and apply pending schema migrations.
    Migrate,
    /// Print events in global order, or one stream's events.
    Events(cmd::events::Events),
    /// List streams with their current versions.
    Streams(cmd::streams::Streams),
}

/// Parses the command line, runs the command and maps the outcome to an exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            return report(&anyhow::Error::new(error).context("cannot start the runtime"));
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => report(&error),
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Migrate => cmd::migrate::run(&cli.database_url).await,
        Command::Events(events) => events.run(&cli.database_url).await,
        Command::Streams(streams) => streams.run(&cli.database_url).await,
    }
}

/// Logs go to stderr, filtered by `OPLEDGER_LOG` (e.g. `info`, `opledger_store=debug`).
fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("OPLEDGER_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

/// Prints an error and its causes as one line. A cause whose text the previous message already
/// contains is not repeated.
fn report(error: &anyhow::Error) -> ExitCode {
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if !line.contains(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
    }
    eprintln!("error: {line}");
    ExitCode::FAILURE
}
