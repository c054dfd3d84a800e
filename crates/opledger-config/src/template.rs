//! Text templates with `{name}` placeholders: business keys, replies, confirmations' questions
//! and lookup URLs.
//!
//! The syntax is the same everywhere: `{name}` is replaced by a value, `{{` and `}}` stand for
//! literal braces. A name is one or more parts of `A-Z a-z 0-9 _` joined by `.` (as in
//! `{result.code}`). Each kind of template then restricts which names it accepts, so a typo is
//! caught when the configuration is loaded rather than when a user first asks.

use std::fmt;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use url::Url;

use crate::error::{List, RenderError, TemplateError};

/// The update fields a business key may use besides the action's params.
///
/// Deliberately absent: `update_id`, message ids and any time. A key must come out the same for
/// every repeat of one business request (a re-delivery, a double click, the same command sent
/// twice), and those values differ between repeats.
pub const KEY_UPDATE_FIELDS: [&str; 4] = ["user_id", "chat_id", "bot", "action"];

/// Placeholder names that a param may not take, because a template could not tell them apart.
pub const RESERVED_PARAM_NAMES: [&str; 9] = [
    "user_id",
    "chat_id",
    "bot",
    "action",
    "update_id",
    "error",
    "operation_id",
    "external_id",
    "result",
];

/// The only placeholder of a lookup URL.
pub const OPERATION_ID: &str = "operation_id";

/// What is kept unencoded when a value is put into a URL: RFC 3986's unreserved characters.
const URL_VALUE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Stands in for an operation id when a lookup URL is checked at load time.
const SAMPLE_OPERATION_ID: &str = "00000000-0000-0000-0000-000000000000";

/// The second stand-in, of the letters an id may hold where the first has digits: a lookup URL
/// whose host differs between the two holds the id in its host.
const LETTERS_OPERATION_ID: &str = "ffffffff-ffff-ffff-ffff-ffffffffffff";

#[derive(Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Placeholder(String),
}

/// A parsed template of any kind: literal text and `{name}` placeholders.
///
/// It exists so that the syntax is parsed once, in one place; the kinds below ([`KeyTemplate`],
/// [`ReplyTemplate`], [`UrlTemplate`]) wrap it and decide which names are allowed.
#[derive(Clone, PartialEq, Eq)]
pub struct Template {
    source: String,
    segments: Vec<Segment>,
}

impl Template {
    /// Parses `text`; a brace left open, a stray `}`, `{}` or a malformed name is an error.
    pub fn parse(text: &str) -> Result<Template, TemplateError> {
        let mut segments = Vec::new();
        let mut literal = String::new();
        let mut chars = text.chars().enumerate().peekable();
        while let Some((i, c)) = chars.next() {
            match c {
                '{' if chars.next_if(|&(_, c)| c == '{').is_some() => literal.push('{'),
                '}' if chars.next_if(|&(_, c)| c == '}').is_some() => literal.push('}'),
                '}' => return Err(TemplateError::Unmatched { at: i + 1 }),
                '{' => {
                    let mut name = String::new();
                    loop {
                        match chars.next() {
                            Some((_, '}')) => break,
                            Some((_, '{')) | None => {
                                return Err(TemplateError::Unclosed { at: i + 1 });
                            }
                            Some((_, c)) => name.push(c),
                        }
                    }
                    if name.is_empty() {
                        return Err(TemplateError::EmptyName { at: i + 1 });
                    }
                    if !is_valid_name(&name) {
                        return Err(TemplateError::BadName { name });
                    }
                    if !literal.is_empty() {
                        segments.push(Segment::Literal(std::mem::take(&mut literal)));
                    }
                    segments.push(Segment::Placeholder(name));
                }
                c => literal.push(c),
            }
        }
        if !literal.is_empty() {
            segments.push(Segment::Literal(literal));
        }
        Ok(Template {
            source: text.to_owned(),
            segments,
        })
    }

    /// A template of fixed text, with no placeholder.
    fn literal(text: &str) -> Template {
        Template {
            source: text.replace('{', "{{").replace('}', "}}"),
            segments: vec![Segment::Literal(text.to_owned())],
        }
    }

    /// The template as written in the configuration.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// The placeholders' names in order of appearance (a name used twice appears twice).
    pub fn placeholders(&self) -> impl Iterator<Item = &str> {
        self.segments.iter().filter_map(|s| match s {
            Segment::Placeholder(name) => Some(name.as_str()),
            Segment::Literal(_) => None,
        })
    }

