//! Property tests: random command sequences never break the aggregates' invariants.

use chrono::{DateTime, TimeDelta, Utc};
use opledger_domain::callback_token::{self, CallbackTokenCommand, CallbackTokenEvent};
use opledger_domain::delivery::{self, DeliveryCommand, DeliveryEvent};
use opledger_domain::operation::{
    self, ConfirmedVia, OperationCommand, OperationEvent, ReconcileOutcome, Transition,
};
use opledger_domain::{CallbackToken, Delivery, Operation};
use proptest::prelude::*;

use crate::fixtures::*;

/// One random step: which command, with which worker and times, after how many seconds.
#[derive(Debug, Clone)]
struct Step {
    command: u8,
    worker: u8,
    advance: i64,
    offset: i64,
    flag: bool,
}

fn steps(max: usize) -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        (0u8..18, 0u8..3, -3i64..40, -5i64..90, any::<bool>()).prop_map(
            |(command, worker, advance, offset, flag)| Step {
                command,
                worker,
                advance,
                offset,
                flag,
            },
        ),
        1..max,
    )
}

const WORKERS: [&str; 3] = ["worker-1", "worker-2", "worker-3"];

/// The command a step stands for; a call is sent by the claim holder half of the time, so that
/// sequences reach the later states often.
fn operation_command(
    step: &Step,
    now: DateTime<Utc>,
    max_attempts: u32,
    holder: Option<&str>,
) -> OperationCommand {
    let worker = WORKERS[usize::from(step.worker)].to_owned();
    let later = now + TimeDelta::seconds(step.offset);
    match step.command {
        0 => OperationCommand::Receive(if step.flag {
            received_with(max_attempts)
        } else {
            received_other()
        }),
        1 | 2 => OperationCommand::Claim {
            worker,
            lease_until: later,
        },
        3..=5 => OperationCommand::RecordCallSent {
            worker: match holder {
                Some(holder) if step.flag => holder.to_owned(),
                _ => worker,
            },
        },
        6 | 7 => {
            let mut confirmation = confirmed();
            if step.flag {
                confirmation.via = ConfirmedVia::Lookup;
            }
            OperationCommand::Confirm(confirmation)
        }
        8 => OperationCommand::Fail {
            reason: "declined".to_owned(),
        },
        9 => OperationCommand::ScheduleRetry {
            at: later,
            reason: "timeout".to_owned(),
            same_key: step.flag,
        },
        10 | 11 => OperationCommand::MarkForReconciliation {
            reason: "timeout".to_owned(),
        },
        12 | 13 => OperationCommand::Reconcile(reconciled(
            [
                ReconcileOutcome::Succeeded,
                ReconcileOutcome::Failed,
                ReconcileOutcome::Retry,
            ][usize::from(step.worker)],
        )),
        14 | 15 => OperationCommand::StartReply,
        16 => OperationCommand::RecordReplySent {
            message_id: Some(1),
        },
        _ => match step.worker {
            0 => OperationCommand::RecordReplyUnknown {
                reason: "timeout".to_owned(),
            },
            _ => OperationCommand::RecordReplyFailed {
                reason: "429".to_owned(),
                retry_at: step.flag.then_some(later),
            },
        },
    }
}

fn is_terminal_event(event: &OperationEvent) -> bool {
    match event {
        OperationEvent::Confirmed(_) | OperationEvent::Failed(_) => true,
        OperationEvent::Reconciled(r) => r.outcome != ReconcileOutcome::Retry,
        _ => false,
    }
}

/// What the checker tracks while it walks the produced log.
#[derive(Default)]
struct Watch {
    terminal: bool,
    live_claim: Option<(String, DateTime<Utc>)>,
    call_outstanding: bool,
    reply_unknown: bool,
}

