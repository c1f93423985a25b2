//! The control plane: the single local writer of the active generation.
//!
//! Every change on this instance goes through here, from the writer
//! (`writer.rs`: admin API, SIGHUP), the fleet or start-up: read the
//! candidate, plan it against the active generation, build the next
//! generation, bind the listeners it adds, compare-and-swap, record
//! history, persist. Everything fallible happens before the swap; one
//! mutating operation runs at a time. `local.rs` is [`Control`]: how it
//! is made, what status, history and the timeline read, drain and
//! upgrade; `operations.rs` is what a writer calls. Both delegate to the
//! owners of the state, each in its own file with its own type and its
//! own operations: `changes.rs` ([`ControlParts`] and `Changes`, what a
//! change writes, whose one path is `commit.rs`, `guarded.rs` for
//! settling the pending generation and `shadow.rs` for the shadow
//! stage), `lock.rs` (the operation lock), `records.rs` (history, the
//! rollback candidacies), `file.rs` (the configuration file),
//! `pending.rs` (the pending generation), `shadowing.rs` (the shadow
//! slot), `timeline.rs`; the certificate keeper is its own module,
//! beside `acme`. By concern besides: `views.rs` (what status and
//! history show), `certs.rs` (certificate reload), `cache.rs`,
//! `backends.rs`, `expectation.rs` (the one expected-generation rule),
//! `candidate.rs`, `process.rs`, `error.rs`. This file only names them:
//! every file imports what it uses
//! from the file that defines it. It knows nothing of fleets: the fleet
//! sits above it.

mod answers;
mod backends;
mod cache;
mod candidate;
mod certs;
mod changes;
mod commit;
mod error;
mod expectation;
mod file;
mod guarded;
mod local;
mod lock;
mod operations;
mod pending;
mod process;
mod records;
mod shadow;
mod shadowing;
mod timeline;
mod views;
mod waf;

#[cfg(test)]
pub(crate) mod tests;

pub use answers::{Activation, RecordedPlan, Settled};
pub use backends::{member_views, BackendsView, UpstreamView};
pub use cache::{CacheView, DiskView, Purged, ZonePurged, ZoneView};
pub use candidate::read as read_candidate;
pub use candidate::{
    CanarySpec, Candidate, CandidateError, CandidateSource, FreezeRule, GuardSpec, RollbackRequest,
    Settle, SettleRequest, ShadowSpec,
};
pub use certs::{CertReload, CertView, ListenerCerts};
pub use changes::ControlParts;
pub use commit::operation_kind_name;
pub use error::ControlError;
pub use expectation::{admit_change, admit_in_freeze, Expectation};
pub use file::FileComposer;
#[cfg(feature = "fleet")]
pub(crate) use guarded::{evaluation_interval, judge, Verdict};
pub use local::{Control, ProcessControl};
pub use pending::PendingView;
#[cfg(feature = "fleet")]
pub(crate) use pending::{Answers, Baseline};
pub use process::{BinaryView, LifecycleError, UpgradeRequest};
pub use records::Requester;
#[cfg(feature = "fleet")]
pub(crate) use shadow::judge as judge_shadow;
pub use shadow::ShadowHandle;
pub use timeline::TimelineView;
pub use views::*;
pub use waf::{RouteWafView, RuleCount, RulesetView, WafView};
