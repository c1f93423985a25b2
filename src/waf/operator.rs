//! The operators: whether one (transformed) value matches, as
//! ModSecurity's reference defines each. The parameter arrives with its
//! macros already expanded; what was compiled at load (a regex, a phrase
//! automaton) arrives as the rule's [`Matcher`].

use std::net::IpAddr;

use super::load::{compile, Matcher};
use super::rule::OperatorKind;

/// What a match captured for `capture` (`TX.0` the whole match, `TX.1`…
/// `TX.9` the groups).
pub type Captures = Vec<Vec<u8>>;

/// Whether `value` matches; with `captures`, what it captured.
pub fn matches(
    kind: OperatorKind,
    matcher: &Matcher,
    param: &[u8],
    value: &[u8],
    captures: Option<&mut Captures>,
) -> bool {
    match kind {
        OperatorKind::Rx => match matcher {
            Matcher::Regex(re) => regex(re, value, captures),
            // Compiled per use: its macros are expanded in `param`.
            _ => match compile(&String::from_utf8_lossy(param)) {
                Ok(re) => regex(&re, value, captures),
                Err(_) => false,
            },
        },
        OperatorKind::Pm | OperatorKind::PmFromFile => match matcher {
            Matcher::Phrases(automaton) => match automaton.find(value) {
                Some(found) => {
                    if let Some(captures) = captures {
                        captures.clear();
                        captures.push(value[found.range()].to_vec());
                    }
                    true
                }
                None => false,
            },
            _ => false,
        },
        OperatorKind::Eq => number(value) == number(param),
        OperatorKind::Ge => number(value) >= number(param),
        OperatorKind::Gt => number(value) > number(param),
        OperatorKind::Le => number(value) <= number(param),
        OperatorKind::Lt => number(value) < number(param),
        OperatorKind::Streq => value == param,
        OperatorKind::Contains => contains(value, param),
        OperatorKind::ContainsWord => contains_word(value, param),
        OperatorKind::BeginsWith => value.starts_with(param),
        OperatorKind::EndsWith => value.ends_with(param),
        OperatorKind::Within => !value.is_empty() && contains(param, value),
        OperatorKind::IpMatch => ip_match(param, value),
        OperatorKind::UnconditionalMatch => true,
        OperatorKind::ValidateByteRange => !within_ranges(param, value),
        OperatorKind::ValidateUrlEncoding => !valid_url_encoding(value),
        OperatorKind::ValidateUtf8Encoding => std::str::from_utf8(value).is_err(),
        OperatorKind::DetectSqli => {
            let found = libinjectionrs::detect_sqli(value);
            if found.is_injection() {
                if let (Some(captures), Some(print)) = (captures, found.fingerprint) {
                    captures.clear();
                    captures.push(print.to_string().into_bytes());
                }
                true
            } else {
                false
            }
        }
        OperatorKind::DetectXss => libinjectionrs::detect_xss(value).is_injection(),
    }
}

fn regex(re: &regex_automata::meta::Regex, value: &[u8], captures: Option<&mut Captures>) -> bool {
    // The fast engines answer whether it matches; only a match pays for
    // its groups.
    let Some(captures) = captures else {
        return re.is_match(value);
    };
    if !re.is_match(value) {
        return false;
    }
    let mut found = re.create_captures();
    re.captures(value, &mut found);
    if !found.is_match() {
        return false;
    }
    captures.clear();
    for group in 0..found.group_len().min(10) {
        let text = found
            .get_group(group)
            .map_or(&[][..], |span| &value[span.range()]);
        captures.push(text.to_vec());
    }
    true
}

