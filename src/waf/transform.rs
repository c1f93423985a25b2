//! The transformations a rule applies to a value before its operator,
//! on bytes, as ModSecurity's reference defines them. Each returns the
//! value itself when it changes nothing, so a chain of them over a clean
//! value allocates nothing.

use std::borrow::Cow;

use sha1::Digest;

use super::rule::Transform;

/// `value` through `transform`.
pub fn apply(transform: Transform, value: &[u8]) -> Cow<'_, [u8]> {
    match transform {
        Transform::Base64Decode => Cow::Owned(base64_decode(value)),
        Transform::CmdLine => Cow::Owned(cmd_line(value)),
        Transform::CompressWhitespace => compress_whitespace(value),
        Transform::CssDecode => escaped(value, b'\\', css_decode),
        Transform::EscapeSeqDecode => escaped(value, b'\\', escape_seq_decode),
        Transform::HexEncode => Cow::Owned(hex(value).into_bytes()),
        Transform::HtmlEntityDecode => escaped(value, b'&', html_entity_decode),
        Transform::JsDecode => escaped(value, b'\\', js_decode),
        Transform::Length => Cow::Owned(value.len().to_string().into_bytes()),
        Transform::Lowercase => {
            if value.iter().any(u8::is_ascii_uppercase) {
                Cow::Owned(value.to_ascii_lowercase())
            } else {
                Cow::Borrowed(value)
            }
        }
        Transform::NormalizePath => normalize_path(value, false),
        Transform::NormalizePathWin => normalize_path(value, true),
        Transform::RemoveCommentsChar => remove_comments_char(value),
        Transform::RemoveNulls => removed(value, |b| b == 0),
        Transform::RemoveWhitespace => removed(value, is_space),
        Transform::ReplaceComments => replace_comments(value),
        Transform::Sha1 => Cow::Owned(sha1::Sha1::digest(value).to_vec()),
        Transform::Trim => {
            let start = value
                .iter()
                .position(|b| !is_space(*b))
                .unwrap_or(value.len());
            let end = value
                .iter()
                .rposition(|b| !is_space(*b))
                .map_or(start, |e| e + 1);
            Cow::Borrowed(&value[start..end])
        }
        Transform::UrlDecode => escaped_either(value, url_decode, false),
        Transform::UrlDecodeUni => escaped_either(value, url_decode, true),
        Transform::Utf8ToUnicode => utf8_to_unicode(value),
    }
}

/// What C's `isspace` and ModSecurity count as white space: the ASCII
/// blanks and the non-breaking space 0xA0.
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c | 0xa0)
}

fn hex_value(b: u8) -> Option<u8> {
    (b as char).to_digit(16).and_then(|d| u8::try_from(d).ok())
}

/// Two hex digits at the start of `bytes`.
fn hex_pair(bytes: &[u8]) -> Option<u8> {
    Some(hex_value(*bytes.first()?)? << 4 | hex_value(*bytes.get(1)?)?)
}

fn hex(value: &[u8]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(value.len() * 2);
    for b in value {
        let _ = write!(out, "{b:02x}");
    }
    out
}

fn removed(value: &[u8], drop: impl Fn(u8) -> bool) -> Cow<'_, [u8]> {
    if value.iter().any(|b| drop(*b)) {
        Cow::Owned(value.iter().copied().filter(|b| !drop(*b)).collect())
    } else {
        Cow::Borrowed(value)
    }
}

/// Runs a decoder over `value` only when it holds `marker`: the decoder
/// gets the rest of the input at each marker and answers the bytes it
/// decodes and how many it read (at least one).
fn escaped(value: &[u8], marker: u8, decode: fn(&[u8], &mut Vec<u8>) -> usize) -> Cow<'_, [u8]> {
    let Some(first) = memchr::memchr(marker, value) else {
        return Cow::Borrowed(value);
    };
    let mut out = Vec::with_capacity(value.len());
    out.extend_from_slice(&value[..first]);
    let mut i = first;
    while i < value.len() {
        if value[i] == marker {
            i += decode(&value[i..], &mut out).max(1);
        } else {
            out.push(value[i]);
            i += 1;
        }
    }
    Cow::Owned(out)
}