    /// Fills in every placeholder with `value(name)`; a name without a value is an error.
    pub fn render(&self, value: &impl Fn(&str) -> Option<String>) -> Result<String, RenderError> {
        self.render_with(|name| {
            value(name).ok_or_else(|| RenderError::Missing {
                name: name.to_owned(),
            })
        })
    }

    fn render_with(
        &self,
        mut value: impl FnMut(&str) -> Result<String, RenderError>,
    ) -> Result<String, RenderError> {
        let mut out = String::new();
        for segment in &self.segments {
            match segment {
                Segment::Literal(text) => out.push_str(text),
                Segment::Placeholder(name) => out.push_str(&value(name)?),
            }
        }
        Ok(out)
    }

    /// The first placeholder that `allowed` refuses, if any.
    fn first_unknown(&self, allowed: impl Fn(&str) -> bool) -> Option<&str> {
        self.placeholders().find(|name| !allowed(name))
    }
}

impl fmt::Debug for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Template").field(&self.source).finish()
    }
}

impl fmt::Display for Template {
    /// The template as written.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

fn is_valid_name(name: &str) -> bool {
    name.split('.').all(|part| {
        !part.is_empty() && part.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
    })
}

/// Advice for an unknown placeholder: the params, then the built-in names.
fn allowed_advice(params: &[impl AsRef<str>], builtins: &str) -> String {
    let params: Vec<&str> = params.iter().map(AsRef::as_ref).collect();
    if params.is_empty() {
        format!("use one of {builtins} (the action has no params)")
    } else {
        format!("use a param ({}) or one of {builtins}", List(&params))
    }
}

/// The template of an action's business key, e.g. `{campaign}:{user_id}`.
///
/// Two requests whose keys render the same are one operation, so the key decides what "the
/// same business request" means. It may use the action's params and the update fields in
/// [`KEY_UPDATE_FIELDS`], and must use at least one placeholder: a fixed key would make every
/// request of every user one operation (write `{action}` for an action meant to happen once ever).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyTemplate {
    template: Template,
}

impl KeyTemplate {
    /// Parses a key template for an action with these params.
    pub fn parse(text: &str, params: &[impl AsRef<str>]) -> Result<KeyTemplate, TemplateError> {
        let template = Template::parse(text)?;
        let allowed = |name: &str| {
            KEY_UPDATE_FIELDS.contains(&name) || params.iter().any(|p| p.as_ref() == name)
        };
        if let Some(name) = template.first_unknown(allowed) {
            let builtins = List(&KEY_UPDATE_FIELDS).to_string();
            let mut advice = allowed_advice(params, &builtins);
            if matches!(
                name,
                "update_id" | "message_id" | "date" | "time" | "now" | "timestamp"
            ) {
                advice = format!(
                    "a key must be the same for every repeat of a request, so it cannot use \
                     an update id or a time; {advice}"
                );
            }
            return Err(TemplateError::Unknown {
                name: name.to_owned(),
                allowed: advice,
            });
        }
        if template.placeholders().next().is_none() {
            return Err(TemplateError::NoPlaceholder);
        }
        Ok(KeyTemplate { template })
    }

    /// The template as written.
    pub fn as_str(&self) -> &str {
        self.template.as_str()
    }

    /// The placeholders' names in order of appearance.
    pub fn placeholders(&self) -> impl Iterator<Item = &str> {
        self.template.placeholders()
    }

    /// The business key for these values; a missing or empty value is an error.
    ///
    /// An empty value is refused: it means a param was left out, and a key missing a part would
    /// merge requests that the template's author meant to keep apart.
    pub fn render(&self, value: &impl Fn(&str) -> Option<String>) -> Result<String, RenderError> {
        self.template.render_with(|name| match value(name) {
            None => Err(RenderError::Missing {
                name: name.to_owned(),
            }),
            Some(v) if v.is_empty() => Err(RenderError::Empty {
                name: name.to_owned(),
            }),
            Some(v) => Ok(v),
        })
    }
}

impl fmt::Display for KeyTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.template, f)
    }
}

/// Which outcome a reply template answers; each offers different placeholders.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReplyKind {
    /// The operation was confirmed: `result.<field>`, `external_id`, `operation_id`, `action`
    /// and the params.
    Confirmed,
    /// The operation failed: `error`, `operation_id`, `action` and the params.
    Failed,
}

impl ReplyKind {
    fn builtins(self) -> &'static str {
        match self {
            ReplyKind::Confirmed => "result.<field>, external_id, operation_id, action",
            ReplyKind::Failed => "error, operation_id, action",
        }
    }
}

