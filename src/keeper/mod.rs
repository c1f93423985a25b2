//! The certificate keeper (DESIGN §21), beside `acme/` whose orders it
//! places: on the control runtime, once a second, it looks at the
//! certificates the active generation serves and
//!
//! - keeps one task per ACME certificate, which orders it when it has
//!   none, renews it `renew_before` its expiry, backs off after a failure
//!   (the old certificate serving meanwhile) and installs the result in
//!   the certificate's slot: the certificate path, never a generation;
//! - staples OCSP responses to certificates whose leaf names a responder:
//!   fetched off the serving threads, asked again at half their validity,
//!   taken off before they go stale;
//! - exports expiry and staple age;
//! - in a fleet, serves the challenge answers other instances publish.
//!
//! What it does is recorded through a [`Journal`] (the control plane's
//! operation log); it changes no generation.

mod status;

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use crate::acme::{self, ocsp::Responders};
use crate::ids::GenerationId;
use crate::runtime::{CertificateRecord, GenerationStore, Outcome};
use crate::telemetry::metrics as m;
use crate::tls::{CertSlot, CertStore, LoadedCert, Staple};

pub use status::{AcmeStatus, CertificateStatus, OcspStatus};

/// Where the keeper records what it did (the operation log).
pub trait Journal: Send + Sync {
    /// Records one certificate operation (requested by `cutover`, for
    /// `acme`), made while `generation` was active.
    fn certificate(
        &self,
        generation: GenerationId,
        started: Instant,
        outcome: Outcome,
        summary: String,
        error: Option<String>,
        certificate: CertificateRecord,
    );
}

/// The certificate keeper of one process.
pub struct Keeper {
    store: Arc<GenerationStore>,
    certificates: Arc<CertStore>,
    journal: Arc<dyn Journal>,
    /// In a fleet: where ACME orders, certificates and challenge answers
    /// are shared (set once by the fleet, which outlives nothing here:
    /// weak, as the fleet holds the control plane that holds this).
    share: OnceLock<Weak<dyn acme::Shared>>,
}

/// After a failed order: 30 s, doubling, at most an hour; a CA that says
/// "rate limited" is not asked again for an hour.
fn back_off(failures: u32, outcome: &str) -> Duration {
    let doubled = 30u64.saturating_mul(1 << failures.saturating_sub(1).min(7));
    let wait = Duration::from_secs(doubled.min(3600));
    if outcome == "rate_limited" {
        wait.max(Duration::from_secs(3600))
    } else {
        wait
    }
}

/// When a certificate is due for renewal: `renew_before` its expiry (at
/// most half its lifetime before, so that a `renew_before` longer than
/// the lifetime cannot make every new certificate due at once), a third
/// of its lifetime before by default.
fn renew_at(info: &crate::tls::CertInfo, renew_before: Option<Duration>) -> i64 {
    let lifetime = (info.not_after_unix - info.not_before_unix).max(0);
    let before = match renew_before {
        Some(d) => i64::try_from(d.as_secs())
            .unwrap_or(i64::MAX)
            .min(lifetime / 2),
        None => lifetime / 3,
    };
    info.not_after_unix - before
}

/// What the keeper knows of one certificate's OCSP responses.
#[derive(Default)]
struct OcspState {
    staple: Option<Staple>,
    fetching: bool,
    next_attempt: Option<Instant>,
    failures: u32,
    error: Option<String>,
}

