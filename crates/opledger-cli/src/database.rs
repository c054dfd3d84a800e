//! Opening the ledger named by a database URL: for writing, with the read models every writer
//! keeps, or read-only.

use anyhow::Context;
use opledger_store::{AnyOptions, AnyStore, LedgerReader};

/// Opens the ledger at `url` (SQLite or PostgreSQL), creating it and applying migrations if
/// needed, with opledger's inline read models installed. Only the commands that write use it
/// (`serve`, `worker`, `migrate`, `reconcile resolve`, `projections rebuild`).
pub(crate) async fn open(url: &str) -> anyhow::Result<AnyStore> {
    let options = AnyOptions {
        inline: opledger_projections::inline(),
        ..AnyOptions::default()
    };
    AnyStore::open(url, options)
        .await
        .with_context(|| format!("cannot open the ledger at {}", redact(url)))
}

/// Opens the ledger at `url` read-only, for the commands that only read: it must exist and be an
/// opledger ledger of a schema this binary knows. Nothing is created, migrated or written, so a
/// mistyped path or someone else's database is refused and left as it was.
pub(crate) async fn open_reader(url: &str) -> anyhow::Result<LedgerReader> {
    LedgerReader::open(url)
        .await
        .with_context(|| format!("cannot open the ledger at {}", redact(url)))
}

/// The URL without its password, fit for messages and logs.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, path) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
    let Some((userinfo, host)) = authority.rsplit_once('@') else {
        return url.to_owned();
    };
    let user = userinfo.split_once(':').map_or(userinfo, |(user, _)| user);
    let slash = if rest.contains('/') { "/" } else { "" };
    if userinfo.contains(':') {
        format!("{scheme}://{user}:***@{host}{slash}{path}")
    } else {
        format!("{scheme}://{user}@{host}{slash}{path}")
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_never_reach_messages() {
        assert_eq!(
            redact("postgres://app:s3cret@db.example:5432/ledger"),
            "postgres://app:***@db.example:5432/ledger"
        );
        assert_eq!(
            redact("postgres://app@db/ledger"),
            "postgres://app@db/ledger"
        );
        assert_eq!(redact("sqlite://opledger.db"), "sqlite://opledger.db");
        assert_eq!(redact("postgres://u:p@h"), "postgres://u:***@h");
    }
}
