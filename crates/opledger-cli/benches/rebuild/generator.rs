//! The ledger generator of the rebuild benchmark: realistic operation lifecycles, decided by the
//! service's own decisions and appended through the store in big multi-stream calls.
//!
//! Every event comes from the code `opledger serve` runs: the intake's pure decision
//! (`opledger_server::intake::decision`, configured by [`CONFIG`]) and the worker's
//! (`opledger_worker::decision`); the generator only plays the outside world (users, Telegram,
//! the services, the operators), holds each stream's state between decisions, as the worker holds
//! its operations, and batches what the decisions stage.
//!
//! A simulated clock advances one second per tick. Each tick, about `arrivals` Telegram updates
//! arrive from many users and chats of two bots (real update bodies, recorded like the intake
//! records them): action commands start an operation (`UpdateReceived` and `Received`, one
//! unit), join one that exists (the same business key and parameters) or record a
//! `KeyConflictRecorded` (the same key, other parameters); `/status`, `/help` and plain messages
//! are recorded alone; a few bodies are quarantined and a few updates are delivered again later
//! (`DuplicateDeliveryObserved`). Due worker steps move each operation on, a few ticks apart:
//! `Claimed` (with `ExternalCallSent` in the same commit for the actions whose service honours
//! the key or has a lookup, else `ExternalCallSent` a tick later), then the service's answer:
//! mostly `Confirmed`, some `RetryScheduled` (claimed again when due, `Failed` once the attempts
//! are used up), some `Failed`, and for an unknown outcome what the worker makes of it (a retry
//! with the honoured key, a lookup's answer, or `MarkedForReconciliation`, resolved by an operator
//! minutes later: `Reconciled`, a few of them retried). An outcome is committed together with
//! its worker's next claim in the same tick, as one unit over both streams, or alone. Then the
//! reply (`ReplyStarted`, then mostly `ReplySent`, a few `ReplyRetryScheduled` or
//! `ReplyOutcomeUnknown`). Every event carries its real causation (the update, the worker, the
//! operator, the intake) and correlation.
//!
//! A tick's units are shuffled, so streams interleave in the global order as they do in
//! production, and appended in calls of at most `call_events` events, one call after the other
//! (the next tick is decided while the store commits the previous one). Exactly `target` events
//! are written: a step that would overshoot is left undone, and the last events are `/help`
//! updates.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};
use opledger_config::Config;
use opledger_domain::delivery::{Delivery, DeliveryEvent};
use opledger_domain::operation::{
    OperationCommand, OperationEvent, Received, ReconcileOutcome, Reconciled, Status,
};
use opledger_domain::quarantine::QuarantineEvent;
use opledger_domain::{DomainEvent, EventMetadata, delivery_stream, fingerprint};
use opledger_ledger::{Changes, Snapshot, StreamState};
use opledger_server::Route;
use opledger_server::intake::decision::{self as intake, Arrival, Decided, Rules};
use opledger_server::reconcile;
use opledger_store::{AnyStore, AppendRequest, EventStore, StreamId};
use opledger_telegram::{BotApiError, parse_update};
use opledger_worker::decision::{self as worker, OutcomeWithClaim, Resolution, View};
use opledger_worker::{CallOutcome, Effector, HttpEffector, LookupOutcome, Success, WorkerOptions};

/// The service the generator's events are decided for: two bots, an action whose service
/// honours the idempotency key (`coupon`), one whose service has neither that nor a lookup
/// (`refund`: an unknown outcome waits for a person), and one with a lookup (`book`).
const CONFIG: &str = include_str!("service.toml");

/// The bots updates arrive for.
const BOTS: [&str; 2] = ["shop", "tickets"];
/// The worker ids that claim operations.
const WORKERS: [&str; 4] = ["web-1", "web-2", "worker-1", "worker-2"];
/// The operators who resolve reconciliations.
const OPERATORS: [&str; 3] = ["alice", "bob", "carol"];
const CAMPAIGNS: [&str; 6] = ["spring", "summer", "autumn", "winter", "vip", "welcome"];
const REFUND_REASONS: [&str; 4] = ["damaged", "late delivery", "wrong size", "changed my mind"];
const SLOTS: [&str; 4] = ["09:00", "11:00", "14:00", "16:00"];

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

