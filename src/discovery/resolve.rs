//! Names to members, with `hickory-resolver`: every A/AAAA record of a
//! `dns` name, every target of an SRV name (with the target's addresses
//! from the answer's additional records, or looked up).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hickory_resolver::config::{
    LookupIpStrategy, NameServerConfig, NameServerConfigGroup, ResolverConfig,
};
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::proto::op::ResponseCode;
use hickory_resolver::proto::rr::{RData, Record, RecordType};
use hickory_resolver::proto::xfer::Protocol;
use hickory_resolver::proto::ProtoErrorKind;
use hickory_resolver::{ResolveError, TokioResolver};

use super::{Answer, Endpoint};
use crate::plan::{DiscoverySpec, Family, SourceSpec};

/// SRV targets looked up at most per resolution (beyond them, an answer
/// is capped by the upstream's `max_members` anyway).
const MAX_SRV_TARGETS: usize = 1000;

#[derive(Debug)]
pub(super) struct Resolver {
    inner: TokioResolver,
    patience: Duration,
}

impl Resolver {
    /// A resolver of `settings.nameservers` (UDP, and TCP for truncated
    /// answers), or of the system's resolv.conf when there are none.
    /// It keeps no cache: each resolution asks, and TTLs pace them.
    pub(super) fn new(settings: &DiscoverySpec) -> Result<Self, String> {
        let mut builder = if settings.nameservers.is_empty() {
            TokioResolver::builder_tokio()
                .map_err(|e| format!("the system's resolver configuration: {e}"))?
        } else {
            let mut group = NameServerConfigGroup::new();
            for addr in &settings.nameservers {
                group.push(NameServerConfig::new(*addr, Protocol::Udp));
                group.push(NameServerConfig::new(*addr, Protocol::Tcp));
            }
            TokioResolver::builder_with_config(
                ResolverConfig::from_parts(None, Vec::new(), group),
                TokioConnectionProvider::default(),
            )
        };
        let options = builder.options_mut();
        options.timeout = settings.timeout;
        options.attempts = settings.attempts as usize;
        options.cache_size = 0;
        options.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
        options.try_tcp_on_error = true;
        // Large answers (a pool of hundreds) fit UDP with EDNS(0), and
        // come over TCP when truncated even so.
        options.edns0 = true;
        let patience = (settings.timeout * settings.attempts.max(1)) * 2 + Duration::from_secs(1);
        Ok(Self {
            inner: builder.build(),
            patience,
        })
    }

    /// The longest one resolution may take (a name, then SRV targets).
    pub(super) fn patience(&self) -> Duration {
        self.patience
    }

    pub(super) async fn resolve(&self, spec: &SourceSpec) -> Answer {
        match spec {
            SourceSpec::Dns {
                name,
                port,
                family,
                weight,
                ..
            } => self.dns(name, *port, *family, *weight).await,
            SourceSpec::Srv { name, .. } => self.srv(name).await,
            SourceSpec::File { .. } => Answer::Failed {
                error: "a file is not resolved".into(),
                timeout: false,
            },
        }
    }

    /// A and AAAA asked apart, so that one family failing is never read
    /// as the name having no addresses.
    async fn dns(&self, name: &str, port: u16, family: Family, weight: u32) -> Answer {
        let ask = |kind: RecordType, wanted: bool| async move {
            if wanted {
                Some(self.inner.lookup(name, kind).await)
            } else {
                None
            }
        };
        let (v4, v6) = tokio::join!(
            ask(RecordType::A, family != Family::Ipv6),
            ask(RecordType::AAAA, family != Family::Ipv4)
        );
        let host: Arc<str> = Arc::from(name.trim_end_matches('.'));
        let mut endpoints = Vec::new();
        let mut ttl = None;
        let mut failures = Vec::new();
        for result in [v4, v6].into_iter().flatten() {
            match result {
                Ok(lookup) => {
                    let records = lookup.records();
                    ttl = min_ttl(ttl, shortest_ttl(records));
                    endpoints.extend(records.iter().filter_map(address).map(|ip| Endpoint {
                        priority: 0,
                        addr: SocketAddr::new(ip, port),
                        weight,
                        host: Some(Arc::clone(&host)),
                    }));
                }
                Err(e) => failures.push(failed(&e, name)),
            }
        }
        if !endpoints.is_empty() {
            let note = failures.iter().find_map(|f| match f {
                Answer::Failed { error, .. } => Some(error.clone()),
                _ => None,
            });
            return Answer::Records {
                endpoints,
                ttl,
                note,
            };
        }
        let asked = failures.len();
        let mut nxdomain = 0;
        for failure in failures {
            match failure {
                Answer::Empty { nxdomain: true } => nxdomain += 1,
                Answer::Empty { nxdomain: false } | Answer::Records { .. } => {}
                failed @ Answer::Failed { .. } => return failed,
            }
        }
        Answer::Empty {
            nxdomain: asked > 0 && nxdomain == asked,
        }
    }

