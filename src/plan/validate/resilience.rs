//! What keeps a request alive or bounded: active health checks, passive
//! outlier detection, retries, hedging and quotas.

use super::*;

impl Validator<'_> {
    /// `upstreams.NAME.health`; `None` after reporting what is wrong.
    pub(super) fn health(
        &mut self,
        base: &str,
        h: &crate::config::FileHealth,
    ) -> Option<HealthSpec> {
        let at = |field: &str| format!("{base}.{field}");
        let before = self.diagnostics.len();
        let kinds = usize::from(h.path.is_some())
            + usize::from(h.tcp == Some(true))
            + usize::from(h.grpc.is_some());
        // The keys only an HTTP check has, refused on the other kinds.
        let http_only = |this: &mut Self, kind: &str| {
            for (field, set) in [
                ("host", h.host.is_some()),
                ("expect_status", h.expect_status.is_some()),
            ] {
                if set {
                    this.error(
                        Code::ConflictingOptions,
                        at(field),
                        format!("`{field}` belongs to HTTP checks; this one is `{kind}`"),
                    );
                }
            }
        };
        let probe = match (&h.path, h.tcp == Some(true), &h.grpc) {
            _ if kinds > 1 => {
                self.error(
                    Code::ConflictingOptions,
                    base.to_owned(),
                    "a health check is one of `path` (HTTP), `tcp = true` or `grpc = \"service\"`",
                );
                None
            }
            (None, _, Some(service)) => {
                http_only(self, "grpc");
                if service.chars().any(|c| c.is_control() || c == '/') {
                    self.error(
                        Code::InvalidValue,
                        at("grpc"),
                        format!("'{service}' is not a gRPC service name (like \"pkg.Service\")"),
                    );
                }
                Some(HealthProbe::Grpc {
                    service: service.clone(),
                })
            }
            (None, true, None) => {
                http_only(self, "tcp = true");
                Some(HealthProbe::Tcp)
            }
            (Some(path), _, _) => {
                if !path.starts_with('/')
                    || http::uri::PathAndQuery::try_from(path.as_str()).is_err()
                {
                    self.error(
                        Code::InvalidPath,
                        at("path"),
                        format!("health path '{path}' must start with '/' and be a valid request target"),
                    );
                }
                if let Some(host) = &h.host {
                    if host.parse::<http::uri::Authority>().is_err() {
                        self.error(
                            Code::InvalidHost,
                            at("host"),
                            format!("'{host}' is not a valid Host header value"),
                        );
                    }
                }
                let expect_status = h.expect_status.clone().unwrap_or_default();
                for (i, status) in expect_status.iter().enumerate() {
                    if !(100..=599).contains(status) {
                        self.error(
                            Code::InvalidStatus,
                            format!("{base}.expect_status[{i}]"),
                            format!("status {status} is not between 100 and 599"),
                        );
                    }
                }
                Some(HealthProbe::Http {
                    path: path.clone(),
                    host: h.host.clone(),
                    expect_status,
                })
            }
            (None, _, _) => {
                self.error(
                    Code::MissingKey,
                    base.to_owned(),
                    "a health check needs `path = \"/healthz\"` (HTTP), `tcp = true` or `grpc = \"service\"`",
                );
                None
            }
        };
        let interval = match &h.interval {
            Some(t) => self.duration(at("interval"), t),
            None => Some(DEFAULT_HEALTH_INTERVAL),
        };
        let timeout = match &h.timeout {
            Some(t) => self.duration(at("timeout"), t),
            None => Some(DEFAULT_HEALTH_TIMEOUT.min(interval.unwrap_or(DEFAULT_HEALTH_TIMEOUT))),
        };
        if let Some(interval) = interval.filter(|i| *i < Duration::from_millis(100)) {
            self.error(
                Code::InvalidDuration,
                at("interval"),
                format!("interval {interval:?} is below 100ms"),
            );
        }
        if let (Some(interval), Some(timeout)) = (interval, timeout) {
            if timeout > interval {
                self.error(
                    Code::InvalidDuration,
                    at("timeout"),
                    format!("timeout {timeout:?} is longer than the interval {interval:?}"),
                );
            }
        }
        let mut count = |field: &str, value: Option<u32>, default: u32| {
            let value = value.unwrap_or(default);
            if !(1..=100).contains(&value) {
                self.error(
                    Code::InvalidValue,
                    at(field),
                    format!("{field} = {value} must be between 1 and 100"),
                );
            }
            value
        };
        let unhealthy_after = count(
            "unhealthy_after",
            h.unhealthy_after,
            DEFAULT_UNHEALTHY_AFTER,
        );
        let healthy_after = count("healthy_after", h.healthy_after, DEFAULT_HEALTHY_AFTER);
        if self.diagnostics.len() != before {
            return None;
        }
        Some(HealthSpec {
            probe: probe?,
            interval: interval?,
            timeout: timeout?,
            unhealthy_after,
            healthy_after,
        })
    }

    /// `upstreams.NAME.outlier` over the defaults of DESIGN §12.
    pub(super) fn outlier(
        &mut self,
        base: &str,
        o: Option<&crate::config::FileOutlier>,
    ) -> OutlierSpec {
        let defaults = OutlierSpec::default();
        let Some(o) = o else {
            return defaults;
        };
        let at = |field: &str| format!("{base}.{field}");
        let consecutive_failures = o
            .consecutive_failures
            .unwrap_or(defaults.consecutive_failures);
        if !(1..=1000).contains(&consecutive_failures) {
            self.error(
                Code::InvalidValue,
                at("consecutive_failures"),
                format!("consecutive_failures = {consecutive_failures} must be between 1 and 1000"),
            );
        }
        let base_ejection = match &o.base_ejection {
            Some(t) => self.duration(at("base_ejection"), t),
            None => Some(defaults.base_ejection),
        };
        let max_ejection = match &o.max_ejection {
            Some(t) => self.duration(at("max_ejection"), t),
            None => Some(defaults.max_ejection.max(base_ejection.unwrap_or_default())),
        };
        if let (Some(base_ejection), Some(max_ejection)) = (base_ejection, max_ejection) {
            if max_ejection < base_ejection {
                self.error(
                    Code::InvalidDuration,
                    at("max_ejection"),
                    format!("max_ejection {max_ejection:?} is shorter than base_ejection {base_ejection:?}"),
                );
            }
        }
        let max_ejected_percent = o
            .max_ejected_percent
            .unwrap_or(defaults.max_ejected_percent);
        if max_ejected_percent > 100 {
            self.error(
                Code::InvalidValue,
                at("max_ejected_percent"),
                format!("max_ejected_percent = {max_ejected_percent} must be between 0 and 100"),
            );
        }
        OutlierSpec {
            consecutive_failures,
            base_ejection: base_ejection.unwrap_or(defaults.base_ejection),
            max_ejection: max_ejection.unwrap_or(defaults.max_ejection),
            max_ejected_percent: max_ejected_percent.min(100),
        }
    }

    /// `routes[i].quota`.
    pub(super) fn quota(&mut self, base: &str, q: &crate::config::FileQuota) -> Option<QuotaSpec> {
        let at = |field: &str| format!("{base}.{field}");
        let before = self.diagnostics.len();
        if !(1..=1_000_000).contains(&q.rate) {
            self.error(
                Code::InvalidValue,
                at("rate"),
                format!("rate = {} must be between 1 and 1000000", q.rate),
            );
        }
        let per = match &q.per {
            Some(t) => self.duration(at("per"), t),
            None => Some(Duration::from_secs(1)),
        };
        if per.is_some_and(|p| p > Duration::from_secs(86_400)) {
            self.error(Code::InvalidDuration, at("per"), "per must be at most 24h");
        }
        let burst = q.burst.unwrap_or(q.rate);
        if !(1..=10_000_000).contains(&burst) {
            self.error(
                Code::InvalidValue,
                at("burst"),
                format!("burst = {burst} must be between 1 and 10000000"),
            );
        }
        let key = self.quota_key(&at("key"), q.key.as_ref());
        let max_keys = q.max_keys.unwrap_or(DEFAULT_QUOTA_MAX_KEYS);
        if !(16..=10_000_000).contains(&max_keys) {
            self.error(
                Code::InvalidValue,
                at("max_keys"),
                format!("max_keys = {max_keys} must be between 16 and 10000000"),
            );
        }
        let fleet = match q.scope.as_deref().unwrap_or("local") {
            "local" => {
                for (field, given) in [
                    (
                        "algorithm",
                        q.algorithm.as_ref().map(|a| a != "token_bucket"),
                    ),
                    ("on_store_error", q.on_store_error.as_ref().map(|_| true)),
                    ("deadline", q.deadline.as_ref().map(|_| true)),
                    ("pre_allowance", q.pre_allowance.map(|_| true)),
                ] {
                    if given == Some(true) {
                        self.error(
                            Code::UnexpectedOption,
                            at(field),
                            format!("{field} applies to scope = \"fleet\"; a local quota is a token bucket this process keeps"),
                        );
                    }
                }
                None
            }
            "fleet" => self.fleet_quota(base, q),
            other => {
                self.error(
                    Code::InvalidValue,
                    at("scope"),
                    format!("scope '{other}' is not local or fleet"),
                );
                None
            }
        };
        let advertise = match q.headers.as_deref().unwrap_or("refusals") {
            "refusals" => false,
            "always" => true,
            other => {
                self.error(
                    Code::InvalidValue,
                    at("headers"),
                    format!("headers '{other}' is not refusals (RateLimit headers on 429s) or always (on every answer)"),
                );
                false
            }
        };
        if self.diagnostics.len() != before {
            return None;
        }
        Some(QuotaSpec {
            rate: q.rate,
            per: per?,
            burst,
            key: key?,
            max_keys,
            fleet,
            advertise,
        })
    }

    /// `quota.key`: a source or a list of them.
    fn quota_key(
        &mut self,
        path: &str,
        key: Option<&crate::config::FileQuotaKey>,
    ) -> Option<Vec<QuotaKey>> {
        use crate::config::FileQuotaKey;
        let (sources, listed): (Vec<&str>, bool) = match key {
            None => (vec!["client_ip"], false),
            Some(FileQuotaKey::One(one)) => (vec![one.as_str()], false),
            Some(FileQuotaKey::Many(many)) => (many.iter().map(String::as_str).collect(), true),
        };
        if sources.is_empty() {
            self.error(
                Code::InvalidValue,
                path,
                "an empty key: write key = \"route\" for one bucket for the route",
            );
            return None;
        }
        let mut keys = Vec::new();
        let mut ok = true;
        for (n, source) in sources.iter().enumerate() {
            let at = if listed {
                format!("{path}[{n}]")
            } else {
                path.to_owned()
            };
            let parsed = match *source {
                "client_ip" => Some(QuotaKey::ClientIp),
                "subject" => Some(QuotaKey::Subject),
                "route" => None,
                other => match other
                    .strip_prefix("header:")
                    .map(|n| HeaderName::from_bytes(n.as_bytes()))
                {
                    Some(Ok(name)) => Some(QuotaKey::Header(name)),
                    _ => {
                        self.error(
                            Code::InvalidValue,
                            at,
                            format!("quota key '{other}' is not client_ip, header:NAME, subject or route"),
                        );
                        ok = false;
                        continue;
                    }
                },
            };
            match parsed {
                Some(k) if keys.contains(&k) => {
                    self.error(
                        Code::InvalidValue,
                        at,
                        format!("quota key '{source}' is named twice"),
                    );
                    ok = false;
                }
                Some(k) => keys.push(k),
                None if sources.len() > 1 => {
                    self.error(
                        Code::InvalidValue,
                        at,
                        "'route' is the whole route's one bucket: it joins no other source (every key is within its route)",
                    );
                    ok = false;
                }
                None => {}
            }
        }
        ok.then_some(keys)
    }

    /// `scope = "fleet"`: the store, the algorithm, what a store error
    /// decides, the deadline and the pre-allowance.
    fn fleet_quota(&mut self, base: &str, q: &crate::config::FileQuota) -> Option<FleetQuotaSpec> {
        let at = |field: &str| format!("{base}.{field}");
        if !self.limit_store {
            self.error(
                Code::MissingLimitStore,
                at("scope"),
                "scope = \"fleet\" counts in a shared store: add [limits] store = { redis = { url = \"redis://…\" } }",
            );
        }
        let algorithm = match q.algorithm.as_deref().unwrap_or("token_bucket") {
            "token_bucket" => Some(QuotaAlgorithm::TokenBucket),
            "fixed_window" => {
                if q.burst.is_some() {
                    self.error(
                        Code::UnexpectedOption,
                        at("burst"),
                        "a fixed window admits rate per per: burst applies to token_bucket",
                    );
                }
                Some(QuotaAlgorithm::FixedWindow)
            }
            other => {
                self.error(
                    Code::InvalidValue,
                    at("algorithm"),
                    format!("algorithm '{other}' is not token_bucket or fixed_window"),
                );
                None
            }
        };
        let on_store_error = match q.on_store_error.as_deref().unwrap_or("local") {
            "local" => Some(OnStoreError::Local),
            "allow" => Some(OnStoreError::Allow),
            "deny" => Some(OnStoreError::Deny),
            other => {
                self.error(
                    Code::InvalidValue,
                    at("on_store_error"),
                    format!("on_store_error '{other}' is not local, allow or deny"),
                );
                None
            }
        };
        let deadline = match &q.deadline {
            Some(text) => self.duration(at("deadline"), text),
            None => Some(DEFAULT_FLEET_DEADLINE),
        };
        if let Some(d) = deadline {
            if d < Duration::from_millis(1) || d > Duration::from_secs(1) {
                self.error(
                    Code::InvalidDuration,
                    at("deadline"),
                    "deadline must be between 1ms and 1s: a request never waits longer on the store",
                );
            }
        }
        let share = q.pre_allowance.unwrap_or(DEFAULT_PRE_ALLOWANCE);
        if !(0.0..=0.5).contains(&share) || share.is_nan() {
            self.error(
                Code::InvalidValue,
                at("pre_allowance"),
                format!("pre_allowance = {share} must be between 0 (every request asks the store) and 0.5"),
            );
        }
        let limit = match algorithm {
            Some(QuotaAlgorithm::FixedWindow) => q.rate,
            _ => q.burst.unwrap_or(q.rate),
        };
        // At least one token per round trip; never more than the bucket.
        let batch = ((f64::from(limit) * share).floor() as u32).clamp(1, limit.max(1));
        Some(FleetQuotaSpec {
            algorithm: algorithm?,
            on_store_error: on_store_error?,
            deadline: deadline?,
            batch,
        })
    }

    /// `routes[i].retry`; `None` after reporting what is wrong.
    pub(super) fn retry(&mut self, base: &str, r: &crate::config::FileRetry) -> Option<RetrySpec> {
        let at = |field: &str| format!("{base}.{field}");
        let before = self.diagnostics.len();
        let attempts = r.attempts.unwrap_or(DEFAULT_RETRY_ATTEMPTS);
        if !(2..=10).contains(&attempts) {
            self.error(
                Code::InvalidValue,
                at("attempts"),
                format!(
                    "attempts = {attempts} must be between 2 and 10 (the first attempt included)"
                ),
            );
        }
        let mut on = RetryOn::default();
        let conditions = r.on.clone().unwrap_or_else(|| {
            vec![
                "connect_failure".into(),
                "reset".into(),
                "gateway_error".into(),
            ]
        });
        for (k, condition) in conditions.iter().enumerate() {
            match condition.as_str() {
                "connect_failure" => on.connect_failure = true,
                "refused" => on.refused = true,
                "reset" => on.reset = true,
                "timeout" => on.timeout = true,
                "gateway_error" => on.gateway_error = true,
                "5xx" => on.server_error = true,
                other if other.starts_with("grpc:") => {
                    let name = &other["grpc:".len()..];
                    match RETRYABLE_GRPC.iter().find(|c| c.name() == name) {
                        Some(code) => on.grpc |= code.bit(),
                        None => self.error(
                            Code::InvalidValue,
                            format!("{base}.on[{k}]"),
                            format!(
                                "'{other}' is not a retryable gRPC status: grpc:{}",
                                RETRYABLE_GRPC.map(|c| c.name()).join(", grpc:")
                            ),
                        ),
                    }
                }
                other => match other.parse::<u16>() {
                    Ok(status) if (400..=599).contains(&status) => on.statuses.push(status),
                    _ => self.error(
                        Code::InvalidValue,
                        format!("{base}.on[{k}]"),
                        format!("'{other}' is not connect_failure, refused, reset, timeout, gateway_error, 5xx, grpc:CODE or a status from 400 to 599"),
                    ),
                },
            }
        }
        let per_try_timeout = r
            .per_try_timeout
            .as_ref()
            .and_then(|t| self.duration(at("per_try_timeout"), t));
        let backoff = r.backoff.as_ref();
        let backoff_base = match backoff.and_then(|b| b.base.as_ref()) {
            Some(t) => self.duration(format!("{base}.backoff.base"), t),
            None => Some(DEFAULT_BACKOFF_BASE),
        };
        let backoff_max = match backoff.and_then(|b| b.max.as_ref()) {
            Some(t) => self.duration(format!("{base}.backoff.max"), t),
            None => Some(DEFAULT_BACKOFF_MAX.max(backoff_base.unwrap_or_default())),
        };
        if let (Some(b), Some(m)) = (backoff_base, backoff_max) {
            if m < b {
                self.error(
                    Code::InvalidDuration,
                    format!("{base}.backoff.max"),
                    format!("backoff.max {m:?} is shorter than backoff.base {b:?}"),
                );
            }
        }
        let budget = match &r.budget {
            None => BudgetSpec::default(),
            Some(crate::config::FileBudget::Ratio(ratio)) => BudgetSpec {
                ratio: *ratio,
                ..BudgetSpec::default()
            },
            Some(crate::config::FileBudget::Table(t)) => BudgetSpec {
                ratio: t.ratio.unwrap_or(BudgetSpec::default().ratio),
                min_per_second: t
                    .min_per_second
                    .unwrap_or(BudgetSpec::default().min_per_second),
            },
        };
        if !(0.0..=1.0).contains(&budget.ratio) {
            self.error(
                Code::InvalidValue,
                at("budget"),
                format!("budget ratio {} must be between 0 and 1", budget.ratio),
            );
        }
        if budget.min_per_second > 10_000 {
            self.error(
                Code::InvalidValue,
                at("budget"),
                format!(
                    "budget min_per_second {} must be at most 10000",
                    budget.min_per_second
                ),
            );
        }
        let methods = match &r.methods {
            None => [
                Method::GET,
                Method::HEAD,
                Method::OPTIONS,
                Method::TRACE,
                Method::PUT,
                Method::DELETE,
            ]
            .to_vec(),
            Some(methods) => {
                let mut out = Vec::new();
                for (k, m) in methods.iter().enumerate() {
                    out.extend(self.method(format!("{base}.methods[{k}]"), m));
                }
                out
            }
        };
        let max_replay_body = r.max_replay_body.unwrap_or(DEFAULT_MAX_REPLAY_BODY);
        if max_replay_body > 16 * 1024 * 1024 {
            self.error(
                Code::InvalidValue,
                at("max_replay_body"),
                format!("max_replay_body = {max_replay_body} must be at most 16 MiB (16777216)"),
            );
        }
        if self.diagnostics.len() != before {
            return None;
        }
        Some(RetrySpec {
            attempts,
            on,
            per_try_timeout,
            backoff_base: backoff_base?,
            backoff_max: backoff_max?,
            budget,
            methods,
            max_replay_body,
        })
    }

    /// `routes[i].hedge`.
    pub(super) fn hedge(&mut self, base: &str, h: &crate::config::FileHedge) -> Option<HedgeSpec> {
        let delay = self.duration(format!("{base}.delay"), &h.delay);
        let max_extra = h.max_extra.unwrap_or(1);
        if !(1..=3).contains(&max_extra) {
            self.error(
                Code::InvalidValue,
                format!("{base}.max_extra"),
                format!("max_extra = {max_extra} must be between 1 and 3"),
            );
            return None;
        }
        Some(HedgeSpec {
            delay: delay?,
            max_extra,
        })
    }
}
