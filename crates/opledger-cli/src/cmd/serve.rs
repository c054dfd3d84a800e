//! `opledger serve`: the service. Webhook intake and long polling, recorded before answered;
//! SIGINT or SIGTERM stops it gracefully.

use anyhow::Context;
use opledger_config::{BotMode, Config};
use opledger_projections::{Projector, ProjectorOptions};
use opledger_server::App;

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
    #[command(flatten)]
    worker: WorkerArgs,
}

pub(crate) async fn run(serve: Serve, config: Config, url: &str) -> anyhow::Result<()> {
    let store = database::open(url).await?;
    // Registers the read models; one whose definition changed is rebuilt (an inline one before
    // the service starts, an asynchronous one in the background while its old version serves).
    let projector = if serve.no_projections {
        None
    } else {
        let mut projector = Projector::new(
            store.clone(),
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
        Some(serve.worker.build(&config, store.clone())?)
    };
    let app = App::build(&config, store);
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
             opledger.example.toml and docs/config.md) and pass it with --config"
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
        if let Some(forward) = &bot.forward {
            say(format_args!(
                "bot {}: gateway forwarding to {}",
                bot.name, forward.url
            ));
        }
    }
    // On SIGINT or SIGTERM the worker stops first: the operations in hand finish their step
    // (the service keeps answering meanwhile), then the service shuts down and closes the
    // store. A step cut off by a closed store would leave a call's outcome unknown.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let projector = projector.map(|projector| {
        let mut stopped = stopped.clone();
        tokio::spawn(projector.run(async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        }))
    });
    let worker = worker.map(|worker| {
        let mut stopped = stopped.clone();
        tokio::spawn(async move {
            worker
                .run(async move {
                    let _ = stopped.wait_for(|stop| *stop).await;
                })
                .await;
        })
    });
    let served = app
        .run(listener, async move {
            shutdown_signal().await;
            let _ = stop.send(true);
            if let Some(worker) = worker {
                let _ = worker.await;
            }
            if let Some(projector) = projector {
                let _ = projector.await;
            }
        })
        .await;
    served.context("the service stopped with an error")?;
    say(format_args!("opledger stopped"));
    Ok(())
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

/// Resolves on SIGINT (Ctrl-C) or SIGTERM.
pub(crate) async fn shutdown_signal() {
    let interrupt = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        () = interrupt => {}
        () = terminate => {}
    }
}
