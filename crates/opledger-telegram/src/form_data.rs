//! `multipart/form-data` bodies (RFC 7578) as bots write them into a webhook answer: aiogram 3
//! answers a handler's returned Bot API call as a form, one part `method` and one part per
//! field, every value text (nested objects as JSON text), which Telegram accepts as it accepts
//! JSON. Only text fields are read: a body with a file part, or anything malformed, is no form
//! this reader returns.

/// The `(name, value)` fields of a `multipart/form-data` body whose `Content-Type` header is
/// `content_type`, in order; `None` if the header is not `multipart/form-data` with a boundary,
/// the body does not follow it, a part is a file or not UTF-8 text.
pub fn form_data_fields(content_type: &str, body: &[u8]) -> Option<Vec<(String, String)>> {
    let boundary = boundary(content_type)?;
    let delimiter = [b"--", boundary.as_bytes()].concat();
    let next_delimiter = [b"\r\n--", boundary.as_bytes()].concat();
    // The first delimiter opens the body or follows a preamble's line end.
    let mut rest = if body.starts_with(&delimiter) {
        &body[delimiter.len()..]
    } else {
        let at = find(body, &next_delimiter)?;
        &body[at + next_delimiter.len()..]
    };
    let mut fields = Vec::new();
    loop {
        if rest.starts_with(b"--") {
            return Some(fields);
        }
        rest = rest.strip_prefix(b"\r\n")?;
        let end = find(rest, &next_delimiter)?;
        fields.push(part(&rest[..end])?);
        rest = &rest[end + next_delimiter.len()..];
    }
}

/// The `boundary` parameter of a `multipart/form-data` media type.
fn boundary(content_type: &str) -> Option<String> {
    let mut pieces = content_type.split(';');
    let media_type = pieces.next()?.trim();
    if !media_type.eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    let boundary = parameters(pieces).find(|(name, _)| name.eq_ignore_ascii_case("boundary"))?;
    // RFC 2046: 1 to 70 characters.
    (!boundary.1.is_empty() && boundary.1.len() <= 70).then_some(boundary.1)
}

/// `name=value` parameters, values unquoted.
fn parameters<'a>(pieces: impl Iterator<Item = &'a str>) -> impl Iterator<Item = (String, String)> {
    pieces.filter_map(|piece| {
        let (name, value) = piece.split_once('=')?;
        let value = value.trim();
        let value = match value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
            Some(quoted) => quoted.replace("\\\"", "\"").replace("\\\\", "\\"),
            None => value.to_owned(),
        };
        Some((name.trim().to_owned(), value))
    })
}

/// One part: its headers, a blank line, its value. A text field's name and value.
fn part(part: &[u8]) -> Option<(String, String)> {
    let (headers, value) = if let Some(value) = part.strip_prefix(b"\r\n") {
        (&b""[..], value)
    } else {
        let at = find(part, b"\r\n\r\n")?;
        (&part[..at], &part[at + 4..])
    };
    let headers = std::str::from_utf8(headers).ok()?;
    let mut name = None;
    for line in headers.split("\r\n") {
        let (header, header_value) = line.split_once(':')?;
        if !header.trim().eq_ignore_ascii_case("content-disposition") {
            continue;
        }
        let mut pieces = header_value.split(';');
        if !pieces.next()?.trim().eq_ignore_ascii_case("form-data") {
            return None;
        }
        for (parameter, value) in parameters(pieces) {
            if parameter.eq_ignore_ascii_case("filename") {
                return None; // a file: not a text field
            }
            if parameter.eq_ignore_ascii_case("name") {
                name = Some(value);
            }
        }
    }
    let value = std::str::from_utf8(value).ok()?;
    Some((name?, value.to_owned()))
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// aiogram 3.31.0's answer to a handler that returned `message.answer(...)` with a keyboard,
    /// byte for byte but for the text.
    const AIOGRAM: &[u8] = b"--webhookBoundarysJuKUaN0gTmMW3yh_HoQOg\r\n\
        Content-Type: text/plain; charset=utf-8\r\n\
        Content-Disposition: form-data; name=\"method\"\r\n\
        \r\n\
        sendMessage\r\n\
        --webhookBoundarysJuKUaN0gTmMW3yh_HoQOg\r\n\
        Content-Type: text/plain; charset=utf-8\r\n\
        Content-Disposition: form-data; name=\"chat_id\"\r\n\
        \r\n\
        42\r\n\
        --webhookBoundarysJuKUaN0gTmMW3yh_HoQOg\r\n\
        Content-Type: text/plain; charset=utf-8\r\n\
        Content-Disposition: form-data; name=\"text\"\r\n\
        \r\n\
        Hello!\r\nTwo lines, \xc3\xa9.\r\n\
        --webhookBoundarysJuKUaN0gTmMW3yh_HoQOg\r\n\
        Content-Type: text/plain; charset=utf-8\r\n\
        Content-Disposition: form-data; name=\"reply_markup\"\r\n\
        \r\n\
        {\"inline_keyboard\": [[{\"text\": \"Yes\", \"callback_data\": \"t1_x\"}]]}\r\n\
        --webhookBoundarysJuKUaN0gTmMW3yh_HoQOg--\r\n";
    const AIOGRAM_TYPE: &str =
        "multipart/form-data; boundary=webhookBoundarysJuKUaN0gTmMW3yh_HoQOg";

    #[test]
    fn aiogram_answers_are_read_field_by_field() {
        let fields = form_data_fields(AIOGRAM_TYPE, AIOGRAM).expect("a form");
        let fields: Vec<(&str, &str)> = fields
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            fields,
            [
                ("method", "sendMessage"),
                ("chat_id", "42"),
                ("text", "Hello!\r\nTwo lines, é."),
                (
                    "reply_markup",
                    "{\"inline_keyboard\": [[{\"text\": \"Yes\", \"callback_data\": \"t1_x\"}]]}"
                ),
            ]
        );
    }

    #[test]
    fn a_quoted_boundary_and_a_preamble_are_read_and_a_nameless_part_is_not() {
        let body = b"preamble\r\n--b\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n1\r\n--b\r\n\r\nx\r\n--b--";
        assert_eq!(
            form_data_fields("Multipart/Form-Data; boundary=\"b\"", body),
            None
        );
        let body =
            b"preamble\r\n--b\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n1\r\n--b--";
        assert_eq!(
            form_data_fields("Multipart/Form-Data; boundary=\"b\"", body),
            Some(vec![("a".to_owned(), "1".to_owned())])
        );
    }

    #[test]
    fn other_bodies_are_no_form() {
        let file = b"--b\r\nContent-Disposition: form-data; name=\"photo\"; filename=\"a.jpg\"\r\n\r\n\xff\xd8\r\n--b--";
        let cases: [(&str, &[u8]); 7] = [
            ("application/json", b"{}"),
            ("multipart/form-data", AIOGRAM),
            ("multipart/mixed; boundary=b", b"--b\r\n\r\nx\r\n--b--"),
            ("multipart/form-data; boundary=b", b""),
            (
                "multipart/form-data; boundary=b",
                b"--b\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n1",
            ),
            ("multipart/form-data; boundary=b", file),
            (
                "multipart/form-data; boundary=b",
                b"--b\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n\xff\r\n--b--",
            ),
        ];
        for (content_type, body) in cases {
            assert_eq!(
                form_data_fields(content_type, body),
                None,
                "{content_type}: {body:?}"
            );
        }
        assert_eq!(
            form_data_fields("multipart/form-data; boundary=b", b"--b--"),
            Some(vec![])
        );
    }
}
