//! `opledger ops`: operations and their states, from the `operation_status` read model.

use opledger_projections::operation_status::{self, Filter, OperationStatusRow};

use crate::database;
use crate::output::{Output, timestamp};

#[derive(Debug, clap::Args)]
pub(crate) struct Ops {
    /// Only operations in this state.
    #[arg(long, value_name = "STATE", value_parser = clap::builder::PossibleValuesParser::new(STATES))]
    state: Option<String>,
    /// Only this bot's operations.
    #[arg(long)]
    bot: Option<String>,
    /// Only this Telegram user's operations.
    #[arg(long, value_name = "ID")]
    user: Option<i64>,
    /// At most N operations, most recently updated first.
    #[arg(long, value_name = "N", default_value_t = 100)]
    limit: u32,
    /// Print JSON Lines instead of a table.
    #[arg(long)]
    json: bool,
}

const STATES: &[&str] = &[
    "received",
    "claimed",
    "call_sent",
    "retry_scheduled",
    "needs_reconciliation",
    "confirmed",
    "failed",
    "reconciled",
];

impl Ops {
    pub(crate) async fn run(self, url: &str) -> anyhow::Result<()> {
        let store = database::open_reader(url).await?;
        let rows = operation_status::list(
            store.pool(),
            &Filter {
                status: self.state.clone(),
                bot: self.bot.clone(),
                user_id: self.user,
                limit: self.limit,
            },
        )
        .await?;
        let mut out = Output::stdout();
        if !self.json {
            out.line(format_args!(
                "{:<27}  {:<20}  {:>8}  {:<36}  ACTION KEY",
                "UPDATED_AT", "STATE", "ATTEMPTS", "OPERATION"
            ))?;
        }
        for row in &rows {
            if !self.print(&mut out, row)? {
                break;
            }
        }
        out.finish()?;
        store.close().await;
        Ok(())
    }

    fn print(&self, out: &mut Output, row: &OperationStatusRow) -> anyhow::Result<bool> {
        if self.json {
            return Ok(out.line(format_args!("{}", serde_json::to_string(row)?))?);
        }
        Ok(out.line(format_args!(
            "{:<27}  {:<20}  {:>8}  {:<36}  {} {}",
            timestamp(row.updated_at),
            row.status,
            row.attempts,
            row.operation_id,
            row.action,
            row.business_key
        ))?)
    }
}
