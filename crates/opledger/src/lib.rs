//! Embed opledger in a Rust bot: every Telegram update recorded once, every business action
//! carried out at most once, and a hash-chained ledger that shows what happened.
//!
//! Telegram delivers updates at least once, users double-click, and a bot can die between an
//! effect and its record. With this crate the bot's updates go through opledger's ledger
//! first (SQLite in a file, or PostgreSQL for several instances) and its side effects are
//! *actions*: operations keyed by a business key, carried out by opledger's worker under the
//! no-blind-retry contract. The same ledger serves `opledger status`, `opledger audit verify`
//! and the `/v1` API, so the service's tools work on an embedded ledger unchanged.
//!
//! # A bot in five steps
//!
//! 1. **Declare** bots and actions, in code ([`Bot`], [`Action`]) or in the service's TOML
//!    ([`Builder::toml`]); both are checked by the same rules, with the same messages.
//! 2. **Register effects** that run in this process ([`Builder::effector`], [`effect_fn`]),
//!    or let an action call an HTTP service ([`Action::calls`]).
//! 3. **Open** the ledger ([`Builder::open`]) and [`start`](Opledger::start) its worker, read
//!    models and pollers (or [`serve`](Opledger::serve) its HTTP routes too).
//! 4. **Receive updates** recorded before the bot sees them: with teloxide, through
//!    `opledger::teloxide::dispatching` (feature `teloxide`); otherwise through
//!    [`Opledger::handlers`], or by calling [`Opledger::record`] yourself.
//! 5. **Run actions** from a handler with [`Opledger::run`] (or [`Opledger::submit`] and
//!    [`Opledger::wait`]) and answer with the outcome, or hand the user a one-time button
//!    ([`Opledger::button`]).
//!
//! ```no_run
//! use std::time::Duration;
//! use opledger::{effect_fn, Action, Bot, CallOutcome, Opledger, Submit, Success, Updates};
//!
//! # async fn example() -> Result<(), opledger::Error> {
//! let ledger = Opledger::builder()
//!     .ledger("sqlite://bot.db")
//!     .bot(Bot::polling("shop", "123456:token").handlers(Updates::Unhandled))
//!     .action(
//!         Action::new("coupon", "shop")
//!             .params(["campaign"])
//!             .key("{user_id}:{campaign}"),
//!     )
//!     .effector(
//!         "coupon",
//!         effect_fn(|request| async move {
//!             // Issue the coupon under `request.operation_id`, the idempotency key.
//!             CallOutcome::Succeeded(Success {
//!                 external_id: Some(format!("C-{}", &request.operation_id[..8])),
//!                 ..Success::default()
//!             })
//!         })
//!         .honours_idempotency_key(),
//!     )
//!     .open()
//!     .await?;
//! let running = ledger.start().await?;
//!
//! // In a handler: at most one coupon per user and campaign, however often this runs.
//! let outcome = ledger
//!     .run(
//!         Submit::new("shop", "coupon").param("campaign", "spring").user(42),
//!         Duration::from_secs(10),
//!     )
//!     .await?;
//! println!("coupon {:?}", outcome.operation.external_id);
//!
//! running.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! # What is guaranteed
//!
//! - **An update is committed before it is acknowledged** (the webhook's 200, the long-poll
//!   offset) and before any handler sees it; a duplicate delivery is recorded as one and goes
//!   nowhere.
//! - **Handlers get each update once it is recorded**, per chat in `update_id` order with one
//!   in flight, until they say they are done with it. An update whose handler did not finish
//!   (a crash, a timeout, an error) is handed over again, with a higher attempt number: a
//!   handler can run twice for one update, which is why its effects go through actions.
//! - **An action runs at most once per business key.** Its effect is recorded before it is
//!   called; an unknown outcome is retried only when the effect honours the idempotency key,
//!   else looked up, else left to an operator (`opledger reconcile`). The action's reply, when
//!   it has a chat, is sent at most once.
//! - **Everything is in one gapless, hash-chained ledger**, readable with the `opledger` CLI.
//!
//! # Mounting the routes
//!
//! [`Opledger::router`] is an `axum::Router` with the webhook (`/telegram/{bot}/webhook`),
//! `/v1`, `/metrics`, `/healthz` and `/readyz`; merge it into the bot's own router and serve
//! both, or let [`Opledger::serve`] serve it with the service's limits and graceful shutdown.

#![deny(missing_docs)]

mod declare;
mod effect;
mod error;
mod handlers;
mod ledger;
#[cfg(feature = "teloxide")]
pub mod teloxide;

pub use declare::{Action, Bot, Updates};
pub use effect::{EffectFn, effect_fn};
pub use error::Error;
pub use handlers::{Handed, HandedUpdates};
pub use ledger::{Builder, Operation, Opledger, Outcome, Running, Submit};
pub use opledger_server::intake::Started;
pub use opledger_server::{Recorded, Route};
pub use opledger_worker::{CallOutcome, EffectRequest, Effector, LookupOutcome, Success};
