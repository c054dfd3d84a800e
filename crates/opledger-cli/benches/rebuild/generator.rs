//! The ledger generator of the rebuild benchmark: realistic operation lifecycles, decided by the
//! domain's own `decide` functions and appended through the store in big multi-stream calls.
//!
//! A simulated clock advances one second per tick. Each tick, about `arrivals` Telegram updates
//! arrive from many users and chats of two bots (built as real update bodies and read with
//! `parse_update`, like the intake does): action commands start an operation (`UpdateReceived`
//! on the delivery stream and `Received` on the operation's stream, one unit), join one that
//! exists (the same business key and parameters) or record a `KeyConflictRecorded` (the same key,
//! other parameters); `/status`, `/help` and plain messages are recorded alone; a few bodies are
//! quarantined and a few updates are delivered again later (`DuplicateDeliveryObserved`). Due
//! worker steps move each operation on, a few ticks apart: `Claimed` (half the time together
//! with `ExternalCallSent`, as when the service honours the key), `ExternalCallSent`, then
//! mostly `Confirmed`, some `RetryScheduled` (claimed again when due, `Failed` once the attempts
//! are used up), some `Failed`, some `MarkedForReconciliation` (resolved by an operator minutes
//! later: `Reconciled`, a few of them retried), then the reply (`ReplyStarted`, then mostly
//! `ReplySent`, a few `ReplyRetryScheduled` or `ReplyOutcomeUnknown`). Every event carries its
//! real causation (the update, the worker, the operator, the intake) and correlation.
//!
//! A tick's units are shuffled, so streams interleave in the global order as they do in
//! production, and appended in calls of at most `call_events` events, one call after the other
//! (the next tick is decided while the store commits the previous one). Exactly `target` events
//! are written: a step that would overshoot is left undone, and the last events are `/help`
//! updates.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Instant;

use chrono::{DateTime, TimeDelta, Utc};
use opledger_domain::delivery::{self, Delivery, DeliveryCommand, DeliveryEvent};
use opledger_domain::operation::{
    self, Confirmed, ConfirmedVia, OperationCommand, OperationEvent, Received, ReconcileOutcome,
    Reconciled,
};
use opledger_domain::quarantine::{BodyQuarantined, QuarantineEvent, quarantine_stream};
use opledger_domain::{
    Causation, DomainEvent, EventMetadata, Operation, OperationId, OperationLink, delivery_stream,
    fingerprint, operation_stream,
};
use opledger_ledger::{expected, request};
use opledger_store::{AnyStore, AppendRequest, EventStore, ExpectedVersion, StreamId};
use opledger_telegram::{Update, parse_update};

/// The bots updates arrive for.
const BOTS: [&str; 2] = ["shop", "tickets"];
/// The worker ids that claim operations.
const WORKERS: [&str; 4] = ["web-1", "web-2", "worker-1", "worker-2"];
/// The operators who resolve reconciliations.
const OPERATORS: [&str; 3] = ["alice", "bob", "carol"];
const CAMPAIGNS: [&str; 6] = ["spring", "summer", "autumn", "winter", "vip", "welcome"];
const REFUND_REASONS: [&str; 4] = ["damaged", "late delivery", "wrong size", "changed my mind"];
const SLOTS: [&str; 4] = ["09:00", "11:00", "14:00", "16:00"];
/// How long a delivery counts as the same update (Telegram's week).
const RETENTION_DAYS: i64 = 7;

/// The generator's settings.
#[derive(Clone, Debug)]
pub(crate) struct Options {
    /// Exactly this many events are written.
    pub(crate) target: u64,
    /// Updates arriving per tick (one simulated second), on average.
    pub(crate) arrivals: u64,
    /// The most events in one append call.
    pub(crate) call_events: usize,
    /// Seeds the random choices: the same seed writes the same events.
    pub(crate) seed: u64,
}

/// What was written.
#[derive(Debug, Default)]
pub(crate) struct Generated {
    pub(crate) events: u64,
    pub(crate) updates: u64,
    pub(crate) operations: u64,
    pub(crate) calls: u64,
    pub(crate) seconds: f64,
    /// Events per type.
    pub(crate) types: BTreeMap<&'static str, u64>,
}

