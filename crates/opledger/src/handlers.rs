//! The hand-over of recorded updates to the program's handlers (ADR 0013).
//!
//! The worker's forwarder takes each in-process bot's updates from the ledger (per chat in
//! order, one in flight; `ForwardStarted` recorded first) and calls [`Handlers`], which passes
//! the exact bytes to whoever [attached](Handlers::attach) to the bot and waits until they say
//! [`Handed::done`]. `done` is recorded as `UpdateForwarded` and the update is never handed
//! over again; a failure, a timeout, a dropped [`Handed`] or a crash of the process is a
//! failed attempt, and the update is handed over again later.

use std::collections::HashMap;
use std::sync::Mutex;

use futures_util::future::BoxFuture;
use opledger_worker::{HandedUpdate, Handover};
use tokio::sync::{mpsc, oneshot};

/// How many updates wait in a bot's channel for its handlers; the forwarder waits beyond.
const CHANNEL: usize = 64;

/// The bots' handlers, by bot name: the worker's [`Handover`].
#[derive(Debug, Default)]
pub(crate) struct Handlers {
    bots: Mutex<HashMap<String, mpsc::Sender<Handed>>>,
}

impl Handlers {
    /// The updates of `bot` from now on; a receiver attached earlier gets no more.
    pub(crate) fn attach(&self, bot: &str) -> HandedUpdates {
        let (sender, receiver) = mpsc::channel(CHANNEL);
        self.lock().insert(bot.to_owned(), sender);
        HandedUpdates { receiver }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, mpsc::Sender<Handed>>> {
        self.bots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Handover for Handlers {
    fn hand_over(&self, update: HandedUpdate) -> BoxFuture<'_, Result<(), String>> {
        let sender = self.lock().get(&update.bot).cloned();
        Box::pin(async move {
            let bot = update.bot.clone();
            let Some(sender) = sender else {
                return Err(format!(
                    "no handlers are attached to bot `{bot}` yet (the program has not started \
                     its dispatcher); handed over again later"
                ));
            };
            let (done, answer) = oneshot::channel();
            sender
                .send(Handed {
                    update,
                    answer: Answer { done },
                })
                .await
                .map_err(|_| {
                    format!("the handlers of bot `{bot}` stopped; handed over again later")
                })?;
            match answer.await {
                Ok(result) => result,
                Err(_) => Err(format!(
                    "the handlers of bot `{bot}` dropped the update before they were done with \
                     it; handed over again later"
                )),
            }
        })
    }
}

/// A bot's recorded updates, as they are handed over (see [`Opledger::handlers`]).
///
/// [`Opledger::handlers`]: crate::Opledger::handlers
#[derive(Debug)]
pub struct HandedUpdates {
    receiver: mpsc::Receiver<Handed>,
}

impl HandedUpdates {
    /// The next update; `None` once the bot's handlers were attached again elsewhere.
    pub async fn next(&mut self) -> Option<Handed> {
        self.receiver.recv().await
    }
}

/// One recorded update in the handlers' hands. Say [`Handed::done`] once it is handled;
/// dropping it unanswered hands it over again later.
#[derive(Debug)]
pub struct Handed {
    update: HandedUpdate,
    answer: Answer,
}

impl Handed {
    /// Telegram's `update_id`.
    pub fn update_id(&self) -> i64 {
        self.update.update_id
    }

    /// 1 the first time it is handed over; more after a failed attempt or a crash.
    pub fn attempt(&self) -> u32 {
        self.update.attempt
    }

    /// The bot it was sent to.
    pub fn bot(&self) -> &str {
        &self.update.bot
    }

    /// The exact bytes Telegram sent.
    pub fn body(&self) -> &[u8] {
        &self.update.body
    }

    /// The handlers are done with it: it is recorded as forwarded and never handed over again.
    pub fn done(self) {
        self.answer.send(Ok(()));
    }

    /// The handlers could not handle it now: it is handed over again later (until it is
    /// older than the bot's `give_up_after`), `reason` recorded with the attempt.
    pub fn fail(self, reason: impl Into<String>) {
        self.answer.send(Err(reason.into()));
    }

    /// Splits off the answer, for handlers that finish elsewhere.
    #[cfg_attr(not(feature = "teloxide"), allow(dead_code))]
    pub(crate) fn into_parts(self) -> (HandedUpdate, Answer) {
        (self.update, self.answer)
    }
}

/// The answer of one handed-over update; dropped unsent, the hand-over failed.
#[derive(Debug)]
pub(crate) struct Answer {
    done: oneshot::Sender<Result<(), String>>,
}

impl Answer {
    pub(crate) fn send(self, result: Result<(), String>) {
        let _ = self.done.send(result);
    }
}
