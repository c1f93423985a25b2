//! What a transaction reads of a request and its answer, taken apart
//! once into the collections rules name: the request line and its parts,
//! the query's and the body's arguments, headers, cookies, and the body
//! by its processor (URL-encoded, JSON, multipart, XML), each within the
//! limits the caller has already applied to the body.

use std::borrow::Cow;

/// One request as the firewall sees it (the body within its limit).
#[derive(Debug, Clone, Default)]
pub struct Request {
    /// The request's id (the one its access-log line and a block's
    /// answer carry): `UNIQUE_ID`.
    pub id: String,
    pub remote_addr: String,
    pub method: String,
    /// The request target as sent (origin-form or absolute-form).
    pub uri: String,
    /// `HTTP/1.1`, `HTTP/2`, …
    pub protocol: String,
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
}

/// The answer, for the response phases.
#[derive(Debug, Clone, Default)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
}

/// A name and its value.
pub type Pair = (Vec<u8>, Vec<u8>);

/// How the body was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyProcessor {
    UrlEncoded,
    Json,
    Multipart,
    Xml,
}

impl BodyProcessor {
    pub fn name(self) -> &'static str {
        match self {
            BodyProcessor::UrlEncoded => "URLENCODED",
            BodyProcessor::Json => "JSON",
            BodyProcessor::Multipart => "MULTIPART",
            BodyProcessor::Xml => "XML",
        }
    }

    /// By name, as `ctl:requestBodyProcessor=` gives it.
    pub fn named(name: &str) -> Option<Self> {
        [Self::UrlEncoded, Self::Json, Self::Multipart, Self::Xml]
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(name))
    }

    /// By the request's `Content-Type`.
    pub fn of(content_type: &[u8]) -> Option<Self> {
        let media = content_type
            .split(|b| *b == b';')
            .next()
            .unwrap_or_default()
            .trim_ascii()
            .to_ascii_lowercase();
        match media.as_slice() {
            b"application/x-www-form-urlencoded" => Some(Self::UrlEncoded),
            b"multipart/form-data" => Some(Self::Multipart),
            m if m == b"application/json" || m.ends_with(b"+json") => Some(Self::Json),
            m if m == b"text/xml" || m == b"application/xml" || m.ends_with(b"+xml") => {
                Some(Self::Xml)
            }
            _ => None,
        }
    }
}

/// The request taken apart.
#[derive(Debug, Clone, Default)]
pub struct Parsed {
    pub filename: Vec<u8>,
    pub basename: Vec<u8>,
    pub query: Vec<u8>,
    pub args_get: Vec<Pair>,
    pub args_post: Vec<Pair>,
    pub cookies: Vec<Pair>,
    /// Each file part: its field name and its file name.
    pub files: Vec<Pair>,
    pub files_size: usize,
    /// Each part's header lines, under the part's name.
    pub part_headers: Vec<Pair>,
    /// `XML:/*` (every text node) and `XML://@*` (every attribute value).
    pub xml_text: Vec<Vec<u8>>,
    pub xml_attributes: Vec<Vec<u8>>,
    pub processor: Option<BodyProcessor>,
    /// Why the body could not be read by its processor.
    pub body_error: Option<String>,
}

impl Request {
    /// The first value of header `name`.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }

    /// The line and headers parsed; the body left to `read_body`.
    pub fn parse_head(&self) -> Parsed {
        let (path, query) = match self.uri.split_once('?') {
            Some((path, query)) => (path, query),
            None => (self.uri.as_str(), ""),
        };
        // An absolute-form target's path starts after its authority.
        let path = match path.split_once("://").filter(|_| !path.starts_with('/')) {
            Some((_, rest)) => rest.find('/').map_or("/", |at| &rest[at..]),
            None => path,
        };
        // The path as the server reads it: percent-decoded (a `+` is a
        // `+` in a path).
        let path = percent_decode(path.as_bytes());
        let basename = path.rsplit(|b| *b == b'/').next().unwrap_or_default();
        let mut cookies = Vec::new();
        for (name, value) in &self.headers {
            if name.eq_ignore_ascii_case("cookie") {
                cookies.extend(split_cookies(value));
            }
        }
        Parsed {
            // Known from the head, so that phase 1 reads it (as
            // ModSecurity's recommended configuration sets it there).
            processor: self.header("content-type").and_then(BodyProcessor::of),
            basename: basename.to_vec(),
            filename: path,
            query: query.as_bytes().to_vec(),
            args_get: split_args(query.as_bytes()),
            cookies,
            ..Parsed::default()
        }
    }