/// URL decoding: `%HH`, `+` as a space and (with `uni`) `%uHHHH`.
fn escaped_either(
    value: &[u8],
    decode: fn(&[u8], &mut Vec<u8>, bool) -> usize,
    uni: bool,
) -> Cow<'_, [u8]> {
    if !value.iter().any(|b| *b == b'%' || *b == b'+') {
        return Cow::Borrowed(value);
    }
    let mut out = Vec::with_capacity(value.len());
    let mut i = 0;
    while i < value.len() {
        i += decode(&value[i..], &mut out, uni).max(1);
    }
    Cow::Owned(out)
}

fn url_decode(input: &[u8], out: &mut Vec<u8>, uni: bool) -> usize {
    match input[0] {
        b'+' => {
            out.push(b' ');
            1
        }
        b'%' => {
            if uni && matches!(input.get(1), Some(b'u' | b'U')) {
                if let (Some(high), Some(low)) = (
                    input.get(2..4).and_then(hex_pair),
                    input.get(4..6).and_then(hex_pair),
                ) {
                    out.push(wide_to_byte(u16::from(high) << 8 | u16::from(low)));
                    return 6;
                }
            } else if let Some(b) = input.get(1..3).and_then(hex_pair) {
                out.push(b);
                return 3;
            }
            out.push(b'%');
            1
        }
        b => {
            out.push(b);
            1
        }
    }
}

/// A 16-bit code as one byte, as ModSecurity does: the full-width ASCII
/// forms (U+FF01–U+FF5E) as the ASCII they stand for, anything else as
/// its low byte.
fn wide_to_byte(code: u16) -> u8 {
    if (0xff01..=0xff5e).contains(&code) {
        u8::try_from(code - 0xfee0).unwrap_or(b'?')
    } else {
        code.to_le_bytes()[0]
    }
}

/// Base64 decoded up to the first byte that is not base64 (padding is
/// optional; a trailing partial group gives what its bits hold).
fn base64_decode(value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(value.len() * 3 / 4);
    let mut bits: u32 = 0;
    let mut count = 0;
    for &b in value {
        let six = match b {
            b'A'..=b'Z' => b - b'A',
            b'a'..=b'z' => b - b'a' + 26,
            b'0'..=b'9' => b - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            _ => break,
        };
        bits = bits << 6 | u32::from(six);
        count += 6;
        if count >= 8 {
            count -= 8;
            out.push((bits >> count) as u8);
        }
    }
    out
}

/// ModSecurity's `cmdLine`: quotes, backslashes and carets deleted,
/// `,` and `;` and white space as one space, no space before `/` or `(`,
/// lowercase.
fn cmd_line(value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(value.len());
    let mut space = false;
    for &b in value {
        match b {
            b'"' | b'\'' | b'\\' | b'^' => {}
            b' ' | b',' | b';' | b'\t' | b'\r' | b'\n' => {
                if !space {
                    out.push(b' ');
                    space = true;
                }
            }
            b'/' | b'(' => {
                if space {
                    out.pop();
                }
                space = false;
                out.push(b);
            }
            b => {
                out.push(b.to_ascii_lowercase());
                space = false;
            }
        }
    }
    out
}

fn compress_whitespace(value: &[u8]) -> Cow<'_, [u8]> {
    let untouched = value
        .windows(2)
        .all(|w| !(is_space(w[0]) && is_space(w[1])))
        && value.iter().all(|b| !is_space(*b) || *b == b' ');
    if untouched {
        return Cow::Borrowed(value);
    }
    let mut out = Vec::with_capacity(value.len());
    let mut space = false;
    for &b in value {
        if is_space(b) {
            if !space {
                out.push(b' ');
                space = true;
            }
        } else {
            out.push(b);
            space = false;
        }
    }
    Cow::Owned(out)
}

/// CSS 2 escapes: `\` and one to six hex digits (the character's low
/// byte, a full-width ASCII form as its ASCII; one white space after
/// them is part of the escape), `\` before a newline removed, `\` before
/// any other character that character.
fn css_decode(input: &[u8], out: &mut Vec<u8>) -> usize {
    let digits = input[1..]
        .iter()
        .take(6)
        .take_while(|b| b.is_ascii_hexdigit())
        .count();
    if digits > 0 {
        let hex = &input[1..=digits];
        let code = hex.iter().fold(0u32, |acc, b| {
            acc << 4 | u32::from(hex_value(*b).unwrap_or(0))
        });
        let byte = match u16::try_from(code) {
            Ok(wide) if digits >= 4 => wide_to_byte(wide),
            _ => code.to_le_bytes()[0],
        };
        out.push(byte);
        let mut read = 1 + digits;
        if input.get(read).is_some_and(|b| is_space(*b)) {
            read += 1;
        }
        return read;
    }
    match input.get(1) {
        None => 1,
        Some(b'\n') => 2,
        Some(&b) => {
            out.push(b);
            2
        }
    }
}

