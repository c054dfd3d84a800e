//! `POST /v1/operations/{id}/resolution` (issue 12 §2), over HTTP on both backends: an
//! operator resolves an operation the worker left waiting for reconciliation, recorded as the
//! `Reconciled` event `opledger reconcile resolve` records (caused by the operator, in the
//! timeline); an operation that does not wait is 409 with its status, an unknown one 404, a bad
//! body 400, a client's token 403, and none of them appends anything.

use opledger_store::EventStore;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::operations_api::{ADMIN_TOKEN, SHOP_CLIENT, World};
use crate::support::app::{Backend, message_from, on_both_backends};
use crate::support::fake_service::Behaviour;
use crate::support::{opledger, stderr, stdout};

on_both_backends!(
    an_operator_resolves_a_waiting_operation_over_http,
    an_operation_that_does_not_wait_is_a_conflict_and_nothing_changes,
    an_unknown_operation_or_a_bad_decision_is_refused_and_nothing_changes,
    only_the_admin_token_decides,
    the_api_and_the_cli_reach_the_same_state,
);

/// Posts `decision` about operation `id` with `token`.
async fn resolve(world: &World, token: &str, id: &str, decision: &Value) -> (StatusCode, Value) {
    let url = world.url(&format!("/v1/operations/{id}/resolution"));
    world
        .send(world.app.http.post(url).json(decision), token)
        .await
}

/// The operation of `key` (`campaign:user`), as the admin reads it.
async fn operation(world: &World, key: &str) -> Value {
    world
        .operations()
        .await
        .into_iter()
        .find(|row| row["business_key"] == key)
        .unwrap_or_else(|| panic!("operation {key}"))
}

/// `/coupon spring` from `user`, delivered as update `update_id`.
async fn ask(world: &World, update_id: i64, user: i64) {
    let body = message_from(update_id, 1_790_000_000, user, "/coupon spring");
    assert_eq!(world.app.deliver(body).await.status(), StatusCode::OK);
}

/// The operation of `spring:{user}`, after the shop created the coupon and then failed: its
/// outcome is unknown, and without a key it honours or a lookup, a person must decide.
async fn waiting(world: &World, update_id: i64, user: i64) -> String {
    world.service.script([Behaviour::CreateThenFail(500)]);
    ask(world, update_id, user).await;
    world.work().await;
    let row = operation(world, &format!("spring:{user}")).await;
    assert_eq!(row["status"], "needs_reconciliation", "{row}");
    row["operation_id"].as_str().expect("an id").to_owned()
}

/// The operation's events, as `/v1` shows them.
async fn events(world: &World, id: &str) -> Vec<Value> {
    let (status, body) = world
        .get(ADMIN_TOKEN, &format!("/v1/operations/{id}/events"))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["events"].as_array().cloned().expect("events")
}

/// A world with [`waiting`] operation `spring:7`, its id, and the ledger's head.
async fn with_a_waiting_operation(backend: Backend) -> Option<(World, String, u64)> {
    let world = World::start(backend).await?;
    let id = waiting(&world, 1, 7).await;
    let before = head(&world).await;
    Some((world, id, before))
}

/// Nothing was appended since `before`, and `spring:7` still waits.
async fn unchanged(world: &World, before: u64) {
    assert_eq!(head(world).await, before, "nothing was appended");
    assert_eq!(
        operation(world, "spring:7").await["status"],
        "needs_reconciliation"
    );
}

async fn head(world: &World) -> u64 {
    world.app.store.head().await.expect("head").position
}

/// A decision of `operator`.
fn decision(outcome: &str, external_id: Option<&str>, operator: &str) -> Value {
    let mut decision = json!({
        "outcome": outcome,
        "operator": operator,
        "note": "found the coupon in the shop's admin panel",
    });
    if let Some(id) = external_id {
        decision["external_id"] = json!(id);
    }
    decision
}