    /// Reads the body with `processor` (its `Content-Type`'s when none is
    /// forced) into `parsed`.
    pub fn read_body(&self, parsed: &mut Parsed, forced: Option<BodyProcessor>) {
        let processor = forced.or(parsed.processor);
        parsed.processor = processor;
        if self.body.is_empty() {
            return;
        }
        match processor {
            Some(BodyProcessor::UrlEncoded) => parsed.args_post = split_args(&self.body),
            Some(BodyProcessor::Json) => {
                match serde_json::from_slice::<serde_json::Value>(&self.body) {
                    Ok(value) => flatten_json(b"json", &value, &mut parsed.args_post),
                    Err(e) => parsed.body_error = Some(format!("JSON parsing error: {e}")),
                }
            }
            Some(BodyProcessor::Multipart) => {
                let boundary = self.header("content-type").and_then(boundary_of);
                match boundary {
                    Some(boundary) => read_multipart(&self.body, &boundary, parsed),
                    None => parsed.body_error = Some("multipart: no boundary".into()),
                }
            }
            Some(BodyProcessor::Xml) => read_xml(&self.body, parsed),
            None => {}
        }
    }
}

/// `a=1&b=2`, each name and value URL-decoded (`+` a space).
pub fn split_args(text: &[u8]) -> Vec<Pair> {
    text.split(|b| *b == b'&')
        .filter(|part| !part.is_empty())
        .map(|part| {
            let (name, value) = match memchr::memchr(b'=', part) {
                Some(at) => (&part[..at], &part[at + 1..]),
                None => (part, &b""[..]),
            };
            (
                url_decode(name).into_owned(),
                url_decode(value).into_owned(),
            )
        })
        .collect()
}