/// What the service of `action` answers on success (the `n`th result): the fields a reply uses.
fn success(action: &str, n: u64) -> Success {
    let (id, fields) = match action {
        "coupon" => (
            format!("cpn_{n}"),
            serde_json::json!({ "code": format!("SAVE-{:06X}", n % 0xff_ffff) }),
        ),
        "refund" => (
            format!("re_{n:08}"),
            serde_json::json!({ "amount": format!("{}.{:02}", 5 + n % 200, n % 100), "currency": "EUR" }),
        ),
        _ => (
            format!("bk-{n}"),
            serde_json::json!({ "seat": format!("{}{}", (b'A' + (n % 12) as u8) as char, 1 + n % 30) }),
        ),
    };
    let result = fields
        .as_object()
        .map(|o| o.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default();
    Success {
        response_digest: Some(fingerprint(
            "response",
            &BTreeMap::from([("id".to_owned(), id.clone())]),
        )),
        external_id: Some(id),
        result,
    }
}

/// One operation as the simulated worker holds it between commits.
struct Op {
    stream: StreamId,
    view: View,
    /// The worker holding the current claim.
    worker: &'static str,
}

impl Op {
    fn received(&self) -> &Received {
        self.view
            .received
            .as_deref()
            .expect("an operation starts with Received")
    }

    /// The worker's metadata on the operation's events.
    fn metadata(&self) -> EventMetadata {
        worker::metadata(self.worker, self.received())
    }
}

/// Something due at a tick.
#[derive(Clone, Debug)]
enum Step {
    /// Claim the operation (with the call's record, for the actions that allow it).
    Claim(usize),
    /// Record the call as sent.
    Send(usize),
    /// The service answered (or did not).
    Outcome(usize),
    /// An operator resolves the reconciliation.
    Reconcile(usize),
    StartReply(usize),
    FinishReply(usize),
    /// Telegram delivers an update's body again.
    Redeliver {
        bot: &'static str,
        raw: Vec<u8>,
        stream: StreamId,
        delivery: Delivery,
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

/// A call's outcome, decided and kept until its worker's next claim (or the tick's end).
struct Pending {
    op: usize,
    command: OperationCommand,
}

/// What became of a body the intake was given.
enum Kept {
    Yes,
    /// Its operation's stream is written this tick already.
    Busy,
    /// Its events do not fit, or its stream is written this tick already.
    No,
}

/// The appends of one decision that must commit together.
type Unit = Vec<AppendRequest>;

/// The simulation.
struct Sim {
    rng: Rng,
    rules: Rules,
    /// Each action's effector, as the worker builds it; only asked what it does, never called.
    effectors: HashMap<String, HttpEffector>,
    worker: WorkerOptions,
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
    by_stream: HashMap<StreamId, usize>,
    schedule: BTreeMap<u64, Vec<Step>>,
    /// Each worker's outcome waiting for its next claim (ordered: the same seed, the same
    /// events).
    pending: BTreeMap<&'static str, Pending>,
    /// Streams already written by this tick's units: a call names each stream once.
    touched: HashSet<StreamId>,
    units: Vec<(Unit, u64)>,
    generated: Generated,
}

/// `state` after the events `changes` staged on `stream`.
fn after<S: StreamState>(changes: &Changes, stream: &StreamId, state: S) -> S {
    match changes.staged::<S::Event>(stream) {
        Some((_, events)) => events.iter().fold(state, |state, event| state.apply(event)),
        None => state,
    }
}

impl Sim {
    fn new(options: &Options) -> Self {
        let config = Config::parse(CONFIG, &|name| {
            Some(match name {
                "WEBHOOK_SECRET" => "generator-webhook-secret".to_owned(),
                _ => "123456:generator-token".to_owned(),
            })
        })
        .expect("the generator's configuration parses");
        let http = reqwest::Client::new();
        let effectors = config
            .actions
            .iter()
            .map(|action| {
                let effector = action.effector.as_ref().expect("every action calls out");
                let url = effector
                    .url
                    .clone()
                    .expect("every action calls out over HTTP");
                let effector = HttpEffector::new(http.clone(), url, effector, Vec::new());
                (action.name.clone(), effector)
            })
            .collect();
        Self {
            rng: Rng(options.seed),
            rules: Rules::new(&config),
            effectors,
            worker: WorkerOptions::new("generator"),
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
            pending: BTreeMap::new(),
            touched: HashSet::new(),
            units: Vec::new(),
            generated: Generated::default(),
        }
    }

    fn now(&self) -> DateTime<Utc> {
        self.start + TimeDelta::seconds(self.tick as i64)
    }

    /// The ticks until `at`, rounded up: a step scheduled then is not early.
    fn ticks_until(&self, at: DateTime<Utc>) -> u64 {
        let millis = (at - self.now()).num_milliseconds().max(0) as u64;
        millis.div_ceil(1000)
    }

    fn at(&mut self, ticks: u64, step: Step) {
        self.schedule
            .entry(self.tick + ticks.max(1))
            .or_default()
            .push(step);
    }

    /// Keeps what a decision staged as one unit of this tick if its streams are free and its
    /// events fit; `false` if not.
    fn push(&mut self, changes: Changes) -> bool {
        let unit = changes.into_requests().expect("decided events encode");
        let events: u64 = unit.iter().map(|r| r.events.len() as u64).sum();
        if events > self.remaining || unit.iter().any(|r| self.touched.contains(&r.stream)) {
            return false;
        }
        for request in &unit {
            self.touched.insert(request.stream.clone());
            for event in &request.events {
                let name = type_name(&event.event_type);
                *self.generated.types.entry(name).or_default() += 1;
            }
        }
        self.remaining -= events;
        self.units.push((unit, events));
        true
    }

    /// Decides one tick: due steps first (outcomes not carried by a claim are then committed
    /// alone), then new updates. Returns its units, shuffled.
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
                .is_some_and(|op| self.touched.contains(&self.ops[op].stream));
            if busy {
                // A key conflict wrote to the stream this tick: one tick later.
                self.at(1, step);
                continue;
            }
            self.step(step);
        }
        for (_, pending) in std::mem::take(&mut self.pending) {
            self.flush(pending);
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
            _ => {
                let bot = self.rng.pick(&BOTS);
                let body = self.rng.pick(&[
                    b"{\"ok\":true}".as_slice(),
                    b"not json at all".as_slice(),
                    b"[1,2,3]".as_slice(),
                ]);
                if !matches!(self.receive(bot, body.to_vec()), Kept::Yes) {
                    self.plain_update(bot, "/help");
                }
            }
        }
    }

    /// A Telegram update body with `text` from a user in a chat.
    fn update(&mut self, bot: &'static str, text: &str) -> Vec<u8> {
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
        serde_json::to_vec(&body).expect("JSON")
    }

    /// The intake's decision on `snapshot`.
    fn decide(&self, arrival: &Arrival<'_>, snapshot: &Snapshot) -> (Decided, Changes) {
        let mut changes = Changes::default();
        let decided = intake::decide(&self.rules, arrival, snapshot, &mut changes)
            .unwrap_or_else(|error| panic!("the intake refused a generated update: {error:?}"));
        (decided, changes)
    }

    /// Records a body as the intake does, and keeps what it decided.
    fn receive(&mut self, bot: &'static str, raw: Vec<u8>) -> Kept {
        let now = self.now();
        let update = match parse_update(&raw) {
            Ok(update) => update,
            Err(quarantine) => {
                let mut changes = Changes::default();
                intake::quarantine(bot, &quarantine, now, &mut changes)
                    .expect("a quarantine note is staged");
                return if self.push(changes) {
                    Kept::Yes
                } else {
                    Kept::No
                };
            }
        };
        let arrival = Arrival {
            bot,
            update: &update,
            raw: &raw,
            now,
            // No generated action asks for confirmation: no token is minted from it.
            token_seed: [0; 16],
        };
        // The intake's first attempt takes every stream as new (ADR 0006)...
        let (decided, mut changes) = self.decide(&arrival, &Snapshot::assuming_new());
        let operation = match &decided {
            Decided::Accepted {
                route: Route::Started(link),
                ..
            } => Some(StreamId::new(link.stream.clone()).expect("a stream id")),
            _ => None,
        };
        let existing = operation
            .as_ref()
            .and_then(|s| self.by_stream.get(s).copied());
        if let Some(op) = existing {
            // ...and decides again on the operation's state when its stream exists.
            if self.touched.contains(&self.ops[op].stream) {
                return Kept::Busy;
            }
            let state = self.ops[op].view.state.clone();
            let snapshot = Snapshot::assuming_new().with(self.ops[op].stream.clone(), state);
            changes = self.decide(&arrival, &snapshot).1;
        }
        let stream = StreamId::new(delivery_stream(bot, update.update_id).expect("a stream name"))
            .expect("a stream id");
        let delivery = after(&changes, &stream, Delivery::default());
        let view = operation.as_ref().map(|s| {
            let view = existing.map_or_else(View::default, |op| self.ops[op].view.clone());
            after(&changes, s, view)
        });
        if !self.push(changes) {
            return Kept::No;
        }
        self.generated.updates += 1;
        match (existing, operation, view) {
            (Some(op), _, Some(view)) => self.ops[op].view = view,
            (None, Some(stream), Some(view)) => {
                let op = self.ops.len();
                self.by_stream.insert(stream.clone(), op);
                self.ops.push(Op {
                    stream,
                    view,
                    worker: WORKERS[0],
                });
                self.generated.operations += 1;
                let wait = self.rng.range(1, 3);
                self.at(wait, Step::Claim(op));
            }
            _ => {}
        }
        if self.rng.chance(0.015) {
            let later = self.rng.range(1, 20);
            self.at(
                later,
                Step::Redeliver {
                    bot,
                    raw,
                    stream,
                    delivery,
                },
            );
        }
        Kept::Yes
    }

    /// An update that asks for no action: recorded alone.
    fn plain_update(&mut self, bot: &'static str, text: &str) {
        let body = self.update(bot, text);
        self.receive(bot, body);
    }

    /// An action command: starts an operation, joins one, or records a key conflict.
    fn command(&mut self) {
        let (bot, text) = match self.rng.next() % 100 {
            0..=54 => {
                let campaign = self.rng.pick(&CAMPAIGNS);
                (BOTS[0], format!("/coupon {campaign}"))
            }
            55..=79 => {
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
                (BOTS[0], format!("/refund {order} {reason}"))
            }
            _ => {
                let date = format!("2026-02-{:02}", self.rng.range(1, 14));
                let slot = self.rng.pick(&SLOTS);
                (BOTS[1], format!("/book {date} {slot}"))
            }
        };
        let body = self.update(bot, &text);
        match self.receive(bot, body) {
            Kept::Yes => {}
            // Its stream is written this tick already: this user asks for their status instead.
            Kept::Busy => self.plain_update(bot, "/status"),
            Kept::No => self.plain_update(bot, "/help"),
        }
    }

    /// Stages `commands` on `op` as its worker decides them, and keeps them if they fit.
    fn commit(&mut self, op: usize, commands: &[OperationCommand]) -> bool {
        let o = &self.ops[op];
        let metadata = o.metadata();
        let mut changes = Changes::default();
        let view = worker::stage(
            &mut changes,
            &o.stream,
            &o.view,
            commands,
            self.now(),
            &metadata,
        )
        .unwrap_or_else(|rejection| {
            panic!(
                "the generator asked for a move the domain refuses on {} ({:?}): {rejection}",
                o.stream.as_str(),
                o.view.state.status
            )
        });
        if !self.push(changes) {
            return false;
        }
        self.ops[op].view = view;
        true
    }

    /// Claims `op`, with its worker's pending outcome in the same unit when there is one.
    fn claim(&mut self, op: usize) {
        let worker = self.rng.pick(&WORKERS);
        self.ops[op].worker = worker;
        let effector = &self.effectors[self.ops[op].received().action.as_str()];
        let together = effector.resolves_unknown_outcomes();
        let margin = self.worker.lease_margin;
        let commands = worker::claim_commands(effector, worker, self.now(), margin);
        let claimed = match self.pending.remove(worker) {
            Some(pending) => self.claim_carrying(pending, op, &commands),
            None => self.commit(op, &commands),
        };
        if claimed {
            if together {
                let wait = self.rng.range(1, 4);
                self.at(wait, Step::Outcome(op));
            } else {
                self.at(1, Step::Send(op));
            }
        }
    }

    /// The worker's decision over two streams: `pending`'s outcome and the claim of `op`.
    fn claim_carrying(&mut self, pending: Pending, op: usize, claim: &[OperationCommand]) -> bool {
        let (done, next) = (&self.ops[pending.op], &self.ops[op]);
        let decision = OutcomeWithClaim {
            done: &done.stream,
            outcome: &pending.command,
            done_metadata: done.metadata(),
            next: &next.stream,
            claim,
            next_metadata: next.metadata(),
            now: self.now(),
        };
        let snapshot = Snapshot::new()
            .with(done.stream.clone(), done.view.clone())
            .with(next.stream.clone(), next.view.clone());
        let mut changes = Changes::default();
        let (refused, claimed) = decision
            .decide(&snapshot, &mut changes)
            .expect("both states are held");
        assert!(refused.is_none(), "an outcome refused: {refused:?}");
        let claimed = claimed.expect("nobody else claims the generator's operations");
        let done_view = after(&changes, &done.stream, done.view.clone());
        if !self.push(changes) {
            // The outcome waits for the tick's end; the claim is left undone.
            let worker = self.ops[pending.op].worker;
            self.pending.insert(worker, pending);
            return false;
        }
        self.ops[pending.op].view = done_view;
        self.ops[op].view = claimed;
        self.next_after_outcome(pending.op);
        true
    }

    /// Commits a call's outcome alone.
    fn flush(&mut self, pending: Pending) {
        let o = &self.ops[pending.op];
        let metadata = o.metadata();
        let mut changes = Changes::default();
        let refused = worker::stage_outcome(
            &mut changes,
            &o.stream,
            &o.view,
            &pending.command,
            self.now(),
            &metadata,
        );
        assert!(refused.is_none(), "an outcome refused: {refused:?}");
        let view = after(&changes, &o.stream, o.view.clone());
        if self.push(changes) {
            self.ops[pending.op].view = view;
            self.next_after_outcome(pending.op);
        }
    }

    /// Schedules what follows a call's outcome on `op`.
    fn next_after_outcome(&mut self, op: usize) {
        let state = &self.ops[op].view.state;
        match state.status {
            Status::RetryScheduled => {
                let wait = state.retry_at.map_or(1, |at| self.ticks_until(at));
                self.at(wait, Step::Claim(op));
            }
            Status::NeedsReconciliation => {
                let wait = self.rng.range(60, 900);
                self.at(wait, Step::Reconcile(op));
            }
            _ => {
                let wait = self.rng.range(1, 3);
                self.at(wait, Step::StartReply(op));
            }
        }
    }

    /// The service's answer to the call on `op` (or its absence), as the worker records it.
    fn outcome(&mut self, op: usize) {
        let roll = self.rng.next() % 1000;
        let n = self.next_result;
        self.next_result += 1;
        let action = self.ops[op].received().action.clone();
        let answer = match roll {
            0..=839 => CallOutcome::Succeeded(success(&action, n)),
            840..=869 => {
                let busy = self.rng.chance(0.5);
                CallOutcome::NotDone {
                    reason: if busy {
                        "HTTP 429 Too Many Requests"
                    } else {
                        "HTTP 503 Service Unavailable"
                    }
                    .to_owned(),
                    retry_after: busy.then(|| Duration::from_secs(self.rng.range(1, 10))),
                }
            }
            870..=914 => CallOutcome::Rejected {
                reason: self
                    .rng
                    .pick(&[
                        "HTTP 422: the campaign is over",
                        "HTTP 409: already used by this customer",
                        "HTTP 400: unknown order",
                    ])
                    .to_owned(),
            },
            _ => CallOutcome::Unknown {
                reason: "timed out after the request left".to_owned(),
            },
        };
        let now = self.now();
        let view = &self.ops[op].view;
        let operation_id = self.ops[op].received().operation_id.to_string();
        let claims = view.state.claims;
        let retry_at = |asked: Option<Duration>| {
            let delay = self.worker.backoff.delay(&operation_id, claims, asked);
            now + TimeDelta::from_std(delay).unwrap_or(TimeDelta::MAX)
        };
        let command = match worker::answered(answer, retry_at) {
            Ok(command) => command,
            Err(reason) => {
                let effector = &self.effectors[action.as_str()];
                let resolution = if effector.honours_idempotency_key() {
                    Resolution::KeyHonoured
                } else if effector.has_lookup() {
                    Resolution::Lookup(match self.rng.next() % 20 {
                        0..=7 => LookupOutcome::Found(success(&action, n)),
                        8..=17 => LookupOutcome::Failed {
                            reason: "HTTP 503 from the lookup".to_owned(),
                        },
                        _ => LookupOutcome::Absent,
                    })
                } else {
                    Resolution::Lookup(LookupOutcome::Unsupported)
                };
                worker::unknown_outcome(reason, resolution, retry_at(None))
            }
        };
        let worker = self.ops[op].worker;
        if let Some(earlier) = self.pending.insert(worker, Pending { op, command }) {
            self.flush(earlier);
        }
    }

    /// An operator's decision about `op`, waiting for reconciliation.
    fn reconcile(&mut self, op: usize) {
        let operator = self.rng.pick(&OPERATORS);
        let outcome = match self.rng.next() % 10 {
            0..=6 => ReconcileOutcome::Succeeded,
            7 | 8 => ReconcileOutcome::Failed,
            _ => ReconcileOutcome::Retry,
        };
        let n = self.next_result;
        self.next_result += 1;
        let decision = Reconciled {
            outcome,
            external_id: (outcome == ReconcileOutcome::Succeeded)
                .then(|| success(&self.ops[op].received().action, n).external_id)
                .flatten(),
            operator: operator.to_owned(),
            note: match outcome {
                ReconcileOutcome::Succeeded => "found it in the shop's admin panel",
                ReconcileOutcome::Failed => "the shop has no record of it",
                ReconcileOutcome::Retry => "not done; the shop asks us to send it again",
            }
            .to_owned(),
        };
        let o = &self.ops[op];
        let operation_id = o.received().operation_id.to_string();
        let mut changes = Changes::default();
        let status = reconcile::stage_resolution(
            &mut changes,
            &o.stream,
            &o.view.state,
            &operation_id,
            &decision,
            self.now(),
        )
        .unwrap_or_else(|refusal| panic!("an operator's decision was refused: {refusal:?}"));
        let view = after(&changes, &o.stream, o.view.clone());
        if !self.push(changes) {
            return;
        }
        self.ops[op].view = view;
        if status == Status::RetryScheduled {
            self.at(1, Step::Claim(op));
        } else {
            let wait = self.rng.range(1, 3);
            self.at(wait, Step::StartReply(op));
        }
    }

    /// What `sendMessage` answered, as the worker records it.
    fn finish_reply(&mut self, op: usize) {
        let sent = match self.rng.next() % 100 {
            0..=96 => Ok(self.rng.range(1, 1_000_000) as i64),
            97 | 98 => Err(BotApiError::RetryAfter {
                method: "sendMessage",
                seconds: self.rng.range(1, 30),
            }),
            _ => Err(BotApiError::Timeout {
                method: "sendMessage",
            }),
        };
        let now = self.now();
        let command = worker::reply_outcome(sent, &self.ops[op].view.state, now);
        let again = match &command {
            OperationCommand::RecordReplyFailed {
                retry_at: Some(at), ..
            } => Some(self.ticks_until(*at)),
            _ => None,
        };
        if self.commit(op, &[command])
            && let Some(wait) = again
        {
            self.at(wait, Step::StartReply(op));
        }
    }

    fn step(&mut self, step: Step) {
        match step {
            Step::Claim(op) => self.claim(op),
            Step::Send(op) => {
                let worker = self.ops[op].worker.to_owned();
                if self.commit(op, &[OperationCommand::RecordCallSent { worker }]) {
                    let wait = self.rng.range(1, 4);
                    self.at(wait, Step::Outcome(op));
                }
            }
            Step::Outcome(op) => self.outcome(op),
            Step::Reconcile(op) => self.reconcile(op),
            Step::StartReply(op) => {
                if self.commit(op, &[OperationCommand::StartReply]) {
                    let wait = self.rng.range(1, 2);
                    self.at(wait, Step::FinishReply(op));
                }
            }
            Step::FinishReply(op) => self.finish_reply(op),
            Step::Redeliver {
                bot,
                raw,
                stream,
                delivery,
            } => {
                let update = parse_update(&raw).expect("a generated update parses");
                let arrival = Arrival {
                    bot,
                    update: &update,
                    raw: &raw,
                    now: self.now(),
                    token_seed: [0; 16],
                };
                let snapshot = Snapshot::assuming_new().with(stream, delivery);
                let (decided, changes) = self.decide(&arrival, &snapshot);
                debug_assert_eq!(decided, Decided::Duplicate);
                self.push(changes);
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
