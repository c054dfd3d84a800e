//! Verifying a ledger in its database (`opledger audit verify`): the store's two-pass check
//! ([`opledger_store::verify::verify`]), timed, and its [`Report`].

use std::time::Instant;

use opledger_store::verify::{self, Verification};
use opledger_store::{LedgerReader, StoreError};
use serde::Serialize;

use crate::verdict::{BrokenLink, Checkpoint, HashAt, Report, rate};

/// What verifying a ledger found, and how long it took.
#[derive(Debug, Clone)]
pub struct LedgerReport {
    pub verification: Verification,
    /// The head kept elsewhere that the ledger was checked against.
    pub expect_head: Option<Checkpoint>,
    pub seconds: f64,
}

/// Verifies the whole ledger behind `reader`; `expect_head` is a hash kept elsewhere that it
/// must still hold. `Err` only when the ledger cannot be read.
pub async fn verify_ledger(
    reader: &LedgerReader,
    expect_head: Option<Checkpoint>,
) -> Result<LedgerReport, StoreError> {
    let started = Instant::now();
    let verification = verify::verify(reader, expect_head).await?;
    Ok(LedgerReport {
        verification,
        expect_head,
        seconds: started.elapsed().as_secs_f64(),
    })
}

impl LedgerReport {
    fn events_per_sec(&self) -> f64 {
        rate(self.verification.events, self.seconds)
    }
}

/// `opledger audit verify --json`.
#[derive(Serialize)]
struct LedgerJson {
    ok: bool,
    events: u64,
    streams: u64,
    seconds: f64,
    events_per_sec: f64,
    peak_rss_bytes: Option<u64>,
    head: HashAt,
    broken: Option<BrokenLink>,
}

impl Report for LedgerReport {
    fn to_json(&self, peak_rss_bytes: Option<u64>) -> serde_json::Result<String> {
        let broken = self.broken();
        serde_json::to_string(&LedgerJson {
            ok: broken.is_none(),
            events: self.verification.events,
            streams: self.verification.streams,
            seconds: self.seconds,
            events_per_sec: self.events_per_sec(),
            peak_rss_bytes,
            head: self.verification.head.into(),
            broken,
        })
    }

    fn ok_lines(&self) -> Vec<String> {
        let Verification {
            head,
            events,
            streams,
            broken,
        } = &self.verification;
        if broken.is_some() {
            return Vec::new();
        }
        let mut lines = vec![
            format!(
                "ok: {events} events in {streams} streams verified in {:.2} s ({:.0} events/s)",
                self.seconds,
                self.events_per_sec()
            ),
            format!("head: position {}, hash {}", head.position, head.hash),
        ];
        if let Some(expected) = self.expect_head {
            lines.push(format!("the kept head {expected} is in the chain"));
        }
        lines
    }

    fn broken(&self) -> Option<BrokenLink> {
        let broken = self.verification.broken.as_ref()?;
        Some(BrokenLink::new("the ledger", broken))
    }
}
