//! Route `mirror` and `mirror_methods` (DESIGN §17, §22): copies of a
//! share of a route's requests to another of the configuration's
//! upstreams. Fixtures: `fixtures/configs/invalid/filters.toml`.

use super::*;
use crate::plan::Mirror;

/// Copies of one route in flight at once, unless `max_inflight` says.
pub const DEFAULT_MIRROR_INFLIGHT: u32 = 64;

impl Validator<'_> {
    /// Route `i`'s `mirror` (one, or a list): empty when it has none.
    pub(super) fn mirrors(&mut self, i: usize, r: &FileRoute) -> Option<Vec<Arc<Mirror>>> {
        let Some(mirrors) = &r.mirror else {
            if r.mirror_methods.is_some() {
                self.error(
                    Code::UnexpectedOption,
                    format!("routes[{i}].mirror_methods"),
                    "mirror_methods says which methods `mirror` copies: it needs a mirror",
                );
                return None;
            }
            return Some(Vec::new());
        };
        let list = mirrors.list();
        if list.is_empty() {
            self.error(
                Code::InvalidValue,
                format!("routes[{i}].mirror"),
                "mirror = [] copies nothing: name a mirror, or remove the key",
            );
            return None;
        }
        let many = matches!(mirrors, crate::config::FileMirrors::Many(_));
        let mut out = Vec::new();
        let mut ok = true;
        for (n, m) in list.iter().enumerate() {
            let key = if many {
                format!("mirror[{n}]")
            } else {
                "mirror".to_owned()
            };
            if list[..n].iter().any(|o| o.upstream == m.upstream) {
                self.error(
                    Code::ConflictingOptions,
                    format!("routes[{i}].{key}.upstream"),
                    format!(
                        "upstream '{}' is mirrored already: one copy per upstream",
                        m.upstream
                    ),
                );
                ok = false;
                continue;
            }
            match self.mirror(i, r, m, &key) {
                Some(m) => out.push(m),
                None => ok = false,
            }
        }
        ok.then_some(out)
    }

    /// One mirror of route `i`, written at `routes[i].{key}`.
    fn mirror(
        &mut self,
        i: usize,
        r: &FileRoute,
        m: &crate::config::FileMirror,
        key: &str,
    ) -> Option<Arc<Mirror>> {
        let at = |field: &str| match field {
            "mirror" => format!("routes[{i}].{key}"),
            "mirror_methods" => format!("routes[{i}].mirror_methods"),
            other => format!("routes[{i}].{key}{}", other.trim_start_matches("mirror")),
        };
        let mut ok = true;
        if r.upstream.is_none() {
            self.error(
                Code::UnexpectedOption,
                at("mirror"),
                "`mirror` copies what a route forwards: it applies to routes with an upstream, not to `respond` or `redirect`",
            );
            ok = false;
        }
        if !self.upstream_tls.contains_key(&m.upstream) {
            self.error(
                Code::UnknownUpstream,
                at("mirror.upstream"),
                format!(
                    "mirror names upstream '{}', which is not defined",
                    m.upstream
                ),
            );
            ok = false;
        } else if r.upstream.as_deref() == Some(m.upstream.as_str()) {
            self.error(
                Code::ConflictingOptions,
                at("mirror.upstream"),
                format!(
                    "the route forwards to '{}' already: a mirror copies to another upstream",
                    m.upstream
                ),
            );
            ok = false;
        }
        let percent = m.percent.unwrap_or(100.0);
        if !(percent > 0.0 && percent <= 100.0) {
            self.error(
                Code::InvalidValue,
                at("mirror.percent"),
                format!("percent {percent} must be above 0 and at most 100"),
            );
            ok = false;
        }
        let max_inflight = m.max_inflight.unwrap_or(DEFAULT_MIRROR_INFLIGHT);
        if !(1..=10_000).contains(&max_inflight) {
            self.error(
                Code::InvalidValue,
                at("mirror.max_inflight"),
                format!("max_inflight {max_inflight} must be between 1 and 10000"),
            );
            ok = false;
        }
        let mut methods = Vec::new();
        for (n, name) in r.mirror_methods.iter().flatten().enumerate() {
            match self.method(format!("routes[{i}].mirror_methods[{n}]"), name) {
                Some(method) => methods.push(method),
                None => ok = false,
            }
        }
        ok.then(|| {
            Arc::new(Mirror {
                upstream: m.upstream.clone(),
                percent,
                max_inflight,
                methods,
            })
        })
    }
}