/// Takes a fetch's result: a current answer about a known certificate
/// becomes the staple, asked again at half its validity (never sooner
/// than a quarter of what is left, so that a responder handing out the
/// same answer is not asked every second); a failure keeps the staple
/// (until it goes stale) and backs off from 10 s to 10 minutes.
fn fetched(state: &mut OcspState, fingerprint: &str, result: Result<Staple, String>, now: i64) {
    let result = result.and_then(|staple| match staple.status {
        "unknown" => {
            Err("the responder does not know this certificate (status unknown)".to_owned())
        }
        _ => Ok(staple),
    });
    match result {
        Ok(staple) => {
            metrics::counter!(m::OCSP_FETCHES, m::LABEL_OUTCOME => "ok").increment(1);
            tracing::info!(certificate = %fingerprint, status = staple.status, next_update = staple.next_update, "OCSP response fetched");
            let half = staple.refresh_at();
            let floor = now + ((staple.next_update - now) / 4).max(1);
            let wait = u64::try_from(half.max(floor) - now).unwrap_or(0);
            state.next_attempt = Some(Instant::now() + Duration::from_secs(wait));
            state.failures = 0;
            state.error = None;
            state.staple = Some(staple);
        }
        Err(error) => {
            metrics::counter!(m::OCSP_FETCHES, m::LABEL_OUTCOME => "failed").increment(1);
            state.failures += 1;
            let wait = Duration::from_secs((5u64 << state.failures.min(7)).min(600));
            state.next_attempt = Some(Instant::now() + wait);
            tracing::warn!(certificate = %fingerprint, %error, retry_in = ?wait, "OCSP response not fetched; a current staple stays until it goes stale");
            state.error = Some(error);
        }
    }
}

type Fetched = (String, Result<Staple, String>);

impl Keeper {
    pub fn new(
        store: Arc<GenerationStore>,
        certificates: Arc<CertStore>,
        journal: Arc<dyn Journal>,
    ) -> Self {
        Self {
            store,
            certificates,
            journal,
            share: OnceLock::new(),
        }
    }

    /// Orders ACME certificates with the fleet's instances through
    /// `shared` (once, when the fleet starts).
    pub fn share(&self, shared: Weak<dyn acme::Shared>) {
        let _ = self.share.set(shared);
    }

    fn shared(&self) -> Option<Arc<dyn acme::Shared>> {
        self.share.get()?.upgrade()
    }

    fn record(
        &self,
        started: Instant,
        outcome: Outcome,
        summary: String,
        error: Option<String>,
        certificate: CertificateRecord,
    ) {
        let generation = self.store.active_id();
        self.journal
            .certificate(generation, started, outcome, summary, error, certificate);
    }

