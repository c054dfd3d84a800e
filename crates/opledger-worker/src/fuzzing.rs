//! The body of the worker's fuzz target (`fuzz/`), shared with the corpus replay tests
//! (`tests/it/fuzz_corpus.rs`) so that CI checks every corpus input against the same invariants
//! without nightly. It takes arbitrary bytes and panics when an invariant breaks; it is not an
//! API.

use std::time::Duration;

use reqwest::StatusCode;
use reqwest::header::{HeaderMap, HeaderValue, RETRY_AFTER};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::effector::CallOutcome;
use crate::http;

/// Answer fields an action's reply may ask for, picked by a bit each.
const FIELDS: [&str; 6] = ["code", "id", "external_id", "result", "", "a.b"];

/// Target `effector_answer`: bytes 0–1 are the HTTP status (100–999), byte 2 the length `n` of
/// the `Retry-After` header (0: none), the next `n` bytes its value, the next byte the answer
/// fields to keep (a bit each of [`FIELDS`]), the rest the body. Every answer is classified by
/// the table of `docs/config.md` (2xx succeeded; 408, 429, 503 not done, with the header's
/// seconds capped at an hour; other 4xx rejected; anything else unknown), and a success keeps
/// the body's digest, its `external_id` or `id`, and exactly the asked fields it has.
pub fn effector_answer(data: &[u8]) {
    let [a, b, n, rest @ ..] = data else {
        return;
    };
    let Some((header, rest)) = rest.split_at_checked(usize::from(*n)) else {
        return;
    };
    let [fields, body @ ..] = rest else {
        return;
    };
    let status =
        StatusCode::from_u16(100 + u16::from_be_bytes([*a, *b]) % 900).expect("a valid status");
    let mut headers = HeaderMap::new();
    if *n > 0 {
        let Ok(value) = HeaderValue::from_bytes(header) else {
            return;
        };
        headers.insert(RETRY_AFTER, value);
    }
    let retry_after = http::retry_after(&headers);
    let seconds = std::str::from_utf8(header)
        .ok()
        .filter(|h| h.is_ascii())
        .and_then(|h| h.trim().parse::<u64>().ok());
    assert_eq!(
        retry_after,
        seconds.map(|s| Duration::from_secs(s.min(3600))),
        "Retry-After is whole seconds, capped at an hour"
    );
    let result_fields: Vec<String> = FIELDS
        .iter()
        .enumerate()
        .filter(|(i, _)| fields & (1 << i) != 0)
        .map(|(_, f)| (*f).to_owned())
        .collect();

    let outcome = http::classify(status, retry_after, || http::success(body, &result_fields));
    let code = status.as_u16();
    match &outcome {
        CallOutcome::Succeeded(success) => {
            assert!(status.is_success(), "{code} succeeded");
            check_success(body, &result_fields, success);
        }
        CallOutcome::NotDone {
            reason,
            retry_after: after,
        } => {
            assert!(matches!(code, 408 | 429 | 503), "{code} not done");
            assert_eq!(*after, retry_after);
            assert!(reason.contains(&code.to_string()));
        }
        CallOutcome::Rejected { reason } => {
            assert!(
                status.is_client_error() && !matches!(code, 408 | 429),
                "{code} rejected"
            );
            assert!(reason.contains(&code.to_string()));
        }
        CallOutcome::Unknown { reason } => {
            assert!(
                !status.is_success() && !status.is_client_error() && code != 503,
                "{code} unknown"
            );
            assert!(reason.contains(&code.to_string()));
        }
    }
}

fn check_success(body: &[u8], result_fields: &[String], success: &crate::effector::Success) {
    assert_eq!(
        success.response_digest.as_deref(),
        Some(hex::encode(Sha256::digest(body)).as_str())
    );
    let value: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let id = value.get("external_id").or_else(|| value.get("id"));
    let expected = match id {
        Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
        Some(Value::Number(n)) => n
            .as_i64()
            .map(|n| n.to_string())
            .or_else(|| n.as_u64().map(|n| n.to_string())),
        _ => None,
    };
    assert_eq!(success.external_id, expected, "the service's id, exactly");
    for (name, kept) in &success.result {
        assert!(
            result_fields.contains(name),
            "only asked fields are kept: {name}"
        );
        assert_eq!(value.get(name), Some(kept));
    }
    for name in result_fields {
        assert_eq!(success.result.contains_key(name), value.get(name).is_some());
    }
}
