//! `opledger migrate`: create the ledger if needed and bring its schema up to date.

use opledger_store::EventStore;

use crate::database;

pub(crate) async fn run(url: &str) -> anyhow::Result<()> {
    let store = database::open(url).await?;
    let head = store.head().await?;
    let schema = store.schema_version();
    println!(
        "ledger {} is ready: schema version {schema}, {} events, head {}",
        database::redact(url),
        head.position,
        head.hash
    );
    store.close().await;
    Ok(())
}
