//! `compress` on routes and listener `defaults` (DESIGN §17): encodings
//! the gateway makes, the media types worth it, a length below which an
//! answer goes as it is, one level name for every encoding. Fixtures:
//! `fixtures/configs/invalid/filters.toml`.

use super::*;
use crate::config::{FileCompress, FileSize};
use crate::plan::{Compress, Encoding, Level, MediaRange};

/// `compress = {}`'s types: text, and the structured formats sent as
/// text (JSON, XML, JavaScript, SVG, WebAssembly's binary compresses well
/// too). Images, video, audio, archives and fonts in WOFF are compressed
/// already.
pub const DEFAULT_TYPES: &[&str] = &[
    "text/*",
    "application/json",
    "application/*+json",
    "application/javascript",
    "application/xml",
    "application/*+xml",
    "application/wasm",
    "image/svg+xml",
];

/// An answer shorter than this is not worth a compressor's set-up.
pub const DEFAULT_MIN_BYTES: u64 = 1024;

impl Validator<'_> {
    pub(super) fn compress(&mut self, base: &str, c: &FileCompress) -> Option<Arc<Compress>> {
        let at = |key: &str| format!("{base}.{key}");
        let mut ok = true;
        let encodings = match &c.encodings {
            None => Encoding::ALL.to_vec(),
            Some(names) => {
                let mut encodings = Vec::with_capacity(names.len());
                for (n, name) in names.iter().enumerate() {
                    let path = format!("{base}.encodings[{n}]");
                    match Encoding::ALL.into_iter().find(|e| e.token() == name) {
                        Some(e) if encodings.contains(&e) => {
                            self.error(
                                Code::DuplicateName,
                                path,
                                format!("encoding '{name}' is listed twice"),
                            );
                            ok = false;
                        }
                        Some(e) => encodings.push(e),
                        None => {
                            self.error(
                                Code::InvalidValue,
                                path,
                                format!("'{name}' is not an encoding the gateway makes: \"zstd\", \"br\" or \"gzip\""),
                            );
                            ok = false;
                        }
                    }
                }
                if names.is_empty() {
                    self.error(
                        Code::InvalidValue,
                        at("encodings"),
                        "encodings = [] compresses nothing; name them, or remove compress",
                    );
                    ok = false;
                }
                encodings
            }
        };
        let min_bytes = match &c.min_bytes {
            None => DEFAULT_MIN_BYTES,
            Some(FileSize::Bytes(n)) => *n,
            Some(FileSize::Text(text)) => match super::filters::parse_size(text) {
                Some(n) => n,
                None => {
                    self.error(
                        Code::InvalidValue,
                        at("min_bytes"),
                        format!("'{text}' is not a size (bytes, or a number with B, KB, MB, GB, KiB, MiB or GiB)"),
                    );
                    ok = false;
                    0
                }
            },
        };
        let names: Vec<&str> = match &c.types {
            Some(list) => list.iter().map(String::as_str).collect(),
            None => DEFAULT_TYPES.to_vec(),
        };
        if names.is_empty() {
            self.error(
                Code::InvalidValue,
                at("types"),
                "types = [] compresses nothing; name them, or remove compress",
            );
            ok = false;
        }
        let mut types = Vec::with_capacity(names.len());
        for (n, name) in names.iter().enumerate() {
            match media_range(name) {
                Ok(range) => types.push(range),
                Err(why) => {
                    self.error(
                        Code::InvalidValue,
                        format!("{base}.types[{n}]"),
                        format!("'{name}' {why}"),
                    );
                    ok = false;
                }
            }
        }
        let level = match c.level.as_deref() {
            None | Some("default") => Level::Default,
            Some("fastest") => Level::Fastest,
            Some("best") => Level::Best,
            Some(other) => {
                self.error(
                    Code::InvalidValue,
                    at("level"),
                    format!("'{other}' is not a level: \"fastest\", \"default\" or \"best\" (one name for every encoding, whose numeric scales differ)"),
                );
                ok = false;
                Level::Default
            }
        };
        ok.then(|| {
            Arc::new(Compress {
                encodings,
                min_bytes,
                types,
                level,
            })
        })
    }
}

/// `type/subtype`, `type/*` or `type/*+suffix`, lower-cased.
fn media_range(text: &str) -> Result<MediaRange, &'static str> {
    let token = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$&-^_.+".contains(&b))
    };
    let lower = text.trim().to_ascii_lowercase();
    let Some((top, sub)) = lower.split_once('/') else {
        return Err("is not a media type: type/subtype, type/* or type/*+suffix");
    };
    if top == "*" {
        return Err("names every type: list the ones worth compressing (images, video and archives are compressed already)");
    }
    if !token(top) {
        return Err("is not a media type: type/subtype, type/* or type/*+suffix");
    }
    if sub == "*" {
        return Ok(MediaRange::Type(top.to_owned()));
    }
    if let Some(suffix) = sub.strip_prefix("*+") {
        if token(suffix) && !suffix.contains('+') {
            return Ok(MediaRange::Suffix(top.to_owned(), format!("+{suffix}")));
        }
    } else if token(sub) {
        return Ok(MediaRange::Exact(top.to_owned(), sub.to_owned()));
    }
    Err("is not a media type: type/subtype, type/* or type/*+suffix")
}

#[cfg(test)]
mod tests {
    use super::*;

    impl MediaRange {
        fn admits_type(&self, content_type: &str) -> bool {
            let essence = content_type.split(';').next().unwrap().trim();
            let (top, sub) = essence.split_once('/').unwrap_or((essence, ""));
            self.admits(top, sub)
        }
    }

    #[test]
    fn media_ranges_are_exact_by_type_or_by_suffix() {
        let json = media_range("application/JSON").unwrap();
        assert!(json.admits_type("application/json; charset=utf-8"));
        assert!(!json.admits_type("application/jsonl"));
        let text = media_range("text/*").unwrap();
        assert!(text.admits_type("Text/HTML"));
        assert!(!text.admits_type("textual/html"));
        let suffixed = media_range("application/*+json").unwrap();
        assert!(suffixed.admits_type("application/problem+json"));
        assert!(!suffixed.admits_type("application/json"));
        assert!(!suffixed.admits_type("application/+json"));
        assert!(!suffixed.admits_type("image/svg+json"));
        for bad in ["*/*", "json", "text/", "/json", "text/*+", "a b/c"] {
            assert!(media_range(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_default_types_are_valid() {
        for name in DEFAULT_TYPES {
            assert!(media_range(name).is_ok(), "{name}");
        }
    }
}
