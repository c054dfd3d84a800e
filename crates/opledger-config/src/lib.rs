//! opledger's configuration: the TOML file's typed, validated form, with secrets read from
//! environment variables the file names.
//!
//! [`Config::parse`] takes the file's text and a function that looks up environment variables,
//! and returns a [`Config`] in which every check has passed, or the first [`ConfigError`],
//! whose message is one line naming the key at fault (`opledger serve` prints it and exits
//! with code 2). [`Config::default`] is the configuration without a file.
//!
//! **Architecture invariant: this crate is pure.** It never reads a file or the environment
//! itself; only the CLI does, and passes the results in. So every rule here is tested with
//! literal text and a fake environment.
//!
//! Secrets (bot tokens, webhook secrets, the admin token) never appear in the file: `*_env` keys name the
//! environment variables that hold them, and they are kept as [`secrecy::SecretString`], so
//! `Debug` output and error messages never show them. The key reference is `docs/config.md`.
//!
//! [`template`] holds the `{placeholder}` templates: business keys, replies and lookup URLs.

mod config;
mod error;
mod forward;
/// Fuzz target bodies, shared with the corpus replay tests; not an API.
#[doc(hidden)]
pub mod fuzzing;
mod raw;
pub mod template;
mod values;

pub use config::{
    ActionConfig, ApiClient, ApiConfig, BotConfig, BotMode, Config, ConfirmConfig, EffectorConfig,
    RESERVED_COMMANDS, ReplyConfig, ServerConfig, StorageBackend, StorageConfig, StorageUrl,
};
pub use error::{ConfigError, RenderError, TemplateError};
pub use forward::{ForwardConfig, ForwardTarget, ForwardUpdates};
pub use secrecy::{ExposeSecret, SecretString};
pub use template::{
    ConfirmTemplate, KeyTemplate, ReplyKind, ReplyPlaceholder, ReplyTemplate, Template, UrlTemplate,
};
