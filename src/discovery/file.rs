//! `endpoints_file`: a JSON list of members, read again whenever it
//! changes.
//!
//! The format (`docs/config.md`): a JSON array of objects,
//! `[{ "addr": "10.0.0.5:8080", "weight": 3, "priority": 0 }]`, where
//! `addr` is an IP:port, `weight` 1–1000 (default 1) and `priority` lower
//! for preferred members (default 0). The folder is watched, not the
//! file, so that a writer's atomic rename and a Kubernetes ConfigMap's
//! symlink swap are both seen; a read every few seconds catches what a
//! watcher misses (network filesystems). A file that cannot be read or
//! does not parse is reported and the last good list kept.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use serde::Deserialize;

use super::{Answer, Endpoint, Source};

/// The largest file read.
const MAX_FILE: u64 = 4 * 1024 * 1024;
/// The most entries a file may list.
const MAX_ENTRIES: usize = 10_000;
/// A read at least this often, watched or not.
const POLL: Duration = Duration::from_secs(5);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    addr: String,
    #[serde(default)]
    weight: Option<u32>,
    #[serde(default)]
    priority: Option<u16>,
}

/// The members a file's contents list, or why they are refused (all of
/// them: one bad entry refuses the file, so that a half-written list is
/// never taken).
pub fn parse_endpoints(contents: &[u8]) -> Result<Vec<Endpoint>, String> {
    let entries: Vec<Entry> =
        serde_json::from_slice(contents).map_err(|e| format!("not a JSON list of members: {e}"))?;
    if entries.len() > MAX_ENTRIES {
        return Err(format!(
            "{} entries; at most {MAX_ENTRIES} are read",
            entries.len()
        ));
    }
    entries
        .into_iter()
        .enumerate()
        .map(|(i, entry)| {
            let addr = entry
                .addr
                .parse()
                .map_err(|_| format!("entry {i}: addr '{}' is not IP:port", entry.addr))?;
            let weight = entry.weight.unwrap_or(1);
            if !(1..=1000).contains(&weight) {
                return Err(format!("entry {i}: weight {weight} is not from 1 to 1000"));
            }
            Ok(Endpoint {
                priority: entry.priority.unwrap_or(0),
                addr,
                weight,
                host: None,
            })
        })
        .collect()
}

/// Reads and parses the file once.
async fn load(path: &Path) -> Result<Vec<u8>, String> {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || {
        crate::files::read_regular(&path, MAX_FILE)
            .map_err(|e| format!("cannot read '{}': {e}", path.display()))
    })
    .await
    .map_err(|e| e.to_string())?
}

/// One read, as a resolution's answer (for previews).
pub(super) async fn read(path: &Path) -> Answer {
    match load(path).await.and_then(|c| parse_endpoints(&c)) {
        Ok(endpoints) if endpoints.is_empty() => Answer::Empty { nxdomain: false },
        Ok(endpoints) => Answer::Records {
            endpoints,
            ttl: None,
            note: None,
        },
        Err(error) => Answer::Failed {
            error,
            timeout: false,
        },
    }
}

/// Follows the file until no live generation names its source: a read
/// now, then on every change in its folder, and every few seconds.
pub(super) async fn follow(source: Weak<Source>, path: PathBuf) {
    let changed = Arc::new(tokio::sync::Notify::new());
    let _watcher = watch(&path, Arc::clone(&changed));
    let mut last: Option<Vec<u8>> = None;
    loop {
        let read = load(&path).await;
        let Some(live) = source.upgrade() else {
            return;
        };
        match read {
            Ok(contents) if last.as_ref() == Some(&contents) => {}
            Ok(contents) => {
                let parsed = parse_endpoints(&contents);
                if let Err(error) = &parsed {
                    tracing::warn!(upstream = %live.key.upstream, file = %path.display(), %error, "endpoints file refused; the last good members are kept");
                }
                live.take_file(parsed);
                last = Some(contents);
            }
            Err(error) => {
                if last.is_some() || !live.has_settled() {
                    tracing::warn!(upstream = %live.key.upstream, %error, "endpoints file unreadable; the last good members are kept");
                    live.take_file(Err(error));
                }
                last = None;
            }
        }
        drop(live);
        let _ = tokio::time::timeout(POLL, changed.notified()).await;
        // Writers often make several events of one change: read once.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Watches the file's folder (renames and symlink swaps happen there);
/// `None` when it cannot be watched (the reads every few seconds remain).
fn watch(path: &Path, changed: Arc<tokio::sync::Notify>) -> Option<notify::RecommendedWatcher> {
    let folder = path.parent()?.to_owned();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if event.is_ok_and(|e| !matches!(e.kind, notify::EventKind::Access(_))) {
            changed.notify_one();
        }
    })
    .ok()?;
    watcher.watch(&folder, RecursiveMode::NonRecursive).ok()?;
    Some(watcher)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_files_parse_or_are_refused_whole() {
        let parsed = parse_endpoints(
            br#"[{"addr":"10.0.0.1:80","weight":3},{"addr":"[::1]:81","priority":1}]"#,
        )
        .expect("parses");
        assert_eq!(parsed.len(), 2);
        assert_eq!(parsed[0].weight, 3);
        assert_eq!(parsed[1].priority, 1);
        assert_eq!(parsed[1].addr.to_string(), "[::1]:81");
        for (bad, why) in [
            (&b"{"[..], "not a JSON list"),
            (br#"[{"addr":"app:80"}]"#, "is not IP:port"),
            (br#"[{"addr":"10.0.0.1:80","weight":0}]"#, "weight 0"),
            (br#"[{"addr":"10.0.0.1:80","wieght":2}]"#, "unknown field"),
        ] {
            let error = parse_endpoints(bad).expect_err("refused");
            assert!(error.contains(why), "{error}");
        }
        assert!(parse_endpoints(b"[]").expect("empty parses").is_empty());
    }
}
