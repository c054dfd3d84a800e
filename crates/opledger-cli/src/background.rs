//! Background work on a thread of its own that the kernel runs after the service's threads:
//! the read models' runner under `opledger serve` (ADRs 0023, 0024).
//!
//! Tokio cannot preempt a task. A read model's page (a thousand events decoded and folded,
//! milliseconds of CPU) holds one of the service's runtime threads until its next `.await`,
//! and the updates whose futures wait on that thread wait with it: with two cores, half of
//! intake stalls. On a thread of its own, with a single-threaded runtime and a nice value
//! [`NICER`] above the service's, the page runs whenever a core is free and the kernel
//! preempts it when an update needs the core. It still gets a share of a busy machine (at
//! nice +10 about a tenth of a service thread's), so the read models fall behind a flood of
//! updates and catch up when it eases, but never stop.
//!
//! Only work whose sockets are its own belongs here: a socket is woken by the reactor of the
//! runtime that opened it, so a pooled connection opened here and later lent to the service
//! would make the service's reads wait for this thread, and fail once it has stopped. On
//! PostgreSQL such work reads through a store handle of its own (`AnyStore::for_background`).

use std::future::Future;

use tokio::sync::oneshot;

/// How much nicer than the service a background thread is (Linux nice values, up to 19).
pub(crate) const NICER: i32 = 10;

/// A background thread started by [`spawn`].
#[derive(Debug)]
pub(crate) struct Background {
    name: String,
    finished: oneshot::Receiver<()>,
}

impl Background {
    /// Waits until its work is done (or has panicked: the panic was printed where it
    /// happened, and is logged here).
    pub(crate) async fn join(self) {
        if self.finished.await.is_err() {
            tracing::error!(thread = %self.name, "a background thread stopped by a panic");
        }
    }
}

/// Runs `work` on a new thread named `name`, with a single-threaded runtime of its own and the
/// caller's tracing subscriber, [`NICER`] than the calling thread. A kernel that refuses the
/// nice value (none does for a lower priority, but a sandbox may) leaves it at the caller's,
/// with a warning: the work still leaves the service's runtime alone.
pub(crate) fn spawn(
    name: &str,
    work: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<Background> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let dispatch = tracing::dispatcher::get_default(Clone::clone);
    // Relative to the caller's: a service started with `nice` keeps its background below it.
    let nice = rustix::process::getpriority_process(None)
        .map(|own| own.saturating_add(NICER).min(19))
        .unwrap_or(NICER);
    let (done, finished) = oneshot::channel();
    let thread = name.to_owned();
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            tracing::dispatcher::with_default(&dispatch, || {
                // On Linux the nice value is per thread; threads started from here inherit it.
                if let Err(error) = rustix::process::setpriority_process(None, nice) {
                    tracing::warn!(
                        thread = %thread,
                        %error,
                        "cannot lower this thread's priority; it runs at the service's"
                    );
                }
                runtime.block_on(work);
            });
            let _ = done.send(());
        })?;
    Ok(Background {
        name: name.to_owned(),
        finished,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own_nice() -> i32 {
        rustix::process::getpriority_process(None).expect("getpriority")
    }

    #[tokio::test]
    async fn work_runs_on_a_thread_of_its_own_nicer_than_the_caller() {
        let caller = own_nice();
        let (seen, saw) = oneshot::channel();
        let background = spawn("opledger-test-bg", async move {
            // A task spawned by the work runs on the background thread's runtime.
            let inner = tokio::spawn(async { std::thread::current().name().map(str::to_owned) });
            let spawned_on = inner.await.expect("task");
            let _ = seen.send((
                std::thread::current().name().map(str::to_owned),
                spawned_on,
                own_nice(),
            ));
        })
        .expect("thread");
        background.join().await;
        let (name, spawned_on, nice) = saw.await.expect("the work ran");
        assert_eq!(name.as_deref(), Some("opledger-test-bg"));
        assert_eq!(spawned_on.as_deref(), Some("opledger-test-bg"));
        assert_eq!(nice, (caller + NICER).min(19), "caller at nice {caller}");
        assert_eq!(own_nice(), caller, "the caller's thread keeps its priority");
    }

    #[tokio::test]
    async fn join_returns_when_the_work_panicked() {
        let background = spawn("opledger-test-panic", async {
            panic!("a background failure");
        })
        .expect("thread");
        tokio::time::timeout(std::time::Duration::from_secs(10), background.join())
            .await
            .expect("join returns");
    }
}