/// ANSI C escapes: `\a \b \f \n \r \t \v \\ \? \' \"`, `\xHH`, and one to
/// three octal digits; an escape that is none of them is kept as it is.
fn escape_seq_decode(input: &[u8], out: &mut Vec<u8>) -> usize {
    let Some(&next) = input.get(1) else {
        out.push(b'\\');
        return 1;
    };
    if let Some(b) = c_escape(next) {
        out.push(b);
        return 2;
    }
    if next == b'x' || next == b'X' {
        if let Some(b) = input.get(2..4).and_then(hex_pair) {
            out.push(b);
            return 4;
        }
    }
    if let Some((byte, digits)) = octal(&input[1..], false) {
        out.push(byte);
        return 1 + digits;
    }
    out.extend_from_slice(&input[..2]);
    2
}

/// Up to three octal digits at the start of `digits`: the value's low
/// byte and how many digits were read. With `byte_only` a third digit
/// is read only while the value stays a byte (as JavaScript reads it).
fn octal(digits: &[u8], byte_only: bool) -> Option<(u8, usize)> {
    let mut count = digits
        .iter()
        .take(3)
        .take_while(|b| (b'0'..=b'7').contains(b))
        .count();
    if count == 0 {
        return None;
    }
    if byte_only && count == 3 && digits[0] > b'3' {
        count = 2;
    }
    let code = digits[..count]
        .iter()
        .fold(0u32, |acc, b| acc * 8 + u32::from(b - b'0'));
    Some((code.to_le_bytes()[0], count))
}

fn c_escape(b: u8) -> Option<u8> {
    Some(match b {
        b'a' => 0x07,
        b'b' => 0x08,
        b'f' => 0x0c,
        b'n' => b'\n',
        b'r' => b'\r',
        b't' => b'\t',
        b'v' => 0x0b,
        b'\\' | b'?' | b'\'' | b'"' => b,
        _ => return None,
    })
}

/// JavaScript escapes: `\uHHHH` (a full-width ASCII form as its ASCII,
/// else the low byte), `\xHH`, up to three octal digits, the C escapes,
/// and `\` before any other character that character.
fn js_decode(input: &[u8], out: &mut Vec<u8>) -> usize {
    let Some(&next) = input.get(1) else {
        out.push(b'\\');
        return 1;
    };
    if next == b'u' {
        if let (Some(high), Some(low)) = (
            input.get(2..4).and_then(hex_pair),
            input.get(4..6).and_then(hex_pair),
        ) {
            out.push(wide_to_byte(u16::from(high) << 8 | u16::from(low)));
            return 6;
        }
    }
    if next == b'x' {
        if let Some(b) = input.get(2..4).and_then(hex_pair) {
            out.push(b);
            return 4;
        }
    }
    if let Some((byte, digits)) = octal(&input[1..], true) {
        out.push(byte);
        return 1 + digits;
    }
    out.push(c_escape(next).unwrap_or(next));
    2
}

/// HTML character references: `&#DDD;`, `&#xHH;` (the low byte; the `;`
/// optional) and `&quot; &nbsp; &lt; &gt; &amp;`; anything else kept.
fn html_entity_decode(input: &[u8], out: &mut Vec<u8>) -> usize {
    let rest = &input[1..];
    let (digits, radix, skip) = match rest {
        [b'#', b'x' | b'X', tail @ ..] => (
            tail.iter().take_while(|b| b.is_ascii_hexdigit()).count(),
            16,
            2,
        ),
        [b'#', tail @ ..] => (
            tail.iter().take_while(|b| b.is_ascii_digit()).count(),
            10,
            1,
        ),
        _ => (0, 0, 0),
    };
    if digits > 0 {
        let text = &rest[skip..skip + digits];
        let code = text.iter().fold(0u32, |acc, b| {
            acc.wrapping_mul(radix)
                .wrapping_add((*b as char).to_digit(radix).unwrap_or(0))
        });
        out.push(code.to_le_bytes()[0]);
        let mut read = 1 + skip + digits;
        if input.get(read) == Some(&b';') {
            read += 1;
        }
        return read;
    }
    for (name, byte) in [
        (&b"quot"[..], b'"'),
        (b"nbsp", 0xa0),
        (b"lt", b'<'),
        (b"gt", b'>'),
        (b"amp", b'&'),
    ] {
        if rest.len() >= name.len() && rest[..name.len()].eq_ignore_ascii_case(name) {
            out.push(byte);
            let mut read = 1 + name.len();
            if input.get(read) == Some(&b';') {
                read += 1;
            }
            return read;
        }
    }
    out.push(b'&');
    1
}