async fn an_operator_resolves_a_waiting_operation_over_http(backend: Backend) {
    let Some((world, id, before)) = with_a_waiting_operation(backend).await else {
        return;
    };

    let (status, body) = resolve(
        &world,
        ADMIN_TOKEN,
        &id,
        &decision("succeeded", Some("crm-77"), "alice"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["operation_id"], id.as_str());
    assert_eq!(body["status"], "reconciled", "{body}");
    assert_eq!(body["external_id"], "crm-77");
    assert_eq!(head(&world).await, before + 1, "one event appended");

    let events = events(&world, &id).await;
    let last = events.last().expect("an event");
    assert_eq!(last["event_type"], "Reconciled");
    assert_eq!(
        last["payload"],
        json!({
            "outcome": "succeeded",
            "external_id": "crm-77",
            "operator": "alice",
            "note": "found the coupon in the shop's admin panel",
        })
    );
    assert_eq!(
        last["metadata"]["causation"],
        json!({ "kind": "operator", "operator": "alice" })
    );

    // The worker replies as after the CLI's decision; the timeline names the operator.
    world.work().await;
    let (_, row) = world
        .get(ADMIN_TOKEN, &format!("/v1/operations/{id}"))
        .await;
    assert_eq!(row["reply"], "sent", "{row}");
    let now = head(&world).await;
    assert!(
        opledger_projections::registry::wait_for(
            &world.app.store,
            "audit_trail",
            now,
            std::time::Duration::from_secs(30)
        )
        .await
        .expect("read the registry"),
        "the audit trail caught up"
    );
    let output = opledger(&world.ledger.url(), &["timeline", &id, "--json"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let reconciled: Value = stdout(&output)
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).expect("a JSON line"))
        .find(|entry| entry["event_type"] == "Reconciled")
        .expect("the decision in the timeline");
    assert_eq!(reconciled["cause"]["kind"], "operator");
    assert_eq!(reconciled["cause"]["operator"], "alice");
    assert_eq!(reconciled["details"]["external_id"], "crm-77");
    world.app.stop().await;
}

async fn an_operation_that_does_not_wait_is_a_conflict_and_nothing_changes(backend: Backend) {
    let Some((world, id, _)) = with_a_waiting_operation(backend).await else {
        return;
    };
    let (status, body) =
        resolve(&world, ADMIN_TOKEN, &id, &decision("failed", None, "alice")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // One the worker has not touched yet.
    ask(&world, 2, 8).await;
    let received = operation(&world, "spring:8").await;
    let before = head(&world).await;

    // A second decision, by someone who did not see the first, and one about an operation that
    // was never marked.
    for (id, status_now) in [
        (id.as_str(), "reconciled"),
        (received["operation_id"].as_str().unwrap(), "received"),
    ] {
        let (status, body) =
            resolve(&world, ADMIN_TOKEN, id, &decision("succeeded", None, "bob")).await;
        assert_eq!(status, StatusCode::CONFLICT, "{body}");
        assert_eq!(body["error"], "not_waiting", "{body}");
        assert_eq!(body["status"], status_now, "{body}");
        let message = body["message"].as_str().expect("a message");
        assert!(
            message.contains(&format!(
                "operation {id} is {status_now}, not waiting for reconciliation; nothing was changed"
            )),
            "{body}"
        );
    }
    assert_eq!(head(&world).await, before, "nothing was appended");
    let row = operation(&world, "spring:7").await;
    assert_eq!(row["status"], "reconciled");
    assert_eq!(row["external_id"], Value::Null, "the first decision stands");
    world.app.stop().await;
}

async fn an_unknown_operation_or_a_bad_decision_is_refused_and_nothing_changes(backend: Backend) {
    let Some((world, id, before)) = with_a_waiting_operation(backend).await else {
        return;
    };

    let unknown = opledger_domain::OperationId::new("coupon", "autumn:7").to_string();
    let (status, body) = resolve(
        &world,
        ADMIN_TOKEN,
        &unknown,
        &decision("failed", None, "alice"),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["error"], "not_found");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains(&format!("no operation has the id `{unknown}`")),
        "{body}"
    );
    let (status, body) = resolve(
        &world,
        ADMIN_TOKEN,
        "not-an-id",
        &decision("failed", None, "alice"),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(
        (body["error"].as_str(), body["parameter"].as_str()),
        (Some("bad_parameter"), Some("id"))
    );

    let bad: Vec<(Value, &str)> = vec![
        (
            decision("maybe", None, "alice"),
            "unknown variant `maybe`, expected one of `succeeded`, `failed`, `retry`",
        ),
        (decision("failed", None, " "), "the operator is empty"),
        (
            json!({ "outcome": "failed", "operator": "alice", "note": "" }),
            "the note is empty",
        ),
        (
            decision("succeeded", Some(""), "alice"),
            "the external id is empty",
        ),
        (
            decision("retry", Some("crm-1"), "alice"),
            "an external id goes only with the outcome succeeded, not retry",
        ),
        (json!({ "outcome": "failed", "operator": "alice" }), "note"),
        (
            json!({ "outcome": "failed", "operator": "alice", "note": "x", "colour": "red" }),
            "colour",
        ),
        (json!("succeeded"), "expected struct"),
    ];
    for (body, says) in bad {
        let (status, answer) = resolve(&world, ADMIN_TOKEN, &id, &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        assert_eq!(answer["error"], "bad_request", "{answer}");
        assert!(
            answer["message"].as_str().unwrap().contains(says),
            "{body}: expected `{says}` in {answer}"
        );
    }
    unchanged(&world, before).await;
    world.app.stop().await;
}

async fn only_the_admin_token_decides(backend: Backend) {
    let Some((world, id, before)) = with_a_waiting_operation(backend).await else {
        return;
    };
    let (status, body) = resolve(
        &world,
        SHOP_CLIENT,
        &id,
        &decision("failed", None, "mallory"),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"], "forbidden");
    let wrong = "CANARY-wrong-token_0123456789abcdef";
    let (status, body) = resolve(&world, wrong, &id, &decision("failed", None, "mallory")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    unchanged(&world, before).await;
    world.app.stop().await;
}

/// The fields of an operation's events that differ between two operations of two users.
const OWN_FIELDS: [&str; 9] = [
    "operation_id",
    "idempotency_key",
    "business_key",
    "fingerprint",
    "user_id",
    "chat_id",
    "update_id",
    "params",
    "lease_until",
];

/// The same decision, once through the API and once through `opledger reconcile resolve`, about
/// two operations in the same state: the same events, payloads, causes and read-model rows.
async fn the_api_and_the_cli_reach_the_same_state(backend: Backend) {
    let Some(world) = World::start(backend).await else {
        return;
    };
    let by_api = waiting(&world, 1, 7).await;
    let by_cli = waiting(&world, 2, 8).await;
    let (status, body) = resolve(
        &world,
        ADMIN_TOKEN,
        &by_api,
        &decision("retry", None, "alice"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "retry_scheduled", "{body}");
    let output = opledger(
        &world.ledger.url(),
        &[
            "reconcile",
            "resolve",
            &by_cli,
            "--outcome",
            "retry",
            "--operator",
            "alice",
            "--note",
            "found the coupon in the shop's admin panel",
        ],
    );
    assert!(output.status.success(), "{}", stderr(&output));

    let shape = |events: Vec<Value>| -> Vec<(Value, Value, Value)> {
        events
            .into_iter()
            .map(|e| {
                let mut payload = e["payload"].clone();
                if let Some(payload) = payload.as_object_mut() {
                    // Each operation's own id, request and lease, not the decision's.
                    for field in OWN_FIELDS {
                        payload.remove(field);
                    }
                }
                let mut metadata = e["metadata"].clone();
                if let Some(metadata) = metadata.as_object_mut() {
                    metadata.remove("correlation");
                }
                if let Some(cause) = metadata["causation"].as_object_mut() {
                    cause.remove("update_id");
                }
                (e["event_type"].clone(), payload, metadata)
            })
            .collect()
    };
    let api_events = shape(events(&world, &by_api).await);
    let cli_events = shape(events(&world, &by_cli).await);
    assert_eq!(api_events, cli_events);
    assert_eq!(
        api_events.last().map(|(t, _, _)| t.clone()),
        Some(json!("Reconciled"))
    );

    let row = |row: Value| {
        (
            row["status"].clone(),
            row["external_id"].clone(),
            row["due_at"].is_string(),
            row["reply"].clone(),
            row["version"].clone(),
            row["attempts"].clone(),
        )
    };
    let api_row = row(operation(&world, "spring:7").await);
    assert_eq!(api_row, row(operation(&world, "spring:8").await));
    assert_eq!(api_row.0, "retry_scheduled");
    assert!(api_row.2, "due again");

    // And the worker calls both again, under their own ids.
    world.work().await;
    assert_eq!(world.service.requests().get(&by_api), Some(&2));
    assert_eq!(world.service.requests().get(&by_cli), Some(&2));
    world.app.stop().await;
}
