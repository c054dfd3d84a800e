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
    #[error(
        "config key `{key}`: in_process is for a Rust program that embeds opledger (the \
         `opledger` crate), which `opledger serve` and `opledger worker` are not; give {instead}"
    )]
    InProcess { key: String, instead: &'static str },
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

/// Refuses a configuration whose bots or effects live in an embedding program (`in_process`),
/// before `serve` or `worker` opens the ledger.
pub(crate) fn runnable_here(config: &Config) -> Result<(), BadConfig> {
    use opledger_config::ForwardTarget;
    for (i, bot) in config.bots.iter().enumerate() {
        if bot
            .forward
            .as_ref()
            .is_some_and(|forward| forward.target == ForwardTarget::InProcess)
        {
            return Err(BadConfig::InProcess {
                key: format!("bots[{i}].forward.in_process"),
                instead: "the bot's own webhook as [bots.forward] url",
            });
        }
    }
    for (i, action) in config.actions.iter().enumerate() {
        if action.effector.as_ref().is_some_and(|e| e.url.is_none()) {
            return Err(BadConfig::InProcess {
                key: format!("actions[{i}].effector.in_process"),
                instead: "the service the action calls as [actions.effector] url",
            });
        }
    }
    Ok(())
}

/// The ledger's URL: `--database-url` (or `OPLEDGER_DATABASE_URL`) if given, else the
/// configuration's `[storage] url`, else the default file.
pub(crate) fn database_url(flag: Option<&str>, config: &Config) -> String {
    flag.map_or_else(
        || config.storage.url.expose_secret().to_owned(),
        str::to_owned,
    )
}
