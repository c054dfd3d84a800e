//! Every error of the configuration: one line each, naming what is wrong and what to do.
//!
//! No message ever contains a secret: environment variables are named, never echoed, and
//! database URLs are shown without their password.

use std::fmt;

/// Why a configuration file was refused.
///
/// `opledger serve` prints it as the one line of its exit-code-2 failure, so every message
/// names the place at fault (a key path such as `bots[1].token_env`, or a line of the file when
/// the TOML itself is broken) and says how to fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The file is not valid TOML; no key can be named, so the line is.
    #[error("config file line {line}, column {column}: {problem}")]
    Syntax {
        /// 1-based line of the error.
        line: usize,
        /// 1-based column (in characters) of the error.
        column: usize,
        /// What the TOML parser found, on one line.
        problem: String,
    },
    /// A key is unknown, missing, of the wrong type or has a value that fails validation.
    #[error("config key `{key}`: {problem}")]
    Key {
        /// The full path of the key, e.g. `actions[0].effector.url`.
        key: String,
        /// What is wrong and what to do, on one line.
        problem: String,
    },
}

impl ConfigError {
    /// The full path of the key at fault, when the file parsed as TOML.
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::Syntax { .. } => None,
            ConfigError::Key { key, .. } => Some(key),
        }
    }

    pub(crate) fn key_problem(key: impl Into<String>, problem: impl Into<String>) -> Self {
        ConfigError::Key {
            key: escape_controls(key.into()),
            problem: escape_controls(problem.into()),
        }
    }
}

/// `text` with its control characters (line breaks, tabs, ESC, ...) written as `\uXXXX`: a value
/// or key quoted from the file must not break the message's one line.
pub(crate) fn escape_controls(text: String) -> String {
    if !text.chars().any(char::is_control) {
        return text;
    }
    let mut escaped = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            escaped.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            escaped.push(c);
        }
    }
    escaped
}

/// Why a template's text was refused.
///
/// It is turned into a [`ConfigError`] naming the template's key; its message is the problem
/// part of that line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// A `{` has no matching `}`.
    #[error(
        "unclosed `{{` at character {at}; close the placeholder with `}}`, or write `{{{{` for a literal `{{`"
    )]
    Unclosed {
        /// 1-based character position of the `{`.
        at: usize,
    },
    /// A `}` closes nothing.
    #[error("unmatched `}}` at character {at}; write `}}}}` for a literal `}}`")]
    Unmatched {
        /// 1-based character position of the `}`.
        at: usize,
    },
    /// `{}` names nothing.
    #[error("empty placeholder `{{}}` at character {at}; name a value inside the braces")]
    EmptyName {
        /// 1-based character position of the `{`.
        at: usize,
    },
    /// A placeholder's name has a character outside the allowed set.
    #[error(
        "placeholder `{{{name}}}` is malformed; a name is made of A-Z, a-z, 0-9 and _, \
         with `.` only between parts (as in result.code)"
    )]
    BadName {
        /// The name between the braces.
        name: String,
    },
    /// A well-formed placeholder that this kind of template does not offer.
    #[error("unknown placeholder `{{{name}}}`; {allowed}")]
    Unknown {
        /// The name between the braces.
        name: String,
        /// Which names are allowed here, as advice ("use one of …").
        allowed: String,
    },
    /// A business key without any placeholder would make every request the same operation.
    #[error(
        "the key has no placeholder, so every request would be the same operation; \
         use e.g. {{user_id}}, or {{action}} if the action really happens once ever"
    )]
    NoPlaceholder,
    /// A reply with no text: Telegram cannot send an empty message.
    #[error("the reply is empty; Telegram cannot send an empty message, so write some text")]
    EmptyReply,
    /// The lookup URL is not an absolute http(s) URL once filled in.
    #[error("{problem}")]
    BadUrl {
        /// What is wrong with the URL.
        problem: String,
    },
}

/// Why a template could not be filled in; the caller supplied too little.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    /// No value was supplied for a placeholder.
    #[error("no value for placeholder `{{{name}}}`: supply it, or fix the template")]
    Missing {
        /// The placeholder's name.
        name: String,
    },
    /// A business key part was empty, which would let different requests share a key.
    #[error("placeholder `{{{name}}}` has an empty value: a business key part must not be empty")]
    Empty {
        /// The placeholder's name.
        name: String,
    },
    /// The filled-in URL does not parse.
    #[error("the filled-in URL is invalid: {source}")]
    BadUrl {
        /// What the URL parser found.
        #[source]
        source: url::ParseError,
    },
}

/// A comma-separated list, for messages.
pub(crate) struct List<'a, T>(pub(crate) &'a [T]);

impl<T: fmt::Display> fmt::Display for List<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, item) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{item}")?;
        }
        Ok(())
    }
}
