//! A zone's disk tier: objects kept in files under the state folder, so
//! that they outlive the process (a restart, a drain-aware upgrade).
//!
//! - **Layout**: one folder per key, named by the key's SHA-256
//!   (`ab/ab12…/`), one file per variant in it (named by the SHA-256 of
//!   the request values its `Vary` selected). A look-up that misses
//!   memory reads the key's folder: no index to rebuild at start, and two
//!   processes (the old and the new one of an upgrade) can share it.
//! - **File**: `cutover-cache 1\n`, the header's length (u32, little
//!   endian), the header (JSON: the key, the RFC 9111 policy, tags,
//!   validators, freshness), the body, then the SHA-256 of all that. A
//!   file that is short, does not say so, or whose digest differs is a
//!   miss, never served, and is removed.
//! - **Writes** go through one thread per zone, fed by a bounded queue:
//!   a request never waits for the disk, and a write the queue cannot
//!   take is dropped (counted). A file is written beside its place and
//!   renamed into it, so a reader sees a whole file or none. A write that
//!   fails (a full disk, a folder gone) is counted and logged once until
//!   one succeeds again; the object stays in memory: nothing fails.
//! - **Size**: the files may take `size` bytes; past it the thread
//!   removes the least recently written or read files until 90 % of it
//!   is left (a file's time is set when it is read back).
//! - **Purges and invalidations** go through the same thread, after the
//!   writes queued before them; until the thread has done one, a read
//!   that would find what it removes finds nothing.

use std::collections::HashSet;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderName, HeaderValue};
use http_cache_semantics::CachePolicy;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use super::stored::Grace;
use super::{Selector, Stored};

const MAGIC: &[u8] = b"cutover-cache 1\n";
/// Writes, removals and purges waiting for the thread.
const QUEUE: usize = 1_024;
/// A header longer than this is not ours.
const MAX_HEADER: usize = 1 << 20;

/// What a zone's disk has counted since the zone was made.
#[derive(Debug, Default)]
pub struct DiskCounts {
    pub written: AtomicU64,
    pub read: AtomicU64,
    /// Files found short or damaged (removed, never served).
    pub corrupt: AtomicU64,
    /// Writes that failed (a full disk, a folder that cannot be written).
    pub errors: AtomicU64,
    /// Writes dropped because the queue was full.
    pub dropped: AtomicU64,
    /// Files removed to stay within the size.
    pub evicted: AtomicU64,
}

enum Command {
    Write {
        key: String,
        stored: Arc<Stored>,
    },
    Remove {
        key: String,
    },
    Purge {
        selector: Selector,
        done: SyncSender<HashSet<String>>,
    },
}

/// One zone's files.
#[derive(Debug)]
pub struct Disk {
    pub root: PathBuf,
    size: Arc<AtomicU64>,
    used: Arc<AtomicU64>,
    commands: SyncSender<Command>,
    /// Removals queued and not yet done: what a read must not find.
    pending: Arc<Mutex<Vec<Selector>>>,
    pub counts: Arc<DiskCounts>,
}

impl Disk {
    /// The disk of zone `zone` in `root`, of `size` bytes; its thread
    /// makes the folder and measures what is already there.
    pub fn open(zone: &str, root: PathBuf, size: u64) -> Self {
        let (commands, queue) = sync_channel(QUEUE);
        let disk = Self {
            root,
            size: Arc::new(AtomicU64::new(size)),
            used: Arc::new(AtomicU64::new(0)),
            commands,
            pending: Arc::default(),
            counts: Arc::default(),
        };
        let worker = Worker {
            zone: zone.to_owned(),
            root: disk.root.clone(),
            size: Arc::clone(&disk.size),
            used: Arc::clone(&disk.used),
            pending: Arc::clone(&disk.pending),
            counts: Arc::clone(&disk.counts),
            failing: AtomicBool::new(false),
        };
        let started = std::thread::Builder::new()
            .name(format!("cache-disk-{zone}"))
            .spawn(move || worker.run(&queue));
        if let Err(error) = started {
            tracing::error!(zone, %error, "cannot start the cache's disk thread; the zone keeps objects in memory only");
        }
        disk
    }