/// One placeholder of a [`ReplyTemplate`], classified, so the worker knows where its value
/// comes from without parsing names again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReplyPlaceholder<'a> {
    /// `{result.<field>}`: a field of the effector's answer (the part after `result.`, which
    /// may itself contain dots for nested fields).
    Result(&'a str),
    /// `{error}`: why the operation failed.
    Error,
    /// `{operation_id}`: the operation's id.
    OperationId,
    /// `{action}`: the action's name.
    Action,
    /// `{external_id}`: the service's id for what it did.
    ExternalId,
    /// `{<param>}`: one of the action's params.
    Param(&'a str),
}

impl<'a> ReplyPlaceholder<'a> {
    fn classify(name: &'a str, kind: ReplyKind, params: &[impl AsRef<str>]) -> Option<Self> {
        let placeholder = match (name, kind) {
            ("operation_id", _) => ReplyPlaceholder::OperationId,
            ("action", _) => ReplyPlaceholder::Action,
            ("error", ReplyKind::Failed) => ReplyPlaceholder::Error,
            ("external_id", ReplyKind::Confirmed) => ReplyPlaceholder::ExternalId,
            (name, ReplyKind::Confirmed) if name.starts_with("result.") => {
                ReplyPlaceholder::Result(&name["result.".len()..])
            }
            (name, _) if params.iter().any(|p| p.as_ref() == name) => ReplyPlaceholder::Param(name),
            _ => return None,
        };
        Some(placeholder)
    }
}

/// The text of a reply to the user, sent by the worker when an operation ends.
///
/// It is checked here, when the configuration is loaded, so that a typo in a placeholder is
/// found at start and not when the first user's reply is due; the worker fills it in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyTemplate {
    kind: ReplyKind,
    template: Template,
}

impl ReplyTemplate {
    /// Parses a reply template of `kind` for an action with these params.
    pub fn parse(
        text: &str,
        kind: ReplyKind,
        params: &[impl AsRef<str>],
    ) -> Result<ReplyTemplate, TemplateError> {
        if text.trim().is_empty() {
            return Err(TemplateError::EmptyReply);
        }
        let template = Template::parse(text)?;
        let params: Vec<&str> = params.iter().map(AsRef::as_ref).collect();
        if let Some(name) =
            template.first_unknown(|name| ReplyPlaceholder::classify(name, kind, &params).is_some())
        {
            return Err(TemplateError::Unknown {
                name: name.to_owned(),
                allowed: allowed_advice(&params, kind.builtins()),
            });
        }
        Ok(ReplyTemplate { kind, template })
    }

    /// The default reply to a confirmed operation: `Done.`
    pub fn default_confirmed() -> ReplyTemplate {
        ReplyTemplate {
            kind: ReplyKind::Confirmed,
            template: Template::literal("Done."),
        }
    }

    /// The default reply to a failed operation: `Sorry, that did not work: {error}`.
    pub fn default_failed() -> ReplyTemplate {
        ReplyTemplate {
            kind: ReplyKind::Failed,
            template: Template {
                source: "Sorry, that did not work: {error}".to_owned(),
                segments: vec![
                    Segment::Literal("Sorry, that did not work: ".to_owned()),
                    Segment::Placeholder("error".to_owned()),
                ],
            },
        }
    }

    /// Which outcome this reply answers.
    pub fn kind(&self) -> ReplyKind {
        self.kind
    }

    /// The template as written.
    pub fn as_str(&self) -> &str {
        self.template.as_str()
    }

    /// The placeholders in order of appearance, classified by where their value comes from.
    pub fn placeholders(&self) -> impl Iterator<Item = ReplyPlaceholder<'_>> {
        // Parsing admitted only the built-in names and the params, so a name that is not
        // built in is a param.
        self.template.placeholders().map(|name| {
            ReplyPlaceholder::classify(name, self.kind, &[] as &[&str])
                .unwrap_or(ReplyPlaceholder::Param(name))
        })
    }

    /// Fills the reply in; `value` is asked for each placeholder by its full name
    /// (`result.code`, `error`, `campaign`, …).
    pub fn render(&self, value: &impl Fn(&str) -> Option<String>) -> Result<String, RenderError> {
        self.template.render(value)
    }
}

impl fmt::Display for ReplyTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.template, f)
    }
}

/// The built-in placeholders of a confirmation's question: what every reply offers before the
/// operation has an outcome.
const CONFIRM_BUILTINS: [&str; 2] = ["operation_id", "action"];