    /// Starts keeping (once, at start-up); stops when the keeper is
    /// dropped.
    pub fn start(self: &Arc<Self>) {
        tokio::spawn(answer_for_the_fleet(Arc::downgrade(self)));
        let keeper = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut orders: HashMap<usize, (Arc<CertSlot>, tokio::task::JoinHandle<()>)> =
                HashMap::new();
            let mut ocsp: HashMap<String, OcspState> = HashMap::new();
            let responders = Arc::new(Responders::default());
            let (fetched_tx, mut fetched_rx) = tokio::sync::mpsc::unbounded_channel::<Fetched>();
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(keeper) = keeper.upgrade() else {
                    break;
                };
                while let Ok((fingerprint, result)) = fetched_rx.try_recv() {
                    let state = ocsp.entry(fingerprint.clone()).or_default();
                    state.fetching = false;
                    fetched(state, &fingerprint, result, acme::unix_now());
                }
                let slots = keeper.serving_slots();
                let now = acme::unix_now();
                // ACME: one task per certificate the active configuration
                // serves; a certificate it no longer names stops ordering.
                orders.retain(|key, (_, task)| {
                    let kept = slots.iter().any(|s| Arc::as_ptr(s) as usize == *key);
                    if !kept {
                        task.abort();
                    }
                    kept && !task.is_finished()
                });
                for slot in slots.iter().filter(|s| s.acme().is_some()) {
                    let key = Arc::as_ptr(slot) as usize;
                    orders.entry(key).or_insert_with(|| {
                        let task =
                            tokio::spawn(keep_acme(Arc::downgrade(&keeper), Arc::clone(slot)));
                        (Arc::clone(slot), task)
                    });
                }
                // OCSP, and the gauges.
                let mut seen = std::collections::HashSet::new();
                for slot in &slots {
                    let Some(info) = slot.info() else { continue };
                    for name in &info.names {
                        metrics::gauge!(m::CERT_EXPIRY, m::LABEL_NAME => name.clone())
                            .set((info.not_after_unix - now) as f64);
                    }
                    let Some(target) = slot.ocsp_target() else {
                        continue;
                    };
                    seen.insert(target.fingerprint.clone());
                    let state = ocsp.entry(target.fingerprint.clone()).or_default();
                    // Never staple what is no longer current.
                    if state.staple.as_ref().is_some_and(|s| s.next_update <= now) {
                        state.staple = None;
                    }
                    slot.set_staple(&target.fingerprint, state.staple.clone());
                    slot.note(|n| n.ocsp_error.clone_from(&state.error));
                    let stapled = slot.staple();
                    for name in &info.names {
                        metrics::gauge!(m::OCSP_STAPLED, m::LABEL_NAME => name.clone())
                            .set(if stapled.is_some() { 1.0 } else { 0.0 });
                        if let Some(staple) = &stapled {
                            metrics::gauge!(m::OCSP_STAPLE_AGE, m::LABEL_NAME => name.clone())
                                .set((now - staple.this_update) as f64);
                        }
                    }
                    let allowed = state.next_attempt.is_none_or(|at| Instant::now() >= at);
                    if allowed && !state.fetching {
                        state.fetching = true;
                        let (responders, sender) = (Arc::clone(&responders), fetched_tx.clone());
                        tokio::spawn(async move {
                            let result = responders.fetch(&target).await;
                            let _ = sender.send((target.fingerprint.clone(), result));
                        });
                    }
                }
                ocsp.retain(|fingerprint, state| state.fetching || seen.contains(fingerprint));
            }
        });
    }

    /// Every certificate slot new handshakes may get, once each; exports
    /// each one's `not_after` by listener on the way (a renewal changes
    /// it with no reload).
    fn serving_slots(&self) -> Vec<Arc<CertSlot>> {
        let active = self.store.load_full();
        let mut out: Vec<Arc<CertSlot>> = Vec::new();
        for listener in active.spec.listeners.iter().filter(|l| l.tls.is_some()) {
            let Some(material) = self.certificates.serving(&listener.name) else {
                continue;
            };
            for slot in material.slots() {
                if let Some(info) = slot.info() {
                    for name in &info.names {
                        metrics::gauge!(m::CERT_NOT_AFTER, m::LABEL_LISTENER => listener.name.clone(), m::LABEL_NAME => name.clone())
                            .set(info.not_after_unix as f64);
                    }
                }
                if !out.iter().any(|s| Arc::ptr_eq(s, slot)) {
                    out.push(Arc::clone(slot));
                }
            }
        }
        out
    }

    /// What status reports of the certificates served now.
    pub fn status(&self) -> Vec<CertificateStatus> {
        let active = self.store.load_full();
        let now = acme::unix_now();
        let mut out = Vec::new();
        for listener in active.spec.listeners.iter().filter(|l| l.tls.is_some()) {
            let Some(material) = self.certificates.serving(&listener.name) else {
                continue;
            };
            for slot in material.slots() {
                out.push(CertificateStatus::of(&listener.name, slot, now));
            }
        }
        out
    }
}

/// In a fleet, once a second while ACME certificates are served: the
/// challenge answers any instance published are given here too, so that
/// the CA's validation succeeds whichever instance it reaches.
async fn answer_for_the_fleet(keeper: Weak<Keeper>) {
    let mut given: std::collections::HashSet<acme::Answer> = std::collections::HashSet::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(this) = keeper.upgrade() else {
            break;
        };
        let Some(shared) = this.shared() else {
            continue;
        };
        let slots: Vec<Arc<CertSlot>> = this
            .serving_slots()
            .into_iter()
            .filter(|s| s.acme().is_some())
            .collect();
        drop(this);
        if slots.is_empty() && given.is_empty() {
            continue;
        }
        let answers = match tokio::time::timeout(Duration::from_secs(3), shared.answers()).await {
            Ok(Ok(answers)) => answers,
            Ok(Err(error)) => {
                tracing::debug!(%error, "the fleet's challenge answers are not readable now");
                continue;
            }
            Err(_) => continue,
        };
        let now: std::collections::HashSet<acme::Answer> = answers.into_iter().collect();
        for answer in now.difference(&given) {
            give(answer, &slots, true);
        }
        for answer in given.difference(&now) {
            give(answer, &slots, false);
        }
        given = now;
    }
}

