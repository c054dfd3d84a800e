//! What the demo may claim, decided from what the ledger and the fakes hold: each check takes
//! what was read and returns what the narration prints, or [`Unexpected`] saying which claim
//! the data contradicts. Nothing here reads or prints; the story does both.

use serde_json::Value;

use super::shop::Coupon;
use super::telegram::Received;

/// An event as the checks read it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Fact {
    pub(super) position: u64,
    pub(super) version: u64,
    pub(super) event_type: String,
    pub(super) payload: Value,
}

impl Fact {
    pub(super) fn from_recorded(event: &opledger_store::RecordedEvent) -> Fact {
        Fact {
            position: event.position,
            version: event.version,
            event_type: event.event_type.clone(),
            payload: serde_json::from_slice(&event.payload).unwrap_or(Value::Null),
        }
    }

    fn text(&self, field: &str) -> Option<&str> {
        self.payload.get(field).and_then(Value::as_str)
    }
}

/// An operation as the checks read it (from the `operation_status` read model).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Operation {
    pub(super) operation_id: String,
    pub(super) business_key: String,
    pub(super) status: String,
    pub(super) external_id: Option<String>,
}

impl From<&opledger_projections::operation_status::OperationStatusRow> for Operation {
    fn from(row: &opledger_projections::operation_status::OperationStatusRow) -> Self {
        Operation {
            operation_id: row.operation_id.clone(),
            business_key: row.business_key.clone(),
            status: row.status.clone(),
            external_id: row.external_id.clone(),
        }
    }
}

/// Something the demo was about to claim that the data contradicts.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(super) struct Unexpected(pub(super) String);

pub(super) type Checked<T> = Result<T, Unexpected>;

fn unexpected<T>(text: impl Into<String>) -> Checked<T> {
    Err(Unexpected(text.into()))
}

fn count(facts: &[Fact], event_type: &str) -> usize {
    facts.iter().filter(|f| f.event_type == event_type).count()
}

/// The webhook acknowledged a delivery (Telegram would otherwise deliver it again).
pub(super) fn acknowledged(what: &str, status: u16) -> Checked<()> {
    match status {
        200 => Ok(()),
        other => unexpected(format!("the webhook answered {other} to {what}, not 200")),
    }
}

/// The operation an update started, as its `UpdateReceived` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Started {
    pub(super) operation_id: String,
    pub(super) stream: String,
    /// The ledger position of the `UpdateReceived`.
    pub(super) position: u64,
}

/// An update's stream holds one receipt that started a new operation.
pub(super) fn started(update: &[Fact]) -> Checked<Started> {
    let receipts: Vec<&Fact> = update
        .iter()
        .filter(|f| f.event_type == "UpdateReceived")
        .collect();
    let [receipt] = receipts.as_slice() else {
        return unexpected(format!(
            "the update's stream holds {} UpdateReceived events, not 1",
            receipts.len()
        ));
    };
    let operation = receipt.payload.get("operation").unwrap_or(&Value::Null);
    let field = |name: &str| operation.get(name).and_then(Value::as_str);
    match (
        field("operation_id"),
        field("stream"),
        operation.get("joined"),
    ) {
        (Some(id), Some(stream), Some(Value::Bool(false))) => Ok(Started {
            operation_id: id.to_owned(),
            stream: stream.to_owned(),
            position: receipt.position,
        }),
        _ => unexpected(format!(
            "the update's UpdateReceived (position {}) names no new operation: {operation}",
            receipt.position
        )),
    }
}

/// The shop's own records hold exactly one coupon for the operation.
pub(super) fn issued_once<'a>(operation_id: &str, coupons: &'a [Coupon]) -> Checked<&'a Coupon> {
    let issued: Vec<&Coupon> = coupons
        .iter()
        .filter(|c| c.idempotency_key == operation_id)
        .collect();
    match issued.as_slice() {
        [coupon] => Ok(coupon),
        _ => unexpected(format!(
            "the shop issued {} coupons for operation {operation_id}, not 1",
            issued.len()
        )),
    }
}

