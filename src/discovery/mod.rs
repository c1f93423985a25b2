//! Discovery: an upstream's members from DNS names, SRV records and
//! endpoint files, changing without a generation (DESIGN §20).
//!
//! A generation pins the *sources* an upstream names (`plan::SourceSpec`);
//! what they currently give is process-shared state, like health (§12).
//! One [`Source`] per upstream name and source spec lives while any live
//! generation names it, however many activations come and go: a task
//! resolves it (DNS, SRV) or watches it (a file) and publishes the
//! endpoints it gives on a `watch` channel. `generation::Upstream`
//! follows the channels of its sources and rebuilds its member table when
//! they change; this module knows nothing of backends or balancing.
//!
//! Failure keeps what worked: a resolver that fails or times out leaves
//! the last good set in place (stale, counted); an empty answer (no
//! records, NXDOMAIN) empties it only once three resolutions in a row
//! agree; an endpoints file that does not parse is reported and the last
//! good list kept.

mod file;
mod resolve;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::watch;

use crate::plan::{DiscoverySpec, SourceSpec};
use crate::telemetry::metrics as m;
use crate::telemetry::series::{self, Count, Exported, Sample};
use crate::weak_map::WeakMap;

pub use file::parse_endpoints;

/// Empty answers in a row that empty a source's set.
pub const EMPTY_AGREEMENT: u32 = 3;
/// The shortest wait between two resolutions, whatever records' TTLs say.
pub const MIN_REFRESH: Duration = Duration::from_secs(1);

/// One member a source gives.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Endpoint {
    /// Lower is preferred (SRV priority; 0 for everything else).
    pub priority: u16,
    pub addr: SocketAddr,
    pub weight: u32,
    /// The name it was found under (TLS server name when the upstream
    /// sets none): the `dns` name or the SRV target.
    pub host: Option<Arc<str>>,
}

/// The process's sources, by upstream name and spec, and how names are
/// resolved.
#[derive(Debug, Default)]
pub struct Discovery {
    settings: OnceLock<DiscoverySpec>,
    resolver: OnceLock<Result<Arc<resolve::Resolver>, String>>,
    sources: WeakMap<SourceKey, Source>,
}

/// What makes two sources the same source.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SourceKey {
    pub upstream: String,
    pub spec: SourceSpec,
}

impl Discovery {
    /// Sets how names are resolved (`[discovery]`, at startup, before
    /// the first source is made; later calls change nothing).
    pub fn configure(&self, settings: &DiscoverySpec) {
        let _ = self.settings.set(settings.clone());
    }

    fn resolver(&self) -> Result<Arc<resolve::Resolver>, String> {
        self.resolver
            .get_or_init(|| {
                let settings = self.settings.get().cloned().unwrap_or_default();
                resolve::Resolver::new(&settings).map(Arc::new)
            })
            .clone()
    }

    /// The live source for `key`, or a new one, following its spec from
    /// now on (when there is a runtime to run it on: building outside
    /// one, as benches do, resolves nothing).
    pub fn source(&self, key: SourceKey) -> Arc<Source> {
        let source = match self.sources.get_or_try_insert(&key, || {
            Ok::<_, std::convert::Infallible>(Source::new(key.clone()))
        }) {
            Ok(source) => source,
            Err(never) => match never {},
        };
        source.started(self)
    }

    /// The sources of every upstream in `spec`, each with its first
    /// answer (or failure) in, waiting at most `patience` for all of them:
    /// what startup holds while it builds the first generation, so that
    /// it does not serve a moment with no members.
    pub async fn prime(&self, spec: &crate::plan::Spec, patience: Duration) -> Vec<Arc<Source>> {
        let sources = self.sources_of(spec);
        let _ = tokio::time::timeout(patience, async {
            for source in &sources {
                source.settled().await;
            }
        })
        .await;
        sources
    }

    /// As [`Discovery::prime`], for the blocking pool (activation builds
    /// there): waits by polling, so never call it on a runtime's worker.
    pub fn prime_blocking(&self, spec: &crate::plan::Spec) -> Vec<Arc<Source>> {
        let sources = self.sources_of(spec);
        let deadline = std::time::Instant::now() + self.patience();
        while !sources.iter().all(|s| s.has_settled()) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        sources
    }

