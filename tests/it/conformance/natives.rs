//! The suite's helpers (`conformance/utils/…` of kubernetes-sigs/gateway-api
//! at 4564255a), written again here against what cutover produces: the
//! status documents `cutover import gateway-api` prints, and answers from
//! the real binary serving the imported configuration. Each helper keeps
//! the Go helper's semantics (which fields it compares, what counts as a
//! match); the Go test bodies call them as written.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::Value;

use super::interp::{go_eq, Flow, Interp, Natives, V};
use super::world::{canonical_header, Pki, Pods};
use crate::harness::Gateway;

pub const CONTROLLER: &str = "cutover.dev/gateway";
const GROUP: &str = "gateway.networking.k8s.io";

/// One assertion or replayed case and how it ended.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub what: String,
    pub error: Option<String>,
}

/// What one conformance test showed.
#[derive(Debug, Default)]
pub struct Report {
    pub statuses: Vec<Outcome>,
    pub cases: Vec<Outcome>,
    /// Requests answered by a backend where the suite expects a refusal.
    pub served_refused: Vec<String>,
    /// Helpers this harness does not replay (gRPC, TCP, UDP, …), and
    /// other reasons a part of the test was not held.
    pub not_held: Vec<String>,
    /// `t.Error`/`t.Fatal` outside any assertion or case.
    pub failures: Vec<String>,
}

/// A subtest being run: a case of its own when it makes requests by
/// hand (`CaptureRoundTrip`) instead of through an assertion helper.
#[derive(Default)]
struct Frame {
    name: String,
    custom_traffic: bool,
    failed: Option<String>,
}

/// Everything one test's helpers need.
pub struct Run {
    pub statuses: Vec<Value>,
    pub resources: Vec<Value>,
    /// `namespace/name` of each Gateway → its address.
    pub addresses: HashMap<String, IpAddr>,
    pub pki: Arc<Pki>,
    pub pods: Arc<Pods>,
    pub handle: tokio::runtime::Handle,
    /// The folder and configuration to serve, started at the first
    /// request.
    pub serve: Option<(tempfile::TempDir, String)>,
    pub gateway: Option<Result<Gateway, String>>,
    pub report: Report,
    frames: Vec<Frame>,
    /// Which test is running (for messages).
    pub test: String,
    /// The supported features this import claims (`SupportedFeatures.Has`).
    pub features: Vec<String>,
}

fn s(v: &V) -> String {
    v.str()
}

/// A fatal stop that is not a failure: the part cannot be held here.
pub const NOT_HELD: &str = "not held here: ";