/// Paths with `//` collapsed and `/./` and `/../` resolved (`\` read as
/// `/` first on Windows); a `..` past the root is dropped.
fn normalize_path(value: &[u8], windows: bool) -> Cow<'_, [u8]> {
    let converted: Cow<'_, [u8]> = if windows && value.contains(&b'\\') {
        Cow::Owned(
            value
                .iter()
                .map(|&b| if b == b'\\' { b'/' } else { b })
                .collect(),
        )
    } else {
        Cow::Borrowed(value)
    };
    let input = converted.as_ref();
    let needs = input
        .windows(2)
        .any(|w| w == b"//" || w == b"/." || w == b"./")
        || input == b"."
        || input == b"..";
    if !needs {
        return converted;
    }
    let absolute = input.first() == Some(&b'/');
    let trailing = input.last() == Some(&b'/')
        || input.ends_with(b"/.")
        || input.ends_with(b"/..")
        || input == b"."
        || input == b"..";
    let mut parts: Vec<&[u8]> = Vec::new();
    for segment in input.split(|b| *b == b'/') {
        match segment {
            b"" | b"." => {}
            b".." => {
                if parts.last().is_some_and(|p| *p != b"..") {
                    parts.pop();
                } else if !absolute {
                    parts.push(segment);
                }
            }
            _ => parts.push(segment),
        }
    }
    let mut out = Vec::with_capacity(input.len());
    if absolute {
        out.push(b'/');
    }
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            out.push(b'/');
        }
        out.extend_from_slice(part);
    }
    if trailing && !parts.is_empty() {
        out.push(b'/');
    }
    Cow::Owned(out)
}

/// The comment characters taken out: `/*`, `*/`, `<!--`, `-->`, `--`, `#`.
fn remove_comments_char(value: &[u8]) -> Cow<'_, [u8]> {
    const MARKS: [&[u8]; 6] = [b"/*", b"*/", b"<!--", b"-->", b"--", b"#"];
    let found = value
        .iter()
        .enumerate()
        .any(|(i, _)| MARKS.iter().any(|m| value[i..].starts_with(m)));
    if !found {
        return Cow::Borrowed(value);
    }
    let mut out = Vec::with_capacity(value.len());
    let mut i = 0;
    'scan: while i < value.len() {
        for mark in MARKS {
            if value[i..].starts_with(mark) {
                i += mark.len();
                continue 'scan;
            }
        }
        out.push(value[i]);
        i += 1;
    }
    Cow::Owned(out)
}

/// Each C comment (`/* … */`, or `/*` to the end) as one space.
fn replace_comments(value: &[u8]) -> Cow<'_, [u8]> {
    let Some(first) = memchr::memmem::find(value, b"/*") else {
        return Cow::Borrowed(value);
    };
    let mut out = Vec::with_capacity(value.len());
    out.extend_from_slice(&value[..first]);
    let mut rest = &value[first..];
    while let Some(start) = memchr::memmem::find(rest, b"/*") {
        out.extend_from_slice(&rest[..start]);
        out.push(b' ');
        match memchr::memmem::find(&rest[start + 2..], b"*/") {
            Some(end) => rest = &rest[start + 2 + end + 2..],
            None => return Cow::Owned(out),
        }
    }
    out.extend_from_slice(rest);
    Cow::Owned(out)
}

/// Each UTF-8 sequence of two to four bytes as `%uHHHH` (its code point,
/// lowercase hex, at least four digits); ASCII and bytes that are not
/// UTF-8 kept.
fn utf8_to_unicode(value: &[u8]) -> Cow<'_, [u8]> {
    if value.is_ascii() {
        return Cow::Borrowed(value);
    }
    let mut out = Vec::with_capacity(value.len() * 2);
    let mut rest = value;
    while !rest.is_empty() {
        match std::str::from_utf8(rest) {
            Ok(text) => {
                push_unicode(text, &mut out);
                break;
            }
            Err(e) => {
                let (good, bad) = rest.split_at(e.valid_up_to());
                push_unicode(std::str::from_utf8(good).unwrap_or_default(), &mut out);
                let skip = e.error_len().unwrap_or(bad.len()).max(1).min(bad.len());
                out.extend_from_slice(&bad[..skip]);
                rest = &bad[skip..];
            }
        }
    }
    Cow::Owned(out)
}