/// Telegram received exactly one message to `chat` that mentions `code` (the worker's reply),
/// and nothing else mentions it.
pub(super) fn replied_once<'a>(
    chat: i64,
    code: &str,
    received: &'a [Received],
) -> Checked<&'a Received> {
    let mentioning: Vec<&Received> = received
        .iter()
        .filter(|r| r.text.as_deref().is_some_and(|t| t.contains(code)))
        .collect();
    match mentioning.as_slice() {
        [reply]
            if reply.method == "sendMessage"
                && reply.chat_id == Some(chat)
                && !reply.in_webhook_answer =>
        {
            Ok(reply)
        }
        _ => unexpected(format!(
            "Telegram received {} messages mentioning {code}, not one sendMessage to chat {chat}",
            mentioning.len()
        )),
    }
}

/// Telegram received nothing that mentions `code`: nobody told the user an outcome that nobody
/// knows.
pub(super) fn not_replied(code: &str, received: &[Received]) -> Checked<()> {
    let told = received
        .iter()
        .filter(|r| r.text.as_deref().is_some_and(|t| t.contains(code)))
        .count();
    match told {
        0 => Ok(()),
        n => unexpected(format!(
            "Telegram received {n} messages mentioning {code}, an outcome nobody knows"
        )),
    }
}

/// An update delivered twice: one receipt, one `DuplicateDeliveryObserved`, nothing else.
pub(super) fn duplicate_noted(update: &[Fact]) -> Checked<&Fact> {
    let receipts = count(update, "UpdateReceived");
    let duplicates: Vec<&Fact> = update
        .iter()
        .filter(|f| f.event_type == "DuplicateDeliveryObserved")
        .collect();
    match (receipts, duplicates.as_slice(), update.len()) {
        (1, [duplicate], 2) => Ok(duplicate),
        _ => unexpected(format!(
            "the redelivered update's stream holds {receipts} UpdateReceived and {} \
             DuplicateDeliveryObserved among {} events, not one of each",
            duplicates.len(),
            update.len()
        )),
    }
}

/// The ledger holds `expected` operations.
pub(super) fn operations(operations: &[Operation], expected: usize) -> Checked<()> {
    match operations.len() {
        n if n == expected => Ok(()),
        n => unexpected(format!("the ledger holds {n} operations, not {expected}")),
    }
}

/// Two clicks on one button, as its token's stream recorded them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Clicks {
    /// The update whose click was counted.
    pub(super) counted: i64,
    /// The update whose click was refused, and why.
    pub(super) refused: i64,
    pub(super) reason: String,
}

/// The token's stream: issued once, one click consumed it, the other was refused.
pub(super) fn one_click_counted(token: &[Fact]) -> Checked<Clicks> {
    let of = |event_type: &str| -> Vec<&Fact> {
        token
            .iter()
            .filter(|f| f.event_type == event_type)
            .collect()
    };
    let update_id = |fact: &Fact| fact.payload.get("update_id").and_then(Value::as_i64);
    match (
        of("TokenIssued").as_slice(),
        of("TokenConsumed").as_slice(),
        of("TokenRejected").as_slice(),
    ) {
        ([_], [consumed], [rejected]) => match (update_id(consumed), update_id(rejected)) {
            (Some(counted), Some(refused)) => Ok(Clicks {
                counted,
                refused,
                reason: rejected.text("reason").unwrap_or("?").to_owned(),
            }),
            _ => unexpected("the token's events name no update"),
        },
        (issued, consumed, rejected) => unexpected(format!(
            "the button's token stream holds {} TokenIssued, {} TokenConsumed and {} \
             TokenRejected, not one of each",
            issued.len(),
            consumed.len(),
            rejected.len()
        )),
    }
}

/// The operation is in the reconciliation queue, and it is the only one there.
pub(super) fn waiting_for_a_person<'a>(
    operation_id: &str,
    queue: &'a [opledger_server::reconcile::Waiting],
) -> Checked<&'a opledger_server::reconcile::Waiting> {
    match queue {
        [waiting] if waiting.operation_id == operation_id => Ok(waiting),
        _ => unexpected(format!(
            "the reconciliation queue holds {} operations, not just {operation_id}",
            queue.len()
        )),
    }
}