/// A small, fast, reproducible random source (SplitMix64): the benchmark needs variety, not
/// cryptography, and the same seed must give the same ledger.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    /// True with probability `p`.
    fn chance(&mut self, p: f64) -> bool {
        ((self.next() >> 11) as f64) / ((1u64 << 53) as f64) < p
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[(self.next() % items.len() as u64) as usize]
    }
}

/// An action of the simulated bots: its name, bot and parameters.
#[derive(Clone, Copy, Debug)]
enum Action {
    /// `/coupon <campaign>` on `shop`, key `{campaign}:{user_id}`.
    Coupon,
    /// `/refund <order> <reason>` on `shop`, key `{order}`: asking again with another reason is
    /// a key conflict.
    Refund,
    /// `/book <date> <slot>` on `tickets`, key `{date}:{slot}:{user_id}`.
    Book,
}

impl Action {
    fn name(self) -> &'static str {
        match self {
            Action::Coupon => "coupon",
            Action::Refund => "refund",
            Action::Book => "book",
        }
    }

    fn bot(self) -> &'static str {
        match self {
            Action::Coupon | Action::Refund => BOTS[0],
            Action::Book => BOTS[1],
        }
    }

    fn max_attempts(self) -> u32 {
        match self {
            Action::Coupon => 5,
            Action::Refund => 3,
            Action::Book => 4,
        }
    }

    /// What the service answers on success: the fields a reply uses.
    fn result(self, n: u64) -> (String, BTreeMap<String, serde_json::Value>) {
        let (id, fields) = match self {
            Action::Coupon => (
                format!("cpn_{n}"),
                serde_json::json!({ "code": format!("SAVE-{:06X}", n % 0xff_ffff) }),
            ),
            Action::Refund => (
                format!("re_{n:08}"),
                serde_json::json!({ "amount": format!("{}.{:02}", 5 + n % 200, n % 100), "currency": "EUR" }),
            ),
            Action::Book => (
                format!("bk-{n}"),
                serde_json::json!({ "seat": format!("{}{}", (b'A' + (n % 12) as u8) as char, 1 + n % 30) }),
            ),
        };
        let fields = fields
            .as_object()
            .map(|o| o.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default();
        (id, fields)
    }
}

/// One operation as the simulation knows it.
struct Op {
    stream: StreamId,
    state: Operation,
    action: Action,
    /// The update that started it (the correlation of the worker's events).
    bot: &'static str,
    update_id: i64,
    /// The worker holding the current claim.
    worker: &'static str,
}

/// Something due at a tick.
#[derive(Clone, Debug)]
enum Step {
    /// Claim the operation (and, half the time, record the call in the same commit).
    Claim(usize),
    /// Record the call as sent.
    Send(usize),
    /// The service answered (or did not).
    Outcome(usize),
    /// An operator resolves the reconciliation.
    Reconcile(usize),
    StartReply(usize),
    FinishReply(usize),
    /// Telegram delivers an update again.
    Redeliver {
        stream: StreamId,
        bot: &'static str,
        update_id: i64,
        delivery: Delivery,
        command: Box<DeliveryCommand>,
    },
}

impl Step {
    fn operation(&self) -> Option<usize> {
        match self {
            Step::Claim(op)
            | Step::Send(op)
            | Step::Outcome(op)
            | Step::Reconcile(op)
            | Step::StartReply(op)
            | Step::FinishReply(op) => Some(*op),
            Step::Redeliver { .. } => None,
        }
    }
}

/// The appends of one decision that must commit together (an update's delivery and operation).
type Unit = Vec<AppendRequest>;