/// The question an action asks before its command starts the operation (`confirm`), sent by
/// intake with *Confirm* and *Cancel* buttons, e.g. `Issue a coupon for {campaign}?`.
///
/// It offers the placeholders every reply template offers: the action's params,
/// `operation_id` (the operation a *Confirm* starts) and `action`; nothing the outcome brings,
/// since there is none yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfirmTemplate {
    template: Template,
}

impl ConfirmTemplate {
    /// Parses a confirmation's question for an action with these params.
    pub fn parse(text: &str, params: &[impl AsRef<str>]) -> Result<ConfirmTemplate, TemplateError> {
        if text.trim().is_empty() {
            return Err(TemplateError::EmptyReply);
        }
        let template = Template::parse(text)?;
        let allowed = |name: &str| {
            CONFIRM_BUILTINS.contains(&name) || params.iter().any(|p| p.as_ref() == name)
        };
        if let Some(name) = template.first_unknown(allowed) {
            return Err(TemplateError::Unknown {
                name: name.to_owned(),
                allowed: allowed_advice(params, &List(&CONFIRM_BUILTINS).to_string()),
            });
        }
        Ok(ConfirmTemplate { template })
    }

    /// The template as written.
    pub fn as_str(&self) -> &str {
        self.template.as_str()
    }

    /// Fills the question in; `value` is asked for each placeholder by name.
    pub fn render(&self, value: &impl Fn(&str) -> Option<String>) -> Result<String, RenderError> {
        self.template.render(value)
    }
}

impl fmt::Display for ConfirmTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.template, f)
    }
}

/// A URL with at most the placeholder `{operation_id}`, e.g. an effector's lookup endpoint
/// `http://svc/coupons/by-reference/{operation_id}`.
///
/// The value is percent-encoded when it is filled in, so whatever it holds stays one path
/// segment or query value and cannot change which host or path is asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UrlTemplate {
    template: Template,
}

impl UrlTemplate {
    /// Parses a URL template; once filled in it must be an absolute http(s) URL without
    /// credentials.
    pub fn parse(text: &str) -> Result<UrlTemplate, TemplateError> {
        let template = Template::parse(text)?;
        if let Some(name) = template.first_unknown(|name| name == OPERATION_ID) {
            return Err(TemplateError::Unknown {
                name: name.to_owned(),
                allowed: format!("the only placeholder allowed in a URL is {{{OPERATION_ID}}}"),
            });
        }
        let template = UrlTemplate { template };
        let sample = template
            .filled_in(SAMPLE_OPERATION_ID)
            .map_err(|problem| TemplateError::BadUrl { problem })?;
        // An internationalised host name is checked as a whole (the bidi rule: no Latin letter
        // in a label with right-to-left text), so an id in such a host would make it valid for
        // some ids and not for others. A plain ASCII host is valid for every id.
        let letters = template.filled_in(LETTERS_OPERATION_ID);
        let id_in_host = letters
            .as_ref()
            .map_or(true, |url| url.host_str() != sample.host_str());
        let idn = sample
            .host_str()
            .is_some_and(|host| host.split('.').any(|label| label.starts_with("xn--")));
        if id_in_host && (idn || letters.is_err()) {
            return Err(TemplateError::BadUrl {
                problem: format!(
                    "puts {{{OPERATION_ID}}} into a host name that only some operation ids keep \
                     valid (an internationalised one); write the host in plain ASCII or move \
                     {{{OPERATION_ID}}} into the path or query"
                ),
            });
        }
        Ok(template)
    }

    /// The URL for `operation_id` as written, checked by [`http_url`].
    fn filled_in(&self, operation_id: &str) -> Result<Url, String> {
        let text = self
            .template
            .render_with(|_| Ok(operation_id.to_owned()))
            .map_err(|e| e.to_string())?;
        http_url(&text)
    }

    /// The template as written.
    pub fn as_str(&self) -> &str {
        self.template.as_str()
    }

    /// Whether the template contains `{operation_id}`.
    pub fn uses_operation_id(&self) -> bool {
        self.template.placeholders().next().is_some()
    }

    /// The URL for one operation, with `operation_id` percent-encoded.
    pub fn render(&self, operation_id: &str) -> Result<Url, RenderError> {
        let text = self
            .template
            .render_with(|_| Ok(utf8_percent_encode(operation_id, URL_VALUE).to_string()))?;
        Url::parse(&text).map_err(|source| RenderError::BadUrl { source })
    }
}

