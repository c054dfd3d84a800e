//! Checks of single values that several sections share: numbers in range, secrets read from
//! the environment.

use secrecy::{ExposeSecret, SecretString};

use crate::error::ConfigError;

/// The longest environment variable name accepted.
const MAX_ENV_NAME_LEN: usize = 128;

/// The value of an integer key, or its default; outside `range` is an error whose advice ends
/// with `suffix` (a unit and a reason).
pub(crate) fn in_range(
    key: &str,
    value: Option<i64>,
    default: i64,
    range: std::ops::RangeInclusive<i64>,
    suffix: &str,
) -> Result<i64, ConfigError> {
    let value = value.unwrap_or(default);
    if range.contains(&value) {
        return Ok(value);
    }
    Err(ConfigError::key_problem(
        key,
        format!(
            "{value} is out of range; use {} to {}{suffix}",
            range.start(),
            range.end()
        ),
    ))
}

/// Reads the secret named by an `*_env` key. Messages name the variable, never its value.
pub(crate) fn read_secret(
    key: &str,
    var: &str,
    what: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<SecretString, ConfigError> {
    let valid_name = !var.is_empty()
        && var.len() <= MAX_ENV_NAME_LEN
        && !var.as_bytes()[0].is_ascii_digit()
        && var
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
    if !valid_name {
        // Not echoed: an operator who wrote the secret itself here must not see it printed.
        return Err(ConfigError::key_problem(
            key,
            format!(
                "must name an environment variable (A-Z, 0-9 and _, not starting with a digit) \
                 that holds {what}; the secret itself never goes in the config file"
            ),
        ));
    }
    match env(var) {
        None => Err(ConfigError::key_problem(
            key,
            format!("environment variable `{var}` is not set; export it with {what}"),
        )),
        Some(value) if value.is_empty() => Err(ConfigError::key_problem(
            key,
            format!("environment variable `{var}` is empty; export it with {what}"),
        )),
        Some(value) => Ok(SecretString::from(value)),
    }
}

/// Reads a webhook secret named by an `*_env` key: 1 to 256 characters of `A-Z`, `a-z`, `0-9`,
/// `_` and `-`, as Telegram accepts (a bot behind the gateway checks it the same way).
pub(crate) fn webhook_secret(
    key: &str,
    var: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<SecretString, ConfigError> {
    let secret = read_secret(key, var, "the webhook secret", env)?;
    let s = secret.expose_secret();
    let valid = s.len() <= 256
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !valid {
        return Err(ConfigError::key_problem(
            key,
            format!(
                "environment variable `{var}` does not hold a valid webhook secret; \
                 Telegram accepts 1 to 256 characters of A-Z, a-z, 0-9, _ and -"
            ),
        ));
    }
    Ok(secret)
}