fn push_unicode(text: &str, out: &mut Vec<u8>) {
    use std::io::Write;
    for c in text.chars() {
        if c.is_ascii() {
            out.push(c as u8);
        } else {
            let _ = write!(out, "%u{:04x}", u32::from(c));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(transform: Transform, input: &[u8]) -> Vec<u8> {
        apply(transform, input).into_owned()
    }

    #[test]
    fn url_decoding_reads_plus_percent_and_wide_forms_and_keeps_what_is_not_an_escape() {
        assert_eq!(t(Transform::UrlDecode, b"a+b%20c%2"), b"a b c%2");
        assert_eq!(t(Transform::UrlDecode, b"%u0041%zz"), b"%u0041%zz");
        assert_eq!(
            t(Transform::UrlDecodeUni, b"%u0041%uff0e%u2215x"),
            b"A.\x15x"
        );
        assert!(matches!(
            apply(Transform::UrlDecodeUni, b"plain"),
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn cmd_line_reads_as_the_reference_does() {
        assert_eq!(
            t(Transform::CmdLine, b"C^OM\"M'A\\ND /C  ,;dir ("),
            b"command/c dir("
        );
    }

    #[test]
    fn javascript_css_and_c_escapes_decode() {
        assert_eq!(
            t(Transform::JsDecode, br"\x41\u0042\uff0e\101\n\q\"),
            b"AB.A\nq\\"
        );
        assert_eq!(
            t(Transform::CssDecode, b"\\41 \\000042\\\nC\\ff0e\\q"),
            b"ABC.q"
        );
        assert_eq!(t(Transform::EscapeSeqDecode, br"\x41\101\n\z"), b"AA\n\\z");
    }

    #[test]
    fn html_entities_decode_numbers_and_five_names() {
        assert_eq!(
            t(
                Transform::HtmlEntityDecode,
                b"&#x3c;&#62&lt;&QUOT;&nbsp;&copy;&"
            ),
            b"<><\"\xa0&copy;&"
        );
    }

    #[test]
    fn white_space_comments_and_nulls() {
        assert_eq!(t(Transform::CompressWhitespace, b"a \t\n b\xa0c"), b"a b c");
        assert!(matches!(
            apply(Transform::CompressWhitespace, b"a b"),
            Cow::Borrowed(_)
        ));
        assert_eq!(t(Transform::RemoveWhitespace, b" a\tb \xa0"), b"ab");
        assert_eq!(t(Transform::RemoveNulls, b"a\0b"), b"ab");
        assert_eq!(t(Transform::ReplaceComments, b"a/*x*/b/*open"), b"a b ");
        assert_eq!(
            t(Transform::RemoveCommentsChar, b"a/*b*/c--d#e<!--f-->"),
            b"abcdef"
        );
        assert_eq!(t(Transform::Trim, b" \ta b\n"), b"a b");
    }

    #[test]
    fn paths_normalize_with_their_trailing_slash() {
        assert_eq!(t(Transform::NormalizePath, b"/a//b/./c/../d/"), b"/a/b/d/");
        assert_eq!(
            t(Transform::NormalizePath, b"/../../etc/passwd"),
            b"/etc/passwd"
        );
        assert_eq!(t(Transform::NormalizePath, b"a/../../b"), b"../b");
        assert_eq!(t(Transform::NormalizePathWin, br"c:\a\..\b"), b"c:/b");
    }

    #[test]
    fn encodings_lengths_and_digests() {
        assert_eq!(t(Transform::Base64Decode, b"QUJD"), b"ABC");
        assert_eq!(t(Transform::Base64Decode, b"QUI=!!"), b"AB");
        assert_eq!(t(Transform::HexEncode, b"\x00\xffA"), b"00ff41");
        assert_eq!(t(Transform::Length, b"abcd"), b"4");
        assert_eq!(
            hex(&t(Transform::Sha1, b"abc")),
            "a9993e364706816aba3e25717850c26c9cd0d89d"
        );
        assert_eq!(
            t(Transform::Utf8ToUnicode, "aé€\u{1F600}\u{ff}".as_bytes()),
            b"a%u00e9%u20ac%u1f600%u00ff"
        );
        assert_eq!(t(Transform::Utf8ToUnicode, b"a\xffb"), b"a\xffb");
        assert_eq!(t(Transform::Lowercase, b"AbC"), b"abc");
    }
}