    fn sources_of(&self, spec: &crate::plan::Spec) -> Vec<Arc<Source>> {
        spec.upstreams
            .iter()
            .flat_map(|u| {
                u.sources.iter().map(|s| SourceKey {
                    upstream: u.name.clone(),
                    spec: s.clone(),
                })
            })
            .map(|key| self.source(key))
            .collect()
    }

    /// What `spec` gives now, for a preview: the live source's set when
    /// the process follows it already, else one resolution (at most
    /// `patience`) that is not kept.
    pub async fn peek(&self, key: &SourceKey, patience: Duration) -> Peek {
        if let Some(source) = self.sources.get(key) {
            let status = source.status();
            return Peek {
                endpoints: source.endpoints().to_vec(),
                error: status.error,
                followed: true,
            };
        }
        let answer = match &key.spec {
            SourceSpec::File { path } => file::read(path).await,
            spec => match self.resolver() {
                Ok(resolver) => {
                    match tokio::time::timeout(patience, resolver.resolve(spec)).await {
                        Ok(answer) => answer,
                        Err(_) => Answer::Failed {
                            error: format!("no answer within {patience:?}"),
                            timeout: true,
                        },
                    }
                }
                Err(error) => Answer::Failed {
                    error,
                    timeout: false,
                },
            },
        };
        match answer {
            Answer::Records {
                endpoints, note, ..
            } => Peek {
                endpoints,
                error: note,
                followed: false,
            },
            Answer::Empty { nxdomain } => Peek {
                endpoints: Vec::new(),
                error: Some(if nxdomain {
                    "the name does not exist (NXDOMAIN)".into()
                } else {
                    "no records".into()
                }),
                followed: false,
            },
            Answer::Failed { error, .. } => Peek {
                endpoints: Vec::new(),
                error: Some(error),
                followed: false,
            },
        }
    }

    /// How long a caller should wait for a first answer: every attempt
    /// of a query, and a second to spare, at most 10 s.
    pub fn patience(&self) -> Duration {
        let settings = self.settings.get().cloned().unwrap_or_default();
        (settings.timeout * settings.attempts + Duration::from_secs(1)).min(Duration::from_secs(10))
    }
}

/// What a source gives, seen from a preview.
#[derive(Debug, Clone)]
pub struct Peek {
    pub endpoints: Vec<Endpoint>,
    pub error: Option<String>,
    /// Whether the process follows this source already.
    pub followed: bool,
}

/// One resolution's result.
#[derive(Debug)]
pub(crate) enum Answer {
    /// At least one member; `ttl` the shortest record TTL; `note` what
    /// was incomplete (an SRV target that did not resolve).
    Records {
        endpoints: Vec<Endpoint>,
        ttl: Option<Duration>,
        note: Option<String>,
    },
    /// No member: no records, or the name does not exist.
    Empty { nxdomain: bool },
    /// No answer to trust.
    Failed { error: String, timeout: bool },
}

/// One upstream's source of members, followed while any live
/// generation names it.
#[derive(Debug)]
pub struct Source {
    pub key: SourceKey,
    members: watch::Sender<Arc<[Endpoint]>>,
    status: Mutex<State>,
    /// How many first answers have come in (0 until one has).
    answers: watch::Sender<u64>,
    counts: Counts,
    /// Members the upstream's `max_members` left out of this source's.
    pub left_out: AtomicUsize,
    started: OnceLock<()>,
    task: Mutex<Option<tokio::task::AbortHandle>>,
    exported: bool,
}

#[derive(Debug, Default)]
struct Counts {
    ok: Count,
    empty: Count,
    nxdomain: Count,
    error: Count,
    timeout: Count,
    invalid: Count,
}

/// Series of one source: six outcomes and two gauges.
const SOURCE_SERIES: usize = 8;

#[derive(Debug, Default, Clone)]
struct State {
    last_resolution_ms: Option<u64>,
    next_refresh_ms: Option<u64>,
    error: Option<String>,
    /// Empty answers in a row.
    empty_streak: u32,
    /// The set is the last good one, kept through failures.
    stale: bool,
}