impl Run {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        test: String,
        statuses: Vec<Value>,
        resources: Vec<Value>,
        addresses: HashMap<String, IpAddr>,
        pki: Arc<Pki>,
        pods: Arc<Pods>,
        handle: tokio::runtime::Handle,
        serve: Option<(tempfile::TempDir, String)>,
        features: Vec<String>,
    ) -> Run {
        Run {
            statuses,
            resources,
            addresses,
            pki,
            pods,
            handle,
            serve,
            gateway: None,
            report: Report::default(),
            frames: vec![Frame {
                name: test.clone(),
                ..Frame::default()
            }],
            test,
            features,
        }
    }

    pub fn begin(&mut self, name: String) {
        self.frames.push(Frame {
            name,
            ..Frame::default()
        });
    }

    /// Ends a (sub)test; `fatal` is how its body ended.
    pub fn end(&mut self, fatal: Option<String>) {
        let Some(mut frame) = self.frames.pop() else {
            return;
        };
        match fatal {
            Some(m) if m.starts_with(NOT_HELD) => {
                self.report
                    .not_held
                    .push(format!("{}: {}", frame.name, &m[NOT_HELD.len()..]))
            }
            Some(m) if frame.failed.is_none() => frame.failed = Some(m),
            _ => {}
        }
        if frame.custom_traffic {
            self.report.cases.push(Outcome {
                what: format!("{} (requests made by the test)", frame.name),
                error: frame.failed.take(),
            });
        } else if let Some(failed) = frame.failed {
            self.report
                .failures
                .push(format!("{}: {failed}", frame.name));
        }
    }

    fn frame(&mut self) -> &mut Frame {
        if self.frames.is_empty() {
            self.frames.push(Frame::default());
        }
        let last = self.frames.len() - 1;
        &mut self.frames[last]
    }

    fn status(&mut self, what: String, result: Result<(), String>) -> Result<V, Flow> {
        self.report.statuses.push(Outcome {
            what,
            error: result.err(),
        });
        Ok(V::Nil)
    }

    /// One replayed case. The same expectation asked again (a loop that
    /// sends it 500 times to measure a distribution) is one case, failed
    /// if any of its tries failed.
    fn case(&mut self, what: String, result: Result<(), String>) -> Result<V, Flow> {
        match self.report.cases.iter_mut().find(|o| o.what == what) {
            Some(seen) => {
                if seen.error.is_none() {
                    seen.error = result.err();
                }
            }
            None => self.report.cases.push(Outcome {
                what,
                error: result.err(),
            }),
        }
        Ok(V::Nil)
    }

    // ---- statuses ----------------------------------------------------

    fn doc(&self, kind: &str, nn: &V) -> Option<&Value> {
        let (ns, name) = (s(&nn.field("Namespace")), s(&nn.field("Name")));
        self.statuses.iter().find(|d| {
            d["kind"] == kind
                && d["metadata"]["name"] == name.as_str()
                && d["metadata"]["namespace"] == ns.as_str()
        })
    }

    fn gateway_status(&self, nn: &V) -> Result<&Value, String> {
        self.doc("Gateway", nn)
            .map(|d| &d["status"])
            .ok_or_else(|| format!("no status for Gateway {}", nn_str(nn)))
    }

    fn route_parents(&self, kind: &str, nn: &V) -> Result<Vec<Value>, String> {
        match self.doc(kind, nn) {
            Some(d) => Ok(d["status"]["parents"]
                .as_array()
                .cloned()
                .unwrap_or_default()),
            None => Err(format!("no status for {kind} {}", nn_str(nn))),
        }
    }

    /// `XRouteMustHaveCondition`: a parent naming the Gateway has it.
    fn route_condition(&self, kind: &str, route: &V, gw: &V, condition: &V) -> Result<(), String> {
        let parents = self.route_parents(kind, route)?;
        let (gns, gname) = (s(&gw.field("Namespace")), s(&gw.field("Name")));
        for p in &parents {
            let r = &p["parentRef"];
            let ns_ok = r
                .get("namespace")
                .and_then(Value::as_str)
                .is_none_or(|n| n == gns);
            if r["name"] == gname.as_str() && ns_ok && find_condition(&p["conditions"], condition) {
                return Ok(());
            }
        }
        Err(format!(
            "{kind} {} under {}: no condition {}; has {}",
            nn_str(route),
            nn_str(gw),
            condition_str(condition),
            conditions_str(parents.iter().map(|p| &p["conditions"]))
        ))
    }

    fn no_accepted_parents(&self, kind: &str, route: &V) -> Result<(), String> {
        let parents = self.route_parents(kind, route)?;
        if parents.is_empty() {
            return Ok(());
        }
        if parents.len() > 1 {
            return Err(format!(
                "{kind} {} has {} parents",
                nn_str(route),
                parents.len()
            ));
        }
        let accepted_false = cond(&[("Accepted", "False", "")]);
        if conditions_match(&accepted_false, &parents[0]["conditions"]) {
            Ok(())
        } else {
            Err(format!(
                "{kind} {}: expected Accepted=False, has {}",
                nn_str(route),
                conditions_str([&parents[0]["conditions"]].into_iter())
            ))
        }
    }

    /// `parentsForRouteMatch`.
    fn route_has_parents(
        &self,
        kind: &str,
        route: &V,
        expected: &V,
        namespace_required: bool,
    ) -> Result<(), String> {
        let actual = self.route_parents(kind, route)?;
        for e in expected.list() {
            let er = e.field("ParentRef");
            let matched = actual.iter().any(|a| {
                let ar = &a["parentRef"];
                let str_of =
                    |v: &Value, k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
                if a["controllerName"] != s(&e.field("ControllerName")).as_str() {
                    return false;
                }
                if str_of(ar, "group") != opt(&er.field("Group"))
                    || str_of(ar, "kind") != opt(&er.field("Kind"))
                {
                    return false;
                }
                if str_of(ar, "name").unwrap_or_default() != s(&er.field("Name")) {
                    return false;
                }
                let ans = str_of(ar, "namespace");
                if ans != opt(&er.field("Namespace")) && (namespace_required || ans.is_some()) {
                    return false;
                }
                let expected: Vec<V> = e.field("Conditions").list();
                conditions_match(&expected, &a["conditions"])
            });
            if !matched {
                return Err(format!(
                    "{kind} {}: no parent matching {} {:?} with {}; parents: {}",
                    nn_str(route),
                    s(&er.field("Name")),
                    opt(&er.field("SectionName")),
                    expected_conditions_str(&e.field("Conditions")),
                    serde_json::to_string(&actual).unwrap_or_default()
                ));
            }
        }
        Ok(())
    }

    /// `RoutesAndParentMustBeAccepted`.
    fn routes_and_parent_accepted(
        &self,
        resource: &V,
        kind_of_route: &str,
        routes: &[V],
    ) -> Result<(), String> {
        let nn = resource.field("NamespacedName");
        let gk = resource.field("GroupKind");
        let parent_kind = match s(&gk.field("Kind")) {
            k if k.is_empty() => "Gateway".to_owned(),
            k => k,
        };
        let ns = s(&nn.field("Namespace"));
        for route in routes {
            let namespace_required = s(&route.field("Namespace")) != ns;
            let listeners = resource.field("ListenerNames").list();
            let parents: Vec<V> = listeners
                .iter()
                .map(|l| {
                    let mut parent_ref = BTreeMap::new();
                    parent_ref.insert("Group".into(), V::Str(GROUP.into()));
                    parent_ref.insert("Kind".into(), V::Str(parent_kind.clone()));
                    parent_ref.insert("Name".into(), nn.field("Name"));
                    parent_ref.insert("Namespace".into(), V::Str(ns.clone()));
                    parent_ref.insert("SectionName".into(), l.clone());
                    let mut p = BTreeMap::new();
                    p.insert(
                        "ParentRef".into(),
                        V::Struct("ParentReference".into(), parent_ref),
                    );
                    p.insert("ControllerName".into(), V::Str(CONTROLLER.into()));
                    p.insert(
                        "Conditions".into(),
                        V::List(cond(&[("Accepted", "True", "Accepted")])),
                    );
                    V::Struct("RouteParentStatus".into(), p)
                })
                .collect();
            self.route_has_parents(kind_of_route, route, &V::List(parents), namespace_required)?;
        }
        if matches!(parent_kind.as_str(), "Gateway" | "ListenerSet") {
            self.owner_listeners_have_conditions(
                &parent_kind,
                &nn,
                &cond(&[
                    ("ResolvedRefs", "True", ""),
                    ("Accepted", "True", ""),
                    ("Programmed", "True", ""),
                ]),
                &[],
            )
        } else {
            Err(format!("{parent_kind} parents are not imported"))
        }
    }

    /// `GatewayListenersMustHaveConditions`.
    fn listeners_have_conditions(
        &self,
        gw: &V,
        conditions: &[V],
        names: &[String],
    ) -> Result<(), String> {
        self.owner_listeners_have_conditions("Gateway", gw, conditions, names)
    }

    /// `GatewayListenersMustHaveConditions` and its ListenerSet twin.
    fn owner_listeners_have_conditions(
        &self,
        kind: &str,
        gw: &V,
        conditions: &[V],
        names: &[String],
    ) -> Result<(), String> {
        let status = self
            .doc(kind, gw)
            .map(|d| &d["status"])
            .ok_or_else(|| format!("no status for {kind} {}", nn_str(gw)))?;
        let listeners = status["listeners"].as_array().cloned().unwrap_or_default();
        let mut unmatched: Vec<&String> = names.iter().collect();
        for c in conditions {
            for l in &listeners {
                let name = l["name"].as_str().unwrap_or_default();
                if !names.is_empty() && !names.iter().any(|n| n == name) {
                    continue;
                }
                if !find_condition(&l["conditions"], c) {
                    return Err(format!(
                        "Gateway {} listener {name}: no {}; has {}",
                        nn_str(gw),
                        condition_str(c),
                        conditions_str([&l["conditions"]].into_iter())
                    ));
                }
                unmatched.retain(|n| n.as_str() != name);
            }
        }
        if unmatched.is_empty() {
            Ok(())
        } else {
            Err(format!("Gateway {}: no listener {unmatched:?}", nn_str(gw)))
        }
    }

    /// `gatewayListenersMatch`.
    fn gateway_listeners_match(&self, gw: &V, expected: &V) -> Result<(), String> {
        self.owner_listeners_match("Gateway", gw, expected)
    }

    /// `gatewayListenersMatch` and `listenerSetListenersMatch`.
    fn owner_listeners_match(&self, kind: &str, gw: &V, expected: &V) -> Result<(), String> {
        let status = self
            .doc(kind, gw)
            .map(|d| &d["status"])
            .ok_or_else(|| format!("no status for {kind} {}", nn_str(gw)))?;
        let actual = status["listeners"].as_array().cloned().unwrap_or_default();
        let expected = expected.list();
        if expected.len() != actual.len() {
            return Err(format!(
                "Gateway {}: {} listeners in status, {} expected: {}",
                nn_str(gw),
                actual.len(),
                expected.len(),
                serde_json::to_string(&actual).unwrap_or_default()
            ));
        }
        for e in &expected {
            let name = s(&e.field("Name"));
            let Some(a) = actual.iter().find(|a| a["name"] == name.as_str()) else {
                return Err(format!(
                    "Gateway {}: no listener {name} in status",
                    nn_str(gw)
                ));
            };
            let kinds = e.field("SupportedKinds").list();
            let actual_kinds = a["supportedKinds"].as_array().cloned().unwrap_or_default();
            if kinds.is_empty() && !actual_kinds.is_empty() {
                return Err(format!(
                    "listener {name}: supportedKinds {actual_kinds:?}, none expected"
                ));
            }
            for k in &kinds {
                let group = opt(&k.field("Group")).unwrap_or_else(|| GROUP.into());
                let kind = s(&k.field("Kind"));
                let found = actual_kinds.iter().any(|a| {
                    a.get("group").and_then(Value::as_str).unwrap_or(GROUP) == group
                        && a["kind"] == kind.as_str()
                });
                if !found {
                    return Err(format!(
                        "listener {name}: supportedKinds lacks {group}/{kind}: {actual_kinds:?}"
                    ));
                }
            }
            let attached = e.field("AttachedRoutes").int();
            if a["attachedRoutes"].as_i64().unwrap_or(0) != attached {
                return Err(format!(
                    "listener {name}: attachedRoutes {}, expected {attached}",
                    a["attachedRoutes"]
                ));
            }
            let conditions = e.field("Conditions").list();
            if !conditions_match(&conditions, &a["conditions"]) {
                return Err(format!(
                    "listener {name}: expected {}, has {}",
                    expected_conditions_str(&V::List(conditions)),
                    conditions_str([&a["conditions"]].into_iter())
                ));
            }
        }
        Ok(())
    }

    fn kubernetes(
        &mut self,
        interp: &mut Interp,
        name: &str,
        args: Vec<V>,
    ) -> Option<Result<V, Flow>> {
        let arg = |i: usize| args.get(i).cloned().unwrap_or(V::Nil);
        let rest = |i: usize| args.get(i..).map(<[V]>::to_vec).unwrap_or_default();
        let route_kind = |name: &str| {
            for k in ["HTTPRoute", "TLSRoute", "TCPRoute", "UDPRoute", "GRPCRoute"] {
                if name.starts_with(k) {
                    return k;
                }
            }
            "HTTPRoute"
        };
        Some(match name {
            "NewGatewayRef" => {
                let mut names = rest(1);
                if names.is_empty() {
                    names.push(V::Str(String::new()));
                }
                let mut f = BTreeMap::new();
                f.insert("NamespacedName".into(), arg(0));
                f.insert("ListenerNames".into(), V::List(names));
                f.insert("Name".into(), arg(0).field("Name"));
                f.insert("Namespace".into(), arg(0).field("Namespace"));
                Ok(V::Struct("GatewayRef".into(), f))
            }
            "NewResourceRef" => {
                let mut names = rest(2);
                if names.is_empty() {
                    names.push(V::Str(String::new()));
                }
                let mut f = BTreeMap::new();
                f.insert("GroupKind".into(), arg(0));
                f.insert("NamespacedName".into(), arg(1));
                f.insert("ListenerNames".into(), V::List(names));
                f.insert("Name".into(), arg(1).field("Name"));
                f.insert("Namespace".into(), arg(1).field("Namespace"));
                Ok(V::Struct("ResourceRef".into(), f))
            }
            "DumpEchoLogs" => {
                let (ns, name, since) = (s(&arg(1)), s(&arg(2)), arg(5).int());
                let pod = self.pods.pod(&ns, &name);
                let lines: Vec<V> = pod
                    .seen
                    .lock()
                    .map(|seen| {
                        seen.iter()
                            .filter(|r| r.at >= since)
                            .map(|r| {
                                V::Str(format!("Echoing back request made to {} to client", r.path))
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                Ok(V::Tuple(vec![V::List(lines), V::Nil]))
            }
            "GetTLSSecret" => {
                let nn = arg(1);
                let key = (s(&nn.field("Namespace")), s(&nn.field("Name")));
                Ok(match self.pki.secrets.get(&key) {
                    Some((cert, key)) => {
                        V::Tuple(vec![V::Str(cert.clone()), V::Str(key.clone()), V::Nil])
                    }
                    None => V::Tuple(vec![V::Nil, V::Nil, V::Str(format!("no Secret {key:?}"))]),
                })
            }
            "GetConfigMapData" => {
                let nn = arg(2);
                let key = (s(&nn.field("Namespace")), s(&nn.field("Name")));
                Ok(match self.pki.config_maps.get(&key) {
                    Some(ca) => V::Tuple(vec![
                        V::Map(vec![(V::Str("ca.crt".into()), V::Str(ca.clone()))]),
                        V::Nil,
                    ]),
                    None => V::Tuple(vec![V::Nil, V::Str(format!("no ConfigMap {key:?}"))]),
                })
            }
            "NamespacesMustBeReady" => {
                let namespaces: Vec<String> = arg(3).list().iter().map(s).collect();
                let mut result = Ok(());
                for d in &self.resources {
                    if d["kind"] != "Gateway" {
                        continue;
                    }
                    let ns = d["metadata"]["namespace"].as_str().unwrap_or_default();
                    let skip = d["metadata"]["annotations"]["gateway-api/skip-this-for-readiness"]
                        == "true";
                    if !namespaces.iter().any(|n| n == ns) || skip {
                        continue;
                    }
                    let nn = nn_value(ns, d["metadata"]["name"].as_str().unwrap_or_default());
                    let conditions = self
                        .gateway_status(&nn)
                        .map(|st| st["conditions"].clone())
                        .unwrap_or(Value::Null);
                    for c in cond(&[("Accepted", "True", ""), ("Programmed", "True", "")]) {
                        if result.is_ok() && !find_condition(&conditions, &c) {
                            result = Err(format!(
                                "Gateway {}: not {} (has {})",
                                nn_str(&nn),
                                condition_str(&c),
                                conditions_str([&conditions].into_iter())
                            ));
                        }
                    }
                }
                self.status(format!("NamespacesMustBeReady {namespaces:?}"), result)
            }
            "GatewayAndHTTPRoutesMustBeAccepted"
            | "GatewayAndUDPRoutesMustBeAccepted"
            | "GatewayAndTCPRoutesMustBeAccepted"
            | "GatewayAndRoutesMustBeAccepted"
            | "GatewayAndTLSRoutesMustBeAccepted" => {
                let gw_ref = arg(4);
                let (kind, use_port, routes) = match name {
                    "GatewayAndRoutesMustBeAccepted" => {
                        let kind = match arg(5) {
                            V::Struct(ty, _) => ty,
                            _ => "HTTPRoute".into(),
                        };
                        (kind, arg(6).truthy(), rest(7))
                    }
                    "GatewayAndUDPRoutesMustBeAccepted" => ("UDPRoute".into(), true, rest(5)),
                    "GatewayAndTCPRoutesMustBeAccepted" => ("TCPRoute".into(), true, rest(5)),
                    "GatewayAndTLSRoutesMustBeAccepted" => ("TLSRoute".into(), true, rest(5)),
                    _ => ("HTTPRoute".into(), true, rest(5)),
                };
                let result = self.routes_and_parent_accepted(&gw_ref, &kind, &routes);
                let nn = gw_ref.field("NamespacedName");
                let _ = self.status(
                    format!(
                        "{name} {} {}",
                        nn_str(&nn),
                        routes.iter().map(nn_str).collect::<Vec<_>>().join(",")
                    ),
                    result,
                );
                let addr = self.gateway_address(&gw_ref, use_port);
                if name == "GatewayAndTLSRoutesMustBeAccepted" {
                    let hostnames = routes
                        .last()
                        .map(|r| self.route_hostnames("TLSRoute", r))
                        .unwrap_or(V::Nil);
                    Ok(V::Tuple(vec![addr, hostnames]))
                } else {
                    Ok(addr)
                }
            }
            "WaitForGatewayAddress" => {
                let addr = self.gateway_address(&arg(3), true);
                Ok(V::Tuple(vec![addr, V::Nil]))
            }
            "RoutesAndParentMustBeAccepted" => {
                let kind = match arg(5) {
                    V::Struct(ty, _) => ty,
                    _ => "HTTPRoute".into(),
                };
                let routes = rest(6);
                let result = self.routes_and_parent_accepted(&arg(4), &kind, &routes);
                self.status(
                    format!("{name} {}", nn_str(&arg(4).field("NamespacedName"))),
                    result,
                )
            }
            "HTTPRouteMustHaveResolvedRefsConditionsTrue"
            | "TLSRouteMustHaveResolvedRefsConditionsTrue" => {
                let c = cond(&[("ResolvedRefs", "True", "ResolvedRefs")]).remove(0);
                let kind = route_kind(name);
                let result = self.route_condition(kind, &arg(3), &arg(4), &c);
                self.status(format!("{name} {}", nn_str(&arg(3))), result)
            }
            "HTTPRouteMustHaveRouteAcceptedConditionsTrue" => {
                let c = cond(&[("Accepted", "True", "Accepted")]).remove(0);
                let result = self.route_condition("HTTPRoute", &arg(3), &arg(4), &c);
                self.status(format!("{name} {}", nn_str(&arg(3))), result)
            }
            "HTTPRouteMustHaveResolvedRefsMustHaveBackendsNotFound" => {
                let c = cond(&[("ResolvedRefs", "False", "BackendNotFound")]).remove(0);
                let result = self.route_condition("HTTPRoute", &arg(3), &arg(4), &c);
                self.status(format!("{name} {}", nn_str(&arg(3))), result)
            }
            "HTTPRouteMustBeAcceptedAndResolved" => {
                let mut result = Ok(());
                for c in cond(&[
                    ("Accepted", "True", "Accepted"),
                    ("ResolvedRefs", "True", "ResolvedRefs"),
                ]) {
                    if result.is_ok() {
                        result = self.route_condition("HTTPRoute", &arg(3), &arg(4), &c);
                    }
                }
                self.status(format!("{name} {}", nn_str(&arg(3))), result)
            }
            "HTTPRouteMustHaveCondition"
            | "TLSRouteMustHaveCondition"
            | "TCPRouteMustHaveCondition"
            | "UDPRouteMustHaveCondition"
            | "GRPCRouteMustHaveCondition" => {
                let result = self.route_condition(route_kind(name), &arg(3), &arg(4), &arg(5));
                self.status(
                    format!("{name} {} {}", nn_str(&arg(3)), condition_str(&arg(5))),
                    result,
                )
            }
            "HTTPRouteMustHaveNoAcceptedParents"
            | "TLSRouteMustHaveNoAcceptedParents"
            | "TCPRouteMustHaveNoAcceptedParents"
            | "UDPRouteMustHaveNoAcceptedParents" => {
                let result = self.no_accepted_parents(route_kind(name), &arg(3));
                self.status(format!("{name} {}", nn_str(&arg(3))), result)
            }
            "HTTPRouteMustHaveParents"
            | "TLSRouteMustHaveParents"
            | "TCPRouteMustHaveParents"
            | "UDPRouteMustHaveParents" => {
                let kind = route_kind(name);
                let result = self.route_has_parents(kind, &arg(3), &arg(4), arg(5).truthy());
                let hostnames = self.route_hostnames(kind, &arg(3));
                let _ = self.status(format!("{name} {}", nn_str(&arg(3))), result);
                Ok(if name == "TLSRouteMustHaveParents" {
                    let mut spec = BTreeMap::new();
                    spec.insert("Hostnames".into(), hostnames);
                    let mut route = BTreeMap::new();
                    route.insert("Spec".into(), V::Struct("TLSRouteSpec".into(), spec));
                    V::Struct("TLSRoute".into(), route)
                } else {
                    V::Nil
                })
            }
            "RouteMustHaveParents" => {
                let kind = match arg(6) {
                    V::Struct(ty, _) => ty,
                    _ => "HTTPRoute".into(),
                };
                let result = self.route_has_parents(&kind, &arg(3), &arg(4), arg(5).truthy());
                self.status(format!("{name} {}", nn_str(&arg(3))), result)
            }
            "GatewayMustHaveCondition" => {
                let result = self.gateway_status(&arg(3)).and_then(|st| {
                    if find_condition(&st["conditions"], &arg(4)) {
                        Ok(())
                    } else {
                        Err(format!(
                            "Gateway {}: no {}; has {}",
                            nn_str(&arg(3)),
                            condition_str(&arg(4)),
                            conditions_str([&st["conditions"]].into_iter())
                        ))
                    }
                });
                self.status(
                    format!("{name} {} {}", nn_str(&arg(3)), condition_str(&arg(4))),
                    result,
                )
            }
            "GatewayStatusMustHaveListeners" => {
                let result = self.gateway_listeners_match(&arg(3), &arg(4));
                self.status(format!("{name} {}", nn_str(&arg(3))), result)
            }
            "GatewayListenersMustHaveConditions" => {
                let names: Vec<String> = rest(5).iter().map(s).collect();
                let result = self.listeners_have_conditions(&arg(3), &arg(4).list(), &names);
                self.status(format!("{name} {}", nn_str(&arg(3))), result)
            }
            "GatewayListenerMustHaveConditions" => {
                let names = vec![s(&arg(4))];
                let result = self.listeners_have_conditions(&arg(3), &arg(5).list(), &names);
                self.status(format!("{name} {} {}", nn_str(&arg(3)), s(&arg(4))), result)
            }
            "GatewayMustHaveZeroRoutes" => {
                let result = self.gateway_status(&arg(3)).and_then(|st| {
                    let listeners = st["listeners"].as_array().cloned().unwrap_or_default();
                    let zero = listeners.is_empty()
                        || (listeners.len() == 1
                            && listeners[0]["attachedRoutes"].as_i64() == Some(0));
                    if zero {
                        Ok(())
                    } else {
                        Err(format!(
                            "Gateway {}: listeners {listeners:?}",
                            nn_str(&arg(3))
                        ))
                    }
                });
                self.status(format!("{name} {}", nn_str(&arg(3))), result)
            }
            "BackendTLSPolicyMustHaveCondition" => {
                let policy = arg(3);
                let c = arg(5);
                let result = match self.doc("BackendTLSPolicy", &policy) {
                    Some(d) => {
                        let ancestors = d["status"]["ancestors"]
                            .as_array()
                            .cloned()
                            .unwrap_or_default();
                        if ancestors
                            .iter()
                            .any(|a| find_condition(&a["conditions"], &c))
                        {
                            Ok(())
                        } else {
                            Err(format!(
                                "BackendTLSPolicy {}: no {}; has {}",
                                nn_str(&policy),
                                condition_str(&c),
                                conditions_str(ancestors.iter().map(|a| &a["conditions"]))
                            ))
                        }
                    }
                    None => Err(format!(
                        "no status for BackendTLSPolicy {}",
                        nn_str(&policy)
                    )),
                };
                self.status(
                    format!("{name} {} {}", nn_str(&policy), condition_str(&c)),
                    result,
                )
            }
            "ListenerSetMustHaveCondition" => {
                let nn = arg(3);
                let c = arg(4);
                let result = match self.doc("ListenerSet", &nn) {
                    Some(d) if find_condition(&d["status"]["conditions"], &c) => Ok(()),
                    Some(d) => Err(format!(
                        "ListenerSet {}: no {}; has {}",
                        nn_str(&nn),
                        condition_str(&c),
                        conditions_str([&d["status"]["conditions"]].into_iter())
                    )),
                    None => Err(format!("no status for ListenerSet {}", nn_str(&nn))),
                };
                self.status(
                    format!("{name} {} {}", nn_str(&nn), condition_str(&c)),
                    result,
                )
            }
            "ListenerSetListenersMustHaveConditions" => {
                let names: Vec<String> = rest(5).iter().map(s).collect();
                let result = self.owner_listeners_have_conditions(
                    "ListenerSet",
                    &arg(3),
                    &arg(4).list(),
                    &names,
                );
                self.status(format!("{name} {} {names:?}", nn_str(&arg(3))), result)
            }
            "ListenerSetStatusMustHaveListeners" => {
                let result = self.owner_listeners_match("ListenerSet", &arg(3), &arg(4));
                self.status(format!("{name} {}", nn_str(&arg(3))), result)
            }
            "GatewayMustHaveAttachedListeners" => {
                let want = arg(4).int();
                let result = self.gateway_status(&arg(3)).and_then(|st| {
                    let got = st["attachedListenerSets"].as_i64().unwrap_or(0);
                    if got == want {
                        Ok(())
                    } else {
                        Err(format!(
                            "Gateway {}: attachedListenerSets {got}, expected {want}",
                            nn_str(&arg(3))
                        ))
                    }
                });
                self.status(format!("{name} {} {want}", nn_str(&arg(3))), result)
            }
            // `ConditionsHaveLatestObservedGeneration`: every condition
            // says it describes the resource's generation (1 unless the
            // input says otherwise).
            "GatewayMustHaveLatestConditions" | "HTTPRouteMustHaveLatestConditions" => {
                let kind = if name.starts_with("Gateway") {
                    "Gateway"
                } else {
                    "HTTPRoute"
                };
                let nn = arg(3);
                let generation = self
                    .resources
                    .iter()
                    .find(|d| {
                        d["kind"] == kind
                            && d["metadata"]["namespace"] == s(&nn.field("Namespace")).as_str()
                            && d["metadata"]["name"] == s(&nn.field("Name")).as_str()
                    })
                    .and_then(|d| d["metadata"]["generation"].as_i64())
                    .unwrap_or(1);
                let result = match self.doc(kind, &nn) {
                    None => Err(format!("no status for {kind} {}", nn_str(&nn))),
                    Some(d) => {
                        let lists: Vec<&Value> = if kind == "Gateway" {
                            vec![&d["status"]["conditions"]]
                        } else {
                            d["status"]["parents"]
                                .as_array()
                                .into_iter()
                                .flatten()
                                .map(|p| &p["conditions"])
                                .collect()
                        };
                        let stale: Vec<String> = lists
                            .iter()
                            .flat_map(|l| l.as_array().into_iter().flatten())
                            .filter(|c| c["observedGeneration"].as_i64() != Some(generation))
                            .map(|c| {
                                format!(
                                    "{}: observedGeneration {}",
                                    c["type"], c["observedGeneration"]
                                )
                            })
                            .collect();
                        if lists.iter().all(|l| l.as_array().is_none_or(Vec::is_empty)) {
                            Err(format!("{kind} {}: no conditions", nn_str(&nn)))
                        } else if stale.is_empty() {
                            Ok(())
                        } else {
                            Err(format!(
                                "{kind} {}: not generation {generation}: {stale:?}",
                                nn_str(&nn)
                            ))
                        }
                    }
                };
                self.status(format!("{name} {}", nn_str(&nn)), result)
            }
            "GatewayClassMustHaveLatestConditions"
            | "BackendTLSPolicyMustHaveLatestConditions"
            | "GWCMustHaveAcceptedConditionAny"
            | "GWCMustHaveAcceptedConditionTrue" => Err(Flow::Fatal(format!(
                "{NOT_HELD}{name}: GatewayClass statuses and objects fetched from a cluster"
            ))),
            _ => {
                let _ = interp;
                return None;
            }
        })
    }

    /// A Gateway's address as the suite's `WaitForGatewayAddress` gives
    /// it: the host, and the port of the first (or named) listener.
    fn gateway_address(&self, gw_ref: &V, use_port: bool) -> V {
        let nn = gw_ref.field("NamespacedName");
        let key = format!("{}/{}", s(&nn.field("Namespace")), s(&nn.field("Name")));
        let Some(ip) = self.addresses.get(&key) else {
            return V::Str(String::new());
        };
        if !use_port {
            return V::Str(ip.to_string());
        }
        let gateway = self.resources.iter().find(|d| {
            d["kind"] == "Gateway"
                && d["metadata"]["namespace"] == s(&nn.field("Namespace")).as_str()
                && d["metadata"]["name"] == s(&nn.field("Name")).as_str()
        });
        let listeners = gateway
            .and_then(|g| g["spec"]["listeners"].as_array().cloned())
            .unwrap_or_default();
        let wanted = gw_ref
            .field("ListenerNames")
            .list()
            .first()
            .map(s)
            .unwrap_or_default();
        let listener = listeners
            .iter()
            .find(|l| !wanted.is_empty() && l["name"] == wanted.as_str())
            .or(listeners.first());
        let port = listener.and_then(|l| l["port"].as_i64()).unwrap_or(80);
        V::Str(format!("{ip}:{port}"))
    }

    fn route_hostnames(&self, kind: &str, nn: &V) -> V {
        let doc = self.resources.iter().find(|d| {
            d["kind"] == kind
                && d["metadata"]["namespace"] == s(&nn.field("Namespace")).as_str()
                && d["metadata"]["name"] == s(&nn.field("Name")).as_str()
        });
        V::List(
            doc.and_then(|d| d["spec"]["hostnames"].as_array().cloned())
                .unwrap_or_default()
                .iter()
                .map(|h| V::Str(h.as_str().unwrap_or_default().to_owned()))
                .collect(),
        )
    }

    // ---- traffic -----------------------------------------------------

    fn ensure_served(&mut self) -> Result<(), String> {
        if self.gateway.is_none() {
            let Some((dir, config)) = self.serve.take() else {
                return Err("the import wrote no configuration".into());
            };
            self.gateway = Some(Gateway::try_start_in(dir, &config));
        }
        match &self.gateway {
            Some(Ok(_)) => Ok(()),
            Some(Err(e)) => Err(format!("the gateway did not start: {e}")),
            None => Err("not started".into()),
        }
    }

    /// `http.MakeRequest`: the request the suite's round tripper sends.
    fn make_request(&self, expected: &V, gw_addr: &str, protocol: &str, scheme: &str) -> V {
        let req = expected.field("Request");
        let method = match s(&req.field("Method")) {
            m if m.is_empty() => "GET".to_owned(),
            m => m,
        };
        let protocol = match s(&req.field("Protocol")) {
            p if p.is_empty() => protocol.to_owned(),
            p => p,
        };
        let full_path = s(&req.field("Path"));
        let (path, query) = match full_path.split_once('?') {
            Some((p, q)) => (p.to_owned(), q.to_owned()),
            None => (full_path, String::new()),
        };
        let mut url = BTreeMap::new();
        url.insert("Scheme".into(), V::Str(scheme.into()));
        url.insert("Host".into(), V::Str(calculate_host(gw_addr, scheme)));
        url.insert("Path".into(), V::Str(path));
        url.insert("RawQuery".into(), V::Str(query));
        let mut headers: Vec<(V, V)> = req
            .field("Headers")
            .map_entries()
            .into_iter()
            .map(|(k, v)| (k, V::List(vec![v])))
            .collect();
        let set: Vec<String> = expected
            .field("BackendSetResponseHeaders")
            .map_entries()
            .iter()
            .map(|(k, v)| format!("{}:{}", s(k), s(v)))
            .collect();
        headers.push((
            V::Str("X-Echo-Set-Header".into()),
            V::List(vec![V::Str(set.join(","))]),
        ));
        let mut f = BTreeMap::new();
        f.insert("Method".into(), V::Str(method));
        f.insert("Host".into(), req.field("Host"));
        f.insert("URL".into(), V::Struct("URL".into(), url));
        f.insert("Protocol".into(), V::Str(protocol));
        f.insert("Headers".into(), V::Map(headers));
        f.insert("UnfollowRedirect".into(), req.field("UnfollowRedirect"));
        f.insert("Body".into(), req.field("Body"));
        V::Struct("Request".into(), f)
    }

    /// `RoundTripper.CaptureRoundTrip`: (captured request, response, error).
    fn capture(&mut self, req: &V) -> V {
        if let Err(e) = self.ensure_served() {
            return V::Tuple(vec![V::Nil, V::Nil, V::Str(e)]);
        }
        let handle = self.handle.clone();
        let request = Outgoing::from(req);
        let answer = handle.block_on(async move {
            tokio::time::timeout(Duration::from_secs(10), request.send())
                .await
                .unwrap_or_else(|_| Err("request timed out".into()))
        });
        match answer {
            Ok(a) => {
                let (creq, cres) = a.values(&s(&req.field("Method")));
                V::Tuple(vec![creq, cres, V::Nil])
            }
            Err(e) => V::Tuple(vec![V::Nil, V::Nil, V::Str(e)]),
        }
    }

    /// `http.MakeRequestAndExpectEventuallyConsistentResponse` and its TLS
    /// form: one case.
    fn expect_response(&mut self, what: String, req: V, expected: &V) -> Result<V, Flow> {
        let mut result = Ok(());
        // The suite waits for 3 consecutive matches (a distribution of
        // weights or a mirror may differ between tries).
        for _ in 0..3 {
            let answer = self.capture(&req);
            let V::Tuple(parts) = &answer else {
                unreachable!()
            };
            if !parts[2].is_nil() {
                result = Err(format!("request failed: {}", s(&parts[2])));
                break;
            }
            if let Err(e) = compare_round_trip(&req, &parts[0], &parts[1], expected) {
                let refused = expected_codes(expected).iter().all(|c| *c != 200);
                if refused
                    && parts[1].field("StatusCode").int() == 200
                    && !s(&parts[0].field("Pod")).is_empty()
                {
                    self.report.served_refused.push(format!("{what}: {e}"));
                }
                result = Err(e);
                break;
            }
        }
        self.case(what, result)
    }

    fn http(&mut self, interp: &mut Interp, name: &str, args: Vec<V>) -> Option<Result<V, Flow>> {
        let arg = |i: usize| args.get(i).cloned().unwrap_or(V::Nil);
        Some(match name {
            "MakeRequest" => Ok(self.make_request(&arg(1), &s(&arg(2)), &s(&arg(3)), &s(&arg(4)))),
            "CalculateHost" => Ok(V::Str(calculate_host(&s(&arg(1)), &s(&arg(2))))),
            "MakeRequestAndExpectEventuallyConsistentResponse" => {
                let expected = arg(4);
                let req = self.make_request(&expected, &s(&arg(3)), "HTTP", "http");
                self.expect_response(case_name(&expected), req, &expected)
            }
            "WaitForConsistentResponse" => {
                let expected = arg(3);
                self.expect_response(case_name(&expected), arg(2), &expected)
            }
            "MakeRequestAndExpectFailure" => {
                let expected = arg(4);
                let req = self.make_request(&expected, &s(&arg(3)), "HTTP", "http");
                let answer = self.capture(&req);
                let V::Tuple(parts) = &answer else {
                    unreachable!()
                };
                let result = if !parts[2].is_nil() {
                    Err(format!("request failed: {}", s(&parts[2])))
                } else if parts[1].field("StatusCode").int() == 200 {
                    self.report.served_refused.push(case_name(&expected));
                    Err("answered 200; the suite expects a failure".into())
                } else {
                    Ok(())
                };
                self.case(format!("{} (must fail)", case_name(&expected)), result)
            }
            "CompareRoundTrip" => Ok(
                match compare_round_trip(&arg(1), &arg(2), &arg(3), &arg(4)) {
                    Ok(()) => V::Nil,
                    Err(e) => {
                        if std::env::var_os("CUTOVER_CONFORMANCE_DEBUG").is_some() {
                            eprintln!("{} :: CompareRoundTrip :: {e}", self.test);
                        }
                        V::Str(e)
                    }
                },
            ),
            "AwaitConvergence" => {
                let f = arg(2);
                for _ in 0..3 {
                    match interp.call_value(&f, vec![V::Int(0)], self) {
                        Ok(v) if v.truthy() => {}
                        Ok(_) => {
                            return Some(Err(Flow::Fatal(
                                "AwaitConvergence: the condition did not hold".into(),
                            )))
                        }
                        Err(f) => return Some(Err(f)),
                    }
                }
                Ok(V::Nil)
            }
            "AddEntropy" => Ok(V::Nil),
            "GetMirrorLogRegexp" => {
                let mut f = BTreeMap::new();
                f.insert(
                    "Needle".into(),
                    V::Str(format!(
                        "Echoing back request made to {} to client",
                        s(&arg(0))
                    )),
                );
                Ok(V::Struct("Regexp".into(), f))
            }
            "ExpectMirroredRequest" => {
                let mut f = BTreeMap::new();
                f.insert("Pods".into(), arg(3));
                f.insert("Path".into(), arg(4));
                Ok(V::Struct("MirrorWait".into(), f))
            }
            _ => return None,
        })
    }

    fn tls(&mut self, name: &str, args: Vec<V>) -> Option<Result<V, Flow>> {
        let arg = |i: usize| args.get(i).cloned().unwrap_or(V::Nil);
        Some(match name {
            "MakeTLSRequestAndExpectEventuallyConsistentResponse"
            | "MakeTLSRequestAndExpectEventuallyConsistentFailureResponse" => {
                let expected = arg(8);
                let mut req = self.make_request(&expected, &s(&arg(3)), "HTTPS", "https");
                if let V::Struct(_, f) = &mut req {
                    f.insert("ServerName".into(), arg(7));
                    f.insert("ServerCertificate".into(), arg(4));
                    if !arg(5).is_nil() && !arg(6).is_nil() {
                        f.insert("ClientCertificate".into(), arg(5));
                        f.insert("ClientCertificateKey".into(), arg(6));
                    }
                }
                if name.ends_with("FailureResponse") {
                    let answer = self.capture(&req);
                    let V::Tuple(parts) = &answer else {
                        unreachable!()
                    };
                    let what = format!(
                        "{} over TLS to {} (must fail)",
                        case_name(&expected),
                        s(&arg(7))
                    );
                    let result = if parts[2].is_nil() {
                        self.report.served_refused.push(format!(
                            "{what}: answered {}",
                            parts[1].field("StatusCode").int()
                        ));
                        Err(format!(
                            "answered {}; the suite expects the request to fail",
                            parts[1].field("StatusCode").int()
                        ))
                    } else {
                        Ok(())
                    };
                    self.case(what, result)
                } else {
                    self.expect_response(
                        format!("{} over TLS to {}", case_name(&expected), s(&arg(7))),
                        req,
                        &expected,
                    )
                }
            }
            "MakeTLSConnectionAndExpectEventuallyConnectionRejection" => {
                let addr = s(&arg(2));
                let server_name = s(&arg(3));
                if let Err(e) = self.ensure_served() {
                    return Some(self.case(format!("TLS to {server_name} rejected"), Err(e)));
                }
                let handle = self.handle.clone();
                let outcome = handle.block_on(tls_rejected(addr, server_name.clone()));
                // Refused outright is not served (the suite fails it, as
                // it wants the handshake cut, but nothing got through).
                if let Err(e) = outcome.as_ref().map_err(String::as_str) {
                    if e.contains("handshake completed") {
                        self.report
                            .served_refused
                            .push(format!("TLS to {server_name}: {e}"));
                    }
                }
                self.case(format!("TLS connection to {server_name} rejected"), outcome)
            }
            _ => return None,
        })
    }

    fn weight(&mut self, interp: &mut Interp, name: &str, args: Vec<V>) -> Option<Result<V, Flow>> {
        let arg = |i: usize| args.get(i).cloned().unwrap_or(V::Nil);
        Some(match name {
            "NewFunctionBasedSender" => {
                let mut f = BTreeMap::new();
                f.insert("Send".into(), arg(0));
                Ok(V::Struct("Sender".into(), f))
            }
            "TestWeightedDistribution" => {
                let sender = arg(0).field("Send");
                let weights = arg(1).map_entries();
                let total = 500;
                let mut seen: BTreeMap<String, f64> = BTreeMap::new();
                for _ in 0..total {
                    let answer = match interp.call_value(&sender, Vec::new(), self) {
                        Ok(a) => a,
                        Err(f) => return Some(Err(f)),
                    };
                    let V::Tuple(parts) = answer else {
                        return Some(Ok(V::Str("the sender returned no pod".into())));
                    };
                    if !parts[1].is_nil() {
                        return Some(Ok(V::Str(format!(
                            "error while sending requests: {}",
                            s(&parts[1])
                        ))));
                    }
                    let pod = s(&parts[0]);
                    let backend = backend_of_pod(&pod);
                    if !weights.iter().any(|(k, _)| s(k) == backend) {
                        return Some(Ok(V::Str(format!(
                            "request was handled by an unexpected pod {pod:?}"
                        ))));
                    }
                    *seen.entry(backend).or_default() += 1.0;
                }
                let mut errors = Vec::new();
                let active = weights.iter().filter(|(_, w)| w.float() > 0.0).count();
                if seen.len() != active {
                    errors.push(format!(
                        "expected {active} backends to receive traffic, but got {}",
                        seen.len()
                    ));
                }
                for (backend, want) in &weights {
                    let got = seen.get(&s(backend)).copied().unwrap_or(0.0) / total as f64;
                    if (got - want.float()).abs() > 0.05 {
                        errors.push(format!("backend {:?} weighted traffic of {got} not within tolerance {} (+/-0.05)", s(backend), want.float()));
                    }
                }
                Ok(if errors.is_empty() {
                    V::Nil
                } else {
                    V::Str(errors.join("; "))
                })
            }
            _ => return None,
        })
    }
}

/// `extractBackendName`.
fn backend_of_pod(pod: &str) -> String {
    let parts: Vec<&str> = pod.split('-').collect();
    if parts.len() < 3 {
        return pod.to_owned();
    }
    parts[..parts.len() - 2].join("-")
}

fn case_name(expected: &V) -> String {
    let name = s(&expected.field("TestCaseName"));
    if !name.is_empty() {
        return name;
    }
    let req = expected.field("Request");
    let method = match s(&req.field("Method")) {
        m if m.is_empty() => "GET".to_owned(),
        m => m,
    };
    let outcome = match s(&expected.field("Backend")) {
        b if !b.is_empty() => format!("→ {b}"),
        _ => format!("→ {:?}", expected_codes(expected)),
    };
    let headers = if req.field("Headers").is_nil() {
        ""
    } else {
        " with headers"
    };
    format!(
        "{method} {}{}{headers} {outcome}",
        s(&req.field("Host")),
        s(&req.field("Path"))
    )
}

fn expected_codes(expected: &V) -> Vec<i64> {
    let response = expected.field("Response");
    let mut codes: Vec<i64> = response
        .field("StatusCodes")
        .list()
        .iter()
        .map(V::int)
        .collect();
    let code = response.field("StatusCode").int();
    if code != 0 && !codes.contains(&code) {
        codes.push(code);
    }
    if codes.is_empty() {
        codes.push(200);
    }
    codes
}

fn is_redirect(code: i64) -> bool {
    matches!(code, 300 | 301 | 302 | 303 | 304 | 305 | 307 | 308)
}

/// `http.CompareRoundTrip`, field by field.
fn compare_round_trip(req: &V, creq: &V, cres: &V, expected: &V) -> Result<(), String> {
    let codes = expected_codes(expected);
    let status = cres.field("StatusCode").int();
    let timeout = |c: i64| c == 408 || c == 504;
    if timeout(status) && codes.iter().any(|c| timeout(*c)) {
        return Ok(());
    }
    if !codes.contains(&status) {
        return Err(format!(
            "expected status code to be one of {codes:?}, got {status}"
        ));
    }
    let want_protocol = s(&expected.field("Response").field("Protocol"));
    if !want_protocol.is_empty() && want_protocol != s(&cres.field("Protocol")) {
        return Err(format!(
            "expected protocol to be {want_protocol}, got {}",
            s(&cres.field("Protocol"))
        ));
    }
    if status == 200 || status == 204 {
        let er = match expected.field("ExpectedRequest") {
            V::Nil => expected.field("Request"),
            v => v,
        };
        let er_req = match er.field("Request") {
            V::Nil => er.clone(),
            inner => inner,
        };
        let method = match s(&er_req.field("Method")) {
            m if m.is_empty() => "GET".to_owned(),
            m => m,
        };
        let host = s(&er_req.field("Host"));
        if !host.is_empty() && host != s(&creq.field("Host")) {
            return Err(format!(
                "expected host to be {host}, got {}",
                s(&creq.field("Host"))
            ));
        }
        if s(&er_req.field("Path")) != s(&creq.field("Path")) {
            return Err(format!(
                "expected path to be {}, got {}",
                s(&er_req.field("Path")),
                s(&creq.field("Path"))
            ));
        }
        if method != s(&creq.field("Method")) {
            return Err(format!(
                "expected method to be {method}, got {}",
                s(&creq.field("Method"))
            ));
        }
        if s(&expected.field("Namespace")) != s(&creq.field("Namespace")) {
            return Err(format!(
                "expected namespace to be {}, got {}",
                s(&expected.field("Namespace")),
                s(&creq.field("Namespace"))
            ));
        }
        let captured = lower_headers(&creq.field("Headers"));
        if !er_req.field("Headers").is_nil() {
            for (name, value) in er_req.field("Headers").map_entries() {
                match captured.get(&s(&name).to_lowercase()) {
                    None => {
                        return Err(format!(
                            "expected {} header to be set, actual headers: {captured:?}",
                            s(&name)
                        ))
                    }
                    Some(actual) if actual.join(",") != s(&value) => {
                        return Err(format!(
                            "expected {} header to be set to {}, got {}",
                            s(&name),
                            s(&value),
                            actual.join(",")
                        ))
                    }
                    _ => {}
                }
            }
        }
        let port = s(&er.field("HTTPPort"));
        if !port.is_empty() && port != s(&creq.field("HTTPPort")) {
            return Err(format!(
                "expected httpPort {port:?}, got {:?}",
                s(&creq.field("HTTPPort"))
            ));
        }
        let response = expected.field("Response");
        let answered = lower_headers(&cres.field("Headers"));
        let squash = |v: &str| {
            if response.field("IgnoreWhitespace").truthy() {
                v.replace(' ', "")
            } else {
                v.to_owned()
            }
        };
        for (name, values) in response.field("ValidHeaderValues").map_entries() {
            let Some(actual) = answered.get(&s(&name).to_lowercase()) else {
                return Err(format!(
                    "expected {} header to be set, actual headers: {answered:?}",
                    s(&name)
                ));
            };
            let actual = squash(&actual.join(","));
            if !values.list().iter().any(|v| squash(&s(v)) == actual) {
                return Err(format!(
                    "expected {} header to be set to one of {:?}, got {actual}",
                    s(&name),
                    values
                ));
            }
        }
        for (name, value) in response.field("Headers").map_entries() {
            let Some(actual) = answered.get(&s(&name).to_lowercase()) else {
                return Err(format!(
                    "expected {} header to be set, actual headers: {answered:?}",
                    s(&name)
                ));
            };
            if squash(&actual.join(",")) != squash(&s(&value)) {
                return Err(format!(
                    "expected {} header to be set to {}, got {}",
                    s(&name),
                    s(&value),
                    actual.join(",")
                ));
            }
        }
        for name in response.field("AbsentHeaders").list() {
            if let Some(v) = answered.get(&s(&name).to_lowercase()) {
                return Err(format!(
                    "expected {} header to not be set, got {v:?}",
                    s(&name)
                ));
            }
        }
        for name in er.field("AbsentHeaders").list() {
            if let Some(v) = captured.get(&s(&name).to_lowercase()) {
                return Err(format!(
                    "expected {} header to not be set, got {v:?}",
                    s(&name)
                ));
            }
        }
        let backend = s(&expected.field("Backend"));
        if !s(&creq.field("Pod")).starts_with(&backend) {
            return Err(format!(
                "expected pod name to start with {backend}, got {}",
                s(&creq.field("Pod"))
            ));
        }
        let sni = s(&er_req.field("SNI"));
        if !sni.is_empty() && sni != s(&creq.field("TLS").field("ServerName")) {
            return Err(format!(
                "expected SNI {sni:?}, got {:?}",
                s(&creq.field("TLS").field("ServerName"))
            ));
        }
        let client_cert = s(&er_req.field("ClientCert"));
        if !client_cert.is_empty()
            && !creq
                .field("TLS")
                .field("PeerCertificates")
                .list()
                .iter()
                .any(|c| s(c).trim() == client_cert.trim())
        {
            return Err("expected client certificate was not captured".into());
        }
    } else if is_redirect(status) {
        let want = expected.field("RedirectRequest");
        if want.is_nil() {
            return Ok(());
        }
        let got = cres.field("RedirectRequest");
        let mut want_host = s(&want.field("Host"));
        if want_host.is_empty() {
            want_host = s(&got.field("Host"));
        }
        let mut want_scheme = s(&want.field("Scheme"));
        if want_scheme.is_empty() {
            want_scheme = s(&req.field("URL").field("Scheme"));
        }
        let mut want_path = s(&want.field("Path"));
        if want_path.is_empty() {
            want_path = s(&req.field("URL").field("Path"));
        }
        if want_host != s(&got.field("Host")) {
            return Err(format!(
                "expected redirected hostname to be {want_host:?}, got {:?}",
                s(&got.field("Host"))
            ));
        }
        let got_port = s(&got.field("Port"));
        let want_port = s(&want.field("Port"));
        let got_scheme = s(&got.field("Scheme")).to_lowercase();
        if want_port.is_empty() {
            if got_scheme == "http" && got_port != "80" && !got_port.is_empty() {
                return Err(format!("for http scheme, expected redirected port to be 80 or not set, got {got_port:?}"));
            }
            if got_scheme == "https" && got_port != "443" && !got_port.is_empty() {
                return Err(format!("for https scheme, expected redirected port to be 443 or not set, got {got_port:?}"));
            }
        } else if want_port != got_port {
            return Err(format!(
                "expected redirected port to be {want_port:?}, got {got_port:?}"
            ));
        }
        if want_scheme != s(&got.field("Scheme")) {
            return Err(format!(
                "expected redirected scheme to be {want_scheme:?}, got {:?}",
                s(&got.field("Scheme"))
            ));
        }
        if want_path != s(&got.field("Path")) {
            return Err(format!(
                "expected redirected path to be {want_path:?}, got {:?}",
                s(&got.field("Path"))
            ));
        }
    }
    Ok(())
}

fn lower_headers(headers: &V) -> BTreeMap<String, Vec<String>> {
    headers
        .map_entries()
        .into_iter()
        .map(|(k, v)| (s(&k).to_lowercase(), v.list().iter().map(s).collect()))
        .collect()
}

/// `http.CalculateHost`: no port when the scheme implies it.
fn calculate_host(gw_addr: &str, scheme: &str) -> String {
    match gw_addr.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') || host.starts_with('[') => {
            if (scheme.eq_ignore_ascii_case("http") && port == "80")
                || (scheme.eq_ignore_ascii_case("https") && port == "443")
            {
                host.to_owned()
            } else {
                gw_addr.to_owned()
            }
        }
        _ => gw_addr.to_owned(),
    }
}

fn nn_value(ns: &str, name: &str) -> V {
    let mut f = BTreeMap::new();
    f.insert("Namespace".into(), V::Str(ns.into()));
    f.insert("Name".into(), V::Str(name.into()));
    V::Struct("NamespacedName".into(), f)
}

fn nn_str(nn: &V) -> String {
    let nn = match nn.field("NamespacedName") {
        V::Nil => nn.clone(),
        inner => inner,
    };
    format!("{}/{}", s(&nn.field("Namespace")), s(&nn.field("Name")))
}

fn opt(v: &V) -> Option<String> {
    match v {
        V::Nil => None,
        other => Some(s(other)),
    }
}

/// Conditions written as `(type, status, reason)`.
fn cond(items: &[(&str, &str, &str)]) -> Vec<V> {
    items
        .iter()
        .map(|(t, st, r)| {
            let mut f = BTreeMap::new();
            f.insert("Type".into(), V::Str((*t).into()));
            f.insert("Status".into(), V::Str((*st).into()));
            f.insert("Reason".into(), V::Str((*r).into()));
            V::Struct("Condition".into(), f)
        })
        .collect()
}

/// `findConditionInList`.
fn find_condition(conditions: &Value, expected: &V) -> bool {
    let (kind, status, reason) = (
        s(&expected.field("Type")),
        s(&expected.field("Status")),
        s(&expected.field("Reason")),
    );
    conditions.as_array().into_iter().flatten().any(|c| {
        c["type"] == kind.as_str()
            && (status.is_empty() || c["status"] == status.as_str())
            && (reason.is_empty() || c["reason"] == reason.as_str())
    })
}

/// `conditionsMatch`.
fn conditions_match(expected: &[V], actual: &Value) -> bool {
    let n = actual.as_array().map_or(0, Vec::len);
    n >= expected.len() && expected.iter().all(|c| find_condition(actual, c))
}

fn condition_str(c: &V) -> String {
    let reason = s(&c.field("Reason"));
    format!(
        "{}={}{}",
        s(&c.field("Type")),
        s(&c.field("Status")),
        if reason.is_empty() {
            String::new()
        } else {
            format!("/{reason}")
        }
    )
}

fn expected_conditions_str(list: &V) -> String {
    list.list()
        .iter()
        .map(condition_str)
        .collect::<Vec<_>>()
        .join(", ")
}

fn conditions_str<'a>(lists: impl Iterator<Item = &'a Value>) -> String {
    let mut out = Vec::new();
    for list in lists {
        for c in list.as_array().into_iter().flatten() {
            out.push(format!(
                "{}={}/{}",
                c["type"].as_str().unwrap_or_default(),
                c["status"].as_str().unwrap_or_default(),
                c["reason"].as_str().unwrap_or_default()
            ));
        }
    }
    if out.is_empty() {
        "none".into()
    } else {
        out.join(", ")
    }
}

impl Natives for Run {
    fn call(
        &mut self,
        interp: &mut Interp,
        pkg: &str,
        name: &str,
        args: Vec<V>,
    ) -> Option<Result<V, Flow>> {
        match pkg {
            "kubernetes" => self.kubernetes(interp, name, args),
            "http" => self.http(interp, name, args),
            "tls" => self.tls(name, args),
            "weight" => self.weight(interp, name, args),
            "tlog" => Some(Ok(V::Nil)),
            "grpc" | "tcp" | "udp" | "websocket" => match name {
                "RequestMetadata" | "Response" | "ExpectedResponse" => {
                    Some(Ok(V::Struct(name.into(), BTreeMap::new())))
                }
                _ => Some(Err(Flow::Fatal(format!(
                    "{NOT_HELD}{pkg}.{name}: this harness replays HTTP only"
                )))),
            },
            "require" | "assert" => {
                let fatal = pkg == "require";
                let arg = |i: usize| args.get(i).cloned().unwrap_or(V::Nil);
                let failed = match name.trim_end_matches('f') {
                    "NoError" => {
                        (!arg(1).is_nil()).then(|| format!("unexpected error: {:?}", arg(1)))
                    }
                    "Error" => arg(1).is_nil().then(|| "an error was expected".to_owned()),
                    "True" => (!arg(1).truthy()).then(|| "should be true".to_owned()),
                    "False" => arg(1).truthy().then(|| "should be false".to_owned()),
                    "Equal" | "EqualValues" => {
                        (!go_eq(&arg(1), &arg(2))).then(|| format!("{:?} != {:?}", arg(1), arg(2)))
                    }
                    "NotEqual" => {
                        go_eq(&arg(1), &arg(2)).then(|| format!("{:?} == {:?}", arg(1), arg(2)))
                    }
                    "Len" => {
                        let n = match arg(1) {
                            V::List(l) => l.len(),
                            V::Map(m) => m.len(),
                            V::Str(s) => s.len(),
                            _ => 0,
                        };
                        (n as i64 != arg(2).int())
                            .then(|| format!("length {n}, expected {}", arg(2).int()))
                    }
                    "Empty" => (!arg(1).is_nil()).then(|| format!("{:?} should be empty", arg(1))),
                    "NotEmpty" => arg(1).is_nil().then(|| "should not be empty".to_owned()),
                    "Nil" => (!arg(1).is_nil()).then(|| format!("{:?} should be nil", arg(1))),
                    "NotNil" => arg(1).is_nil().then(|| "should not be nil".to_owned()),
                    "Contains" => {
                        let hay = arg(1);
                        let needle = arg(2);
                        let found = match &hay {
                            V::Str(h) => h.contains(&s(&needle)),
                            V::List(l) => l.iter().any(|v| go_eq(v, &needle)),
                            V::Map(_) => hay.get(&needle).is_some(),
                            _ => false,
                        };
                        (!found).then(|| format!("{hay:?} does not contain {needle:?}"))
                    }
                    "Eventually" => {
                        let f = arg(1);
                        match interp.call_value(&f, Vec::new(), self) {
                            Ok(v) if v.truthy() => None,
                            Ok(_) => Some("condition never satisfied".to_owned()),
                            Err(f) => return Some(Err(f)),
                        }
                    }
                    _ => return None,
                };
                Some(match failed {
                    None => Ok(V::Bool(true)),
                    Some(m) if fatal => Err(Flow::Fatal(format!("{pkg}.{name}: {m}"))),
                    Some(m) => {
                        self.error(format!("{pkg}.{name}: {m}"));
                        Ok(V::Bool(false))
                    }
                })
            }
            _ => None,
        }
    }

    fn method(
        &mut self,
        interp: &mut Interp,
        recv: &V,
        name: &str,
        args: Vec<V>,
    ) -> Option<Result<V, Flow>> {
        let arg = |i: usize| args.get(i).cloned().unwrap_or(V::Nil);
        match recv {
            V::Opaque(what) if what == "t" => Some(match name {
                "Run" => {
                    self.begin(s(&arg(0)));
                    let ended = interp.call_value(&arg(1), vec![V::Opaque("t".into())], self);
                    let fatal = match ended {
                        Err(Flow::Fatal(m)) => Some(m),
                        _ => None,
                    };
                    self.end(fatal);
                    Ok(V::Bool(true))
                }
                "Fatal" | "Fatalf" | "FailNow" => Err(Flow::Fatal(if name == "Fatalf" {
                    super::interp::sprintf(&s(&arg(0)), args.get(1..).unwrap_or_default())
                } else {
                    args.iter().map(s).collect::<Vec<_>>().join(" ")
                })),
                "Error" | "Errorf" | "Fail" => {
                    let m = if name == "Errorf" {
                        super::interp::sprintf(&s(&arg(0)), args.get(1..).unwrap_or_default())
                    } else {
                        args.iter().map(s).collect::<Vec<_>>().join(" ")
                    };
                    self.error(m);
                    Ok(V::Nil)
                }
                "Skip" | "Skipf" | "SkipNow" => Err(Flow::Fatal(format!(
                    "{NOT_HELD}skipped by the test: {}",
                    args.iter().map(s).collect::<Vec<_>>().join(" ")
                ))),
                _ => Ok(V::Nil),
            }),
            V::Opaque(what) if what == "suite" => Some(Ok(match name {
                "field:ControllerName" => V::Str(CONTROLLER.into()),
                "field:RoundTripper" => V::Opaque("roundtripper".into()),
                "field:SupportedFeatures" => V::Opaque("features".into()),
                "field:GatewayClassName" => V::Str("cutover".into()),
                other => V::Opaque(format!("suite.{}", other.trim_start_matches("field:"))),
            })),
            // The cluster's client and applier: a test that reads or
            // changes resources in the middle needs a cluster.
            V::Opaque(what) if what.starts_with("suite.") && !name.starts_with("field:") => {
                Some(Err(Flow::Fatal(format!(
                    "{NOT_HELD}{what}.{name}: the test changes or reads resources in a cluster"
                ))))
            }
            V::Opaque(what) if what == "features" && name == "Has" => {
                let feature = s(&arg(0));
                Some(Ok(V::Bool(self.features.contains(&feature))))
            }
            V::Opaque(what) if what == "roundtripper" && name == "CaptureRoundTrip" => {
                self.frame().custom_traffic = true;
                Some(Ok(self.capture(&arg(0))))
            }
            V::Struct(ty, _) if ty == "ExpectedResponse" && name == "GetTestCaseName" => {
                Some(Ok(V::Str(case_name(recv))))
            }
            V::Struct(ty, _) if ty == "Regexp" && name == "MatchString" => {
                Some(Ok(V::Bool(s(&arg(0)).contains(&s(&recv.field("Needle"))))))
            }
            V::Struct(ty, _) if ty == "Sender" && name == "SendRequest" => {
                Some(interp.call_value(&recv.field("Send"), Vec::new(), self))
            }
            V::Struct(ty, _) if ty == "MirrorWait" && name == "()" => {
                let path = s(&recv.field("Path"));
                let path = path.split('?').next().unwrap_or_default().to_owned();
                let mut missing = Vec::new();
                for backend in recv.field("Pods").list() {
                    let (ns, name) = (s(&backend.field("Namespace")), s(&backend.field("Name")));
                    let pod = self.pods.pod(&ns, &name);
                    let deadline = std::time::Instant::now() + Duration::from_secs(3);
                    loop {
                        let found = pod
                            .seen
                            .lock()
                            .map(|seen| {
                                seen.iter()
                                    .any(|r| r.path.split('?').next() == Some(path.as_str()))
                            })
                            .unwrap_or(false);
                        if found {
                            break;
                        }
                        if std::time::Instant::now() > deadline {
                            missing.push(format!("{ns}/{name}"));
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
                let result = if missing.is_empty() {
                    Ok(())
                } else {
                    Err(format!("no mirrored request for {path} in {missing:?}"))
                };
                Some(self.case(format!("{path} mirrored"), result))
            }
            _ => None,
        }
    }

    fn constant(&self, pkg: &str, name: &str) -> Option<V> {
        constant(pkg, name)
    }

    fn error(&mut self, message: String) {
        let frame = self.frame();
        if frame.failed.is_none() {
            frame.failed = Some(message);
        }
    }
}

/// Constants of the suite and of the API's packages.
pub fn constant(pkg: &str, name: &str) -> Option<V> {
    let str = |v: &str| Some(V::Str(v.to_owned()));
    match (pkg, name) {
        ("suite", "InfrastructureNamespace") => str(super::world::INFRA),
        ("suite", "AppBackendNamespace") => str(super::world::APP),
        ("suite", "WebBackendNamespace") => str(super::world::WEB),
        ("suite", "MeshNamespace") => str("gateway-conformance-mesh"),
        ("suite", "InfrastructureGatewayName") => str("gateway-conformance-infra-test"),
        ("suite", "InfraBackendServiceNameV1") => str("infra-backend-v1"),
        ("suite", "InfraBackendServiceNameV2") => str("infra-backend-v2"),
        ("suite", "InfraBackendServiceNameV3") => str("infra-backend-v3"),
        ("metav1", "ConditionTrue") => str("True"),
        ("metav1", "ConditionFalse") => str("False"),
        ("metav1", "ConditionUnknown") => str("Unknown"),
        ("v1", "GroupVersion") | ("v1alpha2", "GroupVersion") => {
            let mut f = BTreeMap::new();
            f.insert("Group".into(), V::Str(GROUP.into()));
            f.insert("Version".into(), V::Str("v1".into()));
            Some(V::Struct("GroupVersion".into(), f))
        }
        ("v1", "GroupName") => str(GROUP),
        ("kubernetes", "GatewayKind") => str("Gateway"),
        ("kubernetes", "GatewayExcludedFromReadinessChecks") => {
            str("gateway-api/skip-this-for-readiness")
        }
        ("roundtripper", "HTTPSProtocol") => str("HTTPS"),
        ("roundtripper", "H2CPriorKnowledgeProtocol") => str("H2C_PRIOR_KNOWLEDGE"),
        ("roundtripper", "H2Protocol") => str("H2"),
        ("weight", "MaxTestRetries") => Some(V::Int(10)),
        ("time", "Millisecond") => Some(V::Int(1)),
        ("time", "Second") => Some(V::Int(1000)),
        ("time", "Minute") => Some(V::Int(60_000)),
        ("features", feature) => str(feature),
        ("v1", n) => {
            // `ListenerConditionAccepted` = "Accepted", `RouteReasonBackendNotFound` = "BackendNotFound", …
            for prefix in [
                "GatewayClassConditionStatus",
                "GatewayClassReason",
                "GatewayClassCondition",
                "GatewayConditionType",
                "GatewayCondition",
                "GatewayReason",
                "ListenerConditionType",
                "ListenerCondition",
                "ListenerReason",
                "ListenerEntryCondition",
                "ListenerEntryReason",
                "ListenerSetCondition",
                "ListenerSetReason",
                "RouteConditionType",
                "RouteCondition",
                "RouteReason",
                "PolicyCondition",
                "PolicyReason",
                "BackendTLSPolicyCondition",
                "BackendTLSPolicyReason",
            ] {
                if let Some(rest) = n.strip_prefix(prefix) {
                    if !rest.is_empty() {
                        return str(rest);
                    }
                }
            }
            match n {
                "HTTPProtocolType" => str("HTTP"),
                "HTTPSProtocolType" => str("HTTPS"),
                "TLSProtocolType" => str("TLS"),
                "TCPProtocolType" => str("TCP"),
                "UDPProtocolType" => str("UDP"),
                "TLSModeTerminate" => str("Terminate"),
                "TLSModePassthrough" => str("Passthrough"),
                "IPAddressType" => str("IPAddress"),
                "HostnameAddressType" => str("Hostname"),
                "NamedAddressType" => str("NamedAddress"),
                _ => None,
            }
        }
        _ => None,
    }
}

/// A request as it goes out.
struct Outgoing {
    method: String,
    scheme: String,
    connect: String,
    authority: String,
    target: String,
    headers: Vec<(String, String)>,
    body: String,
    protocol: String,
    follow: bool,
    server_name: String,
    server_certificate: String,
    client: Option<(String, String)>,
}

struct Answer {
    status: u16,
    version: String,
    headers: Vec<(String, String)>,
    body: Bytes,
    peer_tls: Option<()>,
    client_cert_requested: bool,
}

impl From<&V> for Outgoing {
    fn from(req: &V) -> Outgoing {
        let url = req.field("URL");
        let scheme = s(&url.field("Scheme"));
        let url_host = s(&url.field("Host"));
        let default_port = if scheme == "https" { 443 } else { 80 };
        let connect = if url_host.parse::<SocketAddr>().is_ok() {
            url_host.clone()
        } else {
            format!("{url_host}:{default_port}")
        };
        let host = s(&req.field("Host"));
        let query = s(&url.field("RawQuery"));
        let path = match s(&url.field("Path")) {
            p if p.is_empty() => "/".to_owned(),
            p => p,
        };
        let target = if query.is_empty() {
            path
        } else {
            format!("{path}?{query}")
        };
        let headers = req
            .field("Headers")
            .map_entries()
            .into_iter()
            .map(|(k, v)| (s(&k), v.list().first().map(s).unwrap_or_default()))
            .collect();
        let client = match (
            req.field("ClientCertificate"),
            req.field("ClientCertificateKey"),
        ) {
            (V::Str(c), V::Str(k)) => Some((c, k)),
            _ => None,
        };
        Outgoing {
            method: s(&req.field("Method")),
            scheme,
            connect,
            authority: if host.is_empty() { url_host } else { host },
            target,
            headers,
            body: s(&req.field("Body")),
            protocol: s(&req.field("Protocol")),
            follow: !req.field("UnfollowRedirect").truthy(),
            server_name: s(&req.field("ServerName")),
            server_certificate: s(&req.field("ServerCertificate")),
            client,
        }
    }
}

impl Outgoing {
    async fn send(self) -> Result<Answer, String> {
        let addr: SocketAddr = self
            .connect
            .parse()
            .map_err(|_| format!("dial tcp: lookup {}: no such host", self.connect))?;
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("dial tcp {addr}: {e}"))?;
        let mut builder = hyper::Request::builder()
            .method(self.method.as_str())
            .uri(self.target.as_str());
        let h2 = self.protocol == "H2C_PRIOR_KNOWLEDGE";
        if h2 {
            builder = builder.uri(format!(
                "{}://{}{}",
                self.scheme, self.authority, self.target
            ));
        } else {
            builder = builder.header(hyper::header::HOST, self.authority.as_str());
        }
        for (k, v) in &self.headers {
            builder = builder.header(k.as_str(), v.as_str());
        }
        let request = builder
            .body(Full::new(Bytes::from(self.body.clone())))
            .map_err(|e| format!("bad request: {e}"))?;
        if self.scheme == "https" {
            let requested = Arc::new(Mutex::new(false));
            let config = client_config(
                &self.server_certificate,
                self.client.as_ref(),
                Arc::clone(&requested),
            )?;
            let name = rustls::pki_types::ServerName::try_from(self.server_name.clone())
                .map_err(|e| format!("server name: {e}"))?;
            let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
                .connect(name, stream)
                .await
                .map_err(|e| format!("tls: {e}"))?;
            let mut answer = exchange(TokioIo::new(tls), request, false).await?;
            answer.peer_tls = Some(());
            answer.client_cert_requested = *requested.lock().map_err(|_| "poisoned")?;
            Ok(answer)
        } else {
            let answer = exchange(TokioIo::new(stream), request, h2).await?;
            if self.follow && is_redirect(i64::from(answer.status)) {
                // Go's client follows: to a host that is not an address,
                // that is a DNS failure.
                let location = answer
                    .headers
                    .iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case("location"))
                    .map(|(_, v)| v.clone())
                    .unwrap_or_default();
                return Err(format!(
                    "following the redirect to {location}: not followed by this harness"
                ));
            }
            Ok(answer)
        }
    }
}

async fn exchange<I>(
    io: I,
    request: hyper::Request<Full<Bytes>>,
    h2: bool,
) -> Result<Answer, String>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let response = if h2 {
        let (mut sender, conn) =
            hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
                .await
                .map_err(|e| format!("h2 handshake: {e}"))?;
        tokio::spawn(conn);
        sender
            .send_request(request)
            .await
            .map_err(|e| format!("{e}"))?
    } else {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        tokio::spawn(conn);
        sender
            .send_request(request)
            .await
            .map_err(|e| format!("{e}"))?
    };
    let status = response.status().as_u16();
    let version = match response.version() {
        hyper::Version::HTTP_2 => "HTTP/2.0",
        hyper::Version::HTTP_10 => "HTTP/1.0",
        _ => "HTTP/1.1",
    }
    .to_owned();
    let headers = response
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                v.to_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("body: {e}"))?
        .to_bytes();
    Ok(Answer {
        status,
        version,
        headers,
        body,
        peer_tls: None,
        client_cert_requested: false,
    })
}

