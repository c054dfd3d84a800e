//! `opledger reconcile`: the operations whose outcome nobody knows, and a person's decision about
//! each, recorded as a `Reconciled` event caused by the operator.

use chrono::TimeDelta;
use opledger_domain::operation::{ReconcileOutcome, Reconciled};
use opledger_server::reconcile::{self, Outcome, Waiting, outcome_name};
use opledger_server::{Clock, SystemClock};
use opledger_store::LedgerReader;

use crate::database;
use crate::output::Output;

#[derive(Debug, clap::Subcommand)]
pub(crate) enum Reconcile {
    /// List the operations waiting for a person: an external call's outcome is unknown and no
    /// automatic path is safe. Most recently changed first.
    List {
        /// At most N operations.
        #[arg(long, value_name = "N", default_value_t = 100)]
        limit: u32,
        /// Print JSON Lines instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Record what a person found out about an operation waiting for reconciliation (appends a
    /// Reconciled event, caused by the operator).
    Resolve {
        /// The operation's id, as `opledger reconcile list` shows it.
        #[arg(value_name = "OPERATION_ID")]
        operation_id: String,
        /// What happened: succeeded and failed end the operation; retry makes it due now, to be
        /// called again with the same operation id as idempotency key.
        #[arg(long, value_enum)]
        outcome: Outcome,
        /// The external service's id for what it did (only with --outcome succeeded).
        #[arg(long, value_name = "ID")]
        external_id: Option<String>,
        /// Who decides, for the audit trail.
        #[arg(long, value_name = "NAME")]
        operator: String,
        /// Why, for the audit trail (what was checked, where).
        #[arg(long, value_name = "TEXT")]
        note: String,
    },
}

impl Reconcile {
    /// Listing opens the ledger read-only; resolving writes, so it may create and migrate.
    pub(crate) async fn run(self, url: &str) -> anyhow::Result<()> {
        match self {
            Reconcile::List { limit, json } => {
                let reader = database::open_reader(url).await?;
                let result = list(&reader, limit, json).await;
                reader.close().await;
                result
            }
            Reconcile::Resolve {
                operation_id,
                outcome,
                external_id,
                operator,
                note,
            } => {
                let decision = Reconciled {
                    outcome: outcome.into(),
                    external_id,
                    operator,
                    note,
                };
                let store = database::open(url).await?;
                let result = resolve(&store, &operation_id, decision).await;
                store.close().await;
                result
            }
        }
    }
}

async fn list(reader: &LedgerReader, limit: u32, json: bool) -> anyhow::Result<()> {
    let waiting = reconcile::list(reader.pool(), SystemClock.now(), limit).await?;
    let mut out = Output::stdout();
    if !json {
        out.line(format_args!(
            "{:>9}  {:>8}  {:<36}  {:>14}  {:>12}  ACTION KEY: REASON",
            "AGE", "ATTEMPTS", "OPERATION", "CHAT", "USER"
        ))?;
    }
    for operation in &waiting {
        let written = if json {
            out.line(format_args!("{}", serde_json::to_string(operation)?))?
        } else {
            row(&mut out, operation)?
        };
        if !written {
            break;
        }
    }
    out.finish()?;
    Ok(())
}

fn row(out: &mut Output, operation: &Waiting) -> std::io::Result<bool> {
    let id = |id: Option<i64>| id.map_or_else(|| "-".to_owned(), |id| id.to_string());
    out.line(format_args!(
        "{:>9}  {:>8}  {:<36}  {:>14}  {:>12}  {} {}: {}",
        age(TimeDelta::seconds(operation.age_seconds)),
        operation.attempts,
        operation.operation_id,
        id(operation.chat_id),
        id(operation.user_id),
        operation.action,
        operation.business_key,
        operation
            .reason
            .as_deref()
            .unwrap_or("(no reason recorded)")
    ))
}

/// A duration as its two largest units: `45s`, `12m05s`, `3h07m`, `2d04h`.
fn age(age: TimeDelta) -> String {
    let seconds = age.num_seconds().max(0);
    let (days, hours, minutes) = (seconds / 86_400, seconds / 3_600 % 24, seconds / 60 % 60);
    match (days, hours, minutes) {
        (0, 0, 0) => format!("{seconds}s"),
        (0, 0, _) => format!("{minutes}m{:02}s", seconds % 60),
        (0, _, _) => format!("{hours}h{minutes:02}m"),
        _ => format!("{days}d{hours:02}h"),
    }
}

async fn resolve(
    store: &opledger_store::AnyStore,
    operation_id: &str,
    decision: Reconciled,
) -> anyhow::Result<()> {
    let resolved = reconcile::resolve(store, operation_id, decision, SystemClock.now()).await?;
    let decision = &resolved.decision;
    let external = decision
        .external_id
        .as_deref()
        .map(|id| format!(" (external id {id})"))
        .unwrap_or_default();
    let next = match decision.outcome {
        ReconcileOutcome::Retry => {
            "; due again now, to be called with the same operation id as idempotency key"
        }
        ReconcileOutcome::Succeeded | ReconcileOutcome::Failed => "",
    };
    println!(
        "operation {} reconciled: {}{external} by {}{next} (status {}, event at position {})",
        resolved.operation_id,
        outcome_name(decision.outcome),
        decision.operator,
        resolved.status,
        resolved.position
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::age;
    use chrono::TimeDelta;

    #[test]
    fn ages_read_at_a_glance() {
        assert_eq!(age(TimeDelta::seconds(0)), "0s");
        assert_eq!(age(TimeDelta::seconds(45)), "45s");
        assert_eq!(age(TimeDelta::seconds(12 * 60 + 5)), "12m05s");
        assert_eq!(age(TimeDelta::seconds(3 * 3600 + 7 * 60 + 59)), "3h07m");
        assert_eq!(age(TimeDelta::seconds(2 * 86_400 + 4 * 3600)), "2d04h");
        assert_eq!(age(TimeDelta::seconds(-5)), "0s");
    }
}
