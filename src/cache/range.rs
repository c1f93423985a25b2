//! Ranges answered from a stored object (RFC 9110 §14): one `bytes`
//! range of a stored 200 becomes a 206 with `Content-Range`; a range
//! past the end, a 416; several ranges, an invalid header or an
//! `If-Range` the object does not match, the whole object (a server may
//! ignore `Range`, §14.2).

use bytes::Bytes;
use http::{header, response, HeaderMap, HeaderValue, StatusCode};

/// What a request's `Range` selects of an object of some length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selected {
    /// The whole object, as a 200.
    Whole,
    /// Bytes `first..=last`.
    Part { first: u64, last: u64 },
    /// Nothing of it (416).
    Unsatisfiable,
}

/// Whether `range` asks for everything from the first byte
/// (`bytes=0-`, as media players start): a miss fetches and keeps the
/// whole object for it.
pub fn from_start(range: &HeaderValue) -> bool {
    range.as_bytes().eq_ignore_ascii_case(b"bytes=0-")
}

/// What `range` selects of `len` bytes, given the request's `If-Range`
/// and the stored answer's `headers` (its validators).
pub fn select(
    range: &HeaderValue,
    if_range: Option<&HeaderValue>,
    headers: &HeaderMap,
    len: u64,
) -> Selected {
    if let Some(if_range) = if_range {
        if !if_range_matches(if_range, headers) {
            return Selected::Whole;
        }
    }
    let Ok(text) = range.to_str() else {
        return Selected::Whole;
    };
    let Some(spec) = text
        .split_once('=')
        .filter(|(unit, _)| unit.trim().eq_ignore_ascii_case("bytes"))
        .map(|(_, spec)| spec.trim())
    else {
        return Selected::Whole;
    };
    if spec.contains(',') {
        return Selected::Whole;
    }
    let Some((first, last)) = spec.split_once('-') else {
        return Selected::Whole;
    };
    let number = |s: &str| s.trim().parse::<u64>().ok();
    let (first, last) = (first.trim(), last.trim());
    match (number(first), number(last)) {
        // `-n`: the last n bytes.
        (None, Some(n)) if first.is_empty() => {
            if n == 0 || len == 0 {
                Selected::Unsatisfiable
            } else {
                Selected::Part {
                    first: len - n.min(len),
                    last: len - 1,
                }
            }
        }
        // `a-b`, `a-`.
        (Some(first), end) if end.is_some() || last.is_empty() => {
            let last = match end {
                Some(l) if l < first => return Selected::Whole,
                Some(l) => l,
                None => u64::MAX,
            };
            if first >= len {
                Selected::Unsatisfiable
            } else {
                Selected::Part {
                    first,
                    last: last.min(len - 1),
                }
            }
        }
        _ => Selected::Whole,
    }
}

/// `If-Range` (§13.1.5): an entity tag matches the stored one strongly
/// (never a weak one); a date matches the stored `Last-Modified` exactly.
fn if_range_matches(if_range: &HeaderValue, headers: &HeaderMap) -> bool {
    let value = if_range.as_bytes();
    if value.starts_with(b"\"") || value.starts_with(b"W/") {
        return !value.starts_with(b"W/")
            && headers
                .get(header::ETAG)
                .is_some_and(|etag| etag.as_bytes() == value);
    }
    headers
        .get(header::LAST_MODIFIED)
        .is_some_and(|modified| modified.as_bytes() == value)
}

