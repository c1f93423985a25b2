//! The cache zones as the admin API shows them (`GET /admin/cache`) and
//! purges (`POST /admin/cache/purge`), each recorded in the operation
//! log like other operations. A purge changes no generation: it takes
//! no operation lock and runs beside an activation.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};

use super::error::ControlError;
use crate::cache::Selector;
use crate::generation::Generation;

/// `GET /admin/cache`: every zone the active generation names.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CacheView {
    pub zones: Vec<ZoneView>,
}

/// One zone: its size and use, what it counted since it was made, and
/// the active generation's routes that keep answers in it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ZoneView {
    pub name: String,
    pub capacity_bytes: u64,
    pub bytes: u64,
    pub objects: usize,
    /// Requests of its routes answered without the upstream: `hit`,
    /// `collapsed` and `stale` of `requests`.
    pub hits: u64,
    /// Requests looked up that went to the upstream: `miss` and
    /// `revalidated` of `requests`.
    pub misses: u64,
    /// Its routes' requests by what the cache did for each, as the route
    /// metrics count them.
    #[serde(default)]
    pub requests: BTreeMap<String, u64>,
    pub stored: u64,
    pub revalidated: u64,
    pub evicted: u64,
    pub purged: u64,
    pub routes: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<DiskView>,
}

/// A zone's files: where, how many bytes of how many, and what its disk
/// thread counted.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DiskView {
    pub path: String,
    pub capacity_bytes: u64,
    pub bytes: u64,
    pub written: u64,
    pub read: u64,
    /// Files found short or damaged (removed, never served).
    pub corrupt: u64,
    /// Writes that failed (a full disk, an unwritable folder).
    pub errors: u64,
    /// Writes dropped while 1 024 waited.
    pub dropped: u64,
    pub evicted: u64,
}

/// What a purge forgot, by zone.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Purged {
    /// Keys forgot, over every zone.
    pub purged: u64,
    pub zones: Vec<ZonePurged>,
    pub operation_id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ZonePurged {
    pub zone: String,
    pub purged: u64,
}

impl CacheView {
    /// Every zone `active` names, with the routes that keep answers in it.
    pub fn of(active: &Generation) -> Self {
        let zones = active
            .cache_zones()
            .map(|zone| {
                let (objects, bytes, evicted) = zone.usage();
                let counts = &zone.counts;
                let (hits, misses) = counts.hits_and_misses();
                ZoneView {
                    name: zone.name.clone(),
                    capacity_bytes: zone.capacity(),
                    bytes,
                    objects,
                    hits,
                    misses,
                    requests: crate::cache::Outcome::ALL
                        .iter()
                        .map(|o| (o.name().to_owned(), counts.requests(*o)))
                        .collect(),
                    stored: counts.stored.load(Ordering::Relaxed),
                    revalidated: counts.revalidated.load(Ordering::Relaxed),
                    evicted,
                    purged: counts.purged.load(Ordering::Relaxed),
                    routes: active
                        .spec
                        .routes
                        .iter()
                        .filter(|r| r.cache.as_ref().is_some_and(|c| c.zone == zone.name))
                        .map(|r| r.name.clone())
                        .collect(),
                    disk: zone.disk.as_ref().map(|disk| {
                        let c = &disk.counts;
                        DiskView {
                            path: disk.root.display().to_string(),
                            capacity_bytes: disk.size(),
                            bytes: disk.used(),
                            written: c.written.load(Ordering::Relaxed),
                            read: c.read.load(Ordering::Relaxed),
                            corrupt: c.corrupt.load(Ordering::Relaxed),
                            errors: c.errors.load(Ordering::Relaxed),
                            dropped: c.dropped.load(Ordering::Relaxed),
                            evicted: c.evicted.load(Ordering::Relaxed),
                        }
                    }),
                }
            })
            .collect();
        CacheView { zones }
    }
}

/// Forgets what `selector` names in `zone` of `active` (every zone when
/// `None`); returns what each zone forgot and the operation log's summary.
pub(super) fn purge(
    active: &Generation,
    zone: Option<&str>,
    selector: &Selector,
) -> Result<(Vec<ZonePurged>, String), ControlError> {
    let zones: Vec<_> = active
        .cache_zones()
        .filter(|z| zone.is_none_or(|name| z.name == name))
        .collect();
    if let (Some(name), true) = (zone, zones.is_empty()) {
        return Err(ControlError::UnknownZone(name.to_owned()));
    }
    let zones: Vec<ZonePurged> = zones
        .into_iter()
        .map(|z| ZonePurged {
            zone: z.name.clone(),
            purged: z.purge(selector),
        })
        .collect();
    let purged: u64 = zones.iter().map(|z| z.purged).sum();
    let what = match selector {
        Selector::Key(key) => format!("key {key:?}"),
        Selector::Prefix(prefix) => format!("prefix {prefix:?}"),
        Selector::Tag(tag) => format!("tag {tag:?}"),
    };
    let summary = format!(
        "{purged} objects purged by {what} from {}",
        zones
            .iter()
            .map(|z| z.zone.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    tracing::info!(purged, selector = %what, "cache purged");
    Ok((zones, summary))
}
