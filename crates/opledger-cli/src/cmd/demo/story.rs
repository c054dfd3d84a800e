//! The demo's story, step by step: what Ana, Telegram and the shop do, then what the ledger and
//! the fakes say happened. Every `✓` line is a claim [`checks`](super::checks) derived from
//! what was just read; a claim the data contradicts ends the demo with an error instead.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use opledger_projections::operation_status::{self, Filter, OperationStatusRow};
use opledger_server::reconcile;
use opledger_server::{Clock, SystemClock};
use opledger_store::{AnyStore, EventStore, StreamId};
use serde_json::{Value, json};

use super::checks::{self, Fact, Operation, Tally, Unexpected};
use super::shop::FakeShop;
use super::telegram::{self, Delivered, FakeTelegram, Webhook};
use super::{USER, USER_NAME};
use crate::cmd::audit::Audit;
use crate::cmd::reconcile::Reconcile;
use crate::cmd::timeline::Timeline;
use crate::output::escape;

/// How long an operation may take to reach the state a step waits for.
const PATIENCE: Duration = Duration::from_secs(15);

/// The first update id the demo's Telegram uses; each delivery takes the next.
const FIRST_UPDATE: i64 = 1001;

/// Everything the story acts on and reads from.
#[derive(Debug)]
pub(super) struct World<'a> {
    /// The ledger's URL, for the read commands the story runs as a user would.
    pub(super) url: &'a str,
    pub(super) store: &'a AnyStore,
    pub(super) telegram: &'a FakeTelegram,
    pub(super) shop: &'a FakeShop,
    pub(super) webhook: Webhook,
    /// `http://…/v1/buttons` on the service.
    pub(super) buttons_url: String,
    /// The bot handlers' token for the operations API.
    pub(super) client_token: String,
    /// The effector's timeout, as configured.
    pub(super) shop_timeout: Duration,
}

/// What the story found, for the closing lines.
#[derive(Debug)]
pub(super) struct Told {
    pub(super) tally: Tally,
    /// Updates the demo's Telegram delivered, repeats included.
    pub(super) deliveries: usize,
    pub(super) events: u64,
    /// The operation waiting for a person.
    pub(super) waiting: String,
}

/// A line for the reader; text read from the ledger or the fakes cannot steer the terminal.
fn say(line: impl std::fmt::Display) {
    crate::cmd::serve::say(format_args!("{}", escape(&line.to_string())));
}

/// Tells the story; `Err` names the step and the claim the data contradicted.
pub(super) async fn tell(world: &World<'_>) -> anyhow::Result<Told> {
    let mut updates = FIRST_UPDATE..;
    let mut next = move || updates.next().expect("update ids do not run out");
    let first = request(world, next())
        .await
        .context("step 1, a coupon request")?;
    redelivery(world, &first)
        .await
        .context("step 2, Telegram delivers the same update again")?;
    double_click(world, next(), next())
        .await
        .context("step 3, a double click on a one-time button")?;
    let waiting = timeout(world, next())
        .await
        .context("step 4, a call to the shop that times out")?;
    show(world, next(), &first.started.operation_id, &waiting)
        .await
        .context("step 5, what everyone sees")?;
    let operations = all_operations(world.store).await?;
    let tally =
        checks::at_most_once(&operations, &world.shop.coupons()).context("the closing count")?;
    let events = world.store.head().await?.position;
    Ok(Told {
        tally,
        deliveries: world.telegram.deliveries(),
        events,
        waiting,
    })
}

/// The first step's update and what it started.
#[derive(Debug)]
struct First {
    update: Vec<u8>,
    update_id: i64,
    started: checks::Started,
}

async fn request(world: &World<'_>, update_id: i64) -> anyhow::Result<First> {
    say(format_args!(
        "1. {USER_NAME} sends \"/coupon spring\" to the shop's bot."
    ));
    let update = telegram::message(update_id, USER, "/coupon spring");
    let delivered = world.telegram.deliver(&world.webhook, &update).await?;
    checks::acknowledged("the update", delivered.status.as_u16())?;
    let started = checks::started(&facts(world.store, &update_stream(update_id)).await?)?;
    say(format_args!(
        "   Telegram delivers it to the webhook, which answers 200 once it is recorded (ledger \
         position {}): operation {} started.",
        started.position, started.operation_id
    ));
    settled(world, &started, "spring").await?;
    Ok(First {
        update,
        update_id,
        started,
    })
}

