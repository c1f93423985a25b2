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
        Some(RouteCacheSpec {
            zone: c.zone.clone(),
            max_object,
        })
    }
}