/// What `/admin/runtime/backends` shows of one source.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SourceView {
    pub source: String,
    pub members: usize,
    /// Left out by the upstream's `max_members`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub left_out: usize,
    /// Unix milliseconds of the last answer or failure (`null`: none yet).
    pub last_resolution_unix_ms: Option<u64>,
    /// Unix milliseconds of the next resolution (`null` for files,
    /// read again when they change).
    pub next_refresh_unix_ms: Option<u64>,
    /// The last resolution's failure, or what it lacked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The members are the last good set, kept through failures.
    pub stale: bool,
    pub resolutions: u64,
    pub failures: u64,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl Source {
    fn new(key: SourceKey) -> Arc<Self> {
        let source = Arc::new(Self {
            key,
            members: watch::Sender::new(Arc::from(Vec::new())),
            status: Mutex::new(State::default()),
            answers: watch::Sender::new(0),
            counts: Counts::default(),
            left_out: AtomicUsize::new(0),
            started: OnceLock::new(),
            task: Mutex::new(None),
            exported: series::admit(SOURCE_SERIES),
        });
        if source.exported {
            series::register(&source);
        }
        source
    }

    /// Starts following the spec, once.
    fn started(self: Arc<Self>, discovery: &Discovery) -> Arc<Self> {
        if self.started.set(()).is_err() {
            return self;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return self;
        };
        let weak = Arc::downgrade(&self);
        let task = match &self.key.spec {
            SourceSpec::File { path } => runtime.spawn(file::follow(weak, path.clone())),
            spec => runtime.spawn(follow(weak, discovery.resolver(), spec.clone())),
        };
        *self.task.lock().unwrap_or_else(PoisonError::into_inner) = Some(task.abort_handle());
        self
    }

    /// The members it gives now.
    pub fn endpoints(&self) -> Arc<[Endpoint]> {
        Arc::clone(&self.members.borrow())
    }

    /// A receiver that sees every change of the members.
    pub fn subscribe(&self) -> watch::Receiver<Arc<[Endpoint]>> {
        self.members.subscribe()
    }

    /// Returns once the first answer (or failure) is in.
    pub async fn settled(&self) {
        let mut answers = self.answers.subscribe();
        let _ = answers.wait_for(|n| *n > 0).await;
    }

    /// Whether the first answer (or failure) is in.
    pub fn has_settled(&self) -> bool {
        *self.answers.borrow() > 0
    }

    fn status(&self) -> State {
        self.status
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub fn view(&self) -> SourceView {
        let state = self.status();
        let failures = self.counts.error.get()
            + self.counts.timeout.get()
            + self.counts.invalid.get()
            + self.counts.empty.get()
            + self.counts.nxdomain.get();
        SourceView {
            source: self.key.spec.label(),
            members: self.members.borrow().len(),
            left_out: self.left_out.load(Ordering::Relaxed),
            last_resolution_unix_ms: state.last_resolution_ms.map(crate::clock::unix_ms),
            next_refresh_unix_ms: state.next_refresh_ms.map(crate::clock::unix_ms),
            error: state.error,
            stale: state.stale,
            resolutions: failures + self.counts.ok.get(),
            failures,
        }
    }

    /// Takes in one resolution's answer by the rules of the module doc;
    /// returns how long until the next one (`refresh` for failures and
    /// empty answers, the records' TTL when shorter, never under 1 s).
    pub(crate) fn take(&self, answer: Answer, refresh: Duration) -> Duration {
        let now = crate::clock::now_ms();
        let mut state = self.status.lock().unwrap_or_else(PoisonError::into_inner);
        state.last_resolution_ms = Some(now);
        let wait = match answer {
            Answer::Records {
                mut endpoints,
                ttl,
                note,
            } => {
                self.counts.ok.add(1);
                endpoints.sort();
                endpoints.dedup_by(|a, b| a.addr == b.addr && a.priority == b.priority);
                self.publish(endpoints);
                state.error = note;
                state.empty_streak = 0;
                state.stale = false;
                ttl.map_or(refresh, |ttl| ttl.min(refresh))
            }
            Answer::Empty { nxdomain } => {
                if nxdomain {
                    self.counts.nxdomain.add(1);
                } else {
                    self.counts.empty.add(1);
                }
                state.empty_streak += 1;
                let what = if nxdomain {
                    "the name does not exist (NXDOMAIN)"
                } else {
                    "no records"
                };
                if state.empty_streak >= EMPTY_AGREEMENT {
                    self.publish(Vec::new());
                    state.stale = false;
                    state.error = Some(format!(
                        "{what}: {} answers in a row agreed, the set is empty",
                        state.empty_streak
                    ));
                } else {
                    state.stale = !self.members.borrow().is_empty();
                    state.error = Some(format!(
                        "{what} ({} of {EMPTY_AGREEMENT} answers in a row before the set is emptied)",
                        state.empty_streak
                    ));
                }
                refresh
            }
            Answer::Failed { error, timeout } => {
                if timeout {
                    self.counts.timeout.add(1);
                } else {
                    self.counts.error.add(1);
                }
                state.stale = !self.members.borrow().is_empty();
                state.error = Some(error);
                refresh
            }
        };
        let wait = wait.max(MIN_REFRESH);
        state.next_refresh_ms = Some(now + u64::try_from(wait.as_millis()).unwrap_or(u64::MAX));
        drop(state);
        self.answers.send_modify(|n| *n += 1);
        wait
    }

    /// A file's list: read and parsed (`Ok`), or not (`Err`, the last
    /// good list kept).
    pub(crate) fn take_file(&self, read: Result<Vec<Endpoint>, String>) {
        let now = crate::clock::now_ms();
        let mut state = self.status.lock().unwrap_or_else(PoisonError::into_inner);
        state.last_resolution_ms = Some(now);
        match read {
            Ok(mut endpoints) => {
                self.counts.ok.add(1);
                endpoints.sort();
                endpoints.dedup_by(|a, b| a.addr == b.addr && a.priority == b.priority);
                self.publish(endpoints);
                state.error = None;
                state.stale = false;
            }
            Err(error) => {
                self.counts.invalid.add(1);
                state.stale = !self.members.borrow().is_empty();
                state.error = Some(error);
            }
        }
        drop(state);
        self.answers.send_modify(|n| *n += 1);
    }

    fn publish(&self, endpoints: Vec<Endpoint>) {
        self.members.send_if_modified(|current| {
            if **current == *endpoints {
                return false;
            }
            *current = Arc::from(endpoints);
            true
        });
    }
}

impl Exported for Source {
    fn samples(&self, out: &mut Vec<Sample>) {
        let labels = series::named(m::LABEL_UPSTREAM, &Arc::from(self.key.upstream.as_str()));
        for (count, outcome) in [
            (&self.counts.ok, "ok"),
            (&self.counts.empty, "empty"),
            (&self.counts.nxdomain, "nxdomain"),
            (&self.counts.error, "error"),
            (&self.counts.timeout, "timeout"),
            (&self.counts.invalid, "invalid"),
        ] {
            let mut labels = labels.clone();
            labels.push((m::LABEL_OUTCOME, outcome.into()));
            out.push(series::sample(
                &series::DISCOVERY_RESOLUTIONS,
                labels,
                count.get() as f64,
            ));
        }
        let left_out = self.left_out.load(Ordering::Relaxed);
        let members = self.members.borrow().len().saturating_sub(left_out);
        out.push(series::sample(
            &series::DISCOVERY_MEMBERS,
            labels.clone(),
            members as f64,
        ));
        out.push(series::sample(
            &series::DISCOVERY_LEFT_OUT,
            labels,
            left_out as f64,
        ));
    }
}

impl Drop for Source {
    fn drop(&mut self) {
        if let Some(task) = self
            .task
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            task.abort();
        }
        if self.exported {
            series::retire(self);
            series::release(SOURCE_SERIES);
        }
    }
}