    pub fn size(&self) -> u64 {
        self.size.load(Ordering::Relaxed)
    }

    pub fn set_size(&self, size: u64) {
        self.size.store(size, Ordering::Relaxed);
    }

    /// Bytes its files take (as last measured, and written since).
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Queues `stored` to be written under `key`; dropped when the queue
    /// is full.
    pub fn write(&self, key: &str, stored: Arc<Stored>) {
        let command = Command::Write {
            key: key.to_owned(),
            stored,
        };
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) =
            self.commands.try_send(command)
        {
            self.counts.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Queues the removal of every file of `key`.
    pub fn remove(&self, key: &str) {
        self.lock_pending().push(Selector::Key(key.to_owned()));
        // Blocking only when 1 024 commands wait: a removal must not be
        // lost (a stale object would come back from the disk).
        if self
            .commands
            .send(Command::Remove {
                key: key.to_owned(),
            })
            .is_err()
        {
            self.done(&Selector::Key(key.to_owned()));
        }
    }

    /// From now until [`Disk::purge`] has done it, what `selector`
    /// names is not read back.
    pub fn hold(&self, selector: &Selector) {
        self.lock_pending().push(selector.clone());
    }

    /// Removes what `selector` (held first) names, after the writes
    /// queued before; returns the keys removed. Blocks: called off the
    /// serving threads.
    pub fn purge(&self, selector: &Selector) -> HashSet<String> {
        let (done, answer) = sync_channel(1);
        let sent = self.commands.send(Command::Purge {
            selector: selector.clone(),
            done,
        });
        match sent {
            Ok(()) => answer.recv().unwrap_or_default(),
            Err(_) => HashSet::new(),
        }
    }

    fn lock_pending(&self) -> std::sync::MutexGuard<'_, Vec<Selector>> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn done(&self, selector: &Selector) {
        forget_pending(&self.pending, selector);
    }

    /// Hands `found` (read for `key`) to `admit`, leaving out what a
    /// queued removal names; under the same lock as [`Disk::hold`], so
    /// that what is admitted before a purge begins is purged with it.
    pub fn admit(&self, key: &str, mut found: Vec<Stored>, admit: impl FnOnce(Vec<Stored>)) {
        let pending = self.lock_pending();
        found.retain(|stored| !pending.iter().any(|s| s.names(key, &stored.tags)));
        if !found.is_empty() {
            admit(found);
        }
    }

