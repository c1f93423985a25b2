//! `[cache.zones]` and `routes.cache` (issue 57): zone sizes, and that a
//! route names a zone the configuration defines. Fixture:
//! `fixtures/configs/invalid/cache.toml`.

use super::*;
use crate::config::{FileCacheDisk, FileCacheKey, FileConfig, FileRouteCache};
use crate::plan::{CacheKeySpec, DiskSpec, QueryKey, RouteCacheSpec, ZoneSpec};

/// A zone's bytes: 1 MiB to 64 GiB.
const ZONE_MIN: u64 = 1 << 20;
const ZONE_MAX: u64 = 64 << 30;
/// A zone's disk: 16 MiB to 64 TiB.
const DISK_MIN: u64 = 16 << 20;
const DISK_MAX: u64 = 64 << 40;
/// `max_object` when not given.
const DEFAULT_MAX_OBJECT: u64 = 8 << 20;
/// The longest `ttl_default`, and the longest stale windows.
const MAX_TTL_DEFAULT: Duration = Duration::from_secs(365 * 24 * 3600);
const MAX_STALE: Duration = Duration::from_secs(30 * 24 * 3600);

impl Validator<'_> {
    /// `[cache.zones.NAME] = { memory, disk }`.
    pub(super) fn cache_zones(&mut self, file: &FileConfig) -> BTreeMap<String, ZoneSpec> {
        let state_dir = file
            .runtime
            .state_dir
            .as_ref()
            .map(|d| self.base_dir.join(d));
        let mut zones = BTreeMap::new();
        let mut folders: Vec<(PathBuf, String)> = Vec::new();
        for (name, zone) in file.cache.as_ref().map(|c| &c.zones).into_iter().flatten() {
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
            let disk = match &zone.disk {
                None => None,
                Some(disk) => {
                    let base = format!("cache.zones.{}.disk", crate::config::quote_key(name));
                    match self.zone_disk(&base, disk, state_dir.as_deref()) {
                        Some(spec) => {
                            if let Some((_, other)) =
                                folders.iter().find(|(path, _)| *path == spec.path)
                            {
                                self.error(
                                    Code::InvalidValue,
                                    format!("{base}.path"),
                                    format!("zone '{name}' keeps its files where zone '{other}' does: each zone needs a folder of its own"),
                                );
                                continue;
                            }
                            folders.push((spec.path.clone(), name.clone()));
                            Some(spec)
                        }
                        None => continue,
                    }
                }
            };
            zones.insert(name.clone(), ZoneSpec { memory, disk });
        }
        self.refused_zones = file
            .cache
            .as_ref()
            .map(|c| &c.zones)
            .into_iter()
            .flatten()
            .map(|(name, _)| name.clone())
            .filter(|name| !zones.contains_key(name))
            .collect();
        zones
    }

    /// `key = { headers, query, query_include, query_exclude }`.
    fn cache_key(&mut self, base: &str, key: &FileCacheKey) -> Option<CacheKeySpec> {
        let at = |k: &str| format!("{base}.{k}");
        let mut headers = Vec::new();
        let mut ok = true;
        for (n, name) in key.headers.iter().flatten().enumerate() {
            match HeaderName::from_bytes(name.as_bytes()) {
                Ok(header) => headers.push(header),
                Err(_) => {
                    self.error(
                        Code::InvalidHeader,
                        format!("{}[{n}]", at("headers")),
                        format!("'{name}' is not a header name"),
                    );
                    ok = false;
                }
            }
        }
        let names = |list: &Vec<String>| list.clone();
        let query = match (key.query, &key.query_include, &key.query_exclude) {
            (_, Some(_), Some(_)) => {
                self.error(
                    Code::InvalidValue,
                    at("query_include"),
                    "query_include and query_exclude: give one of them",
                );
                return None;
            }
            (Some(false), Some(_), _) | (Some(false), _, Some(_)) => {
                self.error(
                    Code::InvalidValue,
                    at("query"),
                    "query = false leaves the query out: query_include and query_exclude have nothing to choose from",
                );
                return None;
            }
            (Some(false), None, None) => QueryKey::Nothing,
            (_, Some(list), None) if !list.is_empty() => QueryKey::Include(names(list)),
            (_, None, Some(list)) if !list.is_empty() => QueryKey::Exclude(names(list)),
            (_, None, None) => QueryKey::All,
            _ => {
                self.error(
                    Code::InvalidValue,
                    at("query_include"),
                    "an empty list: write query = false to leave the query out",
                );
                return None;
            }
        };
        ok.then_some(CacheKeySpec { headers, query })
    }

    /// `disk = { path, size }`: a folder under the state folder (made
    /// when the zone starts) that can be written, and its bytes.
    fn zone_disk(
        &mut self,
        base: &str,
        disk: &FileCacheDisk,
        state_dir: Option<&Path>,
    ) -> Option<DiskSpec> {
        let at = |key: &str| format!("{base}.{key}");
        let size = self.size(at("size"), &disk.size);
        if let Some(size) = size {
            if !(DISK_MIN..=DISK_MAX).contains(&size) {
                self.error(
                    Code::InvalidValue,
                    at("size"),
                    format!("size = {size} bytes is out of range: 16MiB to 64TiB"),
                );
                return None;
            }
        }
        let Some(state_dir) = state_dir else {
            self.error(
                Code::MissingStateDir,
                at("path"),
                "a cache zone's disk is a folder under runtime.state_dir, and none is set",
            );
            return None;
        };
        let given = Path::new(&disk.path);
        let climbs = given
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir));
        let path = state_dir.join(given);
        if climbs || !path.starts_with(state_dir) || path == state_dir {
            self.error(
                Code::InvalidValue,
                at("path"),
                format!(
                    "'{}' is not a folder under runtime.state_dir ({}): write a relative path such as \"cache/main\"",
                    disk.path,
                    state_dir.display()
                ),
            );
            return None;
        }
        // Not written here (validation writes nothing): the folder, or
        // the nearest folder above it that exists, must be one this
        // process may write in.
        let existing = path.ancestors().find(|p| p.exists());
        let problem = match existing {
            Some(p) if !p.is_dir() => Some(format!("{} is not a folder", p.display())),
            Some(p) if !writable(p) => Some(format!("{} cannot be written", p.display())),
            Some(_) => None,
            None => Some("no folder above it exists".to_owned()),
        };
        if let Some(problem) = problem {
            self.error(
                Code::InvalidValue,
                at("path"),
                format!("the cache folder {}: {problem}", path.display()),
            );
            return None;
        }
        Some(DiskSpec { path, size: size? })
    }

    /// `routes[i].cache = { zone, max_object }`, for a route that proxies.
    pub(super) fn route_cache(
        &mut self,
        base: &str,
        c: &FileRouteCache,
        zones: &BTreeMap<String, ZoneSpec>,
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
        let Some(memory) = zones.get(&c.zone).map(|z| z.memory) else {
            if self.refused_zones.contains(&c.zone) {
                return None;
            }
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
        let key = match &c.key {
            Some(key) => Some(self.cache_key(&at("key"), key)?),
            None => None,
        };
        Some(RouteCacheSpec {
            key,
            zone: c.zone.clone(),
            max_object,
            ttl_default,
            stale_while_revalidate: stale_while_revalidate.unwrap_or_default(),
            stale_if_error: stale_if_error.unwrap_or_default(),
            head,
        })
    }
}

/// Whether this process may write in `dir` (`access(2)`, which writes
/// nothing).
fn writable(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt as _;
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    #[allow(unsafe_code)]
    // SAFETY: `path` is a NUL-terminated string that lives across the
    // call; `access` only reads it.
    unsafe {
        libc::access(path.as_ptr(), libc::W_OK | libc::X_OK) == 0
    }
}