/// A number as C's `atoi` reads it: leading blanks, a sign, the digits
/// up to the first that is not one; 0 when there are none.
pub(super) fn number(text: &[u8]) -> i64 {
    let text = text.trim_ascii_start();
    let (negative, digits) = match text.first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let magnitude = digits
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .fold(0i64, |acc, b| {
            acc.saturating_mul(10).saturating_add(i64::from(b - b'0'))
        });
    if negative {
        -magnitude
    } else {
        magnitude
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    memchr::memmem::find(haystack, needle).is_some()
}

/// `needle` in `haystack` with no word character either side.
fn contains_word(haystack: &[u8], needle: &[u8]) -> bool {
    if needle.is_empty() {
        return true;
    }
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    memchr::memmem::find_iter(haystack, needle).any(|at| {
        let before = at.checked_sub(1).map(|i| haystack[i]);
        let after = haystack.get(at + needle.len()).copied();
        !before.is_some_and(word) && !after.is_some_and(word)
    })
}

/// The value is one of the comma-separated addresses or networks.
fn ip_match(param: &[u8], value: &[u8]) -> bool {
    let Ok(address) = String::from_utf8_lossy(value).trim().parse::<IpAddr>() else {
        return false;
    };
    String::from_utf8_lossy(param)
        .split([',', ' '])
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .any(|network| match network.parse::<ipnet::IpNet>() {
            Ok(net) => net.contains(&address),
            Err(_) => network.parse::<IpAddr>().is_ok_and(|a| a == address),
        })
}

/// Every byte of `value` within the ranges (`9,10,32-126`).
fn within_ranges(param: &[u8], value: &[u8]) -> bool {
    let mut allowed = [false; 256];
    for part in String::from_utf8_lossy(param).split(',') {
        let part = part.trim();
        let (low, high) = part.split_once('-').unwrap_or((part, part));
        if let (Ok(low), Ok(high)) = (low.trim().parse::<u8>(), high.trim().parse::<u8>()) {
            for b in low..=high {
                allowed[usize::from(b)] = true;
            }
        }
    }
    value.iter().all(|b| allowed[usize::from(*b)])
}

/// Every `%` followed by two hex digits.
fn valid_url_encoding(value: &[u8]) -> bool {
    let mut i = 0;
    while let Some(at) = memchr::memchr(b'%', &value[i..]) {
        let at = i + at;
        let pair = value.get(at + 1..at + 3);
        if !pair.is_some_and(|p| p.iter().all(u8::is_ascii_hexdigit)) {
            return false;
        }
        i = at + 3;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param(kind: OperatorKind, param: &str, value: &str) -> bool {
        matches(
            kind,
            &Matcher::Param,
            param.as_bytes(),
            value.as_bytes(),
            None,
        )
    }

    #[test]
    fn numbers_compare_as_atoi_reads_them() {
        assert!(param(OperatorKind::Eq, "0", ""));
        assert!(param(OperatorKind::Ge, "5", "12abc"));
        assert!(param(OperatorKind::Lt, "1", " -3"));
        assert!(!param(OperatorKind::Gt, "5", "5"));
    }

    #[test]
    fn strings_words_ranges_and_encodings() {
        assert!(param(OperatorKind::Within, "GET HEAD POST", "HEAD"));
        assert!(!param(OperatorKind::Within, "GET HEAD POST", ""));
        assert!(param(OperatorKind::ContainsWord, "select", "a select b"));
        assert!(!param(OperatorKind::ContainsWord, "select", "selection"));
        assert!(param(OperatorKind::ValidateByteRange, "32-126", "a\x01"));
        assert!(!param(
            OperatorKind::ValidateByteRange,
            "9,10,32-126",
            "a\tb"
        ));
        assert!(param(OperatorKind::ValidateUrlEncoding, "", "a%2"));
        assert!(!param(OperatorKind::ValidateUrlEncoding, "", "a%20b"));
        assert!(param(
            OperatorKind::IpMatch,
            "127.0.0.1,::1,10.0.0.0/8",
            "10.2.3.4"
        ));
        assert!(!param(OperatorKind::IpMatch, "127.0.0.1", "127.0.0.2"));
        assert!(matches(
            OperatorKind::ValidateUtf8Encoding,
            &Matcher::Param,
            b"",
            b"\xc0\xaf",
            None
        ));
    }

    #[test]
    fn regexes_and_phrases_capture_what_they_matched() {
        let re = compile(r"(?i)(un)ion\s+(select)").unwrap();
        let mut captured = Captures::new();
        assert!(matches(
            OperatorKind::Rx,
            &Matcher::Regex(re),
            b"",
            b"1 UNION  SELECT 2",
            Some(&mut captured)
        ));
        assert_eq!(
            captured,
            [
                b"UNION  SELECT".to_vec(),
                b"UN".to_vec(),
                b"SELECT".to_vec()
            ]
        );
        let phrases = Matcher::phrases(&["passwd".into(), "shadow".into()]).unwrap();
        assert!(matches(
            OperatorKind::Pm,
            &phrases,
            b"",
            b"/etc/PASSWD",
            Some(&mut captured)
        ));
        assert_eq!(captured, [b"PASSWD".to_vec()]);
    }

    #[test]
    fn libinjection_finds_sql_and_script() {
        let run = |kind, value: &str| matches(kind, &Matcher::Param, b"", value.as_bytes(), None);
        assert!(run(OperatorKind::DetectSqli, "1' OR '1'='1"));
        assert!(!run(OperatorKind::DetectSqli, "hello world"));
        assert!(run(OperatorKind::DetectXss, "<script>alert(1)</script>"));
        assert!(!run(OperatorKind::DetectXss, "a < b"));
    }
}