/// The simulation.
struct Sim {
    rng: Rng,
    start: DateTime<Utc>,
    tick: u64,
    remaining: u64,
    users: u64,
    groups: u64,
    next_update: [i64; 2],
    next_order: u64,
    next_result: u64,
    /// Recent refund requests `(order, reason)`, which some users ask for again.
    recent_refunds: Vec<(String, &'static str)>,
    ops: Vec<Op>,
    by_stream: HashMap<String, usize>,
    schedule: BTreeMap<u64, Vec<Step>>,
    /// Streams already written by this tick's units: a call names each stream once.
    touched: HashSet<String>,
    units: Vec<(Unit, u64)>,
    generated: Generated,
}

impl Sim {
    fn new(options: &Options) -> Self {
        Self {
            rng: Rng(options.seed),
            start: DateTime::parse_from_rfc3339("2026-01-05T09:00:00Z")
                .expect("a valid time")
                .with_timezone(&Utc),
            tick: 0,
            remaining: options.target,
            // Many users and chats: about one user per 25 events, a user per 50 in groups.
            users: (options.target / 25).max(500),
            groups: (options.target / 2_000).max(20),
            next_update: [700_000_000, 900_000_000],
            next_order: 10_000,
            next_result: 1,
            recent_refunds: Vec::new(),
            ops: Vec::new(),
            by_stream: HashMap::new(),
            schedule: BTreeMap::new(),
            touched: HashSet::new(),
            units: Vec::new(),
            generated: Generated::default(),
        }
    }

    fn now(&self) -> DateTime<Utc> {
        self.start + TimeDelta::seconds(self.tick as i64)
    }

    fn at(&mut self, ticks: u64, step: Step) {
        self.schedule
            .entry(self.tick + ticks.max(1))
            .or_default()
            .push(step);
    }

    /// Keeps `unit` for this tick if its streams are free and its events fit; `false` if not.
    fn push(&mut self, unit: Unit) -> bool {
        let events: u64 = unit.iter().map(|r| r.events.len() as u64).sum();
        if events > self.remaining
            || unit
                .iter()
                .any(|r| self.touched.contains(r.stream.as_str()))
        {
            return false;
        }
        for request in &unit {
            self.touched.insert(request.stream.as_str().to_owned());
            for event in &request.events {
                let name = type_name(&event.event_type);
                *self.generated.types.entry(name).or_default() += 1;
            }
        }
        self.remaining -= events;
        self.units.push((unit, events));
        true
    }

    /// Decides one tick: due steps first, then new updates. Returns its units, shuffled.
    fn tick(&mut self, arrivals: u64) -> Vec<(Unit, u64)> {
        self.touched.clear();
        let due: Vec<Step> = self
            .schedule
            .remove(&self.tick)
            .into_iter()
            .flatten()
            .collect();
        for step in due {
            if self.remaining == 0 {
                break;
            }
            let busy = step
                .operation()
                .is_some_and(|op| self.touched.contains(self.ops[op].stream.as_str()));
            if busy {
                // A key conflict or join wrote to the stream this tick: one tick later.
                self.at(1, step);
                continue;
            }
            self.step(step);
        }
        let spread = arrivals / 3;
        let count = self.rng.range(arrivals - spread, arrivals + spread);
        for _ in 0..count {
            if self.remaining == 0 {
                break;
            }
            self.arrive();
        }
        let mut units = std::mem::take(&mut self.units);
        for i in (1..units.len()).rev() {
            let j = (self.rng.next() % (i as u64 + 1)) as usize;
            units.swap(i, j);
        }
        self.tick += 1;
        units
    }

    /// One arriving body: an update of some kind, or (rarely) something that is not an update.
    fn arrive(&mut self) {
        let roll = self.rng.next() % 1000;
        if self.remaining < 2 {
            // The ledger is full but for one event: a plain /help fills it.
            return self.plain_update(BOTS[0], "/help");
        }
        match roll {
            0..=699 => self.command(),
            700..=799 => {
                let bot = self.rng.pick(&BOTS);
                self.plain_update(bot, "/status");
            }
            800..=849 => {
                let bot = self.rng.pick(&BOTS);
                self.plain_update(bot, "/help");
            }
            850..=994 => {
                let bot = self.rng.pick(&BOTS);
                let text = self
                    .rng
                    .pick(&["thanks!", "hello", "where is my order?", "ok"]);
                self.plain_update(bot, text);
            }
            _ => self.quarantine(),
        }
    }