impl Answer {
    fn values(&self, method: &str) -> (V, V) {
        let mut headers: Vec<(V, V)> = Vec::new();
        for (k, v) in &self.headers {
            let key = V::Str(canonical_header(k));
            if let Some((_, V::List(values))) =
                headers.iter_mut().find(|(name, _)| go_eq(name, &key))
            {
                values.push(V::Str(v.clone()));
            } else {
                headers.push((key, V::List(vec![V::Str(v.clone())])));
            }
        }
        let json = self
            .headers
            .iter()
            .any(|(k, v)| k.eq_ignore_ascii_case("content-type") && v == "application/json");
        let creq = if json {
            match serde_json::from_slice::<Value>(&self.body) {
                Ok(body) => json_to_creq(&body),
                Err(_) => V::Nil,
            }
        } else {
            let mut f = BTreeMap::new();
            f.insert("Method".into(), V::Str(method.to_owned()));
            V::Struct("CapturedRequest".into(), f)
        };
        let mut f = BTreeMap::new();
        f.insert("StatusCode".into(), V::Int(i64::from(self.status)));
        f.insert("Protocol".into(), V::Str(self.version.clone()));
        f.insert("Headers".into(), V::Map(headers));
        if is_redirect(i64::from(self.status)) {
            let location = self
                .headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case("location"))
                .map(|(_, v)| v.clone())
                .unwrap_or_default();
            f.insert("RedirectRequest".into(), parse_location(&location));
        }
        let _ = (self.peer_tls, self.client_cert_requested);
        (creq, V::Struct("CapturedResponse".into(), f))
    }
}

