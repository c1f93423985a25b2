//! Webhooks (DESIGN §23): every change event a receiver asked for, sent
//! to it as JSON, signed with HMAC-SHA256 as GitHub signs its deliveries
//! (`X-Cutover-Signature-256: sha256=<hex>` over the exact body).
//!
//! Each receiver has a task of its own that follows the event ring: a
//! change only records its event (never waits for a receiver), and a
//! receiver that is slow, down or hanging only falls behind in its own
//! task. Deliveries are in order; a failed one is tried again after 1,
//! 2, 4, 8 and 16 s (six attempts in all), each attempt bounded by the
//! webhook's `timeout`, then counted as failed and the next event goes.
//! A receiver that falls further behind than the ring holds loses the
//! oldest events, counted as dropped.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::events::{Event, Events};
use crate::plan::WebhookSpec;

/// Attempts per event, and the wait before the second (doubling).
const ATTEMPTS: u32 = 6;
const FIRST_RETRY: Duration = Duration::from_secs(1);

/// The signature header: `sha256=` and the hex HMAC-SHA256 of the body.
pub const SIGNATURE_HEADER: &str = "x-cutover-signature-256";

/// The receivers of this process, and what each has been sent.
#[derive(Debug, Default)]
pub struct Webhooks {
    hooks: Vec<Arc<Hook>>,
}

#[derive(Debug)]
struct Hook {
    spec: WebhookSpec,
    state: Mutex<Delivery>,
}

/// What a webhook has been sent, as `GET /admin/webhooks` shows it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Delivery {
    /// Events the receiver answered 2xx.
    pub delivered: u64,
    /// Events given up on after every attempt (or refused with a 4xx).
    pub failed: u64,
    /// Attempts after a first one failed.
    pub retries: u64,
    /// Events the ring no longer held when this webhook came to them.
    pub dropped: u64,
    /// The id of the last event it was sent (delivered or not).
    pub last_event_id: Option<String>,
    pub last_status: Option<u16>,
    pub last_error: Option<String>,
    /// RFC 3339, the last 2xx.
    pub last_delivered_at: Option<String>,
}

/// One webhook's configuration and state.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WebhookView {
    pub name: String,
    /// Without user information or query (which may carry secrets).
    pub url: String,
    /// The event kinds it takes; empty: all.
    pub events: Vec<String>,
    /// Events recorded that it has not come to yet.
    pub behind: u64,
    #[serde(flatten)]
    pub delivery: Delivery,
}

impl Webhooks {
    /// Starts one delivery task per webhook, following `events` from now.
    pub fn start(specs: &[WebhookSpec], events: &Arc<Events>) -> Self {
        let hooks: Vec<Arc<Hook>> = specs
            .iter()
            .map(|spec| {
                Arc::new(Hook {
                    spec: spec.clone(),
                    state: Mutex::new(Delivery::default()),
                })
            })
            .collect();
        for hook in &hooks {
            let client = match client(&hook.spec) {
                Ok(client) => client,
                Err(error) => {
                    tracing::error!(webhook = %hook.spec.name, %error, "webhook: cannot build its client; nothing is sent to it");
                    hook.state().last_error = Some(error);
                    continue;
                }
            };
            tokio::spawn(follow(Arc::clone(hook), Arc::clone(events), client));
        }
        Self { hooks }
    }

    pub fn views(&self, events: &Events) -> Vec<WebhookView> {
        self.hooks
            .iter()
            .map(|hook| {
                let delivery = hook.state().clone();
                let seen = delivery
                    .last_event_id
                    .as_deref()
                    .and_then(|id| id.rsplit_once('-'))
                    .and_then(|(_, seq)| seq.parse::<u64>().ok());
                WebhookView {
                    name: hook.spec.name.clone(),
                    url: shown(&hook.spec.url),
                    events: hook.spec.events.iter().map(|e| (*e).to_owned()).collect(),
                    behind: seen.map_or(0, |seq| events.latest().saturating_sub(seq)),
                    delivery,
                }
            })
            .collect()
    }
}

impl Hook {
    fn state(&self) -> std::sync::MutexGuard<'_, Delivery> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wants(&self, event: &Event) -> bool {
        self.spec.events.is_empty() || self.spec.events.contains(&event.event)
    }
}

/// The URL without user information or query.
fn shown(url: &http::Uri) -> String {
    let scheme = url.scheme_str().unwrap_or("http");
    let host = url.host().unwrap_or("");
    let port = url.port_u16().map(|p| format!(":{p}")).unwrap_or_default();
    format!("{scheme}://{host}{port}{}", url.path())
}

type Client = crate::tls::OwnClient<http_body_util::Full<Bytes>>;

fn client(spec: &WebhookSpec) -> Result<Client, String> {
    crate::tls::own_client(spec.ca.clone()).map_err(|e| e.to_string())
}