    /// A Telegram update body from a user in a chat, read back like the intake reads it.
    fn update(&mut self, bot: &'static str, text: &str) -> (Update, i64) {
        let which = usize::from(bot != BOTS[0]);
        self.next_update[which] += 1;
        let update_id = self.next_update[which];
        let user = 5_000_000 + self.rng.range(1, self.users) as i64;
        let (chat, kind) = if self.rng.chance(0.15) {
            (
                -1_001_000_000 - self.rng.range(1, self.groups) as i64,
                "supergroup",
            )
        } else {
            (user, "private")
        };
        let date = self.now().timestamp() - self.rng.range(0, 2) as i64;
        let mut message = serde_json::json!({
            "message_id": update_id % 100_000 + 1,
            "date": date,
            "chat": { "id": chat, "type": kind },
            "from": { "id": user, "is_bot": false, "first_name": "User", "language_code": "en" },
            "text": text,
        });
        if let Some(length) = text
            .starts_with('/')
            .then(|| text.split_whitespace().next().map_or(0, str::len))
        {
            message["entities"] =
                serde_json::json!([{ "type": "bot_command", "offset": 0, "length": length }]);
        }
        let body = serde_json::json!({ "update_id": update_id, "message": message });
        let raw = serde_json::to_vec(&body).expect("JSON");
        let update = parse_update(&raw).expect("a generated update parses");
        (update, update_id)
    }

    /// The intake's metadata for an update's events.
    fn intake_metadata(bot: &str, update_id: i64, stream: &StreamId) -> EventMetadata {
        EventMetadata::caused_by(Causation::Update {
            bot: bot.to_owned(),
            update_id,
        })
        .correlated_with(stream.as_str())
    }

    /// The delivery's first receipt, decided by the domain, and a redelivery now and then.
    fn delivery(
        &mut self,
        bot: &'static str,
        update: &Update,
        operation: Option<OperationLink>,
    ) -> (AppendRequest, Delivery, Box<DeliveryCommand>, StreamId) {
        let stream = StreamId::new(delivery_stream(bot, update.update_id).expect("a stream id"))
            .expect("a stream id");
        let command = Box::new(DeliveryCommand::RecordUpdate {
            bot: bot.to_owned(),
            update_id: update.update_id,
            kind: update.kind.as_str().into_owned(),
            digest: update.digest.clone(),
            size: update.size as u64,
            chat_id: update.chat_id,
            user_id: update.user_id,
            message_date: update.message_date,
            received_at: self.now(),
            operation,
            retention: TimeDelta::days(RETENTION_DAYS),
            raw_body: None,
        });
        let events = delivery::decide(&Delivery::default(), &command, self.now())
            .expect("a first receipt is accepted");
        let metadata = Self::intake_metadata(bot, update.update_id, &stream);
        let append = request(
            stream.clone(),
            ExpectedVersion::NoStream,
            &events,
            &metadata,
        )
        .expect("encode a delivery");
        (append, Delivery::replay(&events), command, stream)
    }

    /// Schedules Telegram delivering the update again, for a few updates.
    fn maybe_redeliver(
        &mut self,
        bot: &'static str,
        update_id: i64,
        stream: StreamId,
        delivery: Delivery,
        command: Box<DeliveryCommand>,
    ) {
        if self.rng.chance(0.015) {
            let later = self.rng.range(1, 20);
            self.at(
                later,
                Step::Redeliver {
                    stream,
                    bot,
                    update_id,
                    delivery,
                    command,
                },
            );
        }
    }

    /// An update that asks for no action: recorded alone.
    fn plain_update(&mut self, bot: &'static str, text: &str) {
        let (update, update_id) = self.update(bot, text);
        let (append, delivery, command, stream) = self.delivery(bot, &update, None);
        if self.push(vec![append]) {
            self.generated.updates += 1;
            self.maybe_redeliver(bot, update_id, stream, delivery, command);
        }
    }

