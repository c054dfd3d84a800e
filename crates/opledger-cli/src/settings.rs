//! Where a command's settings come from: the configuration file (if any), the environment it
//! names, and the command line, in that order of precedence, lowest first.

use std::path::{Path, PathBuf};

use opledger_config::Config;

/// A configuration that cannot be used; `opledger` exits with code 2 for it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BadConfig {
    #[error("cannot read the configuration file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Invalid {
        path: PathBuf,
        #[source]
        source: opledger_config::ConfigError,
    },
}

/// Reads and validates the configuration file, taking secrets from the environment variables
/// it names; without a file, the defaults (SQLite at `opledger.db`, no bots).
pub(crate) fn load(path: Option<&Path>) -> Result<Config, BadConfig> {
    let Some(path) = path else {
        return Ok(Config::default());
    };
    let text = std::fs::read_to_string(path).map_err(|source| BadConfig::Read {
        path: path.to_owned(),
        source,
    })?;
    Config::parse(&text, &|name| std::env::var(name).ok()).map_err(|source| BadConfig::Invalid {
        path: path.to_owned(),
        source,
    })
}

/// The ledger's URL: `--database-url` (or `OPLEDGER_DATABASE_URL`) if given, else the
/// configuration's `[storage] url`, else the default file.
pub(crate) fn database_url(flag: Option<&str>, config: &Config) -> String {
    flag.map_or_else(
        || config.storage.url.expose_secret().to_owned(),
        str::to_owned,
    )
}