/// The hex HMAC-SHA256 of `body` under `key`, as the signature header
/// carries it (after `sha256=`).
pub fn signature(key: &ring::hmac::Key, body: &[u8]) -> String {
    ring::hmac::sign(key, body)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

async fn follow(hook: Arc<Hook>, events: Arc<Events>, client: Client) {
    let mut wake = events.subscribe();
    let mut cursor = events.latest();
    let name = hook.spec.name.clone();
    loop {
        wake.borrow_and_update();
        let batch = events.after(cursor);
        if batch.missed > 0 {
            hook.state().dropped += batch.missed;
            metrics::counter!(crate::telemetry::metrics::WEBHOOK_DROPPED, "webhook" => name.clone())
                .increment(batch.missed);
            tracing::warn!(webhook = %name, missed = batch.missed, "webhook: fell behind the event ring; events dropped");
        }
        for event in batch.events {
            cursor = event.seq;
            if hook.wants(&event) {
                deliver(&hook, &client, &event).await;
            }
        }
        if events.closed() || wake.changed().await.is_err() {
            return;
        }
    }
}

/// Sends one event until it is answered 2xx, refused for good (a 4xx
/// other than 408 and 429) or every attempt failed.
async fn deliver(hook: &Hook, client: &Client, event: &Event) {
    let name = hook.spec.name.as_str();
    let body = Bytes::from(serde_json::to_vec(event).unwrap_or_default());
    let signed = format!("sha256={}", signature(&hook.spec.key, &body));
    let mut wait = FIRST_RETRY;
    for attempt in 1..=ATTEMPTS {
        let request = http::Request::post(hook.spec.url.clone())
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(
                http::header::USER_AGENT,
                concat!("cutover/", env!("CARGO_PKG_VERSION")),
            )
            .header("x-cutover-event", event.event)
            .header("x-cutover-delivery", event.id.as_str())
            .header(SIGNATURE_HEADER, signed.as_str())
            .body(http_body_util::Full::new(body.clone()));
        let request = match request {
            Ok(request) => request,
            Err(error) => {
                hook.state().last_error = Some(error.to_string());
                return;
            }
        };
        let answer = tokio::time::timeout(hook.spec.timeout, async {
            let response = client.request(request).await?;
            // The answer's body is read (and thrown away) so that the
            // connection can be used again.
            use http_body_util::BodyExt as _;
            let status = response.status();
            let _ = http_body_util::Limited::new(response.into_body(), 64 * 1024)
                .collect()
                .await;
            Ok::<_, hyper_util::client::legacy::Error>(status)
        })
        .await;
        let (status, error) = match answer {
            Ok(Ok(status)) => (Some(status), None),
            Ok(Err(error)) => (None, Some(format!("{error}: {}", source_of(&error)))),
            Err(_) => (
                None,
                Some(format!("no answer within {:?}", hook.spec.timeout)),
            ),
        };
        let delivered = status.is_some_and(|s| s.is_success());
        let permanent = status.is_some_and(|s| {
            s.is_client_error()
                && s != http::StatusCode::REQUEST_TIMEOUT
                && s != http::StatusCode::TOO_MANY_REQUESTS
        });
        {
            let mut state = hook.state();
            state.last_event_id = Some(event.id.clone());
            state.last_status = status.map(|s| s.as_u16());
            if delivered {
                state.delivered += 1;
                state.last_error = None;
                state.last_delivered_at = Some(super::rfc3339(SystemTime::now()));
            } else {
                state.last_error =
                    Some(error.unwrap_or_else(|| {
                        format!("answered {}", status.map_or(0, |s| s.as_u16()))
                    }));
                if permanent || attempt == ATTEMPTS {
                    state.failed += 1;
                } else {
                    state.retries += 1;
                }
            }
        }
        let outcome = if delivered {
            "delivered"
        } else if permanent || attempt == ATTEMPTS {
            "failed"
        } else {
            "retried"
        };
        metrics::counter!(crate::telemetry::metrics::WEBHOOK_DELIVERIES, "webhook" => name.to_owned(), "outcome" => outcome)
            .increment(1);
        if delivered || permanent {
            return;
        }
        if attempt == ATTEMPTS {
            tracing::warn!(webhook = name, event = %event.id, "webhook: every attempt failed; going on to the next event");
            return;
        }
        tokio::time::sleep(wait).await;
        wait *= 2;
    }
}

/// The innermost cause of a client error (hyper's own says only
/// "client error (Connect)").
fn source_of(error: &(dyn std::error::Error + 'static)) -> String {
    let mut inner = error;
    while let Some(next) = inner.source() {
        inner = next;
    }
    inner.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_are_hex_hmac_sha256_of_the_body() {
        // RFC 4231, test case 2.
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"Jefe");
        assert_eq!(
            signature(&key, b"what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn the_shown_url_keeps_no_credentials() {
        let url: http::Uri = "https://user:pw@hooks.example.com:8443/cutover?token=x"
            .parse()
            .expect("uri");
        assert_eq!(shown(&url), "https://hooks.example.com:8443/cutover");
    }
}
