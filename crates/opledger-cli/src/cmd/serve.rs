//! `opledger serve`: the service. Webhook intake and long polling, recorded before answered;
//! SIGINT or SIGTERM stops it gracefully.

use std::future::Future;
use std::pin::Pin;

use crate::cmd::worker::Workers;
use anyhow::Context;
use opledger_config::{BotMode, Config};
use opledger_projections::{Projector, ProjectorOptions};
use opledger_server::App;
use opledger_store::AnyStore;

use crate::background;
use crate::cmd::worker::WorkerArgs;
use crate::database;

/// `opledger serve`'s options.
#[derive(Debug, clap::Args)]
pub(crate) struct Serve {
    /// Do not run the worker in this process (run `opledger worker` elsewhere).
    #[arg(long)]
    no_worker: bool,
    /// Do not run the asynchronous read models in this process (another instance runs them;
    /// inline ones are still kept by every append).
    #[arg(long)]
    no_projections: bool,
    /// Do not make this process's read models wait while updates are being recorded, nor its
    /// worker while a crowd of them is (by default they do, at most 50 ms a step, and the read
    /// models run on a thread below the service's priority, so that acknowledgements stay
    /// fast under load; without it more operations per second finish, acknowledged later).
    #[arg(long)]
    no_intake_priority: bool,
    #[command(flatten)]
    worker: WorkerArgs,
}

impl Default for Serve {
    /// The service as `opledger serve` runs it without options: worker and read models in
    /// this process.
    fn default() -> Self {
        Serve {
            no_worker: false,
            no_projections: false,
            no_intake_priority: false,
            worker: WorkerArgs::default(),
        }
    }
}

pub(crate) async fn run(serve: Serve, config: Config, url: &str) -> anyhow::Result<()> {
    // Before anything is announced: a signal sent as soon as the service says where it is
    // stops it gracefully.
    let shutdown = shutdown_signal();
    let store = database::open(url).await?;
    let service = Service::build(&serve, &config, store).await?;
    let listener = tokio::net::TcpListener::bind(config.server.listen)
        .await
        .with_context(|| {
            format!(
                "cannot listen on {}; is another process using it? set [server] listen",
                config.server.listen
            )
        })?;
    let address = listener
        .local_addr()
        .context("cannot read the listening address")?;
    // One line on stdout says where the service is (with port 0, which port it got).
    say(format_args!(
        "opledger is serving on http://{address} with the ledger {}",
        database::redact(url)
    ));
    if config.bots.is_empty() {
        say(format_args!(
            "no bot is configured yet: add a [[bots]] section to a configuration file (see \
             opledger.example.toml and docs/config.md) and pass it with --config, or watch \
             opledger at work with `opledger demo`"
        ));
    }
    for bot in &config.bots {
        match bot.mode {
            BotMode::Webhook => say(format_args!(
                "bot {}: webhook at http://{address}/telegram/{}/webhook",
                bot.name, bot.name
            )),
            BotMode::Poll => say(format_args!(
                "bot {}: long polling {}",
                bot.name, bot.api_base_url
            )),
        }
        if let Some(forward) = &bot.forward
            && let opledger_config::ForwardTarget::Webhook(url) = &forward.target
        {
            say(format_args!(
                "bot {}: gateway forwarding to {url}",
                bot.name
            ));
        }
    }
    service.run(listener, shutdown).await?;
    say(format_args!("opledger stopped"));
    Ok(())
}

/// The service's parts on one ledger, built from its configuration: the read models' runner
/// (prepared), the worker and the app. `serve` runs it until a signal, `demo` until its story
/// is told.
#[derive(Debug)]
pub(crate) struct Service {
    app: App,
    worker: Option<Workers>,
    projector: Option<Projector>,
    /// Whether intake goes first ([`opledger_store::Priority`]); then the read models also
    /// run on a thread below the service's priority (ADRs 0023, 0024). Their store handle is
    /// `AnyStore::for_background`: on PostgreSQL its reads go through connections of its own,
    /// so none of intake's reads waits on their thread.
    foreground_first: bool,
}

impl Service {
    /// Registers the read models (one whose definition changed is rebuilt: an inline one
    /// before the service starts, an asynchronous one in the background while its old version
    /// serves), builds the worker and the app.
    pub(crate) async fn build(
        serve: &Serve,
        config: &Config,
        store: AnyStore,
    ) -> anyhow::Result<Service> {
        let foreground_first = !serve.no_intake_priority;
        store.priority().put_foreground_first(foreground_first);
        let projector = if serve.no_projections {
            None
        } else {
            let mut projector = Projector::new(
                store.for_background(),
                opledger_projections::builtin(),
                ProjectorOptions {
                    runner: runner_id(),
                    ..ProjectorOptions::default()
                },
            );
            projector
                .prepare()
                .await
                .context("cannot prepare the read models")?;
            Some(projector)
        };
        let worker = if serve.no_worker {
            None
        } else {
            Some(serve.worker.build(config, store.clone())?)
        };
        Ok(Service {
            app: App::build(config, store),
            worker,
            projector,
            foreground_first,
        })
    }

    /// Serves on `listener` until `shutdown` resolves. Then the worker stops first: the
    /// operations in hand finish their step (the service keeps answering meanwhile); then the
    /// read models' runner, and the service shuts down and closes the store. A step cut off by
    /// a closed store would leave a call's outcome unknown.
    pub(crate) async fn run(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let projector = match self.projector {
            None => None,
            Some(projector) => {
                let mut stopped = stopped.clone();
                let run = projector.run(async move {
                    let _ = stopped.wait_for(|stop| *stop).await;
                });
                Some(if self.foreground_first {
                    // Below intake: the kernel preempts a page for an update (ADR 0023).
                    let thread = background::spawn("opledger-read-models", run)
                        .context("cannot start the read models' thread")?;
                    Box::pin(thread.join()) as Pin<Box<dyn Future<Output = ()> + Send>>
                } else {
                    let task = tokio::spawn(run);
                    Box::pin(async move {
                        let _ = task.await;
                    })
                })
            }
        };
        let worker = self.worker.map(|worker| {
            let mut stopped = stopped.clone();
            tokio::spawn(async move {
                worker
                    .run(async move {
                        let _ = stopped.wait_for(|stop| *stop).await;
                    })
                    .await;
            })
        });
        let served = self
            .app
            .run(listener, async move {
                shutdown.await;
                let _ = stop.send(true);
                if let Some(worker) = worker {
                    let _ = worker.await;
                }
                if let Some(projector) = projector {
                    projector.await;
                }
            })
            .await;
        served.context("the service stopped with an error")
    }
}

/// This process's name in the projection registry's `runner` column: `host:pid`.
pub(crate) fn runner_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    format!("{host}:{}", std::process::id())
}

/// A line on stdout for whoever watches; a reader that went away does not stop the service.
pub(crate) fn say(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM. The handlers are in place once this returns, not
/// once the future is first polled (a server may poll it only after it started serving; a
/// signal in between would kill the process instead of stopping it).
pub(crate) fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{SignalKind, signal};
    let interrupt = signal(SignalKind::interrupt()).ok();
    let terminate = signal(SignalKind::terminate()).ok();
    async move {
        let wait = |signal: Option<tokio::signal::unix::Signal>| async move {
            match signal {
                Some(mut signal) => {
                    signal.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            () = wait(interrupt) => {}
            () = wait(terminate) => {}
        }
    }
}
