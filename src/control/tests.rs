//! Control-plane tests that need a whole `Control`: the harness that
//! builds one on a configuration file, and the promises that hold only
//! across its operations (DESIGN §14: a canary's switches).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::candidate::{CanarySpec, Candidate, CandidateSource, Settle, SettleRequest};
use super::changes::ControlParts;
use super::error::ControlError;
use super::expectation::{admit_change, Expectation};
use super::local::{Control, ProcessControl};
use super::process::{BinaryView, LifecycleError, UpgradeRequest};
use super::records::Requester;
use crate::admission::Admission;
use crate::config::ConfigText;
use crate::generation::{self, SharedState};
use crate::ids::GenerationId;
use crate::proxy::ListenerSet;
use crate::runtime::{
    rfc3339, GenerationRecord, GenerationStore, History, OperationKind, PersistedState, Phase,
    PhaseCell, RetainedText, Source,
};
use crate::telemetry::LogLevel;
use crate::test_config::TestConfig;

/// A running control plane on `text`, written to a file in a temporary
/// folder (kept as long as the folder lives), its listeners bound.
pub(crate) fn control_with(text: &str, release_memory: fn()) -> (Arc<Control>, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, text).expect("write");
    let source = ConfigText::read(&path).expect("read");
    let spec = Arc::new(crate::plan::validate(&source).expect("valid base config"));
    let shared = Arc::new(SharedState::default());
    let store = Arc::new(GenerationStore::new(
        generation::build(Arc::clone(&spec), GenerationId::FIRST, &shared).expect("build"),
    ));
    let certificates = Arc::new(crate::tls::CertStore::default());
    certificates.follow(Arc::clone(&store) as Arc<dyn crate::tls::ActiveMaterial>);
    let listeners = ListenerSet::new(
        Admission::new(Arc::clone(&store)),
        Arc::clone(&certificates),
        None,
    );
    listeners.start(listeners.bind_new(&spec.listeners).expect("bind"));
    let mut history = History::new(spec.runtime.history_limit, None, PersistedState::default());
    history.record_generation(GenerationRecord {
        generation: GenerationId::FIRST,
        config_version: spec.config_version.clone(),
        activated_at: rfc3339(SystemTime::now()),
        source: Source::Startup,
        rolled_back_to: None,
        requested_by: None,
        caller: None,
        reason: None,
        config: RetainedText::new(&source.text),
        base_dir: source.base_dir.clone(),
        origin: source.origin.clone(),
    });
    let phase = Arc::new(PhaseCell::default());
    phase.advance(Phase::Running);
    let control = Arc::new(Control::new(ControlParts {
        release_memory,
        store,
        shared,
        listeners,
        certificates,
        history,
        config_file: path,
        log_level: LogLevel::detached(),
        phase,
    }));
    (control, dir)
}

/// A configuration that differs from every other `numbered(n)`.
fn numbered(n: usize) -> String {
    TestConfig::web()
        .respond("hello", &format!("configuration {n}"))
        .build()
}

/// What admission may do in one published state: the active generation,
/// and while a canary runs, the previous generation it keeps the rest of
/// new requests on.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Published {
    active: GenerationId,
    canary_previous: Option<GenerationId>,
}

impl Published {
    /// The generation a request lands on: `inside` the canary's share
    /// (bucket below its percent) or outside it.
    fn pins(self, inside: bool) -> GenerationId {
        match self.canary_previous {
            Some(previous) if !inside => previous,
            _ => self.active,
        }
    }
}

/// Explains `seen` (each admission's share and generation, in the order
/// one thread made them) as a walk forward through `states`: the
/// admissions no state from the current one on can produce, and the
/// first of them with the state the walk had reached.
fn unexplained(
    states: &[Published],
    seen: &[(bool, GenerationId)],
) -> (usize, Option<(usize, bool, GenerationId, Published)>) {
    let mut at = 0;
    let mut count = 0;
    let mut first = None;
    for (index, &(inside, generation)) in seen.iter().enumerate() {
        match (at..states.len()).find(|&s| states[s].pins(inside) == generation) {
            Some(state) => at = state,
            None => {
                count += 1;
                first.get_or_insert((index, inside, generation, states[at]));
            }
        }
    }
    (count, first)
}

fn candidate(n: usize, expected: GenerationId) -> Candidate {
    Candidate {
        source: CandidateSource::Text(numbered(n)),
        expected_generation: Some(expected),
        reason: None,
        requested_by: Some("canary-test".into()),
        caller: None,
        confirm_within: None,
        guard: None,
        canary: Some(CanarySpec {
            steps: vec![10, 100],
            // The canary stays on its first step for the whole test.
            step_interval: Duration::from_secs(3600),
            key: crate::plan::parse_hash_key("header:x-user"),
        }),
        shadow: None,
        freeze: super::candidate::FreezeRule::Honour,
        approved_by: Vec::new(),
    }
}

fn settle(generation: GenerationId) -> SettleRequest {
    SettleRequest {
        generation,
        expected_active_generation: Some(generation),
        requested_by: Some("canary-test".into()),
        caller: None,
        reason: None,
    }
}