    async fn srv(&self, name: &str) -> Answer {
        let lookup = match self.inner.srv_lookup(name).await {
            Ok(lookup) => lookup,
            Err(e) => return failed(&e, name),
        };
        let records = lookup.as_lookup().records();
        // The targets' addresses the answer carried along.
        let mut carried: HashMap<String, Vec<IpAddr>> = HashMap::new();
        for record in records {
            if let Some(ip) = address(record) {
                carried
                    .entry(normal(&record.name().to_ascii()))
                    .or_default()
                    .push(ip);
            }
        }
        let mut ttl = shortest_ttl(records);
        let mut endpoints = Vec::new();
        let mut unresolved = Vec::new();
        let srvs: Vec<_> = lookup.iter().take(MAX_SRV_TARGETS).collect();
        let missing: Vec<String> = srvs
            .iter()
            .map(|srv| normal(&srv.target().to_ascii()))
            .filter(|target| !carried.contains_key(target))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let looked_up =
            futures_util::future::join_all(missing.iter().map(|target| async move {
                (target, self.inner.lookup_ip(target.as_str()).await)
            }))
            .await;
        for (target, result) in looked_up {
            match result {
                Ok(lookup) => {
                    let records = lookup.as_lookup().records();
                    ttl = min_ttl(ttl, shortest_ttl(records));
                    carried.insert(target.clone(), records.iter().filter_map(address).collect());
                }
                Err(e) => unresolved.push(format!("{target}: {}", describe(&e))),
            }
        }
        for srv in srvs {
            let target = normal(&srv.target().to_ascii());
            // "." means: no such service here (RFC 2782).
            if target.is_empty() {
                continue;
            }
            let host: Arc<str> = Arc::from(target.as_str());
            for ip in carried.get(&target).into_iter().flatten() {
                endpoints.push(Endpoint {
                    priority: srv.priority(),
                    addr: SocketAddr::new(*ip, srv.port()),
                    // Weight 0 is "rarely" (RFC 2782): the least share.
                    weight: u32::from(srv.weight()).max(1),
                    host: Some(Arc::clone(&host)),
                });
            }
        }
        let note = (!unresolved.is_empty()).then(|| {
            format!(
                "{} SRV target(s) did not resolve: {}",
                unresolved.len(),
                unresolved.join("; ")
            )
        });
        if endpoints.is_empty() {
            return match note {
                Some(error) => Answer::Failed {
                    error,
                    timeout: false,
                },
                None => Answer::Empty { nxdomain: false },
            };
        }
        Answer::Records {
            endpoints,
            ttl,
            note,
        }
    }
}

/// A failed lookup: an empty answer (no records, NXDOMAIN), a timeout,
/// or another failure.
fn failed(error: &ResolveError, name: &str) -> Answer {
    // Only an answer is an empty answer: the name exists with no such
    // records (NOERROR), or does not exist (NXDOMAIN). SERVFAIL, REFUSED
    // and the like come as "no records" too, and are failures.
    if let Some(ProtoErrorKind::NoRecordsFound { response_code, .. }) =
        error.proto().map(|p| p.kind())
    {
        if matches!(
            *response_code,
            ResponseCode::NoError | ResponseCode::NXDomain
        ) {
            return Answer::Empty {
                nxdomain: *response_code == ResponseCode::NXDomain,
            };
        }
        return Answer::Failed {
            error: format!("resolving {name}: the server answered {response_code}"),
            timeout: false,
        };
    }
    let timeout = matches!(
        error.proto().map(|p| p.kind()),
        Some(ProtoErrorKind::Timeout)
    );
    Answer::Failed {
        error: format!("resolving {name}: {}", describe(error)),
        timeout,
    }
}

fn describe(error: &ResolveError) -> String {
    if error.is_nx_domain() {
        return "the name does not exist (NXDOMAIN)".into();
    }
    if error.is_no_records_found() {
        return "no records".into();
    }
    error.to_string()
}

fn address(record: &Record) -> Option<IpAddr> {
    match record.data() {
        RData::A(a) => Some(IpAddr::V4(a.0)),
        RData::AAAA(aaaa) => Some(IpAddr::V6(aaaa.0)),
        _ => None,
    }
}

fn shortest_ttl(records: &[Record]) -> Option<Duration> {
    records
        .iter()
        .map(|r| Duration::from_secs(u64::from(r.ttl())))
        .min()
}

fn min_ttl(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// A name as keys compare it: lower case, without the root's dot.
fn normal(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}