    /// An authenticated body that is not an update: its digest and size go to quarantine.
    fn quarantine(&mut self) {
        let bot = self.rng.pick(&BOTS);
        let body: &[u8] = self.rng.pick(&[
            b"{\"ok\":true}".as_slice(),
            b"not json at all".as_slice(),
            b"[1,2,3]".as_slice(),
        ]);
        let Err(quarantine) = parse_update(body) else {
            unreachable!("these bodies are not updates");
        };
        let event: QuarantineEvent = BodyQuarantined {
            reason: quarantine.reason.as_str().to_owned(),
            digest: quarantine.digest,
            size: quarantine.size as u64,
            received_at: self.now(),
        }
        .into();
        let metadata = EventMetadata::caused_by(Causation::System {
            component: "intake".to_owned(),
        });
        let stream = StreamId::new(quarantine_stream(bot).expect("a stream id")).expect("valid");
        let note = request(stream, ExpectedVersion::Any, &[event], &metadata).expect("encode");
        if !self.push(vec![note]) {
            self.plain_update(bot, "/help");
        }
    }

    /// An action command: starts an operation, joins one, or records a key conflict.
    fn command(&mut self) {
        let action = match self.rng.next() % 100 {
            0..=54 => Action::Coupon,
            55..=79 => Action::Refund,
            _ => Action::Book,
        };
        let mut params = BTreeMap::new();
        let text = match action {
            Action::Coupon => {
                let campaign = self.rng.pick(&CAMPAIGNS);
                params.insert("campaign".to_owned(), campaign.to_owned());
                format!("/coupon {campaign}")
            }
            Action::Refund => {
                let again = !self.recent_refunds.is_empty() && self.rng.chance(0.08);
                let (order, reason) = if again {
                    let i = (self.rng.next() % self.recent_refunds.len() as u64) as usize;
                    let (order, reason) = self.recent_refunds[i].clone();
                    // Half ask again the same way (a join), half with another reason (a conflict).
                    let reason = if self.rng.chance(0.5) {
                        reason
                    } else {
                        self.rng.pick(&REFUND_REASONS)
                    };
                    (order, reason)
                } else {
                    self.next_order += 1 + self.rng.range(0, 3);
                    let order = format!("A{}", self.next_order);
                    let reason = self.rng.pick(&REFUND_REASONS);
                    if self.recent_refunds.len() < 512 {
                        self.recent_refunds.push((order.clone(), reason));
                    } else {
                        let i = (self.rng.next() % 512) as usize;
                        self.recent_refunds[i] = (order.clone(), reason);
                    }
                    (order, reason)
                };
                params.insert("order".to_owned(), order.clone());
                params.insert("reason".to_owned(), reason.to_owned());
                format!("/refund {order} {reason}")
            }
            Action::Book => {
                let date = format!("2026-02-{:02}", self.rng.range(1, 14));
                let slot = self.rng.pick(&SLOTS);
                params.insert("date".to_owned(), date.clone());
                params.insert("slot".to_owned(), slot.to_owned());
                format!("/book {date} {slot}")
            }
        };
        let bot = action.bot();
        let (update, update_id) = self.update(bot, &text);
        let key = match action {
            Action::Coupon => format!("{}:{}", params["campaign"], update.user_id.unwrap_or(0)),
            Action::Refund => params["order"].clone(),
            Action::Book => format!(
                "{}:{}:{}",
                params["date"],
                params["slot"],
                update.user_id.unwrap_or(0)
            ),
        };
        let stream_id = operation_stream(action.name(), &key).expect("a stream id");
        let operation_id = OperationId::new(action.name(), &key);
        let existing = self.by_stream.get(&stream_id).copied();
        if existing.is_some_and(|op| self.touched.contains(self.ops[op].stream.as_str())) {
            // Its stream is written this tick already: this user asks for their status instead.
            return self.plain_update(bot, "/status");
        }
        let state = existing.map_or_else(Operation::default, |op| self.ops[op].state.clone());
        let received = Received {
            operation_id,
            action: action.name().to_owned(),
            business_key: key,
            fingerprint: fingerprint(action.name(), &params),
            params,
            bot: bot.to_owned(),
            chat_id: update.chat_id,
            user_id: update.user_id,
            update_id,
            message_date: update.message_date,
            max_attempts: action.max_attempts(),
        };
        let events = operation::decide(&state, &OperationCommand::Receive(received), self.now())
            .expect("the domain accepts a request");
        let stream = StreamId::new(stream_id.clone()).expect("a stream id");
        let link = match events.first() {
            None => Some(true),
            Some(OperationEvent::Received(_)) => Some(false),
            _ => None,
        }
        .map(|joined| OperationLink {
            action: action.name().to_owned(),
            operation_id,
            stream: stream_id.clone(),
            joined,
        });
        let (delivery, delivery_state, command, delivery_id) = self.delivery(bot, &update, link);
        let mut unit = vec![delivery];
        if !events.is_empty() {
            let metadata = Self::intake_metadata(bot, update_id, &delivery_id);
            unit.push(
                request(stream.clone(), expected(state.version), &events, &metadata)
                    .expect("encode"),
            );
        }
        if !self.push(unit) {
            return self.plain_update(bot, "/help");
        }
        self.generated.updates += 1;
        self.maybe_redeliver(bot, update_id, delivery_id, delivery_state, command);
        let state = events.iter().fold(state, operation::evolve);
        match existing {
            Some(op) => self.ops[op].state = state,
            None => {
                let op = self.ops.len();
                self.ops.push(Op {
                    stream,
                    state,
                    action,
                    bot,
                    update_id,
                    worker: WORKERS[0],
                });
                self.by_stream.insert(stream_id, op);
                self.generated.operations += 1;
                let wait = self.rng.range(1, 3);
                self.at(wait, Step::Claim(op));
            }
        }
    }

