//! What can go wrong, each saying what to do.

use opledger_config::ConfigError;
use opledger_projections::ProjectorError;
use opledger_projections::operation_status::ReadError;
use opledger_server::IntakeError;
use opledger_store::OpenError;
use opledger_worker::{ForwarderError, WorkerError};

/// An error of the embedded ledger.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A declaration or the TOML text is refused, with the key at fault.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The TOML text given to [`Builder::toml`](crate::Builder::toml) does not parse.
    #[error("the configuration is not valid TOML: {0}")]
    Toml(String),
    /// The ledger could not be opened (or migrated).
    #[error("cannot open the ledger: {0}")]
    Open(#[from] OpenError),
    /// An effector was registered for an action that is not declared.
    #[error("an effector was given for `{0}`, which is not a declared action; declare it first")]
    UnknownAction(String),
    /// An update, submission or button could not be recorded. Nothing was committed: answer
    /// Telegram with an error (it delivers again) or retry later.
    #[error(transparent)]
    Intake(#[from] IntakeError),
    /// The worker could not be set up.
    #[error(transparent)]
    Worker(#[from] WorkerError),
    /// The hand-over of updates could not be set up.
    #[error(transparent)]
    Forwarder(#[from] ForwarderError),
    /// The read models could not be installed.
    #[error("cannot prepare the read models: {0}")]
    Projections(#[from] ProjectorError),
    /// An operation could not be read.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// No operation has this id.
    #[error("no operation has the id `{0}`")]
    UnknownOperation(String),
    /// Updates of this bot do not go to the program's handlers.
    #[error(
        "bot `{0}` does not hand its updates to this program's handlers; declare it with \
         Bot::handlers (or `[bots.forward] in_process = true`)"
    )]
    NoHandlers(String),
    /// No bot has this name.
    #[error("no bot named `{0}` is declared")]
    UnknownBot(String),
    /// The HTTP server stopped with an error.
    #[error("the HTTP server stopped: {0}")]
    Serve(#[source] std::io::Error),
}
