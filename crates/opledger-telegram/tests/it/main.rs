//! opledger-telegram's integration tests, in one test binary: every update fixture through the
//! envelope, the Bot API client against small scripted servers, and the client against the
//! project's fake Bot API.

mod bot_api;
mod fake_api;
mod fixtures;

#[path = "../../../../tests/it/support/fake_telegram.rs"]
mod fake_telegram;