/// `/status` was answered, in the webhook's answer, with a message that names every one of
/// the user's operations.
pub(super) fn status_answer<'a>(
    answer: Option<&'a Received>,
    operations: &[Operation],
) -> Checked<&'a str> {
    let Some(text) = answer
        .filter(|a| a.method == "sendMessage")
        .and_then(|a| a.text.as_deref())
    else {
        return unexpected("/status was not answered with a message");
    };
    match operations
        .iter()
        .find(|op| !text.contains(&op.operation_id))
    {
        None => Ok(text),
        Some(missing) => unexpected(format!(
            "/status does not mention operation {} ({})",
            missing.operation_id, missing.business_key
        )),
    }
}

/// The whole run in numbers, each one read from the ledger and the shop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Tally {
    pub(super) operations: usize,
    pub(super) coupons: usize,
    pub(super) confirmed: usize,
    pub(super) waiting: usize,
}

/// At most once, from both sides: no operation got two coupons, every confirmed operation got
/// exactly the one the ledger names, and the shop issued nothing no operation asked for.
pub(super) fn at_most_once(operations: &[Operation], coupons: &[Coupon]) -> Checked<Tally> {
    let mut tally = Tally {
        operations: operations.len(),
        coupons: coupons.len(),
        confirmed: 0,
        waiting: 0,
    };
    for op in operations {
        let theirs: Vec<&Coupon> = coupons
            .iter()
            .filter(|c| c.idempotency_key == op.operation_id)
            .collect();
        if theirs.len() > 1 {
            return unexpected(format!(
                "the shop issued {} coupons for operation {} ({}): a side effect happened twice",
                theirs.len(),
                op.operation_id,
                op.business_key
            ));
        }
        match op.status.as_str() {
            "confirmed" => {
                tally.confirmed += 1;
                let named = op.external_id.as_deref();
                if theirs.first().map(|c| c.id.as_str()) != named {
                    return unexpected(format!(
                        "operation {} ({}) is confirmed with the shop's id {}, but the shop's \
                         records hold {}",
                        op.operation_id,
                        op.business_key,
                        named.unwrap_or("(none)"),
                        theirs.first().map_or("no coupon", |c| c.id.as_str())
                    ));
                }
            }
            "needs_reconciliation" => tally.waiting += 1,
            other => {
                return unexpected(format!(
                    "operation {} ({}) is still {other}",
                    op.operation_id, op.business_key
                ));
            }
        }
    }
    if let Some(stray) = coupons.iter().find(|c| {
        !operations
            .iter()
            .any(|op| op.operation_id == c.idempotency_key)
    }) {
        return unexpected(format!(
            "the shop issued coupon {} for `{}`, which is no operation of the ledger",
            stray.code, stray.idempotency_key
        ));
    }
    Ok(tally)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn coupon(n: usize, operation_id: &str) -> Coupon {
        Coupon {
            id: format!("cpn_{n}"),
            code: format!("SPRING-{n:04}"),
            idempotency_key: operation_id.to_owned(),
            business_key: "spring:42".to_owned(),
            answered: true,
        }
    }

    fn operation(id: &str, status: &str, external_id: Option<&str>) -> Operation {
        Operation {
            operation_id: id.to_owned(),
            business_key: format!("{id}:42"),
            status: status.to_owned(),
            external_id: external_id.map(str::to_owned),
        }
    }

    fn fact(event_type: &str, payload: Value) -> Fact {
        Fact {
            position: 1,
            version: 1,
            event_type: event_type.to_owned(),
            payload,
        }
    }

    #[test]
    fn two_coupons_for_one_operation_fail_the_demo() {
        let ops = [operation("a", "confirmed", Some("cpn_1"))];
        let once = [coupon(1, "a")];
        assert_eq!(
            at_most_once(&ops, &once).unwrap(),
            Tally {
                operations: 1,
                coupons: 1,
                confirmed: 1,
                waiting: 0
            }
        );
        let twice = [coupon(1, "a"), coupon(2, "a")];
        let error = at_most_once(&ops, &twice).unwrap_err().to_string();
        assert!(
            error.contains("issued 2 coupons for operation a"),
            "{error}"
        );
        let error = issued_once("a", &twice).unwrap_err().to_string();
        assert!(error.contains("issued 2 coupons"), "{error}");
    }

    #[test]
    fn the_tally_agrees_with_the_shop_or_fails() {
        // Confirmed with another id than the shop's.
        let ops = [operation("a", "confirmed", Some("cpn_9"))];
        assert!(at_most_once(&ops, &[coupon(1, "a")]).is_err());
        // Confirmed although the shop issued nothing.
        assert!(at_most_once(&ops, &[]).is_err());
        // A coupon no operation asked for.
        let ops = [operation("a", "needs_reconciliation", None)];
        let error = at_most_once(&ops, &[coupon(1, "b")])
            .unwrap_err()
            .to_string();
        assert!(error.contains("no operation"), "{error}");
        // An operation still under way.
        assert!(at_most_once(&[operation("a", "claimed", None)], &[]).is_err());
        // Waiting for a person, with or without the coupon it may have got.
        let tally = at_most_once(&ops, &[coupon(1, "a")]).unwrap();
        assert_eq!((tally.waiting, tally.coupons), (1, 1));
    }

    #[test]
    fn a_redelivery_counts_only_when_the_ledger_noted_it() {
        let received = fact("UpdateReceived", json!({"operation": null}));
        let duplicate = fact("DuplicateDeliveryObserved", json!({"epoch": 1}));
        assert!(duplicate_noted(&[received.clone(), duplicate.clone()]).is_ok());
        assert!(duplicate_noted(std::slice::from_ref(&received)).is_err());
        let twice = [received.clone(), received, duplicate];
        assert!(duplicate_noted(&twice).is_err());
    }

    #[test]
    fn a_double_click_counts_only_once() {
        let issued = fact("TokenIssued", json!({}));
        let consumed = |update: i64| fact("TokenConsumed", json!({"update_id": update}));
        let rejected = fact(
            "TokenRejected",
            json!({"update_id": 8, "reason": "already_consumed"}),
        );
        let clicks = one_click_counted(&[issued.clone(), consumed(7), rejected]).unwrap();
        assert_eq!(
            clicks,
            Clicks {
                counted: 7,
                refused: 8,
                reason: "already_consumed".to_owned()
            }
        );
        assert!(one_click_counted(&[issued, consumed(7), consumed(8)]).is_err());
    }

    #[test]
    fn a_started_operation_is_read_from_the_receipt() {
        let receipt = |joined: bool| {
            fact(
                "UpdateReceived",
                json!({"operation": {"operation_id": "a", "stream": "op-coupon-spring:42", "joined": joined}}),
            )
        };
        assert_eq!(started(&[receipt(false)]).unwrap().operation_id, "a");
        assert!(started(&[receipt(true)]).is_err());
        assert!(started(&[]).is_err());
    }

    #[test]
    fn a_reply_is_counted_from_what_telegram_received() {
        let sent = |text: &str, in_webhook_answer: bool| Received {
            method: "sendMessage".to_owned(),
            chat_id: Some(42),
            text: Some(text.to_owned()),
            in_webhook_answer,
        };
        let once = [sent("Your spring coupon: SPRING-0001", false)];
        assert!(replied_once(42, "SPRING-0001", &once).is_ok());
        assert!(replied_once(7, "SPRING-0001", &once).is_err());
        assert!(replied_once(42, "SPRING-0002", &once).is_err());
        let twice = [once[0].clone(), once[0].clone()];
        assert!(replied_once(42, "SPRING-0001", &twice).is_err());
        assert!(not_replied("SPRING-0001", &once).is_err());
        assert!(not_replied("FLASH-0003", &once).is_ok());
        let status = sent("coupon spring:42: done (a)", true);
        let ops = [operation("a", "confirmed", None)];
        assert!(status_answer(Some(&status), &ops).is_ok());
        assert!(status_answer(Some(&status), &[operation("b", "confirmed", None)]).is_err());
        assert!(status_answer(None, &ops).is_err());
    }
}
