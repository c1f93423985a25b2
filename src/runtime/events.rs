//! Change events (DESIGN §23): every change of state, in order, kept in
//! a bounded ring that `GET /admin/events` streams (resumed with
//! `Last-Event-ID`) and webhooks deliver.
//!
//! An event's id is `<process>-<sequence>`: the process part is when this
//! process started (Unix milliseconds), so an id from another process (a
//! client that reconnects after an upgrade) is told apart from one this
//! process gave, and the client is told that it may have missed events
//! instead of being given a wrong resume point.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use serde::Serialize;
use serde_json::Value;
use tokio::sync::watch;

/// Events kept for resumption; older ones are gone (a client that
/// resumes from before them is told how many it missed).
pub const RING: usize = 1024;

/// Every event kind, as webhooks' `events` name them.
pub use crate::plan::EVENT_KINDS as KINDS;

/// One change of state.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    /// `<process>-<sequence>`: what `Last-Event-ID` names.
    pub id: String,
    #[serde(skip)]
    pub seq: u64,
    /// One of [`KINDS`].
    pub event: &'static str,
    /// RFC 3339, UTC.
    pub time: String,
    /// What happened: the operation record, the pending generation, the
    /// freeze window, … (per kind; see `docs/admin-api.md`).
    #[serde(flatten)]
    pub data: serde_json::Map<String, Value>,
}

/// Where a reader resumes.
#[derive(Debug, PartialEq, Eq)]
pub enum Resume {
    /// Every event after this sequence number.
    After(u64),
    /// The id was another process's (or unreadable): what this one
    /// holds, from its first, after a `reset`.
    Reset,
}

/// What a reader gets next: the events after its cursor, and how many it
/// missed because the ring no longer held them.
#[derive(Debug)]
pub struct Batch {
    pub events: Vec<Arc<Event>>,
    pub missed: u64,
}

struct Ring {
    events: VecDeque<Arc<Event>>,
    next: u64,
    closed: bool,
}

/// The ring and its readers' wake-up.
pub struct Events {
    /// When this process started, in Unix milliseconds: the id's first
    /// part.
    process: u64,
    ring: Mutex<Ring>,
    /// The last sequence number given, for readers to wait on.
    latest: watch::Sender<u64>,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Events(process {})", self.process)
    }
}

impl Default for Events {
    fn default() -> Self {
        Self::new()
    }
}

impl Events {
    pub fn new() -> Self {
        let process = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        Self {
            process,
            ring: Mutex::new(Ring {
                events: VecDeque::with_capacity(64),
                next: 1,
                closed: false,
            }),
            latest: watch::channel(0).0,
        }
    }

    /// Records an event of `kind` with `data` (an object's fields).
    pub fn emit(&self, kind: &'static str, data: Value) {
        let data = match data {
            Value::Object(map) => map,
            other => {
                let mut map = serde_json::Map::new();
                map.insert("data".into(), other);
                map
            }
        };
        let seq = {
            let mut ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
            let seq = ring.next;
            ring.next += 1;
            if ring.events.len() == RING {
                ring.events.pop_front();
            }
            ring.events.push_back(Arc::new(Event {
                id: format!("{}-{seq}", self.process),
                seq,
                event: kind,
                time: super::rfc3339(SystemTime::now()),
                data,
            }));
            seq
        };
        self.latest.send_replace(seq);
    }

    /// Where a reader that sent `last_event_id` (or none) resumes.
    pub fn resume(&self, last_event_id: Option<&str>) -> Resume {
        let Some(id) = last_event_id.map(str::trim).filter(|id| !id.is_empty()) else {
            // A new reader: what happens from now on.
            return Resume::After(*self.latest.borrow());
        };
        match id.split_once('-') {
            Some((process, seq)) if process.parse() == Ok(self.process) => {
                seq.parse().map_or(Resume::Reset, Resume::After)
            }
            _ => Resume::Reset,
        }
    }

    /// The events after sequence number `after`, and how many of those
    /// the ring no longer holds.
    pub fn after(&self, after: u64) -> Batch {
        let ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
        let first = ring.events.front().map_or(ring.next, |e| e.seq);
        let missed = first.saturating_sub(after.saturating_add(1));
        let events = ring
            .events
            .iter()
            .filter(|e| e.seq > after)
            .cloned()
            .collect();
        Batch { events, missed }
    }

    /// Wakes when an event is recorded (or the ring closes).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.latest.subscribe()
    }

    /// This process hands its admin socket over or exits: readers get
    /// what is left, then their streams end.
    pub fn close(&self) {
        self.ring
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .closed = true;
        self.latest.send_modify(|_| {});
    }

    pub fn closed(&self) -> bool {
        self.ring
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .closed
    }

    /// The last sequence number given (0: none yet).
    pub fn latest(&self) -> u64 {
        *self.latest.borrow()
    }

    /// The id of the event with sequence number `seq` in this process.
    pub fn id_of(&self, seq: u64) -> String {
        format!("{}-{seq}", self.process)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn readers_resume_after_their_id_and_are_told_what_they_missed() {
        let events = Events::new();
        assert_eq!(events.resume(None), Resume::After(0));
        events.emit("activation", json!({ "generation": 2 }));
        events.emit("pending", json!({ "generation": 2 }));
        let first = events.after(0);
        assert_eq!(first.missed, 0);
        assert_eq!(
            first.events.iter().map(|e| e.event).collect::<Vec<_>>(),
            ["activation", "pending"]
        );
        let id = first.events[0].id.clone();
        assert_eq!(events.resume(Some(&id)), Resume::After(1));
        assert_eq!(events.after(1).events.len(), 1);
        // A new reader starts from now.
        assert_eq!(events.resume(None), Resume::After(2));
        // Another process's id, or nonsense: a reset.
        assert_eq!(events.resume(Some("17-3")), Resume::Reset);
        assert_eq!(events.resume(Some("garbage")), Resume::Reset);
        // Past the ring's end: what it still holds, and the count of the rest.
        for n in 0..RING + 10 {
            events.emit("canary_step", json!({ "n": n }));
        }
        let late = events.after(1);
        assert_eq!(late.events.len(), RING);
        assert_eq!(late.missed, 11);
        let value = serde_json::to_value(&*late.events[0]).expect("json");
        assert_eq!(value["event"], "canary_step");
        assert_eq!(value["n"], 10);
        assert!(value["id"].as_str().is_some_and(|id| id.ends_with("-13")));
    }
}