/// Resolves a `dns` or `srv` source until no live generation names it.
async fn follow(
    source: Weak<Source>,
    resolver: Result<Arc<resolve::Resolver>, String>,
    spec: SourceSpec,
) {
    let refresh = match &spec {
        SourceSpec::Dns { refresh, .. } | SourceSpec::Srv { refresh, .. } => *refresh,
        SourceSpec::File { .. } => return,
    };
    loop {
        let answer = match &resolver {
            Ok(resolver) => {
                // The resolver's own timeout and attempts bound a query;
                // this bounds the whole (SRV targets included).
                let patience = resolver.patience();
                match tokio::time::timeout(patience, resolver.resolve(&spec)).await {
                    Ok(answer) => answer,
                    Err(_) => Answer::Failed {
                        error: format!("no answer within {patience:?}"),
                        timeout: true,
                    },
                }
            }
            Err(error) => Answer::Failed {
                error: error.clone(),
                timeout: false,
            },
        };
        let Some(live) = source.upgrade() else {
            return;
        };
        // Once per failing spell, not once per refresh.
        if let (Answer::Failed { error, .. }, None) = (&answer, live.status().error) {
            tracing::warn!(upstream = %live.key.upstream, source = %spec.label(), %error, "resolution failed; the last good members are kept");
        }
        let wait = live.take(answer, refresh);
        drop(live);
        tokio::time::sleep(wait).await;
    }
}

