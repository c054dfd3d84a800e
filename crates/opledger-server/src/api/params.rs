//! Query and path parameters, checked one by one so that a bad one is answered 400 naming it.
//!
//! Unknown and repeated query parameters are refused too: a misspelt filter (`status=` for
//! `state=`) would otherwise be ignored and the answer would look right while listing
//! everything. An empty value (`state=`, as a blank form field sends it) counts as absent.

use std::str::FromStr;

use url::form_urlencoded;

use crate::api::error::ApiError;

/// The longest parameter value quoted back in an error.
const QUOTED_MAX: usize = 64;

/// The largest `limit` accepted (larger ones are refused; those above a route's maximum are
/// capped to it). The OpenAPI document declares it as the parameter's `maximum`.
pub(crate) const LIMIT_MAX: u32 = u32::MAX;
/// The largest stream version a request may name: versions are signed 64-bit in the ledger.
/// The OpenAPI document declares it as `from_version`'s `maximum`.
pub(crate) const VERSION_MAX: u64 = i64::MAX.unsigned_abs();

/// A request's query parameters, checked against the names its route takes.
#[derive(Debug)]
pub(crate) struct Params {
    pairs: Vec<(String, String)>,
}

impl Params {
    /// Parses a raw query string; every name must be one of `allowed`, at most once.
    pub(crate) fn parse(raw: Option<&str>, allowed: &[&str]) -> Result<Params, ApiError> {
        let mut pairs: Vec<(String, String)> = Vec::new();
        for (name, value) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
            if !allowed.contains(&name.as_ref()) {
                let takes = if allowed.is_empty() {
                    "this route takes no query parameters".to_owned()
                } else {
                    format!("this route takes {}", allowed.join(", "))
                };
                return Err(ApiError::bad(
                    cut(&name),
                    format!("unknown query parameter; {takes}"),
                ));
            }
            if pairs.iter().any(|(n, _)| *n == name) {
                return Err(ApiError::bad(
                    name.into_owned(),
                    "given more than once; give it once",
                ));
            }
            pairs.push((name.into_owned(), value.into_owned()));
        }
        Ok(Params { pairs })
    }

    /// The value of `name`, if given and not empty.
    pub(crate) fn text(&self, name: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .filter(|v| !v.is_empty())
    }

    /// The value of `name` as a `T`, if given; `what` describes a valid value.
    pub(crate) fn parsed<T: FromStr>(&self, name: &str, what: &str) -> Result<Option<T>, ApiError> {
        self.text(name)
            .map(|text| {
                text.parse().map_err(|_| {
                    ApiError::bad(name, format!("must be {what}, not {}", quote(text)))
                })
            })
            .transpose()
    }

    /// `limit`: `default` when absent, at least 1 and at most [`LIMIT_MAX`] (what the OpenAPI
    /// document declares); a value above `max` is capped to it.
    pub(crate) fn limit(&self, default: u32, max: u32) -> Result<u32, ApiError> {
        let what =
            format!("an integer from 1 to {max} (larger values, up to {LIMIT_MAX}, are capped)");
        match self.text("limit") {
            None => Ok(default),
            Some(text) => match text.parse::<u32>() {
                Ok(0) | Err(_) => Err(ApiError::bad(
                    "limit",
                    format!("must be {what}, not {}", quote(text)),
                )),
                Ok(n) => Ok(n.min(max)),
            },
        }
    }
}

/// A value as an error quotes it: in backticks, cut short if long.
pub(crate) fn quote(value: &str) -> String {
    format!("`{}`", cut(value))
}

/// A value cut short if long, for errors.
fn cut(value: &str) -> String {
    let mut shown: String = value.chars().take(QUOTED_MAX).collect();
    if shown.len() < value.len() {
        shown.push('…');
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(result: Result<impl std::fmt::Debug, ApiError>) -> String {
        result.expect_err("refused").to_string()
    }

    #[test]
    fn known_parameters_are_read_and_empty_ones_are_absent() {
        let params = Params::parse(
            Some("state=failed&bot=&limit=7"),
            &["state", "bot", "limit"],
        )
        .unwrap();
        assert_eq!(params.text("state"), Some("failed"));
        assert_eq!(params.text("bot"), None);
        assert_eq!(params.limit(50, 500).unwrap(), 7);
        let none = Params::parse(None, &["limit"]).unwrap();
        assert_eq!(none.limit(50, 500).unwrap(), 50);
    }

    #[test]
    fn limits_are_capped_and_must_be_positive_integers() {
        let params = |q: &str| Params::parse(Some(q), &["limit"]).unwrap();
        assert_eq!(params("limit=100000").limit(50, 500).unwrap(), 500);
        assert_eq!(params("limit=4294967295").limit(50, 500).unwrap(), 500);
        assert_eq!(
            params("limit=4294967296")
                .limit(50, 500)
                .unwrap_err()
                .to_string(),
            "parameter `limit`: must be an integer from 1 to 500 (larger values, up to \
             4294967295, are capped), not `4294967296`"
        );
        for bad in ["limit=0", "limit=-1", "limit=ten", "limit=1.5"] {
            assert!(
                problem(params(bad).limit(50, 500)).starts_with("parameter `limit`: must be"),
                "{bad}"
            );
        }
    }

    #[test]
    fn unknown_and_repeated_parameters_are_refused() {
        assert_eq!(
            problem(Params::parse(Some("status=failed"), &["state", "limit"])),
            "parameter `status`: unknown query parameter; this route takes state, limit"
        );
        assert_eq!(
            problem(Params::parse(Some("limit=1&limit=2"), &["limit"])),
            "parameter `limit`: given more than once; give it once"
        );
        assert_eq!(
            problem(Params::parse(Some("x=1"), &[])),
            "parameter `x`: unknown query parameter; this route takes no query parameters"
        );
    }

    #[test]
    fn values_are_decoded_and_long_ones_cut_in_errors() {
        let params = Params::parse(Some("bot=a%20b&user_id=12x"), &["bot", "user_id"]).unwrap();
        assert_eq!(params.text("bot"), Some("a b"));
        assert_eq!(
            problem(params.parsed::<i64>("user_id", "an integer")),
            "parameter `user_id`: must be an integer, not `12x`"
        );
        let long = "x".repeat(100);
        assert_eq!(quote(&long), format!("`{}…`", "x".repeat(64)));
    }
}