impl fmt::Display for UrlTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.template, f)
    }
}

/// Parses an absolute http(s) URL with a host and no credentials, written out in full.
///
/// The URL parser forgives what a browser's address bar would: `http:///x`, `http:/x` and
/// `http:x` become host `x`, a backslash becomes a slash, tabs and line breaks are dropped,
/// spaces around are trimmed. A configuration must mean what it says, so those are refused here.
pub(crate) fn http_url(text: &str) -> Result<Url, String> {
    if let Some(c) = text.chars().find(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "must not contain spaces or control characters (found U+{:04X}); percent-encode \
             them",
            u32::from(c)
        ));
    }
    if text.contains('\\') {
        return Err("must separate its parts with `/`, not `\\`".to_owned());
    }
    let no_host = |scheme: &str| {
        format!(
            "must name a host right after `{scheme}://`, e.g. \"{scheme}://127.0.0.1:9000/path\""
        )
    };
    if let Some((scheme, rest)) = text.split_once(':') {
        let scheme = scheme.to_ascii_lowercase();
        let authority = rest.strip_prefix("//").and_then(|rest| rest.chars().next());
        if matches!(scheme.as_str(), "http" | "https")
            && authority.is_none_or(|c| matches!(c, '/' | '?' | '#'))
        {
            return Err(no_host(&scheme));
        }
    }
    let url = Url::parse(text).map_err(|e| format!("is not a valid URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "must be an http:// or https:// URL, not {}:",
            url.scheme()
        ));
    }
    if url.host().is_none() {
        return Err(no_host(url.scheme()));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(
            "must not contain a user name or password: secrets never go in the config file"
                .to_owned(),
        );
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(name: &str) -> Option<String> {
        match name {
            "campaign" => Some("spring".to_owned()),
            "user_id" => Some("42".to_owned()),
            "empty" => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn parses_placeholders_and_escapes() {
        let t = Template::parse("{{x}} {campaign}:{user_id}}}").unwrap();
        assert_eq!(
            t.placeholders().collect::<Vec<_>>(),
            ["campaign", "user_id"]
        );
        assert_eq!(t.render(&values).unwrap(), "{x} spring:42}");
        assert_eq!(t.as_str(), "{{x}} {campaign}:{user_id}}}");
    }

    #[test]
    fn refuses_malformed_templates() {
        let cases = [
            ("{campaign", TemplateError::Unclosed { at: 1 }),
            ("a{b{c}", TemplateError::Unclosed { at: 2 }),
            ("ab}", TemplateError::Unmatched { at: 3 }),
            ("x{}", TemplateError::EmptyName { at: 2 }),
            (
                "{a b}",
                TemplateError::BadName {
                    name: "a b".to_owned(),
                },
            ),
            (
                "{result.}",
                TemplateError::BadName {
                    name: "result.".to_owned(),
                },
            ),
            (
                "{.x}",
                TemplateError::BadName {
                    name: ".x".to_owned(),
                },
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(Template::parse(text), Err(expected), "{text}");
        }
    }

    #[test]
    fn key_render_refuses_missing_and_empty_values() {
        let key = KeyTemplate::parse("{campaign}:{user_id}", &["campaign"]).unwrap();
        assert_eq!(key.render(&values).unwrap(), "spring:42");
        let key = KeyTemplate::parse("{chat_id}", &[] as &[&str]).unwrap();
        assert_eq!(
            key.render(&values).unwrap_err().to_string(),
            "no value for placeholder `{chat_id}`: supply it, or fix the template"
        );
        let key = KeyTemplate::parse("{empty}", &["empty"]).unwrap();
        assert_eq!(
            key.render(&values),
            Err(RenderError::Empty {
                name: "empty".to_owned()
            })
        );
    }

    #[test]
    fn key_must_have_a_placeholder_and_no_update_id() {
        assert_eq!(
            KeyTemplate::parse("fixed", &[] as &[&str]),
            Err(TemplateError::NoPlaceholder)
        );
        let err = KeyTemplate::parse("{update_id}", &["campaign"]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown placeholder `{update_id}`; a key must be the same for every repeat of a \
             request, so it cannot use an update id or a time; use a param (campaign) or one of \
             user_id, chat_id, bot, action"
        );
    }

    #[test]
    fn reply_placeholders_depend_on_the_outcome() {
        let ok = ReplyTemplate::parse(
            "{result.code} {result.a.b} {external_id} {operation_id} {action} {campaign}",
            ReplyKind::Confirmed,
            &["campaign"],
        )
        .unwrap();
        assert_eq!(
            ok.placeholders().collect::<Vec<_>>(),
            [
                ReplyPlaceholder::Result("code"),
                ReplyPlaceholder::Result("a.b"),
                ReplyPlaceholder::ExternalId,
                ReplyPlaceholder::OperationId,
                ReplyPlaceholder::Action,
                ReplyPlaceholder::Param("campaign"),
            ]
        );
        let err = ReplyTemplate::parse("{error}", ReplyKind::Confirmed, &[] as &[&str]);
        assert_eq!(
            err.unwrap_err().to_string(),
            "unknown placeholder `{error}`; use one of result.<field>, external_id, \
             operation_id, action (the action has no params)"
        );
        let err = ReplyTemplate::parse("{result.code}", ReplyKind::Failed, &["campaign"]);
        assert_eq!(
            err.unwrap_err().to_string(),
            "unknown placeholder `{result.code}`; use a param (campaign) or one of error, \
             operation_id, action"
        );
        let failed = ReplyTemplate::default_failed();
        assert_eq!(
            failed,
            ReplyTemplate::parse(failed.as_str(), ReplyKind::Failed, &[] as &[&str]).unwrap()
        );
        let done = ReplyTemplate::default_confirmed();
        assert_eq!(
            done,
            ReplyTemplate::parse(done.as_str(), ReplyKind::Confirmed, &[] as &[&str]).unwrap()
        );
        assert_eq!(
            ReplyTemplate::parse("  ", ReplyKind::Confirmed, &[] as &[&str]),
            Err(TemplateError::EmptyReply)
        );
    }

    #[test]
    fn url_template_encodes_the_value() {
        let t =
            UrlTemplate::parse("http://127.0.0.1:9000/by-reference/{operation_id}?x=1").unwrap();
        assert!(t.uses_operation_id());
        assert_eq!(
            t.render("a/b?c#d e").unwrap().as_str(),
            "http://127.0.0.1:9000/by-reference/a%2Fb%3Fc%23d%20e?x=1"
        );
        assert_eq!(
            t.render("0f1e2d3c-0000-4000-8000-000000000000")
                .unwrap()
                .as_str(),
            "http://127.0.0.1:9000/by-reference/0f1e2d3c-0000-4000-8000-000000000000?x=1"
        );
    }

    #[test]
    fn url_template_refuses_other_placeholders_and_bad_urls() {
        assert_eq!(
            UrlTemplate::parse("http://h/{id}").unwrap_err().to_string(),
            "unknown placeholder `{id}`; the only placeholder allowed in a URL is {operation_id}"
        );
        assert_eq!(
            UrlTemplate::parse("ftp://h/{operation_id}")
                .unwrap_err()
                .to_string(),
            "must be an http:// or https:// URL, not ftp:"
        );
        assert_eq!(
            UrlTemplate::parse("/by-reference/{operation_id}")
                .unwrap_err()
                .to_string(),
            "is not a valid URL: relative URL without a base"
        );
        assert_eq!(
            UrlTemplate::parse("http://u:p@h/{operation_id}")
                .unwrap_err()
                .to_string(),
            "must not contain a user name or password: secrets never go in the config file"
        );
    }

    #[test]
    fn url_template_refuses_an_id_in_an_internationalised_host() {
        // Found by the `template` fuzz target: with a right-to-left letter before the id the
        // all-digit sample id made a valid host, but a real id (with a-f) breaks the bidi rule.
        let idn = "puts {operation_id} into a host name that only some operation ids keep valid \
                   (an internationalised one); write the host in plain ASCII or move \
                   {operation_id} into the path or query";
        for text in [
            "http://\u{674}{operation_id}/x",
            "http://a{operation_id}.xn--mgbh0fb.example/x",
            "http://id-{operation_id}.b\u{fc}cher.example/x",
        ] {
            assert_eq!(
                UrlTemplate::parse(text).map_err(|e| e.to_string()),
                Err(idn.to_owned()),
                "{text}"
            );
        }
        // The id in a plain host, or anywhere but the host of an internationalised one, is fine.
        for text in [
            "http://{operation_id}.svc.example/x",
            "http://b\u{fc}cher.example/by-reference/{operation_id}",
            "http://\u{674}.example/{operation_id}?id={operation_id}",
        ] {
            let url = UrlTemplate::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            url.render("0b9f1f0e-8f43-5d3a-9a57-3b1c2a6f5e44")
                .unwrap_or_else(|e| panic!("{text}: {e}"));
        }
    }
}