/// `%HH` decoded, everything else (a `+`, a `%` not followed by two hex
/// digits) as it is.
fn percent_decode(value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(value.len());
    let mut i = 0;
    while i < value.len() {
        let pair = value
            .get(i + 1..i + 3)
            .filter(|p| p.iter().all(u8::is_ascii_hexdigit));
        match (value[i], pair) {
            (b'%', Some(pair)) => {
                let hex = std::str::from_utf8(pair).unwrap_or("00");
                out.push(u8::from_str_radix(hex, 16).unwrap_or(0));
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

fn url_decode(value: &[u8]) -> Cow<'_, [u8]> {
    super::transform::apply(super::rule::Transform::UrlDecode, value)
}

/// `a=1; b=2`, names and values as sent.
fn split_cookies(header: &[u8]) -> Vec<Pair> {
    header
        .split(|b| *b == b';')
        .map(<[u8]>::trim_ascii)
        .filter(|c| !c.is_empty())
        .map(|c| match memchr::memchr(b'=', c) {
            Some(at) => (c[..at].trim_ascii().to_vec(), c[at + 1..].to_vec()),
            None => (c.to_vec(), Vec::new()),
        })
        .collect()
}

/// Every scalar of a JSON document under its dotted path (`json.a.b`);
/// an array's items under the array's own name (`json.list`), as
/// ModSecurity names them.
fn flatten_json(prefix: &[u8], value: &serde_json::Value, out: &mut Vec<Pair>) {
    use serde_json::Value;
    let child = |key: &[u8]| [prefix, b".", key].concat();
    match value {
        Value::Object(map) => {
            for (key, item) in map {
                flatten_json(&child(key.as_bytes()), item, out);
            }
        }
        Value::Array(items) => {
            for item in items {
                flatten_json(prefix, item, out);
            }
        }
        Value::String(text) => out.push((prefix.to_vec(), text.as_bytes().to_vec())),
        Value::Null => out.push((prefix.to_vec(), Vec::new())),
        other => out.push((prefix.to_vec(), other.to_string().into_bytes())),
    }
}

/// The `boundary` parameter of a multipart content type.
fn boundary_of(content_type: &[u8]) -> Option<Vec<u8>> {
    content_type
        .split(|b| *b == b';')
        .skip(1)
        .find_map(|param| {
            let param = param.trim_ascii();
            let (name, value) = param.split_at(memchr::memchr(b'=', param)?);
            name.eq_ignore_ascii_case(b"boundary").then(|| {
                let value = &value[1..];
                value
                    .strip_prefix(b"\"")
                    .and_then(|v| v.strip_suffix(b"\""))
                    .unwrap_or(value)
                    .to_vec()
            })
        })
}

/// A multipart body's parts (lines may end in CRLF or LF alone): fields
/// as arguments, files by their field and file names, every part's
/// header lines.
fn read_multipart(body: &[u8], boundary: &[u8], parsed: &mut Parsed) {
    let delimiter = [b"--", boundary].concat();
    let mut sections = memchr::memmem::find_iter(body, &delimiter).collect::<Vec<_>>();
    if sections.is_empty() {
        parsed.body_error = Some("multipart: no boundary in the body".into());
        return;
    }
    sections.push(body.len());
    for window in sections.windows(2) {
        let part = &body[window[0] + delimiter.len()..window[1]];
        if part.starts_with(b"--") {
            break;
        }
        let part = part
            .strip_prefix(b"\r\n")
            .or_else(|| part.strip_prefix(b"\n"))
            .unwrap_or(part);
        let (head, content) = match memchr::memmem::find(part, b"\r\n\r\n") {
            Some(at) => (&part[..at], &part[at + 4..]),
            None => match memchr::memmem::find(part, b"\n\n") {
                Some(at) => (&part[..at], &part[at + 2..]),
                None => (part, &b""[..]),
            },
        };
        let content = content
            .strip_suffix(b"\r\n")
            .or_else(|| content.strip_suffix(b"\n"))
            .unwrap_or(content);
        let mut name = None;
        let mut filename = None;
        let mut lines = Vec::new();
        for line in head
            .split(|b| *b == b'\n')
            .map(<[u8]>::trim_ascii)
            .filter(|l| !l.is_empty())
        {
            let Some(colon) = memchr::memchr(b':', line) else {
                continue;
            };
            let (field, value) = (&line[..colon], line[colon + 1..].trim_ascii());
            lines.push(line.to_vec());
            if field.eq_ignore_ascii_case(b"content-disposition") {
                name = disposition_param(value, b"name");
                filename = disposition_param(value, b"filename");
            }
        }
        let name = name.unwrap_or_default();
        // Each header line of the part, under the part's name.
        for line in lines {
            parsed.part_headers.push((name.clone(), line));
        }
        match filename {
            Some(filename) => {
                parsed.files_size += content.len();
                parsed.files.push((name, filename));
            }
            None => parsed.args_post.push((name, content.to_vec())),
        }
    }
}

/// A parameter of `Content-Disposition` (quoted or not; `\"` in quotes).
fn disposition_param(value: &[u8], wanted: &[u8]) -> Option<Vec<u8>> {
    let mut rest = value;
    while let Some(at) = memchr::memchr(b';', rest) {
        rest = rest[at + 1..].trim_ascii_start();
        let eq = memchr::memchr(b'=', rest)?;
        let (name, after) = (rest[..eq].trim_ascii(), &rest[eq + 1..]);
        let (text, tail) = match after.strip_prefix(b"\"") {
            Some(quoted) => {
                let mut text = Vec::new();
                let mut i = 0;
                while i < quoted.len() && quoted[i] != b'"' {
                    // Only `\"` and `\\` are escapes; any other backslash
                    // is part of the name (as ModSecurity reads it).
                    if quoted[i] == b'\\' && matches!(quoted.get(i + 1), Some(b'"' | b'\\')) {
                        i += 1;
                    }
                    text.push(quoted[i]);
                    i += 1;
                }
                (text, &quoted[(i + 1).min(quoted.len())..])
            }
            None => {
                let end = memchr::memchr(b';', after).unwrap_or(after.len());
                (after[..end].trim_ascii().to_vec(), &after[end..])
            }
        };
        if name.eq_ignore_ascii_case(wanted) {
            return Some(text);
        }
        rest = tail;
    }
    None
}

/// An XML body's text nodes (character references resolved, CDATA as
/// it is) and attribute values (unescaped).
fn read_xml(body: &[u8], parsed: &mut Parsed) {
    use quick_xml::events::Event;
    let mut reader = quick_xml::Reader::from_reader(body);
    let mut buf = Vec::new();
    let mut text = String::new();
    let flush = |text: &mut String, parsed: &mut Parsed| {
        if !text.trim().is_empty() {
            parsed.xml_text.push(std::mem::take(text).into_bytes());
        }
        text.clear();
    };
    loop {
        match reader.read_event_into(&mut buf) {
            Ok(Event::Start(tag) | Event::Empty(tag)) => {
                flush(&mut text, parsed);
                for attribute in tag.attributes().flatten() {
                    let value = attribute
                        .normalized_value(quick_xml::XmlVersion::Implicit1_0)
                        .map_or_else(|_| attribute.value.to_string(), Cow::into_owned);
                    parsed.xml_attributes.push(value.into_bytes());
                }
            }
            Ok(Event::End(_)) => flush(&mut text, parsed),
            Ok(Event::Text(part)) => text.push_str(&part),
            Ok(Event::GeneralRef(reference)) => {
                let raw = format!("&{};", &*reference);
                match quick_xml::escape::unescape(&raw) {
                    Ok(resolved) => text.push_str(&resolved),
                    Err(_) => text.push_str(&raw),
                }
            }
            Ok(Event::CData(part)) => {
                flush(&mut text, parsed);
                parsed.xml_text.push(part.as_bytes().to_vec());
            }
            Ok(Event::Eof) => {
                flush(&mut text, parsed);
                return;
            }
            Ok(_) => {}
            Err(e) => {
                parsed.body_error = Some(format!("XML parsing error: {e}"));
                return;
            }
        }
        buf.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(uri: &str, content_type: &str, body: &str) -> Request {
        Request {
            id: "test".into(),
            remote_addr: "127.0.0.1".into(),
            method: "POST".into(),
            uri: uri.into(),
            protocol: "HTTP/1.1".into(),
            headers: vec![
                ("Content-Type".into(), content_type.as_bytes().to_vec()),
                ("Cookie".into(), b"a=1; b=x y".to_vec()),
            ],
            body: body.as_bytes().to_vec(),
        }
    }

    fn pairs(list: &[Pair]) -> Vec<(String, String)> {
        list.iter()
            .map(|(n, v)| {
                (
                    String::from_utf8_lossy(n).into(),
                    String::from_utf8_lossy(v).into(),
                )
            })
            .collect()
    }

    #[test]
    fn the_line_the_query_and_cookies() {
        let r = request("http://h/a/b%20c+d.php?x=1+2&y=%41&z", "", "");
        let p = r.parse_head();
        assert_eq!(p.filename, b"/a/b c+d.php");
        assert_eq!(p.basename, b"b c+d.php");
        assert_eq!(
            pairs(&p.args_get),
            [
                ("x".into(), "1 2".into()),
                ("y".into(), "A".into()),
                ("z".into(), String::new())
            ]
        );
        assert_eq!(
            pairs(&p.cookies),
            [("a".into(), "1".into()), ("b".into(), "x y".into())]
        );
    }

    #[test]
    fn bodies_by_their_processor() {
        let r = request("/", "application/x-www-form-urlencoded", "a=1&b=%27");
        let mut p = r.parse_head();
        r.read_body(&mut p, None);
        assert_eq!(
            pairs(&p.args_post),
            [("a".into(), "1".into()), ("b".into(), "'".into())]
        );

        let r = request("/", "application/json", r#"{"a":{"b":[1,"x"]},"c":null}"#);
        let mut p = r.parse_head();
        r.read_body(&mut p, None);
        assert_eq!(
            pairs(&p.args_post),
            [
                ("json.a.b".into(), "1".into()),
                ("json.a.b".into(), "x".into()),
                ("json.c".into(), String::new())
            ]
        );

        let body = "--XX\nContent-Disposition: form-data; name=\"f\"; filename=\"a\\\"b.txt\"\nContent-Type: text/plain\n\nhello\n--XX\r\nContent-Disposition: form-data; name=field\r\n\r\nvalue\r\n--XX--\r\n";
        let r = request("/", "multipart/form-data; boundary=XX", body);
        let mut p = r.parse_head();
        r.read_body(&mut p, None);
        assert_eq!(pairs(&p.files), [("f".into(), "a\"b.txt".into())]);
        assert_eq!(p.files_size, 5);
        assert_eq!(pairs(&p.args_post), [("field".into(), "value".into())]);
        assert_eq!(p.part_headers.len(), 3);
        assert_eq!(p.part_headers[0].0, b"f");

        let r = request(
            "/",
            "text/xml",
            "<a x=\"1&amp;\"><b>t&lt;u</b><![CDATA[c]]></a>",
        );
        let mut p = r.parse_head();
        r.read_body(&mut p, None);
        assert_eq!(p.xml_text, [b"t<u".to_vec(), b"c".to_vec()]);
        assert_eq!(p.xml_attributes, [b"1&".to_vec()]);

        let r = request("/", "application/json", "{nope");
        let mut p = r.parse_head();
        r.read_body(&mut p, None);
        assert!(p.body_error.is_some());
    }
}