/// DESIGN §14: while a canary runs, every new request is pinned to the
/// candidate (its share) or the previous generation (the rest), and once
/// the canary is committed, aborted or superseded, to the generation that
/// ends it, never to a mixture of the states before and after. One
/// thread admits requests in a tight loop, one inside the canary's share
/// and one outside it each round, while the control plane runs 1 000
/// canaries: each started, one in three superseded by a second canary,
/// then confirmed or aborted. Every admission must be explained by the
/// published states in the order they were published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_admitted_across_canary_switches_meets_one_published_state() {
    const CANARIES: usize = 1_000;
    let (control, _dir) = control_with(&numbered(0), || {});
    let admission = Admission::new(Arc::clone(control.store()));
    let stop = Arc::new(AtomicBool::new(false));
    let admitting = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            // Consecutive rounds that saw the same pair are kept once:
            // leaving out repeats can hide nothing the first one shows.
            let mut seen: Vec<(bool, GenerationId)> = Vec::new();
            let mut last = None;
            let mut admitted = 0_u64;
            while !stop.load(Ordering::Relaxed) {
                let inside = admission.pin_request("web", |_| Some(0)).generation.id;
                let outside = admission.pin_request("web", |_| Some(99)).generation.id;
                admitted += 2;
                if last != Some((inside, outside)) {
                    last = Some((inside, outside));
                    seen.push((true, inside));
                    seen.push((false, outside));
                }
            }
            (seen, admitted)
        })
    };
    let mut states = vec![Published {
        active: GenerationId::FIRST,
        canary_previous: None,
    }];
    let mut final_generation = GenerationId::FIRST;
    let mut n = 0;
    for round in 0..CANARIES {
        n += 1;
        let started = control
            .activate(candidate(n, final_generation), OperationKind::Activate)
            .await
            .expect("canary starts");
        let mut pending = started.generation;
        states.push(Published {
            active: pending,
            canary_previous: Some(final_generation),
        });
        if round % 3 == 2 {
            n += 1;
            let superseding = control
                .activate(candidate(n, pending), OperationKind::Activate)
                .await
                .expect("a second canary supersedes the first");
            pending = superseding.generation;
            states.push(Published {
                active: pending,
                canary_previous: Some(final_generation),
            });
        }
        let how = if round % 2 == 0 {
            Settle::Confirm
        } else {
            Settle::Abort
        };
        let settled = control
            .settle(settle(pending), how)
            .await
            .expect("canary settles");
        final_generation = settled.generation;
        states.push(Published {
            active: final_generation,
            canary_previous: None,
        });
    }
    stop.store(true, Ordering::Relaxed);
    let (seen, admitted) = admitting.join().expect("the admitting thread");
    let (count, first) = unexplained(&states, &seen);
    eprintln!(
        "{admitted} requests admitted across {} published states ({} distinct rounds): {count} unexplained",
        states.len(),
        seen.len() / 2,
    );
    assert!(
        seen.len() > 2 * CANARIES,
        "too few rounds were seen to judge: {}",
        seen.len()
    );
    if let Some((index, inside, generation, state)) = first {
        panic!(
            "{count} admissions no published state explains; the first, admission {index} \
             ({} the canary's share), was pinned to generation {generation}, which no state \
             published from {state:?} on admits",
            if inside { "inside" } else { "outside" }
        );
    }
}

/// The one expected-generation rule (local, shadowed and fleet changes all
/// call it): required before named, named before pending.
#[test]
fn the_expected_generation_rule_checks_required_then_conflict_then_pending() {
    let (seven, eight) = (GenerationId(7), GenerationId(8));
    let required = |named| Expectation {
        named,
        required: true,
    };
    let kind = |result: Result<(), ControlError>| result.map_err(|e| e.to_string());
    assert!(matches!(
        admit_change(required(None), seven, Some(seven)),
        Err(ControlError::ExpectedGenerationRequired)
    ));
    // The same first rule, alone, for a writer that asks remotely.
    assert!(matches!(
        required(None).given(),
        Err(ControlError::ExpectedGenerationRequired)
    ));
    assert!(required(Some(eight)).given().is_ok());
    assert!(matches!(
        admit_change(required(Some(eight)), seven, Some(seven)),
        Err(ControlError::Conflict { expected, active }) if expected == eight && active == seven
    ));
    assert!(matches!(
        admit_change(Expectation::optional(None), seven, Some(seven)),
        Err(ControlError::PendingActivation { pending }) if pending == seven
    ));
    assert_eq!(
        kind(admit_change(required(Some(seven)), seven, Some(seven))),
        Ok(())
    );
    assert_eq!(
        kind(admit_change(Expectation::optional(None), seven, None)),
        Ok(())
    );
    assert_eq!(
        kind(admit_change(
            Expectation::optional(Some(seven)),
            seven,
            None
        )),
        Ok(())
    );
}