/// Waits for the operation to be confirmed and replied to, then checks both with the shop
/// and Telegram.
async fn settled(
    world: &World<'_>,
    started: &checks::Started,
    campaign: &str,
) -> anyhow::Result<()> {
    let row = wait_for(
        world.store,
        &started.operation_id,
        "confirmed and replied to",
        |row| row.status == "confirmed" && row.reply == "sent",
    )
    .await?;
    let coupons = world.shop.coupons();
    let coupon = checks::issued_once(&started.operation_id, &coupons)?;
    say(format_args!(
        "   The worker called the shop with the operation id as Idempotency-Key and recorded \
         the answer."
    ));
    say(format_args!(
        "   ✓ the shop issued 1 coupon for {}: {} ({}), and the operation is {}",
        row.business_key, coupon.code, coupon.id, row.status
    ));
    let received = world.telegram.received();
    let reply = checks::replied_once(USER, &coupon.code, &received)?;
    say(format_args!(
        "   ✓ the bot replied to {USER_NAME} once: \"{}\" ({campaign} campaign)",
        reply.text.as_deref().unwrap_or_default()
    ));
    Ok(())
}

async fn redelivery(world: &World<'_>, first: &First) -> anyhow::Result<()> {
    say(format_args!(""));
    say(format_args!(
        "2. Telegram missed the answer (say, a network blip) and delivers update {} again, \
         byte for byte.",
        first.update_id
    ));
    let delivered = world
        .telegram
        .deliver(&world.webhook, &first.update)
        .await?;
    checks::acknowledged("the repeated update", delivered.status.as_u16())?;
    let stream = update_stream(first.update_id);
    let update = facts(world.store, &stream).await?;
    let duplicate = checks::duplicate_noted(&update)?;
    let operations = all_operations(world.store).await?;
    checks::operations(&operations, 1)?;
    let coupons = world.shop.coupons();
    let coupon = checks::issued_once(&first.started.operation_id, &coupons)?;
    say(format_args!(
        "   ✓ the ledger noted {} ({stream}@{}, position {}) and started nothing: still 1 \
         operation, and the shop still counts 1 coupon for it ({})",
        duplicate.event_type, duplicate.version, duplicate.position, coupon.code
    ));
    Ok(())
}

async fn double_click(world: &World<'_>, first: i64, second: i64) -> anyhow::Result<()> {
    say(format_args!(""));
    say(format_args!(
        "3. The bot's handler asks opledger for a one-time button \"autumn coupon\" \
         (POST /v1/buttons) and shows it to {USER_NAME}, who double-clicks it."
    ));
    let token = issue_button(world, "autumn").await?;
    let clicks = [
        telegram::click(first, USER, &token),
        telegram::click(second, USER, &token),
    ];
    let (a, b) = tokio::join!(
        world.telegram.deliver(&world.webhook, &clicks[0]),
        world.telegram.deliver(&world.webhook, &clicks[1]),
    );
    let answers = BTreeMap::from([(first, a?), (second, b?)]);
    for delivered in answers.values() {
        checks::acknowledged("a click", delivered.status.as_u16())?;
    }
    say(format_args!(
        "   Telegram delivers both clicks at once (updates {first} and {second}); both are \
         answered 200."
    ));
    let clicked = checks::one_click_counted(&facts(world.store, &format!("cb-{token}")).await?)?;
    let notice = answers
        .get(&clicked.refused)
        .and_then(|d: &Delivered| d.answer.as_ref())
        .and_then(|a| a.text.as_deref())
        .ok_or_else(|| Unexpected("the refused click was answered without a notice".into()))?;
    let started = checks::started(&facts(world.store, &update_stream(clicked.counted)).await?)?;
    let operations = all_operations(world.store).await?;
    checks::operations(&operations, 2)?;
    say(format_args!(
        "   ✓ 1 operation from 2 clicks: update {} consumed the button's token and started \
         operation {}; update {} was refused ({}) and {USER_NAME} saw \"{notice}\"",
        clicked.counted, started.operation_id, clicked.refused, clicked.reason
    ));
    settled(world, &started, "autumn").await
}

/// Issues a one-time button for [`USER`] through the operations API, as a bot's handler does;
/// returns its `callback_data`.
async fn issue_button(world: &World<'_>, campaign: &str) -> anyhow::Result<String> {
    let response = reqwest::Client::new()
        .post(&world.buttons_url)
        .bearer_auth(&world.client_token)
        .json(&json!({
            "action": "coupon",
            "params": {"campaign": campaign},
            "user_id": USER,
            "chat_id": USER,
        }))
        .send()
        .await
        .context("POST /v1/buttons did not answer")?;
    let status = response.status();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    match body.get("callback_data").and_then(Value::as_str) {
        Some(token) if status == reqwest::StatusCode::CREATED => Ok(token.to_owned()),
        _ => Err(Unexpected(format!("POST /v1/buttons answered {status}: {body}")).into()),
    }
}