/// The members a source gives, as `ip:port` (for plans and views).
pub fn addresses(endpoints: &[Endpoint]) -> Vec<String> {
    endpoints.iter().map(|e| e.addr.to_string()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(last: u8) -> Endpoint {
        Endpoint {
            priority: 0,
            addr: SocketAddr::from(([10, 0, 0, last], 80)),
            weight: 1,
            host: None,
        }
    }

    fn source() -> Arc<Source> {
        Source::new(SourceKey {
            upstream: "app".into(),
            spec: SourceSpec::Dns {
                name: "app.test".into(),
                port: 80,
                family: crate::plan::Family::Any,
                refresh: Duration::from_secs(10),
                weight: 1,
            },
        })
    }

    fn records(last: &[u8], ttl: Option<u64>) -> Answer {
        Answer::Records {
            endpoints: last.iter().map(|l| endpoint(*l)).collect(),
            ttl: ttl.map(Duration::from_secs),
            note: None,
        }
    }

    #[test]
    fn failures_keep_the_last_good_set_and_only_three_empty_answers_empty_it() {
        let source = source();
        let refresh = Duration::from_secs(10);
        assert!(!source.has_settled());
        assert_eq!(source.take(records(&[2, 1, 2], Some(60)), refresh), refresh);
        assert!(source.has_settled());
        // Sorted, without repeats.
        assert_eq!(&*source.endpoints(), &[endpoint(1), endpoint(2)]);
        let good = source.endpoints();
        for failure in [
            Answer::Failed {
                error: "SERVFAIL".into(),
                timeout: false,
            },
            Answer::Failed {
                error: "no answer".into(),
                timeout: true,
            },
        ] {
            source.take(failure, refresh);
            assert_eq!(source.endpoints(), good);
            assert!(source.view().stale);
        }
        // Two empty answers: kept; a good answer in between starts over.
        source.take(Answer::Empty { nxdomain: true }, refresh);
        source.take(Answer::Empty { nxdomain: false }, refresh);
        assert_eq!(source.endpoints(), good);
        source.take(records(&[3], None), refresh);
        assert_eq!(&*source.endpoints(), &[endpoint(3)]);
        for n in 1..=EMPTY_AGREEMENT {
            source.take(Answer::Empty { nxdomain: true }, refresh);
            assert_eq!(source.endpoints().is_empty(), n == EMPTY_AGREEMENT, "{n}");
        }
        let view = source.view();
        assert!(!view.stale);
        assert!(view.error.is_some_and(|e| e.contains("NXDOMAIN")));
        assert_eq!(view.resolutions, 9);
        assert_eq!(view.failures, 7);
    }

    #[test]
    fn ttls_shorten_the_wait_but_never_under_a_second() {
        let source = source();
        let refresh = Duration::from_secs(30);
        assert_eq!(
            source.take(records(&[1], Some(5)), refresh),
            Duration::from_secs(5)
        );
        assert_eq!(source.take(records(&[1], Some(0)), refresh), MIN_REFRESH);
        assert_eq!(source.take(records(&[1], Some(600)), refresh), refresh);
        assert_eq!(source.take(records(&[1], None), refresh), refresh);
    }

    #[test]
    fn an_unchanged_answer_does_not_wake_followers() {
        let source = source();
        let mut followers = source.subscribe();
        source.take(records(&[1, 2], None), Duration::from_secs(1));
        assert!(followers.has_changed().unwrap_or(false));
        followers.mark_unchanged();
        source.take(records(&[2, 1], None), Duration::from_secs(1));
        assert!(!followers.has_changed().unwrap_or(true));
        source.take_file(Err("bad".into()));
        assert!(!followers.has_changed().unwrap_or(true));
        assert_eq!(source.endpoints().len(), 2);
    }
}
