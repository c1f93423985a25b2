//! `[cache.zones]` and `routes.cache` (issue 57): zone sizes, and that a
//! route names a zone the configuration defines. Fixture:
//! `fixtures/configs/invalid/cache.toml`.

use super::*;
use crate::config::{FileCache, FileRouteCache};
use crate::plan::RouteCacheSpec;

/// A zone's bytes: 1 MiB to 64 GiB.
const ZONE_MIN: u64 = 1 << 20;
const ZONE_MAX: u64 = 64 << 30;
/// `max_object` when not given.
const DEFAULT_MAX_OBJECT: u64 = 8 << 20;
/// The longest `ttl_default`, and the longest stale windows.
const MAX_TTL_DEFAULT: Duration = Duration::from_secs(365 * 24 * 3600);
const MAX_STALE: Duration = Duration::from_secs(30 * 24 * 3600);

impl Validator<'_> {
    /// `[cache.zones.NAME] = { memory }`.
    pub(super) fn cache_zones(&mut self, cache: Option<&FileCache>) -> BTreeMap<String, u64> {
        let mut zones = BTreeMap::new();
        for (name, zone) in cache.map(|c| &c.zones).into_iter().flatten() {
            let path = format!("cache.zones.{}.memory", crate::config::quote_key(name));
            let Some(memory) = self.size(path.clone(), &zone.memory) else {
                continue;
            };
            if !(ZONE_MIN..=ZONE_MAX).contains(&memory) {
                self.error(
                    Code::InvalidValue,
                    path,
                    format!(
                        "zone '{name}': memory = {memory} bytes is out of range: 1MiB to 64GiB"
                    ),
                );
                continue;
            }
            zones.insert(name.clone(), memory);
        }
        zones
    }

    /// `routes[i].cache = { zone, max_object }`, for a route that proxies.
    pub(super) fn route_cache(
        &mut self,
        base: &str,
        c: &FileRouteCache,
        zones: &BTreeMap<String, u64>,
        proxies: bool,
    ) -> Option<RouteCacheSpec> {
        let at = |key: &str| format!("{base}.{key}");
        if !proxies {
            self.error(
                Code::UnexpectedOption,
                base,
                "`cache` applies to routes with an upstream, not to `respond` or `redirect`",
            );
            return None;
        }
        let Some(memory) = zones.get(&c.zone).copied() else {
            let known: Vec<&str> = zones.keys().map(String::as_str).collect();
            self.error(
                Code::UnknownZone,
                at("zone"),
                if known.is_empty() {
                    format!("zone '{}' is not defined: add [cache.zones.{}] = {{ memory = \"256MiB\" }}", c.zone, c.zone)
                } else {
                    format!("zone '{}' is not defined ([cache.zones] has {})", c.zone, known.join(", "))
                },
            );
            return None;
        };
        let max_object = match &c.max_object {
            None => DEFAULT_MAX_OBJECT.min(memory / 8),
            Some(size) => {
                let n = self.size(at("max_object"), size)?;
                if n > memory / 8 {
                    self.error(
                        Code::InvalidValue,
                        at("max_object"),
                        format!(
                            "max_object = {n} bytes is more than an eighth of zone '{}' ({memory} bytes): one object could push out most of the zone",
                            c.zone
                        ),
                    );
                    return None;
                }
                n
            }
        };
        let mut bounded = |key: &str, text: &Option<String>, max: Duration| {
            let text = text.as_ref()?;
            let d = self.duration(at(key), text)?;
            if d > max {
                self.error(
                    Code::InvalidValue,
                    at(key),
                    format!(
                        "{key} = '{text}' is longer than {}",
                        humantime::format_duration(max)
                    ),
                );
                return None;
            }
            Some(d)
        };
        let ttl_default = bounded("ttl_default", &c.ttl_default, MAX_TTL_DEFAULT);
        let stale_while_revalidate = bounded(
            "stale_while_revalidate",
            &c.stale_while_revalidate,
            MAX_STALE,
        );
        let stale_if_error = bounded("stale_if_error", &c.stale_if_error, MAX_STALE);
        let mut head = true;
        if let Some(methods) = &c.methods {
            let mut get = false;
            head = false;
            for (n, text) in methods.iter().enumerate() {
                let path = format!("{}[{n}]", at("methods"));
                match self.method(path.clone(), text) {
                    Some(Method::GET) => get = true,
                    Some(Method::HEAD) => head = true,
                    Some(other) => self.error(
                        Code::InvalidValue,
                        path,
                        format!("{other} answers are not kept: a cache answers GET, and HEAD from a stored GET (a POST's key would need its body)"),
                    ),
                    None => {}
                }
            }
            if !get {
                self.error(
                    Code::InvalidValue,
                    at("methods"),
                    "methods must list GET: what the zone keeps is GET answers",
                );
            }
        }
        Some(RouteCacheSpec {
            zone: c.zone.clone(),
            max_object,
            ttl_default,
            stale_while_revalidate: stale_while_revalidate.unwrap_or_default(),
            stale_if_error: stale_if_error.unwrap_or_default(),
            head,
        })
    }
}