/// Gives (or takes back) one published answer on this instance.
fn give(answer: &acme::Answer, slots: &[Arc<CertSlot>], on: bool) {
    match answer.kind() {
        Some(crate::tls::Challenge::Http01) => {
            crate::tls::set_http01(
                &answer.name,
                on.then_some(answer.key_authorization.as_str()),
            );
        }
        Some(crate::tls::Challenge::TlsAlpn01) => {
            let certificate = if on {
                let digest = acme::authorization_digest(&answer.key_authorization);
                match acme::alpn_certificate(&answer.name, &digest) {
                    Ok(certificate) => Some(certificate),
                    Err(error) => {
                        tracing::warn!(%error, "a tls-alpn-01 answer could not be made");
                        return;
                    }
                }
            } else {
                None
            };
            for slot in slots {
                if slot
                    .acme()
                    .is_some_and(|s| s.domains.contains(&answer.name))
                {
                    slot.set_challenge(&answer.name, certificate.clone());
                }
            }
        }
        None => {}
    }
}

/// One ACME certificate, for as long as the active configuration serves
/// it: ordered when missing, renewed when due, retried with back-off.
async fn keep_acme(keeper: Weak<Keeper>, slot: Arc<CertSlot>) {
    let Some(spec) = slot.acme().cloned() else {
        return;
    };
    let domains = spec.domains.join(", ");
    let mut failures = 0u32;
    let mut fleet_failures = 0u32;
    let mut retry_at: Option<Instant> = None;
    loop {
        let now = acme::unix_now();
        let due = slot
            .info()
            .map_or(now, |info| renew_at(&info, spec.renew_before));
        let wait = match retry_at {
            Some(at) => at.saturating_duration_since(Instant::now()),
            None => Duration::from_secs(u64::try_from(due - now).unwrap_or(0)),
        };
        if !wait.is_zero() {
            // Woken at least hourly: a clock that jumps is noticed.
            tokio::time::sleep(wait.min(Duration::from_secs(3600))).await;
            if retry_at.is_some_and(|at| Instant::now() < at) {
                continue;
            }
            retry_at = None;
            continue;
        }
        retry_at = None;
        let lock = acme::lock_domains(&spec);
        let _ordering = lock.lock().await;
        // Another slot for the same domains (or a restart's files) may
        // hold a newer certificate than this slot serves.
        if let Some(stored) = acme::stored(&spec) {
            let newer = slot
                .info()
                .is_none_or(|info| info.fingerprint != stored.info.fingerprint);
            if newer && renew_at(&stored.info, spec.renew_before) > now {
                tracing::info!(domains, serial = %stored.info.serial, "ACME certificate taken from state_dir");
                slot.install(stored);
                continue;
            }
        }
        let shared = keeper.upgrade().and_then(|k| k.shared());
        let id = acme::CertificateFiles::of(&spec).id();
        // In a fleet: a peer's certificate is taken, and only the holder
        // of the order lock orders.
        let mut fleet_lock = None;
        // Without etcd for 30 s, a certificate that is missing or has
        // under 7 days left is ordered alone: a second order beats an
        // expired certificate.
        let urgent = slot
            .info()
            .is_none_or(|info| info.not_after_unix - now < 7 * 86_400);
        let alone = fleet_failures >= 3 && urgent;
        if let (Some(shared), false) = (&shared, alone) {
            let taken = match from_fleet(shared.as_ref(), &spec, &slot, &id, now).await {
                Ok(found) => match found {
                    Some(loaded) => Ok(Some(loaded)),
                    None => shared.lock(id.clone()).await.map(|lock| {
                        fleet_lock = lock;
                        None
                    }),
                },
                Err(error) => Err(error),
            };
            match taken {
                Ok(Some(loaded)) => {
                    fleet_failures = 0;
                    taken_from_fleet(&keeper, &slot, &spec, loaded);
                    continue;
                }
                Ok(None) if fleet_lock.is_none() => {
                    fleet_failures = 0;
                    tracing::debug!(domains, "another instance orders this certificate");
                    retry_at = Some(Instant::now() + Duration::from_secs(2));
                    continue;
                }
                Ok(None) => fleet_failures = 0,
                Err(error) => {
                    fleet_failures += 1;
                    tracing::warn!(domains, %error, "the fleet's certificate store is unreachable; trying again in 10 s");
                    retry_at = Some(Instant::now() + Duration::from_secs(10));
                    continue;
                }
            }
            // It may have finished while the lock was being taken.
            if let Ok(Some(loaded)) = from_fleet(shared.as_ref(), &spec, &slot, &id, now).await {
                taken_from_fleet(&keeper, &slot, &spec, loaded);
                continue;
            }
        } else if alone {
            tracing::warn!(domains, "the fleet has been unreachable for 30 s and this certificate is missing or expires within 7 days: ordering without the fleet's lock");
            // The next attempt asks the fleet first again.
            fleet_failures = 0;
        }
        let shared = shared.filter(|_| !alone);
        let renewal = slot.info().is_some();
        let started = Instant::now();
        tracing::info!(domains, directory = %spec.directory, challenge = spec.challenge.name(), renewal, "ordering an ACME certificate");
        let result = acme::issue(&spec, &slot, shared.as_deref()).await;
        if let (Some(shared), Ok(issued)) = (&shared, &result) {
            let certificate = acme::SharedCert {
                chain_pem: issued.chain_pem.clone(),
                key_pem: issued.key_pem.clone(),
            };
            if let Err(error) = shared.store(id.clone(), certificate).await {
                tracing::warn!(domains, %error, "the new certificate is not in the fleet's store; the other instances will order their own");
            }
        }
        drop(fleet_lock.take());
        let Some(keeper) = keeper.upgrade() else {
            return;
        };
        match result {
            Ok(issued) => {
                failures = 0;
                slot.note(|n| {
                    n.acme_error = None;
                    n.acme_retry_at = None;
                });
                let event = if renewal { "renewed" } else { "issued" };
                metrics::counter!(m::ACME_ORDERS, m::LABEL_OUTCOME => event).increment(1);
                let info = issued.loaded.info.clone();
                install(&slot, issued.loaded);
                tracing::info!(domains, serial = %info.serial, not_after = %info.not_after, "ACME certificate {event}");
                keeper.record(
                    started,
                    Outcome::Succeeded,
                    format!(
                        "certificate {event} for {domains}, serial {}, expires {}",
                        info.serial, info.not_after
                    ),
                    None,
                    CertificateRecord {
                        domains: spec.domains.clone(),
                        event: event.to_owned(),
                        serial: Some(info.serial),
                        not_after: Some(info.not_after),
                        fingerprint: Some(info.fingerprint),
                    },
                );
            }
            Err(failure) => {
                failures += 1;
                let wait = back_off(failures, failure.outcome);
                retry_at = Some(Instant::now() + wait);
                slot.note(|n| {
                    n.acme_error = Some(failure.message.clone());
                    n.acme_retry_at =
                        Some(acme::unix_now() + i64::try_from(wait.as_secs()).unwrap_or(0));
                });
                metrics::counter!(m::ACME_ORDERS, m::LABEL_OUTCOME => failure.outcome).increment(1);
                tracing::warn!(domains, error = %failure, retry_in = ?wait, serving = renewal, "ACME order failed; what is served stays");
                keeper.record(
                    started,
                    Outcome::Failed,
                    format!(
                        "ordering a certificate for {domains} failed ({}); next attempt in {}s",
                        failure.outcome,
                        wait.as_secs()
                    ),
                    Some(failure.message.clone()),
                    CertificateRecord {
                        domains: spec.domains.clone(),
                        event: "failed".to_owned(),
                        serial: None,
                        not_after: None,
                        fingerprint: None,
                    },
                );
            }
        }
    }
}

