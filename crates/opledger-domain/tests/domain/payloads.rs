//! The event JSON is a public contract: every payload and metadata shape is pinned by a snapshot,
//! and every event survives the trip through the store's bytes.

use std::collections::BTreeSet;
use std::fmt::Debug;

use opledger_domain::{Causation, DecodeError, DomainEvent, EventMetadata, OperationEvent};

use crate::fixtures::*;

/// Type name, schema version and the exact payload bytes, as the store keeps them.
fn stored<E: DomainEvent>(event: &E) -> String {
    let payload = event.to_payload().expect("events serialize");
    format!(
        "event_type: {}\nschema_version: {}\npayload: {}",
        event.event_type(),
        event.schema_version(),
        String::from_utf8(payload).expect("JSON is UTF-8")
    )
}

fn pin_all<E: DomainEvent + Debug + PartialEq>(aggregate: &str, events: &[E]) {
    let types: BTreeSet<_> = events.iter().map(DomainEvent::event_type).collect();
    assert_eq!(
        types,
        E::EVENT_TYPES.iter().copied().collect(),
        "one sample per type"
    );
    for event in events {
        insta::assert_snapshot!(
            format!("{aggregate}__{}", event.event_type()),
            stored(event)
        );
        let payload = event.to_payload().expect("events serialize");
        let back = E::from_stored(event.event_type(), event.schema_version(), &payload)
            .expect("a stored event reads back");
        assert_eq!(&back, event);
    }
}

#[test]
fn operation_payloads_are_pinned_and_round_trip() {
    pin_all("operation", &every_operation_event());
}

#[test]
fn delivery_payloads_are_pinned_and_round_trip() {
    pin_all("delivery", &every_delivery_event());
}

#[test]
fn repeat_guard_payloads_are_pinned_and_round_trip() {
    pin_all("repeat_guard", &every_repeat_guard_event());
}

#[test]
fn quarantine_payloads_are_pinned_and_round_trip() {
    pin_all("quarantine", &every_quarantine_event());
}

#[test]
fn callback_token_payloads_are_pinned_and_round_trip() {
    pin_all("callback_token", &every_token_event());
}

#[test]
fn metadata_of_every_causation_is_pinned_and_round_trips() {
    let cases = [
        (
            "update",
            EventMetadata::caused_by(Causation::Update {
                bot: BOT.to_owned(),
                update_id: UPDATE_ID,
            })
            .correlated_with(format!("update-{BOT}-{UPDATE_ID}")),
        ),
        (
            "worker",
            EventMetadata::caused_by(Causation::Worker {
                worker: W1.to_owned(),
            })
            .correlated_with(format!("update-{BOT}-{UPDATE_ID}")),
        ),
        (
            "operator",
            EventMetadata::caused_by(Causation::Operator {
                operator: "alice".to_owned(),
            }),
        ),
        (
            "system",
            EventMetadata::caused_by(Causation::System {
                component: "lease_sweep".to_owned(),
            }),
        ),
    ];
    for (kind, metadata) in cases {
        let bytes = metadata.to_bytes().expect("metadata serializes");
        insta::assert_snapshot!(
            format!("metadata__{kind}"),
            String::from_utf8(bytes.clone()).expect("JSON is UTF-8")
        );
        assert_eq!(
            EventMetadata::from_bytes(&bytes).expect("reads back"),
            metadata
        );
    }
}

#[test]
fn stored_bytes_that_cannot_be_read_are_typed_errors() {
    let payload = br#"{"attempt":1}"#;
    assert!(OperationEvent::from_stored("ReplyStarted", 1, payload).is_ok());
    assert!(matches!(
        OperationEvent::from_stored("CouponIssued", 1, payload),
        Err(DecodeError::UnknownEventType { event_type }) if event_type == "CouponIssued"
    ));
    for version in [0, 2] {
        assert!(matches!(
            OperationEvent::from_stored("ReplyStarted", version, payload),
            Err(DecodeError::UnsupportedSchemaVersion { schema_version, supported: 1, .. })
                if schema_version == version
        ));
    }
    let error = OperationEvent::from_stored("ReplyStarted", 1, br#"{"attempt":"one"}"#)
        .expect_err("wrong type");
    assert!(
        matches!(error, DecodeError::BadPayload { ref event_type, .. } if event_type == "ReplyStarted")
    );
    assert!(std::error::Error::source(&error).is_some());
    assert!(matches!(
        EventMetadata::from_bytes(br#"{"causation":{"kind":"moon"}}"#),
        Err(DecodeError::BadMetadata { .. })
    ));
}

#[test]
fn the_type_name_travels_outside_the_payload() {
    for event in every_operation_event() {
        let payload: serde_json::Value =
            serde_json::from_slice(&event.to_payload().expect("serializes")).expect("JSON");
        let object = payload.as_object().expect("payloads are objects");
        assert!(!object.contains_key("type") && !object.contains_key(event.event_type()));
        assert_eq!(event.event_type(), event.kind().as_str());
    }
}
