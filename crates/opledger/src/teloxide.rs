//! teloxide's dispatcher on opledger's ledger (feature `teloxide`; ADR 0013).
//!
//! [`dispatching`] gives the two parts of a `Dispatcher` that gets each update once it is
//! recorded:
//!
//! - a [`Listener`], teloxide's `UpdateListener`: it yields the updates opledger hands over
//!   (from the ledger, per chat in order, one in flight), not what Telegram sends. opledger
//!   itself polls Telegram or takes its webhooks, and answers Telegram only after the update
//!   is committed; a duplicate delivery is recorded and never reaches the dispatcher.
//! - the bot's handler, wrapped: when the handler has finished with an update, the ledger
//!   records it as handed over (`UpdateForwarded`) and it is never dispatched again. If the
//!   process dies first, or the handler returns an error or outlives the bot's
//!   `handler_timeout`, the update is dispatched again later (teloxide's own polling would
//!   have lost it, or moved the offset past it before it was handled).
//!
//! So a handler can run more than once for one update, never concurrently with itself for one
//! chat; its business effects go through [`Opledger::run`] (at most once per business key)
//! and are never repeated.
//!
//! ```no_run
//! use std::time::Duration;
//! use opledger::{Bot, Opledger, Submit, Updates};
//! use teloxide::prelude::*;
//!
//! # async fn example(ledger: Opledger) -> Result<(), opledger::Error> {
//! let handler = Update::filter_message().endpoint(
//!     |bot: teloxide::Bot, ledger: Opledger, message: Message| async move {
//!         let Some(user) = message.from.as_ref() else { return Ok(()) };
//!         let submit = Submit::new("shop", "coupon")
//!             .param("campaign", "spring")
//!             .user(user.id.0 as i64);
//!         let outcome = ledger.run(submit, Duration::from_secs(10)).await;
//!         let text = match outcome {
//!             Ok(outcome) => format!("{:?}", outcome.operation.external_id),
//!             Err(error) => format!("not now: {error}"),
//!         };
//!         bot.send_message(message.chat.id, text).await?;
//!         respond(())
//!     },
//! );
//! let (listener, handler) = opledger::teloxide::dispatching(&ledger, "shop", handler)?;
//! let running = ledger.start().await?;
//! let bot = teloxide::Bot::new("123456:token");
//! Dispatcher::builder(bot, handler)
//!     .dependencies(dptree::deps![ledger.clone()])
//!     .build()
//!     .dispatch_with_listener(listener, LoggingErrorHandler::new())
//!     .await;
//! running.shutdown().await;
//! # Ok(())
//! # }
//! ```

use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt;
use std::ops::ControlFlow;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};

use futures_util::stream::BoxStream;
use teloxide::dispatching::UpdateHandler;
use teloxide::dptree::{self, di::DependencyMap};
use teloxide::stop::{StopFlag, StopToken, mk_stop_token};
use teloxide::types::{Update, UpdateKind};
use teloxide::update_listeners::{AsUpdateStream, UpdateListener};

use crate::error::Error;
use crate::handlers::{Answer, HandedUpdates};
use crate::ledger::Opledger;

/// Answers of the updates the dispatcher has, by `update_id`.
type InHand = Arc<Mutex<HashMap<u32, Answer>>>;

/// The update source and the wrapped handler of a dispatcher for `bot`, whose updates go to
/// handlers ([`Bot::handlers`](crate::Bot::handlers)). Call it before [`Opledger::start`] (or
/// soon after: updates wait in the ledger until it is called).
pub fn dispatching<Err>(
    ledger: &Opledger,
    bot: &str,
    handler: UpdateHandler<Err>,
) -> Result<(Listener, UpdateHandler<Err>), Error>
where
    Err: Send + Sync + 'static,
{
    let updates = ledger.handlers(bot)?;
    let in_hand = InHand::default();
    let (stop_token, stop_flag) = mk_stop_token();
    let listener = Listener {
        bot: bot.to_owned(),
        updates,
        in_hand: Arc::clone(&in_hand),
        stop_token,
        stop_flag: Box::pin(stop_flag),
    };
    Ok((listener, completing(handler, in_hand)))
}

/// teloxide's update source for one bot: the updates opledger recorded and hands over.
pub struct Listener {
    bot: String,
    updates: HandedUpdates,
    in_hand: InHand,
    stop_token: StopToken,
    stop_flag: Pin<Box<StopFlag>>,
}

impl fmt::Debug for Listener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Listener")
            .field("bot", &self.bot)
            .finish_non_exhaustive()
    }
}

impl UpdateListener for Listener {
    type Err = Infallible;

    fn stop_token(&mut self) -> StopToken {
        self.stop_token.clone()
    }
}

impl<'a> AsUpdateStream<'a> for Listener {
    type StreamErr = Infallible;
    type Stream = BoxStream<'a, Result<Update, Infallible>>;

    fn as_stream(&'a mut self) -> Self::Stream {
        Box::pin(futures_util::stream::unfold(self, |listener| async move {
            let update = listener.next().await?;
            Some((Ok(update), listener))
        }))
    }
}

impl Listener {
    /// The next handed-over update teloxide can read; `None` once stopped.
    async fn next(&mut self) -> Option<Update> {
        loop {
            let handed = tokio::select! {
                () = &mut self.stop_flag => return None,
                handed = self.updates.next() => handed?,
            };
            let (handed, answer) = handed.into_parts();
            match serde_json::from_slice::<Update>(&handed.body) {
                Ok(update) if !matches!(update.kind, UpdateKind::Error(_)) => {
                    self.in_hand
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .insert(update.id.0, answer);
                    return Some(update);
                }
                // teloxide's dispatcher drops what it cannot read (and logs it); so does this
                // source, once, rather than block the chat behind an update no handler gets.
                _ => {
                    tracing::warn!(
                        bot = %self.bot,
                        update_id = handed.update_id,
                        "teloxide cannot read this update; it is not dispatched"
                    );
                    answer.send(Ok(()));
                }
            }
        }
    }
}

/// `handler`, and then the update's answer: done, or failed when the handler returned an
/// error (it is dispatched again later).
fn completing<Err>(handler: UpdateHandler<Err>, in_hand: InHand) -> UpdateHandler<Err>
where
    Err: Send + Sync + 'static,
{
    let description = handler.description().clone();
    let sig = handler.sig().clone();
    dptree::from_fn_with_description(
        description,
        move |deps: DependencyMap, cont| {
            let handler = handler.clone();
            let in_hand = Arc::clone(&in_hand);
            async move {
                let id = deps.try_get::<Update>().map(|update| update.id.0);
                let result = handler.execute(deps, cont).await;
                let answer = id.and_then(|id| {
                    in_hand
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .remove(&id)
                });
                if let Some(answer) = answer {
                    answer.send(match &result {
                        ControlFlow::Break(Err(_)) => Err(
                            "the handler returned an error (see the dispatcher's error handler)"
                                .to_owned(),
                        ),
                        _ => Ok(()),
                    });
                }
                result
            }
        },
        sig,
    )
}