/// The timeline looks at the backends only when one's state or the
/// active generation moved; a move between two seconds is still noted.
#[tokio::test]
async fn the_timeline_notes_a_backend_that_changed_between_two_idle_seconds() {
    let (control, _dir) = control_with(
        &TestConfig::web()
            .route(
                "app",
                "listeners = [\"web\"]\npath_prefix = \"/\"\nupstream = \"app\"",
            )
            .upstream("app", &["127.0.0.1:9", "127.0.0.1:10"], "")
            .build(),
        || {},
    );
    let states = |control: &Control| -> Vec<Vec<String>> {
        control
            .timeline_view()
            .backends
            .iter()
            .map(|b| b.changes.iter().map(|c| c.state.to_string()).collect())
            .collect()
    };
    control.sample_timeline();
    control.sample_timeline();
    assert_eq!(states(&control), [["unchecked"], ["unchecked"]]);
    // An ejection between two looks: it counts as a change, so the next
    // second looks and notes it.
    let active = control.store().load_full();
    let upstream = active.upstream("app").expect("upstream");
    let backend = std::sync::Arc::clone(&upstream.members().backends[1]);
    backend.outlier.eject(&upstream.outlier);
    control.sample_timeline();
    assert_eq!(
        states(&control),
        [vec!["unchecked"], vec!["unchecked", "ejected"]]
    );
    // Back: noted too.
    backend.outlier.success();
    control.sample_timeline();
    assert_eq!(
        states(&control),
        [vec!["unchecked"], vec!["unchecked", "ejected", "unchecked"]]
    );
}

/// A process lifecycle that records the drain and stops nothing.
struct RecordedDrain;

impl ProcessControl for RecordedDrain {
    fn drain(
        &self,
        control: &Arc<Control>,
        requester: Requester,
    ) -> Result<String, LifecycleError> {
        Ok(control.record_started(OperationKind::Drain, requester, "draining".into()))
    }

    fn upgrade(
        &self,
        _control: &Arc<Control>,
        _request: UpgradeRequest,
    ) -> Result<String, LifecycleError> {
        Err(LifecycleError::Unavailable)
    }

    fn binary(&self) -> Option<BinaryView> {
        None
    }
}

fn plain(n: usize) -> Candidate {
    Candidate {
        source: CandidateSource::Text(numbered(n)),
        expected_generation: None,
        reason: None,
        requested_by: Some("drain-race".into()),
        caller: None,
        confirm_within: None,
        guard: None,
        canary: None,
        shadow: None,
        freeze: super::candidate::FreezeRule::Honour,
        approved_by: Vec::new(),
    }
}

/// Issue 61: a drain and the changes around it are exclusive. Two tasks
/// activate one configuration after another while a third drains, all
/// let go at once, 1 000 times: every activation that starts after the
/// drain's answer gets 503 (`Draining`), and the active generation when
/// the drain answered is the one left at the end (no change commits
/// after it). Before the fix the phase turned to draining only when the
/// process's main loop took the stop, and changes went on committing
/// after the 202.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_change_commits_after_a_drain_is_acknowledged() {
    const RACES: usize = 1_000;
    let (mut committed_before, mut refused_after) = (0usize, 0usize);
    for race in 0..RACES {
        let (control, _dir) = control_with(&numbered(0), || {});
        control.set_process(Arc::new(RecordedDrain));
        let go = Arc::new(tokio::sync::Barrier::new(3));
        let drained: Arc<std::sync::OnceLock<std::time::Instant>> = Arc::default();
        let activating: Vec<_> = (0..2)
            .map(|task| {
                let (control, go, drained) =
                    (Arc::clone(&control), Arc::clone(&go), Arc::clone(&drained));
                tokio::spawn(async move {
                    go.wait().await;
                    let mut outcomes = Vec::new();
                    for i in 1.. {
                        let started = std::time::Instant::now();
                        let n = race * 1_000 + task * 100 + i;
                        let result = control.activate(plain(n), OperationKind::Activate).await;
                        outcomes.push((started, result.map(|a| a.generation)));
                        // Go on a little past the drain's answer.
                        if drained
                            .get()
                            .is_some_and(|at| at.elapsed() > Duration::from_millis(2))
                        {
                            break;
                        }
                        if i > 200 {
                            break;
                        }
                    }
                    outcomes
                })
            })
            .collect();
        go.wait().await;
        tokio::task::yield_now().await;
        control.drain(Requester::default()).await.expect("drain");
        let at = std::time::Instant::now();
        let _ = drained.set(at);
        let active_at_answer = control.store().active_id();
        for task in activating {
            for (started, result) in task.await.expect("task") {
                match result {
                    Ok(generation) => {
                        assert!(
                            started < at,
                            "race {race}: an activation started after the drain's answer committed {generation}"
                        );
                        committed_before += 1;
                    }
                    Err(ControlError::Draining) => {
                        if started > at {
                            refused_after += 1;
                        }
                    }
                    Err(ControlError::InProgress) => {}
                    Err(other) => panic!("race {race}: {other}"),
                }
            }
        }
        assert_eq!(
            control.store().active_id(),
            active_at_answer,
            "race {race}: the active generation moved after the drain answered"
        );
    }
    eprintln!("{RACES} races: {committed_before} activations committed before the drain's answer, {refused_after} refused after it");
    assert!(
        refused_after >= RACES,
        "{refused_after}: every race has activations after the answer"
    );
}