/// Installs a certificate a fleet peer ordered, and records it.
fn taken_from_fleet(
    keeper: &Weak<Keeper>,
    slot: &CertSlot,
    spec: &crate::tls::AcmeSpec,
    loaded: LoadedCert,
) {
    let info = loaded.info.clone();
    let domains = spec.domains.join(", ");
    install(slot, loaded);
    tracing::info!(domains, serial = %info.serial, "ACME certificate taken from the fleet");
    if let Some(keeper) = keeper.upgrade() {
        keeper.record(
            Instant::now(),
            Outcome::Succeeded,
            format!(
                "certificate for {domains} taken from the fleet, serial {}, expires {}",
                info.serial, info.not_after
            ),
            None,
            CertificateRecord {
                domains: spec.domains.clone(),
                event: "fleet".to_owned(),
                serial: Some(info.serial),
                not_after: Some(info.not_after),
                fingerprint: Some(info.fingerprint),
            },
        );
    }
}

/// The fleet's certificate for `id`, when it is not the one `slot`
/// serves and is not due for renewal; kept in `state_dir` too, so that a
/// restart without etcd serves it.
async fn from_fleet(
    shared: &dyn acme::Shared,
    spec: &crate::tls::AcmeSpec,
    slot: &CertSlot,
    id: &str,
    now: i64,
) -> Result<Option<LoadedCert>, String> {
    let Some(certificate) = shared.load(id.to_owned()).await? else {
        return Ok(None);
    };
    let files = acme::CertificateFiles::of(spec);
    let loaded = match crate::tls::parse_cert(
        &files.cert,
        certificate.chain_pem.as_bytes(),
        &files.key,
        certificate.key_pem.as_bytes(),
    ) {
        Ok(loaded) => loaded,
        Err(error) => {
            tracing::warn!(%error, "the fleet's certificate does not load; it is ordered again");
            return Ok(None);
        }
    };
    let covers = spec.domains.iter().all(|d| loaded.info.names.contains(d));
    let current = renew_at(&loaded.info, spec.renew_before) > now;
    let other = slot
        .info()
        .is_none_or(|info| info.fingerprint != loaded.info.fingerprint);
    if !(covers && current && other) {
        return Ok(None);
    }
    if let Err(error) = acme::write_issued(spec, &certificate.chain_pem, &certificate.key_pem) {
        tracing::warn!(%error, "the fleet's certificate is served but not kept in state_dir");
    }
    Ok(Some(loaded))
}