    /// Decides `commands` on operation `op` and keeps the events as one unit caused by
    /// `causation`. `None` if they do not fit (the operation is left where it is).
    fn decide_op(
        &mut self,
        op: usize,
        commands: &[OperationCommand],
        causation: Causation,
    ) -> Option<Vec<OperationEvent>> {
        let now = self.now();
        let mut state = self.ops[op].state.clone();
        let mut events = Vec::new();
        for command in commands {
            let decided = operation::decide(&state, command, now).unwrap_or_else(|rejection| {
                panic!(
                    "the generator asked for a move the domain refuses: {} on {} ({:?}): {rejection}",
                    command.kind(),
                    self.ops[op].stream.as_str(),
                    state.status
                )
            });
            for event in decided {
                state = operation::evolve(state, &event);
                events.push(event);
            }
        }
        let correlation = match causation {
            Causation::Operator { .. } => None,
            _ => delivery_stream(self.ops[op].bot, self.ops[op].update_id).ok(),
        };
        let metadata = EventMetadata {
            causation,
            correlation,
        };
        let append = request(
            self.ops[op].stream.clone(),
            expected(self.ops[op].state.version),
            &events,
            &metadata,
        )
        .expect("encode");
        if !self.push(vec![append]) {
            return None;
        }
        self.ops[op].state = state;
        Some(events)
    }

    fn worker(&self, op: usize) -> Causation {
        Causation::Worker {
            worker: self.ops[op].worker.to_owned(),
        }
    }