/// `head` and `body` of a stored 200, cut to what was selected.
pub fn cut(mut head: response::Parts, body: Bytes, selected: Selected) -> (response::Parts, Bytes) {
    let len = body.len() as u64;
    match selected {
        Selected::Whole => (head, body),
        Selected::Part { first, last } => {
            let part = body.slice(first as usize..=last as usize);
            head.status = StatusCode::PARTIAL_CONTENT;
            if let Ok(value) = HeaderValue::from_str(&format!("bytes {first}-{last}/{len}")) {
                head.headers.insert(header::CONTENT_RANGE, value);
            }
            head.headers
                .insert(header::CONTENT_LENGTH, HeaderValue::from(part.len()));
            (head, part)
        }
        Selected::Unsatisfiable => {
            head.status = StatusCode::RANGE_NOT_SATISFIABLE;
            if let Ok(value) = HeaderValue::from_str(&format!("bytes */{len}")) {
                head.headers.insert(header::CONTENT_RANGE, value);
            }
            head.headers
                .insert(header::CONTENT_LENGTH, HeaderValue::from(0u64));
            (head, Bytes::new())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn select_of(range: &str, len: u64) -> Selected {
        select(
            &HeaderValue::from_str(range).unwrap(),
            None,
            &HeaderMap::new(),
            len,
        )
    }

    #[test]
    fn one_range_is_a_part_and_others_are_the_whole_or_nothing() {
        // RFC 9110 §14.1.2 (byte ranges), §14.2 (ignoring Range), §15.5.17 (416).
        let part = |first, last| Selected::Part { first, last };
        for (range, expected) in [
            ("bytes=0-9", part(0, 9)),
            ("bytes=5-", part(5, 99)),
            ("bytes=90-200", part(90, 99)),
            ("bytes=-10", part(90, 99)),
            ("bytes=-1000", part(0, 99)),
            ("BYTES=1-1", part(1, 1)),
            ("bytes=100-", Selected::Unsatisfiable),
            ("bytes=-0", Selected::Unsatisfiable),
            ("bytes=0-1,5-6", Selected::Whole),
            ("bytes=9-1", Selected::Whole),
            ("bytes=x-1", Selected::Whole),
            ("items=0-1", Selected::Whole),
            ("bytes", Selected::Whole),
        ] {
            assert_eq!(select_of(range, 100), expected, "{range}");
        }
        assert_eq!(select_of("bytes=0-", 0), Selected::Unsatisfiable);
        assert!(from_start(&HeaderValue::from_static("bytes=0-")));
        assert!(!from_start(&HeaderValue::from_static("bytes=1-")));
    }

    #[test]
    fn if_range_needs_the_stored_strong_etag_or_exact_date() {
        // RFC 9110 §13.1.5.
        let mut stored = HeaderMap::new();
        stored.insert(header::ETAG, HeaderValue::from_static("\"v1\""));
        stored.insert(
            header::LAST_MODIFIED,
            HeaderValue::from_static("Tue, 01 Dec 2026 10:00:00 GMT"),
        );
        let range = HeaderValue::from_static("bytes=0-1");
        let with = |if_range: &'static str| {
            select(
                &range,
                Some(&HeaderValue::from_static(if_range)),
                &stored,
                10,
            )
        };
        assert_eq!(with("\"v1\""), Selected::Part { first: 0, last: 1 });
        assert_eq!(with("\"v2\""), Selected::Whole);
        assert_eq!(with("W/\"v1\""), Selected::Whole);
        assert_eq!(
            with("Tue, 01 Dec 2026 10:00:00 GMT"),
            Selected::Part { first: 0, last: 1 }
        );
        assert_eq!(with("Tue, 01 Dec 2026 10:00:01 GMT"), Selected::Whole);
    }

    #[test]
    fn a_cut_says_what_it_holds() {
        let head = http::Response::builder()
            .status(200)
            .header("content-length", "10")
            .body(())
            .unwrap()
            .into_parts()
            .0;
        let body = Bytes::from_static(b"0123456789");
        let (head, part) = cut(head, body.clone(), Selected::Part { first: 2, last: 4 });
        assert_eq!(head.status, StatusCode::PARTIAL_CONTENT);
        assert_eq!(head.headers["content-range"], "bytes 2-4/10");
        assert_eq!(head.headers["content-length"], "3");
        assert_eq!(part, "234");
        let whole = http::Response::new(()).into_parts().0;
        let (head, none) = cut(whole, body, Selected::Unsatisfiable);
        assert_eq!(head.status, StatusCode::RANGE_NOT_SATISFIABLE);
        assert_eq!(head.headers["content-range"], "bytes */10");
        assert!(none.is_empty());
    }
}
