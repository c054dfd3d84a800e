//! Long polling (`mode = "poll"`): `getUpdates` in a loop. Each update is recorded durably before
//! the next `getUpdates` moves the offset past it, so a crash re-reads the batch and intake's
//! dedup recognises what was already recorded. On shutdown the last batch is confirmed.

use std::sync::Arc;
use std::time::Duration;

use opledger_config::BotConfig;
use opledger_domain::text::Redactor;
use opledger_telegram::{BotApi, BotApiError};
use tokio::sync::watch;

use crate::app::{AppState, allowed_updates};
use crate::intake::Recorded;

/// The most updates one `getUpdates` returns (Telegram's limit).
const BATCH: u8 = 100;
/// The longest wait between failed attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// One bot's polling loop.
#[derive(Debug)]
pub(crate) struct Poller {
    bot: String,
    api: BotApi,
    timeout_secs: u32,
    state: Arc<AppState>,
}

impl Poller {
    /// The poller of `bot`, scrubbing the secrets `redactor` knows from Telegram's answers.
    pub(crate) fn new(
        bot: &BotConfig,
        redactor: &Redactor,
        state: Arc<AppState>,
    ) -> Result<Self, BotApiError> {
        let timeout_secs = u32::try_from(bot.poll_timeout.as_secs()).unwrap_or(50);
        let api = BotApi::new(&bot.api_base_url, bot.token.clone(), BotApi::http_client()?)?
            .redacting(redactor);
        Ok(Self {
            bot: bot.name.clone(),
            api,
            timeout_secs,
            state,
        })
    }

    pub(crate) async fn run(self, mut stop: watch::Receiver<bool>) {
        let bot = self.bot.as_str();
        let allowed = allowed_updates();
        let mut offset: Option<i64> = None;
        let mut backoff = Duration::from_secs(1);
        'polling: while !*stop.borrow() {
            let batch = tokio::select! {
                _ = stop.changed() => break 'polling,
                batch = self.api.get_updates(offset, BATCH, self.timeout_secs, Some(&allowed)) => batch,
            };
            let updates = match batch {
                Ok(updates) => {
                    backoff = Duration::from_secs(1);
                    updates
                }
                Err(error) => {
                    match &error {
                        BotApiError::Conflict { .. } => tracing::error!(
                            bot, %error,
                            "Telegram refused getUpdates: a webhook is set for this bot or another \
                             process polls it; delete the webhook or stop the other poller"
                        ),
                        BotApiError::Unauthorized { .. } => tracing::error!(
                            bot, %error, "Telegram refused the bot token; check the bot's token_env"
                        ),
                        _ => tracing::warn!(bot, %error, "getUpdates failed; retrying"),
                    }
                    if wait(&mut stop, backoff).await {
                        break 'polling;
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    continue;
                }
            };
            for raw in updates {
                // An update is never skipped: storage failures are retried until it is recorded
                // (or the process stops, and Telegram delivers it again).
                let mut retry = Duration::from_millis(100);
                let update_id = loop {
                    match self.state.intake.record(bot, &raw.bytes).await {
                        Ok(receipt) => {
                            self.state.count(&receipt.recorded);
                            let click =
                                crate::replies::callback_to_answer(&receipt).map(str::to_owned);
                            let update_id = receipt.recorded.update_id();
                            self.answer(receipt.recorded, click);
                            break update_id;
                        }
                        Err(error) => {
                            tracing::warn!(bot, %error, "a polled update was not recorded; retrying");
                            if wait(&mut stop, retry).await {
                                break 'polling;
                            }
                            retry = (retry * 2).min(MAX_BACKOFF);
                        }
                    }
                };
                // A quarantined body has no id: the next update's id moves the offset past it.
                if let Some(update_id) = update_id {
                    offset = Some(offset.map_or(update_id + 1, |o| o.max(update_id + 1)));
                }
            }
        }
        // Confirm what was recorded, so that a restart does not fetch it again.
        if let Some(offset) = offset
            && let Err(error) = self.api.get_updates(Some(offset), 1, 0, None).await
        {
            tracing::warn!(bot, %error, "could not confirm the last polled batch; it will be fetched and deduplicated again");
        }
    }

    /// Answers an update in the background, best effort (a pure answer is recomputed if the
    /// user asks again): a button click with `answerCallbackQuery` (the answer as its notice,
    /// which stops the button's progress indicator), anything else with `sendMessage` when it
    /// has an answer. The loop does not wait: a `/status` answer may wait for its read model.
    fn answer(&self, recorded: Recorded, click: Option<String>) {
        let (state, api, bot) = (self.state.clone(), self.api.clone(), self.bot.clone());
        tokio::spawn(async move {
            let answer = state.answer(&bot, &recorded).await;
            match click {
                Some(id) => {
                    let text = answer.map(|a| a.text);
                    if let Err(error) = api.answer_callback_query(&id, text.as_deref()).await {
                        tracing::warn!(bot, %error, "could not answer a button click");
                    }
                }
                None => {
                    if let Some(answer) = answer
                        && let Err(error) = api
                            .send_message_with(
                                answer.chat_id,
                                &answer.text,
                                answer.keyboard.as_ref(),
                            )
                            .await
                    {
                        tracing::warn!(bot, %error, "could not send an answer");
                    }
                }
            }
        });
    }
}

/// Sleeps for `duration` unless asked to stop; `true` means stop.
async fn wait(stop: &mut watch::Receiver<bool>, duration: Duration) -> bool {
    tokio::select! {
        _ = stop.changed() => true,
        () = tokio::time::sleep(duration) => *stop.borrow(),
    }
}
