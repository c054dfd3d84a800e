//! `opledger worker`: the worker alone (several processes may share one ledger), and the
//! worker options `opledger serve` shares.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use opledger_config::Config;
use opledger_server::SystemClock;
use opledger_store::AnyStore;
use opledger_worker::{Forwarder, ForwarderOptions, Worker, WorkerOptions};

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

/// The worker and, for bots with a gateway, the forwarder: what `serve` and `worker` run.
#[derive(Debug)]
pub(crate) struct Workers {
    pub(crate) worker: Worker,
    pub(crate) forwarder: Option<Forwarder>,
}

impl Workers {
    /// Runs both until `shutdown` resolves; each finishes the steps in hand.
    pub(crate) async fn run(self, shutdown: impl std::future::Future<Output = ()> + Send) {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let until = |mut stopped: tokio::sync::watch::Receiver<bool>| async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        };
        let forwarder = self.forwarder;
        tokio::join!(
            async move {
                shutdown.await;
                let _ = stop.send(true);
            },
            self.worker.run(until(stopped.clone())),
            async {
                if let Some(forwarder) = &forwarder {
                    forwarder.run(until(stopped.clone())).await;
                }
            },
        );
    }
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
    /// Builds the worker (and the forwarder, if a bot has a gateway) for `config` on `store`.
    pub(crate) fn build(&self, config: &Config, store: AnyStore) -> anyhow::Result<Workers> {
        let id = self.worker_id.clone().unwrap_or_else(|| {
            let random = uuid::Uuid::new_v4().simple().to_string();
            format!("worker-{}-{}", std::process::id(), &random[..8])
        });
        let mut forwarding = ForwarderOptions::new(id.clone());
        let mut options = WorkerOptions::new(id);
        options.concurrency = usize::from(self.worker_concurrency);
        options.replies = !self.no_replies;
        if let Some(ms) = test_timing() {
            options.backoff.base = Duration::from_millis(ms);
            options.idle_poll = Duration::from_millis(ms.max(20));
            options.lease_margin = Duration::from_millis(ms);
            forwarding.backoff.base = Duration::from_millis(ms);
            forwarding.backoff.cap = Duration::from_millis(ms.saturating_mul(10));
            forwarding.idle_poll = Duration::from_millis(ms.max(20));
            forwarding.lease_margin = Duration::from_millis(ms);
        }
        let worker = Worker::new(config, store.clone(), Arc::new(SystemClock), options)
            .context("cannot start the worker")?;
        let forwarder = Forwarder::new(config, store, Arc::new(SystemClock), forwarding)
            .context("cannot start the gateway's forwarder")?;
        Ok(Workers { worker, forwarder })
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
    let shutdown = super::serve::shutdown_signal();
    let store = database::open(url).await?;
    let workers = args.build(&config, store.clone())?;
    super::serve::say(format_args!(
        "opledger worker {} is working on the ledger {}",
        workers.worker.id(),
        database::redact(url)
    ));
    workers.run(shutdown).await;
    store.close().await;
    super::serve::say(format_args!("opledger worker stopped"));
    Ok(())
}