    fn step(&mut self, step: Step) {
        let now = self.now();
        match step {
            Step::Claim(op) => {
                self.ops[op].worker = self.rng.pick(&WORKERS);
                let worker = self.ops[op].worker.to_owned();
                let together = self.rng.chance(0.5);
                let mut commands = vec![OperationCommand::Claim {
                    worker: worker.clone(),
                    lease_until: now + TimeDelta::seconds(60),
                }];
                if together {
                    commands.push(OperationCommand::RecordCallSent { worker });
                }
                if self.decide_op(op, &commands, self.worker(op)).is_some() {
                    if together {
                        let wait = self.rng.range(1, 4);
                        self.at(wait, Step::Outcome(op));
                    } else {
                        self.at(1, Step::Send(op));
                    }
                }
            }
            Step::Send(op) => {
                let worker = self.ops[op].worker.to_owned();
                let command = OperationCommand::RecordCallSent { worker };
                if self.decide_op(op, &[command], self.worker(op)).is_some() {
                    let wait = self.rng.range(1, 4);
                    self.at(wait, Step::Outcome(op));
                }
            }
            Step::Outcome(op) => self.outcome(op),
            Step::Reconcile(op) => {
                let operator = self.rng.pick(&OPERATORS);
                let roll = self.rng.next() % 10;
                let outcome = match roll {
                    0..=6 => ReconcileOutcome::Succeeded,
                    7 | 8 => ReconcileOutcome::Failed,
                    _ => ReconcileOutcome::Retry,
                };
                let n = self.next_result;
                self.next_result += 1;
                let command = OperationCommand::Reconcile(Reconciled {
                    outcome,
                    external_id: (outcome == ReconcileOutcome::Succeeded)
                        .then(|| self.ops[op].action.result(n).0),
                    operator: operator.to_owned(),
                    note: match outcome {
                        ReconcileOutcome::Succeeded => "found it in the shop's admin panel",
                        ReconcileOutcome::Failed => "the shop has no record of it",
                        ReconcileOutcome::Retry => "not done; the shop asks us to send it again",
                    }
                    .to_owned(),
                });
                let causation = Causation::Operator {
                    operator: operator.to_owned(),
                };
                if self.decide_op(op, &[command], causation).is_some() {
                    if outcome == ReconcileOutcome::Retry {
                        self.at(1, Step::Claim(op));
                    } else {
                        let wait = self.rng.range(1, 3);
                        self.at(wait, Step::StartReply(op));
                    }
                }
            }
            Step::StartReply(op) => {
                let command = OperationCommand::StartReply;
                if self.decide_op(op, &[command], self.worker(op)).is_some() {
                    let wait = self.rng.range(1, 2);
                    self.at(wait, Step::FinishReply(op));
                }
            }
            Step::FinishReply(op) => {
                let roll = self.rng.next() % 100;
                let retry = TimeDelta::seconds(self.rng.range(1, 30) as i64);
                let command = match roll {
                    0..=96 => OperationCommand::RecordReplySent {
                        message_id: Some(self.rng.range(1, 1_000_000) as i64),
                    },
                    97 | 98 => OperationCommand::RecordReplyFailed {
                        reason: "Telegram answered 429: Too Many Requests".to_owned(),
                        retry_at: Some(now + retry),
                    },
                    _ => OperationCommand::RecordReplyUnknown {
                        reason: "timed out waiting for Telegram".to_owned(),
                    },
                };
                let again = matches!(
                    command,
                    OperationCommand::RecordReplyFailed {
                        retry_at: Some(_),
                        ..
                    }
                );
                if self.decide_op(op, &[command], self.worker(op)).is_some() && again {
                    self.at(retry.num_seconds() as u64, Step::StartReply(op));
                }
            }
            Step::Redeliver {
                stream,
                bot,
                update_id,
                delivery,
                command,
            } => {
                let events =
                    delivery::decide(&delivery, &command, now).expect("a redelivery is accepted");
                debug_assert!(matches!(
                    events.first(),
                    Some(DeliveryEvent::DuplicateDeliveryObserved(_))
                ));
                let metadata = Self::intake_metadata(bot, update_id, &stream);
                let note =
                    request(stream, ExpectedVersion::Any, &events, &metadata).expect("encode");
                self.push(vec![note]);
            }
        }
    }