async fn timeout(world: &World<'_>, update_id: i64) -> anyhow::Result<String> {
    say(format_args!(""));
    say(format_args!(
        "4. {USER_NAME} sends \"/coupon flash\". This time the shop issues the coupon but \
         answers too late: the worker gives up after {} ms.",
        world.shop_timeout.as_millis()
    ));
    world.shop.stall_next();
    let update = telegram::message(update_id, USER, "/coupon flash");
    let delivered = world.telegram.deliver(&world.webhook, &update).await?;
    checks::acknowledged("the update", delivered.status.as_u16())?;
    let started = checks::started(&facts(world.store, &update_stream(update_id)).await?)?;
    let row = wait_for(
        world.store,
        &started.operation_id,
        "marked for reconciliation",
        |row| row.status == "needs_reconciliation",
    )
    .await?;
    let queue = reconcile::list(world.store.reader(), SystemClock.now(), 100).await?;
    let waiting = checks::waiting_for_a_person(&started.operation_id, &queue)?;
    say(format_args!(
        "   Did the shop issue a coupon? opledger cannot know. The shop does not honour the \
         Idempotency-Key and offers no lookup, so calling again could issue a second coupon: \
         the worker does not call again."
    ));
    say(format_args!(
        "   ✓ operation {} ({}) needs reconciliation: {}",
        row.operation_id,
        row.business_key,
        waiting.reason.as_deref().unwrap_or("(no reason recorded)")
    ));
    let coupons = world.shop.coupons();
    let coupon = checks::issued_once(&started.operation_id, &coupons)?;
    checks::not_replied(&coupon.code, &world.telegram.received())?;
    say(format_args!(
        "   ✓ it is the one operation in the reconciliation queue, for a person to settle; \
         {USER_NAME} was told nothing yet"
    ));
    Ok(started.operation_id)
}

async fn show(world: &World<'_>, update_id: i64, first: &str, waiting: &str) -> anyhow::Result<()> {
    say(format_args!(""));
    say(format_args!(
        "5. {USER_NAME} sends \"/status\". What Telegram received for her, in the webhook's \
         answer:"
    ));
    let update = telegram::message(update_id, USER, "/status");
    let delivered = world.telegram.deliver(&world.webhook, &update).await?;
    checks::acknowledged("/status", delivered.status.as_u16())?;
    let operations = all_operations(world.store).await?;
    let text = checks::status_answer(delivered.answer.as_ref(), &operations)?;
    for line in text.lines() {
        say(format_args!("   | {line}"));
    }
    say(format_args!(""));
    for (title, operation) in [
        (
            "The ledger's history of the first coupon (the redelivery is noted, nothing repeated):",
            first,
        ),
        ("And of the coupon whose answer was lost:", waiting),
    ] {
        say(title);
        run(
            &format!("opledger timeline {operation}"),
            Timeline::of(operation.to_owned()).run(world.url),
        )
        .await?;
        say(format_args!(""));
    }
    run(
        "opledger reconcile list",
        Reconcile::List {
            limit: 100,
            json: false,
        }
        .run(world.url),
    )
    .await?;
    say(format_args!(""));
    say("The shop's own records, what it actually issued:");
    for coupon in world.shop.coupons() {
        say(format_args!(
            "   {}  {}  for {} (Idempotency-Key {}){}",
            coupon.id,
            coupon.code,
            coupon.business_key,
            coupon.idempotency_key,
            if coupon.answered {
                ""
            } else {
                ", answered too late"
            }
        ));
    }
    say(format_args!(""));
    run("opledger audit verify", Audit::verify().run(world.url)).await
}

/// Runs one of opledger's read commands as a user would, after showing its command line.
async fn run(
    command: &str,
    ran: impl std::future::Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<()> {
    say(format_args!("$ {command}"));
    ran.await.with_context(|| format!("`{command}` failed"))
}

fn update_stream(update_id: i64) -> String {
    format!("update-{}-{update_id}", super::BOT)
}

/// A stream's events, as the checks read them.
async fn facts(store: &AnyStore, stream: &str) -> anyhow::Result<Vec<Fact>> {
    let events = store
        .read_stream(&StreamId::new(stream)?, 1, 1000)
        .await
        .with_context(|| format!("cannot read the stream {stream}"))?;
    Ok(events.iter().map(Fact::from_recorded).collect())
}

/// Every operation of the ledger, from the `operation_status` read model.
async fn all_operations(store: &AnyStore) -> anyhow::Result<Vec<Operation>> {
    let filter = Filter {
        limit: 1000,
        ..Filter::default()
    };
    let rows = operation_status::list(store.reader(), &filter).await?;
    Ok(rows.iter().map(Operation::from).collect())
}

/// Waits until the operation's row satisfies `reached`; fails after [`PATIENCE`] naming the
/// state it is in.
async fn wait_for(
    store: &AnyStore,
    operation_id: &str,
    what: &str,
    reached: impl Fn(&OperationStatusRow) -> bool,
) -> anyhow::Result<OperationStatusRow> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let row = operation_status::get(store.reader(), operation_id).await?;
        match row {
            Some(row) if reached(&row) => return Ok(row),
            row if Instant::now() >= deadline => {
                let state = row.map_or_else(
                    || "not in operation_status".to_owned(),
                    |row| format!("{} (reply {})", row.status, row.reply),
                );
                return Err(Unexpected(format!(
                    "operation {operation_id} was not {what} within {} s; it is {state}",
                    PATIENCE.as_secs()
                ))
                .into());
            }
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}