/// Serves `loaded` in `slot` from the next handshake on.
fn install(slot: &CertSlot, loaded: LoadedCert) {
    for name in &loaded.info.names {
        metrics::gauge!(m::CERT_EXPIRY, m::LABEL_NAME => name.clone())
            .set((loaded.info.not_after_unix - acme::unix_now()) as f64);
    }
    slot.install(loaded);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(not_before: i64, not_after: i64) -> crate::tls::CertInfo {
        crate::tls::CertInfo {
            names: vec!["a.example".into()],
            fingerprint: String::new(),
            not_after: String::new(),
            not_after_unix: not_after,
            not_before_unix: not_before,
            serial: String::new(),
            cert_file: Default::default(),
            key_file: Default::default(),
        }
    }

    #[test]
    fn renewal_is_a_third_of_the_lifetime_before_expiry_by_default() {
        let ninety_days = info(0, 90 * 86400);
        assert_eq!(renew_at(&ninety_days, None), 60 * 86400);
        assert_eq!(
            renew_at(&ninety_days, Some(Duration::from_secs(30 * 86400))),
            60 * 86400
        );
        assert_eq!(
            renew_at(&ninety_days, Some(Duration::from_secs(7 * 86400))),
            83 * 86400
        );
        // Longer than the lifetime: half of it, never "always due".
        assert_eq!(
            renew_at(&info(1000, 1060), Some(Duration::from_secs(3600))),
            1030
        );
    }

    #[test]
    fn failed_orders_back_off_and_a_rate_limit_waits_an_hour() {
        let waits: Vec<u64> = (1..=9).map(|n| back_off(n, "rejected").as_secs()).collect();
        assert_eq!(waits, [30, 60, 120, 240, 480, 960, 1920, 3600, 3600]);
        assert_eq!(back_off(1, "rate_limited").as_secs(), 3600);
    }
}
