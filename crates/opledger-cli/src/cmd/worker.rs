//! `opledger worker`: the worker alone (several processes may share one ledger), and the
//! worker options `opledger serve` shares.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use opledger_config::Config;
use opledger_server::SystemClock;
use opledger_store::AnyStore;
use opledger_worker::{Worker, WorkerOptions};

use crate::database;

/// How the worker runs, inside `serve` or alone.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct WorkerArgs {
    /// Operations worked on at once by this process.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_CONCURRENCY, value_parser = clap::value_parser!(u16).range(1..=1024))]
    worker_concurrency: u16,
    /// This worker's id in its claims (default: worker-<pid>-<random>); unique per process.
    #[arg(long, value_name = "ID")]
    worker_id: Option<String>,
    /// Leave replies to users to other workers.
    #[arg(long)]
    no_replies: bool,
}

/// Operations one worker process works on at once unless told otherwise.
const DEFAULT_CONCURRENCY: u16 = 4;

impl Default for WorkerArgs {
    /// The worker as `opledger serve` runs it without options.
    fn default() -> Self {
        WorkerArgs {
            worker_concurrency: DEFAULT_CONCURRENCY,
            worker_id: None,
            no_replies: false,
        }
    }
}

impl WorkerArgs {
    /// Builds the worker for `config` on `store`.
    pub(crate) fn build(&self, config: &Config, store: AnyStore) -> anyhow::Result<Worker> {
        let id = self.worker_id.clone().unwrap_or_else(|| {
            let random = uuid::Uuid::new_v4().simple().to_string();
            format!("worker-{}-{}", std::process::id(), &random[..8])
        });
        let mut options = WorkerOptions::new(id);
        options.concurrency = usize::from(self.worker_concurrency);
        options.replies = !self.no_replies;
        if let Some(ms) = test_timing() {
            options.backoff.base = Duration::from_millis(ms);
            options.idle_poll = Duration::from_millis(ms.max(20));
            options.lease_margin = Duration::from_millis(ms);
        }
        Worker::new(config, store, Arc::new(SystemClock), options)
            .context("cannot start the worker")
    }
}

/// `OPLEDGER_TEST_WORKER_MS` shortens the retry backoff's base, the idle polling and the lease
/// margin to that many milliseconds, so that crash tests see leases expire in well under a
/// second. For tests only; not a documented setting.
fn test_timing() -> Option<u64> {
    std::env::var("OPLEDGER_TEST_WORKER_MS").ok()?.parse().ok()
}

/// Runs the worker until SIGINT or SIGTERM.
pub(crate) async fn run(args: WorkerArgs, config: Config, url: &str) -> anyhow::Result<()> {
    let store = database::open(url).await?;
    let worker = args.build(&config, store.clone())?;
    super::serve::say(format_args!(
        "opledger worker {} is working on the ledger {}",
        worker.id(),
        database::redact(url)
    ));
    worker.run(super::serve::shutdown_signal()).await;
    store.close().await;
    super::serve::say(format_args!("opledger worker stopped"));
    Ok(())
}
