//! The `opledger` command line: operators' and developers' entry point to a ledger.
//!
//! Only this crate reads the environment, files and the command line; it builds the validated
//! configuration once and hands it to the library crates. Errors are printed as one line on
//! stderr with a non-zero exit code: 2 for a bad configuration or usage (a ledger that is not
//! there included), 1 for anything else.

mod background;
mod cmd;
mod database;
mod output;
mod settings;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use opledger_store::OpenError;

/// opledger: an event-sourced operation ledger that makes every Telegram update produce each
/// business side effect at most once, and proves it afterwards.
#[derive(Debug, Parser)]
#[command(name = "opledger", version, propagate_version = true)]
pub(crate) struct Cli {
    /// The configuration file (TOML, see opledger.example.toml). Without one: a SQLite ledger
    /// at opledger.db, listening on 127.0.0.1:8080, no bots.
    #[arg(long, global = true, env = "OPLEDGER_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,

    /// The ledger, overriding the configuration's [storage] url: sqlite://PATH (created if
    /// missing by the commands that write: serve, worker, migrate; the others only read an
    /// existing ledger) or postgres://USER@HOST/DB.
    #[arg(
        long,
        global = true,
        env = "OPLEDGER_DATABASE_URL",
        hide_env_values = true
    )]
    database_url: Option<String>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Watch opledger at work, no Telegram account needed (start here): a fake Telegram and a fake shop on
    /// this machine, a duplicate delivery, a double click and a timed-out call, and what the
    /// ledger, /status and the reconciliation queue show. Uses its own configuration.
    Demo(cmd::demo::Demo),
    /// Run the service: Telegram webhooks and long polling, recorded before they are answered,
    /// and the worker that carries operations out.
    Serve(cmd::serve::Serve),
    /// Run only the worker: claims due operations, calls their services, sends replies.
    Worker(cmd::worker::WorkerArgs),
    /// Create the ledger if needed and apply pending schema migrations.
    Migrate,
    /// Print events in global order, or one stream's events.
    Events(cmd::events::Events),
    /// List streams with their current versions.
    Streams(cmd::streams::Streams),
    /// List operations and their states.
    Ops(cmd::ops::Ops),
    /// Set up or inspect a bot's webhook with Telegram.
    #[command(subcommand)]
    Webhook(cmd::webhook::Webhook),
    /// Operations whose outcome nobody knows: list them, and record what a person found out.
    #[command(subcommand)]
    Reconcile(cmd::reconcile::Reconcile),
    /// Read models: list them with their checkpoints and lag, rebuild one blue/green.
    #[command(subcommand)]
    Projections(cmd::projections::Projections),
    /// Prove the history untouched: verify the hash chain, export it, print its head.
    #[command(subcommand)]
    Audit(cmd::audit::Audit),
    /// One operation's history: its events, their causes, operators and times.
    Timeline(cmd::timeline::Timeline),
    /// Build the read models as of a past position or time into a separate SQLite file.
    Replay(cmd::replay::Replay),
}

/// Parses the command line, runs the command and maps the outcome to an exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    // Crash tests configure crash points through FAILPOINTS; shipped builds have none.
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
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
    // The demo brings its own configuration and ledger: no file of the user's is read.
    let config = match cli.command {
        Command::Demo(_) => opledger_config::Config::default(),
        _ => settings::load(cli.config.as_deref())?,
    };
    let url = settings::database_url(cli.database_url.as_deref(), &config);
    if matches!(cli.command, Command::Serve(_) | Command::Worker(_)) {
        settings::runnable_here(&config)?;
    }
    match cli.command {
        Command::Serve(serve) => cmd::serve::run(serve, config, &url).await,
        Command::Worker(args) => cmd::worker::run(args, config, &url).await,
        Command::Migrate => cmd::migrate::run(&url).await,
        Command::Events(events) => events.run(&url).await,
        Command::Streams(streams) => streams.run(&url).await,
        Command::Ops(ops) => ops.run(&url).await,
        Command::Webhook(webhook) => webhook.run(&config).await,
        Command::Reconcile(reconcile) => reconcile.run(&url).await,
        Command::Projections(projections) => projections.run(&url).await,
        Command::Audit(audit) => audit.run(&url).await,
        Command::Timeline(timeline) => timeline.run(&url).await,
        Command::Replay(replay) => replay.run(&url).await,
        Command::Demo(demo) => {
            if cli.config.is_some() || cli.database_url.is_some() {
                eprintln!(
                    "note: the demo runs on its own configuration and ledger; --config and \
                     --database-url (OPLEDGER_CONFIG, OPLEDGER_DATABASE_URL) are not used"
                );
            }
            demo.run().await
        }
    }
}

/// Logs go to stderr, filtered by `OPLEDGER_LOG` (e.g. `info`, `opledger_store=debug`).
fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("OPLEDGER_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
}

/// A command-line value that the ledger cannot serve (a position beyond its head, a time before
/// its first event): exits with code 2, like the usage errors the parser finds itself.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct BadUsage(pub(crate) String);

/// Prints an error and its causes as one line. A cause whose text the previous message already
/// contains is not repeated. A bad configuration or usage (a missing ledger too) exits with 2,
/// anything else with 1.
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
    // Causes can quote the ledger or a remote service: no control sequence reaches the terminal.
    eprintln!("error: {}", output::escape(&line));
    if error.chain().any(|cause| {
        cause.is::<settings::BadConfig>()
            || cause.is::<BadUsage>()
            // A read of a ledger that is not there: a mistyped path, like a bad argument.
            || matches!(cause.downcast_ref(), Some(OpenError::Missing { .. }))
    }) {
        ExitCode::from(2)
    } else {
        ExitCode::FAILURE
    }
}
