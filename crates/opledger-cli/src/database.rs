//! Opening the ledger named by a database URL, with the read models every writer keeps.

use anyhow::Context;
use opledger_store::{AnyOptions, AnyStore};

/// Opens the ledger at `url` (SQLite or PostgreSQL), creating it and applying migrations if
/// needed, with opledger's inline read models installed.
pub(crate) async fn open(url: &str) -> anyhow::Result<AnyStore> {
    let options = AnyOptions {
        inline: opledger_projections::inline(),
        ..AnyOptions::default()
    };
    AnyStore::open(url, options)
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