/// Go's `resp.Location()` split as the suite does.
fn parse_location(location: &str) -> V {
    let (scheme, rest) = match location.split_once("://") {
        Some((scheme, rest)) => (scheme.to_owned(), rest.to_owned()),
        None => (String::new(), location.to_owned()),
    };
    let (authority, path) = if scheme.is_empty() {
        (String::new(), rest)
    } else {
        match rest.find('/') {
            Some(i) => (rest[..i].to_owned(), rest[i..].to_owned()),
            None => (rest, String::new()),
        }
    };
    let path = path.split('?').next().unwrap_or_default().to_owned();
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !p.contains(']') => (h.to_owned(), p.to_owned()),
        _ => (authority, String::new()),
    };
    let mut f = BTreeMap::new();
    f.insert("Scheme".into(), V::Str(scheme));
    f.insert(
        "Host".into(),
        V::Str(
            host.trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
        ),
    );
    f.insert("Port".into(), V::Str(port));
    f.insert("Path".into(), V::Str(path));
    V::Struct("RedirectRequest".into(), f)
}

fn json_to_creq(body: &Value) -> V {
    let str_of = |k: &str| V::Str(body[k].as_str().unwrap_or_default().to_owned());
    let mut headers = Vec::new();
    if let Some(map) = body["headers"].as_object() {
        for (k, v) in map {
            let values = v
                .as_array()
                .into_iter()
                .flatten()
                .map(|x| V::Str(x.as_str().unwrap_or_default().to_owned()))
                .collect();
            headers.push((V::Str(k.clone()), V::List(values)));
        }
    }
    let mut tls = BTreeMap::new();
    tls.insert(
        "ServerName".into(),
        V::Str(
            body["tls"]["serverName"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        ),
    );
    tls.insert(
        "PeerCertificates".into(),
        V::List(
            body["tls"]["peerCertificates"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| V::Str(c.as_str().unwrap_or_default().to_owned()))
                .collect(),
        ),
    );
    let mut f = BTreeMap::new();
    f.insert("Path".into(), str_of("path"));
    f.insert("Host".into(), str_of("host"));
    f.insert("Method".into(), str_of("method"));
    f.insert("Protocol".into(), str_of("proto"));
    f.insert("Headers".into(), V::Map(headers));
    f.insert("HTTPPort".into(), str_of("httpPort"));
    f.insert("Namespace".into(), str_of("namespace"));
    f.insert("Pod".into(), str_of("pod"));
    f.insert("TLS".into(), V::Struct("TLS".into(), tls));
    V::Struct("CapturedRequest".into(), f)
}

/// A client that trusts exactly the given certificates (as Go's
/// `RootCAs` with a self-signed leaf does), checks the name, and shows
/// the client certificate when asked.
fn client_config(
    trusted: &str,
    client: Option<&(String, String)>,
    requested: Arc<Mutex<bool>>,
) -> Result<rustls::ClientConfig, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let trusted: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(trusted.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("trusted certificates: {e}"))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Trusted { trusted, provider }));
    let mut config = match client {
        Some((cert, key)) => {
            let chain: Vec<CertificateDer<'static>> =
                CertificateDer::pem_slice_iter(cert.as_bytes())
                    .collect::<Result<_, _>>()
                    .map_err(|e| format!("client certificate: {e}"))?;
            let key = PrivateKeyDer::from_pem_slice(key.as_bytes())
                .map_err(|e| format!("client key: {e}"))?;
            let signing =
                rustls::crypto::ring::sign::any_supported_type(&key).map_err(|e| e.to_string())?;
            builder.with_client_cert_resolver(Arc::new(Presenting {
                key: Arc::new(rustls::sign::CertifiedKey::new(chain, signing)),
                requested,
            }))
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

#[derive(Debug)]
struct Presenting {
    key: Arc<rustls::sign::CertifiedKey>,
    requested: Arc<Mutex<bool>>,
}

impl rustls::client::ResolvesClientCert for Presenting {
    fn resolve(
        &self,
        _: &[&[u8]],
        _: &[rustls::SignatureScheme],
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        if let Ok(mut r) = self.requested.lock() {
            *r = true;
        }
        Some(Arc::clone(&self.key))
    }
    fn has_certs(&self) -> bool {
        true
    }
}

#[derive(Debug)]
struct Trusted {
    trusted: Vec<rustls::pki_types::CertificateDer<'static>>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl rustls::client::danger::ServerCertVerifier for Trusted {
    fn verify_server_cert(
        &self,
        end_entity: &rustls::pki_types::CertificateDer<'_>,
        intermediates: &[rustls::pki_types::CertificateDer<'_>],
        server_name: &rustls::pki_types::ServerName<'_>,
        ocsp: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        if self
            .trusted
            .iter()
            .any(|t| t.as_ref() == end_entity.as_ref())
        {
            // Go's rules for the name (crypto/x509 `matchHostnames`): a
            // `*` label matches one label, `*.org` covers `example.org`.
            let name = server_name.to_str();
            return if go_name_matches(end_entity.as_ref(), &name) {
                Ok(rustls::client::danger::ServerCertVerified::assertion())
            } else {
                Err(rustls::Error::General(format!(
                    "certificate not valid for {name}"
                )))
            };
        }
        let mut roots = rustls::RootCertStore::empty();
        for t in &self.trusted {
            let _ = roots.add(t.clone());
        }
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::clone(&self.provider),
        )
        .build()
        .map_err(|e| rustls::Error::General(e.to_string()))?;
        verifier.verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// `MakeTLSConnectionAndExpectEventuallyConnectionRejection`: a TLS
/// handshake (any certificate) must end in EOF or a reset.
async fn tls_rejected(addr: String, server_name: String) -> Result<(), String> {
    #[derive(Debug)]
    struct Any(Arc<rustls::crypto::CryptoProvider>);
    impl rustls::client::danger::ServerCertVerifier for Any {
        fn verify_server_cert(
            &self,
            _: &rustls::pki_types::CertificateDer<'_>,
            _: &[rustls::pki_types::CertificateDer<'_>],
            _: &rustls::pki_types::ServerName<'_>,
            _: &[u8],
            _: rustls::pki_types::UnixTime,
        ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        }
        fn verify_tls12_signature(
            &self,
            m: &[u8],
            c: &rustls::pki_types::CertificateDer<'_>,
            d: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(
                m,
                c,
                d,
                &self.0.signature_verification_algorithms,
            )
        }
        fn verify_tls13_signature(
            &self,
            m: &[u8],
            c: &rustls::pki_types::CertificateDer<'_>,
            d: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(
                m,
                c,
                d,
                &self.0.signature_verification_algorithms,
            )
        }
        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Any(provider)))
        .with_no_client_auth();
    let addr: SocketAddr = addr.parse().map_err(|e| format!("{addr}: {e}"))?;
    let stream = match tokio::net::TcpStream::connect(addr).await {
        Ok(s) => s,
        // Refused is not "rejected" for the suite (it retries), but no
        // handshake can complete: nothing is served.
        Err(e) => return Err(format!("connect: {e} (the suite wants the handshake cut)")),
    };
    let name = rustls::pki_types::ServerName::try_from(server_name).map_err(|e| e.to_string())?;
    match tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, stream)
        .await
    {
        Ok(_) => Err("the TLS handshake completed".into()),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset
            ) =>
        {
            Ok(())
        }
        Err(e) => Err(format!("the handshake failed with {e}, not EOF or a reset")),
    }
}

/// Whether a DNS name of the certificate matches `host` as Go's TLS
/// client decides.
fn go_name_matches(der: &[u8], host: &str) -> bool {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return false;
    };
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return false;
    };
    let host: Vec<String> = host
        .trim_end_matches('.')
        .to_ascii_lowercase()
        .split('.')
        .map(str::to_owned)
        .collect();
    san.value.general_names.iter().any(|n| match n {
        x509_parser::extensions::GeneralName::DNSName(pattern) => {
            let pattern: Vec<String> = pattern
                .to_ascii_lowercase()
                .split('.')
                .map(str::to_owned)
                .collect();
            pattern.len() == host.len()
                && pattern
                    .iter()
                    .zip(&host)
                    .enumerate()
                    .all(|(i, (p, h))| (i == 0 && p == "*") || p == h)
        }
        _ => false,
    })
}
