//! `GET /admin/events`: the change events (`runtime::events`) as
//! Server-Sent Events. A reader that reconnects with `Last-Event-ID` (the
//! header a browser's `EventSource` sends by itself, or the
//! `last_event_id` query parameter) gets every event after it that the
//! ring still holds, preceded by a `lost` event when some are gone, or by
//! a `reset` event when the id is another process's.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::Stream;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::watch;

use super::Shared;
use crate::runtime::events::{Events, Resume};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    /// As the `Last-Event-ID` header (which wins when both are sent).
    last_event_id: Option<String>,
}

/// How often an idle stream says it is alive (a comment line), so that
/// proxies in between keep it open.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

pub async fn stream(
    State(writer): Shared,
    headers: HeaderMap,
    Query(query): Query<EventsQuery>,
) -> Response {
    let events = Arc::clone(writer.control().events());
    let last = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or(query.last_event_id);
    let start = events.resume(last.as_deref());
    Sse::new(follow(events, start))
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response()
}

struct Reader {
    events: Arc<Events>,
    wake: watch::Receiver<u64>,
    /// The last sequence number sent.
    cursor: u64,
    ready: VecDeque<SseEvent>,
}

fn follow(events: Arc<Events>, start: Resume) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    let mut ready = VecDeque::new();
    let cursor = match start {
        Resume::After(seq) => seq,
        Resume::Reset => {
            let said = json!({
                "message": "the id is not this process's (it restarted or was upgraded since): these are the events it holds; history has what came before",
            });
            ready.push_back(SseEvent::default().event("reset").data(said.to_string()));
            0
        }
    };
    let wake = events.subscribe();
    let reader = Reader {
        events,
        wake,
        cursor,
        ready,
    };
    futures_util::stream::unfold(reader, |mut reader| async move {
        loop {
            if let Some(next) = reader.ready.pop_front() {
                return Some((Ok(next), reader));
            }
            // Seen before the ring is read: an event recorded after the
            // read wakes the wait below.
            reader.wake.borrow_and_update();
            let batch = reader.events.after(reader.cursor);
            if batch.missed > 0 {
                let said = json!({ "missed": batch.missed, "message": "events older than the ring were dropped before this reader came back" });
                reader
                    .ready
                    .push_back(SseEvent::default().event("lost").data(said.to_string()));
            }
            for event in batch.events {
                reader.cursor = event.seq;
                let data = serde_json::to_string(&*event).unwrap_or_default();
                reader.ready.push_back(
                    SseEvent::default()
                        .id(event.id.clone())
                        .event(event.event)
                        .data(data),
                );
            }
            if !reader.ready.is_empty() {
                continue;
            }
            if reader.events.closed() || reader.wake.changed().await.is_err() {
                return None;
            }
        }
    })
}