impl Watch {
    fn observe(&mut self, event: &OperationEvent, now: DateTime<Utc>) -> Result<(), TestCaseError> {
        match event {
            OperationEvent::Claimed(c) => {
                prop_assert!(!self.terminal, "a claim after a terminal event");
                prop_assert!(
                    !self.call_outstanding,
                    "a claim while a call's outcome is unknown"
                );
                if let Some((worker, lease_until)) = &self.live_claim {
                    prop_assert!(
                        now >= *lease_until,
                        "a second live claim: {} while {worker} holds it until {lease_until}",
                        c.worker
                    );
                }
                self.live_claim = Some((c.worker.clone(), c.lease_until));
            }
            OperationEvent::ExternalCallSent(sent) => {
                prop_assert!(!self.terminal, "an external call after a terminal event");
                let holder = self.live_claim.as_ref().filter(|(_, until)| now < *until);
                prop_assert!(
                    holder.is_some_and(|(worker, _)| *worker == sent.worker),
                    "a call without a live claim of its worker"
                );
                self.call_outstanding = true;
            }
            OperationEvent::ReplyStarted(_) => {
                prop_assert!(self.terminal, "a reply before the outcome");
                prop_assert!(
                    !self.reply_unknown,
                    "a reply resent after an unknown outcome"
                );
            }
            OperationEvent::ReplyOutcomeUnknown(_) => self.reply_unknown = true,
            OperationEvent::RetryScheduled(_)
            | OperationEvent::MarkedForReconciliation(_)
            | OperationEvent::Reconciled(_) => {
                self.live_claim = None;
                self.call_outstanding = false;
            }
            _ => {}
        }
        if is_terminal_event(event) {
            prop_assert!(!self.terminal, "two terminal events");
            self.terminal = true;
            self.live_claim = None;
            self.call_outstanding = false;
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn operation_invariants_hold_for_any_command_sequence(
        max_attempts in 1u32..4,
        start_received in any::<bool>(),
        steps in steps(60),
    ) {
        let mut state = Operation::default();
        let mut log: Vec<OperationEvent> = Vec::new();
        let mut watch = Watch::default();
        let mut now = t(0);
        let mut commands: Vec<OperationCommand> = Vec::new();
        if start_received {
            commands.push(OperationCommand::Receive(received_with(max_attempts)));
        }
        for step in &steps {
            let command = match commands.pop() {
                Some(first) => first,
                None => {
                    now += TimeDelta::seconds(step.advance);
                    let holder = state.claim.as_ref().map(|c| c.worker.as_str());
                    operation_command(step, now, max_attempts, holder)
                }
            };
            let Ok(events) = operation::decide(&state, &command, now) else {
                continue;
            };
            prop_assert!(events.len() <= 1);
            let from = state.status;
            for event in &events {
                watch.observe(event, now)?;
                state = operation::evolve(state, event);
            }
            prop_assert!(
                Transition::find(from, command.kind(), events.first().map(OperationEvent::kind), state.status).is_some(),
                "{from} {} produced {events:?} and {}, which no row lists", command.kind(), state.status
            );
            log.extend(events);
        }
        prop_assert_eq!(state.version, log.len() as u64);
        prop_assert_eq!(Operation::replay(&log), state);
    }

    #[test]
    fn a_delivery_opens_each_epoch_once(
        arrivals in prop::collection::vec((any::<bool>(), -60i64..(3 * 24 * 3_600)), 1..40),
    ) {
        let retention = TimeDelta::days(7);
        let mut state = Delivery::default();
        let mut log: Vec<DeliveryEvent> = Vec::new();
        let mut epochs: Vec<(u32, DateTime<Utc>)> = Vec::new();
        let mut now = t(0);
        for (same, advance) in arrivals {
            now += TimeDelta::seconds(advance);
            let digest = if same { DIGEST_A } else { DIGEST_B };
            let mut command = record(digest, 0);
            let DeliveryCommand::RecordUpdate { received_at, .. } = &mut command else {
        unreachable!("a record")
    };
            *received_at = now;
            let events = delivery::decide(&state, &command, now).expect("well-formed arrivals");
            prop_assert_eq!(events.len(), 1);
            for event in &events {
                if let DeliveryEvent::UpdateReceived(received) = event {
                    if let Some(&(epoch, first)) = epochs.last() {
                        prop_assert_eq!(received.epoch, epoch + 1);
                        prop_assert!(now - first >= retention, "a new epoch inside the window");
                    } else {
                        prop_assert_eq!(received.epoch, 1);
                    }
                    epochs.push((received.epoch, now));
                }
                state = delivery::evolve(state, event);
            }
            log.extend(events);
        }
        prop_assert_eq!(state.version, log.len() as u64);
        prop_assert_eq!(Delivery::replay(&log), state);
    }

    #[test]
    fn a_token_is_consumed_or_cancelled_at_most_once(
        clicks in prop::collection::vec((0u8..6, -5i64..200), 1..30),
    ) {
        let mut state = CallbackToken::default();
        let mut log: Vec<CallbackTokenEvent> = Vec::new();
        let mut now = t(0);
        for (action, advance) in clicks {
            now += TimeDelta::seconds(advance);
            let command = match action {
                0 => {
                    let mut issued = token_issued();
                    issued.expires_at = now + TimeDelta::seconds(300);
                    CallbackTokenCommand::Issue(issued)
                }
                1 => CallbackTokenCommand::Consume { user_id: 7, update_id: 1 },
                2 => CallbackTokenCommand::Cancel { user_id: 7, update_id: 3 },
                3 => CallbackTokenCommand::Cancel { user_id: USER, update_id: 4 },
                _ => CallbackTokenCommand::Consume { user_id: USER, update_id: 2 },
            };
            let Ok(events) = callback_token::decide(&state, &command, now) else {
                continue;
            };
            for event in &events {
                let user = match event {
                    CallbackTokenEvent::TokenConsumed(e) => Some(e.user_id),
                    CallbackTokenEvent::TokenCancelled(e) => Some(e.user_id),
                    _ => None,
                };
                if let Some(user) = user {
                    prop_assert_eq!(user, USER);
                    prop_assert!(state.expires_at.is_some_and(|at| now < at));
                }
                state = callback_token::evolve(state, event);
            }
            log.extend(events);
        }
        let count = |kind: &str| log.iter().filter(|e| opledger_domain::DomainEvent::event_type(*e) == kind).count();
        prop_assert!(count("TokenIssued") <= 1);
        prop_assert!(count("TokenConsumed") + count("TokenCancelled") <= 1, "used once: {:?}", log);
        prop_assert_eq!(state.version, log.len() as u64);
        prop_assert_eq!(CallbackToken::replay(&log), state);
    }
}