    /// The service's answer to a call, and what the worker records.
    fn outcome(&mut self, op: usize) {
        let now = self.now();
        let roll = self.rng.next() % 1000;
        let n = self.next_result;
        self.next_result += 1;
        let action = self.ops[op].action;
        let command = match roll {
            0..=849 => {
                let (external_id, result) = action.result(n);
                OperationCommand::Confirm(Confirmed {
                    response_digest: Some(fingerprint(
                        "response",
                        &BTreeMap::from([("id".to_owned(), external_id.clone())]),
                    )),
                    external_id: Some(external_id),
                    result,
                    via: if roll < 840 {
                        ConfirmedVia::Response
                    } else {
                        ConfirmedVia::Lookup
                    },
                })
            }
            850..=919 => {
                let claims = self.ops[op].state.claims;
                let backoff = 2u64.pow(claims.min(5)) + self.rng.range(0, 3);
                OperationCommand::ScheduleRetry {
                    at: now + TimeDelta::seconds(backoff as i64),
                    reason: self
                        .rng
                        .pick(&[
                            "HTTP 503 Service Unavailable",
                            "HTTP 429 Too Many Requests",
                            "connection reset after the request was sent",
                        ])
                        .to_owned(),
                    same_key: true,
                }
            }
            920..=959 => OperationCommand::Fail {
                reason: self
                    .rng
                    .pick(&[
                        "HTTP 422: the campaign is over",
                        "HTTP 409: already used by this customer",
                        "HTTP 400: unknown order",
                    ])
                    .to_owned(),
            },
            _ => OperationCommand::MarkForReconciliation {
                reason: "timed out after the request left; the service has no lookup".to_owned(),
            },
        };
        let Some(events) = self.decide_op(op, &[command], self.worker(op)) else {
            return;
        };
        match events.first() {
            Some(OperationEvent::RetryScheduled(retry)) => {
                let wait = (retry.at - now).num_seconds().max(1) as u64;
                self.at(wait, Step::Claim(op));
            }
            Some(OperationEvent::MarkedForReconciliation(_)) => {
                let wait = self.rng.range(60, 900);
                self.at(wait, Step::Reconcile(op));
            }
            _ => {
                let wait = self.rng.range(1, 3);
                self.at(wait, Step::StartReply(op));
            }
        }
    }
}

/// The event type names the generator writes, as `'static` keys for counting.
fn type_name(event_type: &str) -> &'static str {
    OperationEvent::EVENT_TYPES
        .iter()
        .chain(DeliveryEvent::EVENT_TYPES)
        .chain(QuarantineEvent::EVENT_TYPES)
        .find(|t| **t == event_type)
        .copied()
        .unwrap_or("other")
}

/// Writes exactly `options.target` events of realistic lifecycles into `store`.
pub(crate) async fn generate(store: &AnyStore, options: &Options) -> Generated {
    let started = Instant::now();
    let (calls, mut queue) = tokio::sync::mpsc::channel::<Vec<AppendRequest>>(2);
    let appender = {
        let store = store.clone();
        tokio::spawn(async move {
            let mut appended = 0u64;
            while let Some(call) = queue.recv().await {
                if let Err(error) = store.append(call).await {
                    panic!("the generator's append {appended} failed: {error}");
                }
                appended += 1;
            }
            appended
        })
    };
    let mut sim = Sim::new(options);
    let mut call: Vec<AppendRequest> = Vec::new();
    let mut call_events = 0usize;
    while sim.remaining > 0 {
        for (unit, events) in sim.tick(options.arrivals) {
            let events = events as usize;
            if call_events + events > options.call_events && !call.is_empty() {
                calls
                    .send(std::mem::take(&mut call))
                    .await
                    .expect("the appender runs");
                call_events = 0;
            }
            call.extend(unit);
            call_events += events;
        }
        // A call never spans two ticks: a stream is written at most once per tick.
        if !call.is_empty() {
            calls
                .send(std::mem::take(&mut call))
                .await
                .expect("the appender runs");
            call_events = 0;
        }
    }
    drop(calls);
    let appended = appender.await.expect("the appender finishes");
    let mut generated = sim.generated;
    generated.events = options.target;
    generated.calls = appended;
    generated.seconds = started.elapsed().as_secs_f64();
    let head = store.head().await.expect("read the head");
    assert_eq!(
        head.position, options.target,
        "the generator wrote exactly the events asked for"
    );
    generated
}