    /// The variants of `key` its files hold (newest first, at most
    /// `max`), leaving out damaged files (removed); see [`Disk::admit`].
    /// Blocking: run it on a blocking thread.
    pub fn read(&self, key: &str, max: usize) -> Vec<Stored> {
        let dir = key_dir(&self.root, key);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Vec::new();
        };
        let mut found: Vec<(SystemTime, Stored)> = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_none_or(|e| e != "obj") {
                continue;
            }
            match read_file(&path) {
                Ok(Some((header_key, stored))) if header_key == key => {
                    let at = entry
                        .metadata()
                        .and_then(|m| m.modified())
                        .unwrap_or(SystemTime::UNIX_EPOCH);
                    found.push((at, stored));
                }
                // Another key of the same digest (never seen): not ours.
                Ok(Some(_)) => {}
                // Gone meanwhile (removed by the other process).
                Ok(None) => {}
                Err(why) => {
                    self.counts.corrupt.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(file = %path.display(), why, "damaged cache file removed; answered as a miss");
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        found.sort_by_key(|f| std::cmp::Reverse(f.0));
        found.truncate(max);
        if !found.is_empty() {
            self.counts.read.fetch_add(1, Ordering::Relaxed);
            // Read again: last in line to be removed for room.
            for (_, stored) in &found {
                let _ = touch(&dir.join(variant_name(stored)));
            }
        }
        found.into_iter().map(|(_, s)| s).collect()
    }
}

fn forget_pending(pending: &Mutex<Vec<Selector>>, selector: &Selector) {
    let mut pending = pending.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(i) = pending.iter().position(|s| s == selector) {
        pending.swap_remove(i);
    }
}

fn touch(path: &Path) -> std::io::Result<()> {
    std::fs::File::options()
        .write(true)
        .open(path)?
        .set_modified(SystemTime::now())
}

impl Selector {
    /// Whether this selector names `key` (whose answer carries `tags`).
    pub(super) fn names(&self, key: &str, tags: &[String]) -> bool {
        match self {
            // `host path?query upstream`, then the route's `key` headers
            // on lines of their own: a key selector names the first line
            // (every variant by those headers), or it without its
            // upstream (every upstream's).
            Selector::Key(k) => {
                let first = key.split('\n').next().unwrap_or(key);
                key == k
                    || first == k
                    || first.strip_prefix(k.as_str()).is_some_and(|rest| {
                        rest.strip_prefix(' ').is_some_and(|up| !up.contains(' '))
                    })
            }
            Selector::Prefix(prefix) => key.starts_with(prefix.as_str()),
            Selector::Tag(tag) => tags.iter().any(|t| t == tag),
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn key_dir(root: &Path, key: &str) -> PathBuf {
    let digest = hex(&Sha256::digest(key.as_bytes()));
    root.join(&digest[..2]).join(&digest[..32])
}

fn variant_name(stored: &Stored) -> String {
    let mut hasher = Sha256::new();
    for (name, value) in stored.selected.iter() {
        hasher.update(name.as_str().as_bytes());
        hasher.update([0]);
        match value {
            Some(v) => {
                hasher.update([1]);
                hasher.update(v.as_bytes());
            }
            None => hasher.update([2]),
        }
        hasher.update([0]);
    }
    format!("{}.obj", &hex(&hasher.finalize())[..16])
}

/// What a file says besides its body.
#[derive(Serialize, Deserialize)]
struct Header {
    key: String,
    policy: CachePolicy,
    tags: Vec<String>,
    selected: Vec<(String, Option<Vec<u8>>)>,
    validators: Vec<(String, Vec<u8>)>,
    fresh_until_ms: u64,
    grace: Grace,
    shown_cache_control: Option<Vec<Vec<u8>>>,
}

fn encode(key: &str, stored: &Stored) -> Result<Vec<u8>, serde_json::Error> {
    let header = Header {
        key: key.to_owned(),
        policy: stored.policy.clone(),
        tags: stored.tags.to_vec(),
        selected: stored
            .selected
            .iter()
            .map(|(n, v)| {
                (
                    n.as_str().to_owned(),
                    v.as_ref().map(|v| v.as_bytes().to_vec()),
                )
            })
            .collect(),
        validators: stored
            .validators
            .iter()
            .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
            .collect(),
        fresh_until_ms: stored
            .fresh_until
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        grace: stored.grace,
        shown_cache_control: stored
            .shown_cache_control
            .as_ref()
            .map(|values| values.iter().map(|v| v.as_bytes().to_vec()).collect()),
    };
    let header = serde_json::to_vec(&header)?;
    let mut out = Vec::with_capacity(MAGIC.len() + 4 + header.len() + stored.body.len() + 32);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(
        &u32::try_from(header.len())
            .unwrap_or(u32::MAX)
            .to_le_bytes(),
    );
    out.extend_from_slice(&header);
    out.extend_from_slice(&stored.body);
    let digest = Sha256::digest(&out);
    out.extend_from_slice(&digest);
    Ok(out)
}

/// A file's key and object; `Ok(None)` when it is gone; `Err` (why)
/// when it is not a whole file of ours.
fn read_file(path: &Path) -> Result<Option<(String, Stored)>, &'static str> {
    let mut bytes = Vec::new();
    match std::fs::File::open(path) {
        Ok(mut file) => {
            if file.read_to_end(&mut bytes).is_err() {
                return Err("unreadable");
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(_) => return Err("unreadable"),
    }
    let (key, stored) = decode(&bytes)?;
    Ok(Some((key, stored)))
}

fn decode(bytes: &[u8]) -> Result<(String, Stored), &'static str> {
    let Some(content_len) = bytes.len().checked_sub(32) else {
        return Err("truncated");
    };
    let (content, digest) = bytes.split_at(content_len);
    if Sha256::digest(content).as_slice() != digest {
        return Err("digest differs (truncated or damaged)");
    }
    let rest = content.strip_prefix(MAGIC).ok_or("not a cache file")?;
    let (len, rest) = rest.split_first_chunk::<4>().ok_or("truncated")?;
    let len = u32::from_le_bytes(*len) as usize;
    if len > MAX_HEADER || len > rest.len() {
        return Err("truncated");
    }
    let (header, body) = rest.split_at(len);
    let header: Header = serde_json::from_slice(header).map_err(|_| "header unreadable")?;
    let value = |v: &[u8]| HeaderValue::from_bytes(v).ok();
    let name = |n: &str| HeaderName::from_bytes(n.as_bytes()).ok();
    let selected = header
        .selected
        .iter()
        .map(|(n, v)| Some((name(n)?, v.as_deref().map(value).unwrap_or(None))))
        .collect::<Option<Vec<_>>>()
        .ok_or("header unreadable")?;
    let validators = header
        .validators
        .iter()
        .map(|(n, v)| Some((name(n)?, value(v)?)))
        .collect::<Option<Vec<_>>>()
        .ok_or("header unreadable")?;
    let shown_cache_control = match &header.shown_cache_control {
        None => None,
        Some(values) => Some(
            values
                .iter()
                .map(|v| value(v))
                .collect::<Option<Vec<_>>>()
                .ok_or("header unreadable")?
                .into_boxed_slice(),
        ),
    };
    let body = Bytes::copy_from_slice(body);
    let head_weight = (len as u64) + 256;
    Ok((
        header.key,
        Stored {
            policy: header.policy,
            weight: head_weight + body.len() as u64,
            body,
            tags: header.tags.into_boxed_slice(),
            selected: selected.into_boxed_slice(),
            validators: validators.into_boxed_slice(),
            fresh_until: SystemTime::UNIX_EPOCH + Duration::from_millis(header.fresh_until_ms),
            grace: header.grace,
            shown_cache_control,
            plain: None,
        },
    ))
}

/// The zone's disk thread.
struct Worker {
    zone: String,
    root: PathBuf,
    size: Arc<AtomicU64>,
    used: Arc<AtomicU64>,
    pending: Arc<Mutex<Vec<Selector>>>,
    counts: Arc<DiskCounts>,
    failing: AtomicBool,
}

impl Worker {
    fn run(&self, queue: &Receiver<Command>) {
        if let Err(error) = std::fs::create_dir_all(&self.root) {
            self.failed(&error);
        }
        self.measure(false);
        while let Ok(command) = queue.recv() {
            match command {
                Command::Write { key, stored } => self.write(&key, &stored),
                Command::Remove { key } => {
                    let freed = remove_dir(&key_dir(&self.root, &key));
                    self.used
                        .fetch_sub(freed.min(self.used()), Ordering::Relaxed);
                    forget_pending(&self.pending, &Selector::Key(key));
                }
                Command::Purge { selector, done } => {
                    let removed = self.purge(&selector);
                    forget_pending(&self.pending, &selector);
                    let _ = done.send(removed);
                }
            }
        }
    }

    fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    fn write(&self, key: &str, stored: &Stored) {
        let dir = key_dir(&self.root, key);
        let path = dir.join(variant_name(stored));
        let written = encode(key, stored)
            .map_err(std::io::Error::other)
            .and_then(|bytes| {
                std::fs::create_dir_all(&dir)?;
                let before = std::fs::metadata(&path).map_or(0, |m| m.len());
                let temp = dir.join(format!(
                    ".{}.{}.tmp",
                    std::process::id(),
                    self.counts.written.load(Ordering::Relaxed)
                ));
                let mut file = std::fs::File::create(&temp)?;
                let result = file.write_all(&bytes).and_then(|()| file.sync_data());
                drop(file);
                if let Err(error) = result.and_then(|()| std::fs::rename(&temp, &path)) {
                    let _ = std::fs::remove_file(&temp);
                    return Err(error);
                }
                Ok((before, bytes.len() as u64))
            });
        match written {
            Ok((before, after)) => {
                self.counts.written.fetch_add(1, Ordering::Relaxed);
                self.used.fetch_add(after, Ordering::Relaxed);
                self.used
                    .fetch_sub(before.min(self.used()), Ordering::Relaxed);
                if self.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!(zone = self.zone, "the cache's disk takes writes again");
                }
                if self.used() > self.size.load(Ordering::Relaxed) {
                    self.measure(true);
                }
            }
            Err(error) => self.failed(&error),
        }
    }

    fn failed(&self, error: &std::io::Error) {
        self.counts.errors.fetch_add(1, Ordering::Relaxed);
        if !self.failing.swap(true, Ordering::Relaxed) {
            tracing::warn!(zone = self.zone, folder = %self.root.display(), %error,
                "cannot write to the cache's disk; objects stay in memory only until a write succeeds");
        }
    }

    /// Every file of the zone: its time, bytes and path.
    fn files(&self) -> Vec<(SystemTime, u64, PathBuf)> {
        let mut files = Vec::new();
        let Ok(tops) = std::fs::read_dir(&self.root) else {
            return files;
        };
        for top in tops.flatten() {
            let Ok(keys) = std::fs::read_dir(top.path()) else {
                continue;
            };
            for key in keys.flatten() {
                let Ok(variants) = std::fs::read_dir(key.path()) else {
                    continue;
                };
                for variant in variants.flatten() {
                    let Ok(meta) = variant.metadata() else {
                        continue;
                    };
                    let path = variant.path();
                    let at = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                    // A temporary file an interrupted write left (not one
                    // the other process of an upgrade is writing now).
                    if path.extension().is_some_and(|e| e == "tmp") {
                        if at.elapsed().is_ok_and(|age| age > Duration::from_secs(600)) {
                            let _ = std::fs::remove_file(&path);
                        }
                        continue;
                    }
                    files.push((at, meta.len(), path));
                }
            }
        }
        files
    }

    /// Measures what the files take; with `evict`, removes the least
    /// recently used until 90 % of the size is left.
    fn measure(&self, evict: bool) {
        let mut files = self.files();
        let mut used: u64 = files.iter().map(|f| f.1).sum();
        let size = self.size.load(Ordering::Relaxed);
        if evict && used > size {
            let target = size / 10 * 9;
            files.sort_by_key(|f| f.0);
            for (_, bytes, path) in files {
                if used <= target {
                    break;
                }
                if std::fs::remove_file(&path).is_ok() {
                    used -= bytes;
                    self.counts.evicted.fetch_add(1, Ordering::Relaxed);
                    if let Some(dir) = path.parent() {
                        // Only when empty.
                        let _ = std::fs::remove_dir(dir);
                    }
                }
            }
        }
        self.used.store(used, Ordering::Relaxed);
    }

    /// Removes the files `selector` names; returns their keys.
    fn purge(&self, selector: &Selector) -> HashSet<String> {
        let mut removed = HashSet::new();
        for (_, bytes, path) in self.files() {
            let Ok(Some((key, stored))) = read_file(&path) else {
                continue;
            };
            if selector.names(&key, &stored.tags) && std::fs::remove_file(&path).is_ok() {
                self.used
                    .fetch_sub(bytes.min(self.used()), Ordering::Relaxed);
                if let Some(dir) = path.parent() {
                    let _ = std::fs::remove_dir(dir);
                }
                removed.insert(key);
            }
        }
        removed
    }
}

/// Removes a key's folder; returns the bytes its files took.
fn remove_dir(dir: &Path) -> u64 {
    let bytes = std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .flatten()
            .filter_map(|e| e.metadata().ok())
            .map(|m| m.len())
            .sum()
    });
    match std::fs::remove_dir_all(dir) {
        Ok(()) => bytes,
        Err(_) => 0,
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use bytes::Bytes;

    use super::*;
    use crate::cache::{Found, Zones};
    use crate::plan::{DiskSpec, ZoneSpec};

    fn get() -> http::request::Parts {
        http::Request::builder()
            .uri("/a")
            .header("host", "app.test")
            .body(())
            .unwrap()
            .into_parts()
            .0
    }

    fn answer(cache_control: &str, tag: &str) -> http::response::Parts {
        http::Response::builder()
            .header("cache-control", cache_control)
            .header("etag", "\"v1\"")
            .header("surrogate-key", tag)
            .body(())
            .unwrap()
            .into_parts()
            .0
    }

    fn stored(tag: &str, body: &'static [u8]) -> Stored {
        Stored::new(
            &get(),
            &answer("max-age=600, stale-if-error=60", tag),
            Bytes::from_static(body),
            SystemTime::now(),
        )
        .expect("storable")
    }

    fn spec(dir: &Path, size: u64) -> ZoneSpec {
        ZoneSpec {
            memory: 1 << 20,
            disk: Some(DiskSpec {
                path: dir.to_owned(),
                size,
            }),
        }
    }

    /// Waits (bounded) until the zone's disk has written `n` objects.
    fn written(disk: &Disk, n: u64) {
        for _ in 0..500 {
            if disk.counts.written.load(Ordering::Relaxed) >= n {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        panic!("not written: {:?}", disk.counts);
    }

    #[test]
    fn a_file_holds_the_object_and_any_damage_is_refused() {
        let object = stored("t1", b"the body");
        let bytes = encode("k a", &object).unwrap();
        let (key, back) = decode(&bytes).expect("whole");
        assert_eq!(key, "k a");
        assert_eq!(back.body, "the body");
        assert_eq!(back.tags.as_ref(), ["t1"]);
        assert_eq!(back.validators.len(), 1);
        assert!(back.grace.if_error.is_some());
        match back.policy.before_request(&get(), SystemTime::now()) {
            http_cache_semantics::BeforeRequest::Fresh(head) => {
                assert_eq!(head.headers["etag"], "\"v1\"");
            }
            http_cache_semantics::BeforeRequest::Stale { .. } => panic!("fresh expected"),
        }
        // Truncated anywhere, or one byte changed: refused.
        for cut in [0, 10, 20, bytes.len() / 2, bytes.len() - 1] {
            assert!(decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut flipped = bytes.clone();
        let at = flipped.len() - 40;
        flipped[at] ^= 1;
        assert!(decode(&flipped).is_err());
    }

    #[tokio::test]
    async fn objects_outlive_the_zone_and_a_damaged_file_is_a_miss() {
        let dir = tempfile::tempdir().unwrap();
        let key = "app.test /a app";
        {
            let zone = Zones::default().zone("d", &spec(dir.path(), 64 << 20));
            zone.store(key, stored("t1", b"kept"));
            written(zone.disk.as_ref().unwrap(), 1);
        }
        // Another process (a new zone on the same folder) finds it.
        let zone = Zones::default().zone("d", &spec(dir.path(), 64 << 20));
        assert!(matches!(
            zone.lookup(key, &get(), SystemTime::now()),
            Found::Miss
        ));
        assert!(zone.load(key).await, "read from the disk");
        match zone.lookup(key, &get(), SystemTime::now()) {
            Found::Fresh { body, .. } => assert_eq!(body, "kept"),
            other => panic!("fresh expected: {other:?}"),
        }
        // Damaged on disk: a miss, and the file goes.
        let file = key_dir(dir.path(), key).join(variant_name(&stored("t1", b"")));
        let mut bytes = std::fs::read(&file).unwrap();
        bytes.truncate(bytes.len() - 5);
        std::fs::write(&file, &bytes).unwrap();
        let zone = Zones::default().zone("d2", &spec(dir.path(), 64 << 20));
        assert!(!zone.load(key).await);
        assert!(!file.exists(), "removed");
        assert_eq!(
            zone.disk
                .as_ref()
                .unwrap()
                .counts
                .corrupt
                .load(Ordering::Relaxed),
            1
        );
    }

    #[tokio::test]
    async fn purges_and_invalidations_reach_the_disk_before_any_read() {
        let dir = tempfile::tempdir().unwrap();
        let zone = Zones::default().zone("p", &spec(dir.path(), 64 << 20));
        zone.store("h /a up", stored("red", b"a"));
        zone.store("h /b up", stored("blue", b"b"));
        zone.store("h /c up", stored("red", b"c"));
        written(zone.disk.as_ref().unwrap(), 3);
        assert_eq!(zone.purge(&Selector::Tag("red".into())), 2);
        let fresh = Zones::default().zone("p2", &spec(dir.path(), 64 << 20));
        assert!(!fresh.load("h /a up").await);
        assert!(fresh.load("h /b up").await);
        // An invalidation: gone from the disk too (the removal is queued:
        // a read before it is done finds nothing either).
        zone.invalidate("h /b up");
        let again = Zones::default().zone("p3", &spec(dir.path(), 64 << 20));
        for _ in 0..200 {
            if !key_dir(dir.path(), "h /b up").exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!again.load("h /b up").await);
        assert!(!zone.load("h /b up").await, "held while queued");
    }

    #[test]
    fn files_stay_within_the_size_and_failed_writes_are_counted() {
        let dir = tempfile::tempdir().unwrap();
        let body: &'static [u8] = Box::leak(vec![b'x'; 100 * 1024].into_boxed_slice());
        let zone = Zones::default().zone("s", &spec(dir.path(), 1 << 20));
        for i in 0..30 {
            zone.store(&format!("h /{i} up"), stored("t", body));
        }
        let disk = zone.disk.as_ref().unwrap();
        written(disk, 30);
        assert!(disk.used() <= 1 << 20, "{} bytes", disk.used());
        assert!(disk.counts.evicted.load(Ordering::Relaxed) >= 20);
        // The oldest went first.
        assert!(!key_dir(dir.path(), "h /0 up").exists());
        assert!(key_dir(dir.path(), "h /29 up").exists());

        // A folder that cannot be written (here: a file in its place):
        // counted, the object stays in memory, nothing fails.
        let blocked = dir.path().join("blocked");
        std::fs::write(&blocked, b"not a folder").unwrap();
        let zone = Zones::default().zone("b", &spec(&blocked, 1 << 20));
        zone.store("h /a up", stored("t", b"memory only"));
        let disk = zone.disk.as_ref().unwrap();
        for _ in 0..500 {
            if disk.counts.errors.load(Ordering::Relaxed) >= 2 {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            disk.counts.errors.load(Ordering::Relaxed) >= 2,
            "{:?}",
            disk.counts
        );
        assert!(matches!(
            zone.lookup("h /a up", &get(), SystemTime::now()),
            Found::Fresh { .. }
        ));
    }
}
