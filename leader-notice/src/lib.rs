//! Leadership that sees the autoscaler coming.
//!
//! Clouds warn before they take a machine away: EC2 Spot two minutes ahead, an Auto Scaling
//! terminate lifecycle hook for as long as the hook holds, Azure Scheduled Events 30 s
//! (`Preempt`) to 15 min (`Terminate`) ahead, GCE at preemption and before a terminating host
//! maintenance. A leader that acts on the warning hands over while the network is still
//! healthy, instead of on the final SIGTERM that leaves 30 s for the whole OS shutdown. And a
//! leader can keep the autoscaler off itself: with scale-in protection on the leader's
//! instance, a scale-in removes a follower and no failover happens at all.
//!
//! This crate offers the two parts; `leader run` composes them (`--watch-notices`,
//! `--protect-leader`, `--complete-lifecycle-hook`), and so can a program that uses the
//! library (see `examples/notice.rs`):
//!
//! - [`NoticeWatcher`] polls this instance's metadata service at each cloud's recommended
//!   rate and publishes the first [`Notice`] for this instance (a machine that goes away for
//!   good: a `Reboot` or a live migration is not a notice). On one, a leader stops its
//!   work and releases (`ElectorHandle::shutdown`), a follower stops campaigning for good (it
//!   would only lead on a doomed machine); then [`NoticeWatch::approve`] lets Azure go ahead
//!   at once with this instance's own event, and [`AutoScaling::complete_lifecycle_action`]
//!   lets an Auto Scaling group terminate it without waiting for the hook's timeout.
//! - [`Protection`] keeps this instance protected from scale-in exactly while it leads
//!   (AWS Auto Scaling, Azure VMSS, or a Kubernetes pod deletion cost), level-triggered: the
//!   mark is written again every period, set or cleared, so a crashed leader's mark is undone
//!   when its process comes back.
//!
//! Neither ever affects leadership: a metadata service that is absent (not on that cloud),
//! hangs or answers garbage is logged and counted, and a protection call that fails is
//! retried in the background.
//!
//! Endpoints follow each cloud's own settings, so that tests and unusual networks can move
//! them: `AWS_EC2_METADATA_SERVICE_ENDPOINT` (read by `aws-config`), `AWS_ENDPOINT_URL_AUTO_SCALING`
//! or `AWS_ENDPOINT_URL`, `GCE_METADATA_HOST`, and this crate's `LEADER_AZURE_IMDS_ENDPOINT`
//! and `LEADER_AZURE_ARM_ENDPOINT`; Kubernetes' `KUBERNETES_SERVICE_HOST` and
//! `KUBERNETES_SERVICE_PORT`, with `LEADER_K8S_SERVICEACCOUNT_DIR` for the service account's
//! folder and `POD_NAME` (else the host name) for the pod.

mod asg;
mod aws;
mod azure;
mod error;
mod gcp;
mod http;
mod protect;
mod watch;

pub use asg::AutoScaling;
pub use error::NoticeError;
pub use protect::{ProtectOn, Protection, Protector, protector};
pub use watch::{NoticeWatch, NoticeWatcher, Watch};
// The sources implement it without naming `watch`, which names them (no module cycle).
pub(crate) use watch::Source;

use std::fmt;

/// A cloud whose notices this crate reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Cloud {
    /// EC2 instance metadata (IMDSv2).
    Aws,
    /// Azure Instance Metadata Service, Scheduled Events.
    Azure,
    /// Google Compute Engine metadata server.
    Gcp,
}

impl Cloud {
    /// The name used in flags, logs and metric labels: `aws`, `azure`, `gcp`.
    pub fn as_str(self) -> &'static str {
        match self {
            Cloud::Aws => "aws",
            Cloud::Azure => "azure",
            Cloud::Gcp => "gcp",
        }
    }
}

impl fmt::Display for Cloud {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a notice announces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NoticeKind {
    /// EC2 Spot interruption (`spot/instance-action`): terminate, stop or hibernate in about
    /// two minutes.
    SpotInterruption,
    /// EC2 Auto Scaling is taking the instance out (`autoscaling/target-lifecycle-state`
    /// reads `Terminated`): a scale-in, an instance refresh, a rebalance.
    ScaleIn,
    /// Azure `Preempt`: a Spot eviction, in about 30 s.
    Preempt,
    /// Azure `Terminate`: the scale set deletes this instance (5 to 15 min ahead).
    Terminate,
    /// GCE `instance/preempted` reads `TRUE`.
    Preempted,
    /// GCE `instance/maintenance-event` reads `TERMINATE_ON_HOST_MAINTENANCE`.
    HostMaintenance,
}

impl NoticeKind {
    /// The name used in logs and metric labels, e.g. `spot_interruption`.
    pub fn as_str(self) -> &'static str {
        match self {
            NoticeKind::SpotInterruption => "spot_interruption",
            NoticeKind::ScaleIn => "scale_in",
            NoticeKind::Preempt => "preempt",
            NoticeKind::Terminate => "terminate",
            NoticeKind::Preempted => "preempted",
            NoticeKind::HostMaintenance => "host_maintenance",
        }
    }
}

impl fmt::Display for NoticeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A warning that this instance is about to be taken away.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Notice {
    /// Where it came from.
    pub cloud: Cloud,
    /// What it announces.
    pub kind: NoticeKind,
    /// What the metadata service said, for the logs (e.g. `{"action":"terminate","time":...}`).
    pub detail: String,
    /// Azure: the id of the event, which [`NoticeWatch::approve`] approves if it names this
    /// instance alone.
    pub event_id: Option<String>,
    /// Azure: whether the event lists this instance alone among its resources (an event for
    /// several machines is never approved by one of them).
    pub only_this_instance: bool,
}

impl Notice {
    /// A notice with no event to approve.
    pub fn new(cloud: Cloud, kind: NoticeKind, detail: impl Into<String>) -> Self {
        Self {
            cloud,
            kind,
            detail: detail.into(),
            event_id: None,
            only_this_instance: false,
        }
    }
}

impl fmt::Display for Notice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.cloud, self.kind, self.detail)
    }
}

/// Metric names (through the [`metrics`](https://docs.rs/metrics) facade, like the rest of
/// the suite; the table is in `docs/metrics.md`).
pub mod metric {
    /// Counter: notices for this instance, by `cloud` and `kind`.
    pub const NOTICES: &str = "leader_notices_total";
    /// Counter: failed looks at a metadata service, by `cloud`.
    pub const NOTICE_ERRORS: &str = "leader_notice_errors_total";
    /// Counter: approvals and lifecycle completions after a handover, by `cloud` and
    /// `outcome` (`ok`, `error`, `skipped`).
    pub const NOTICE_ACKS: &str = "leader_notice_acks_total";
    /// Gauge: 1 while this instance's scale-in protection is set as far as the last
    /// successful call knows, else 0.
    pub const PROTECTED: &str = "leader_scale_in_protected";
    /// Counter: protection calls, by `on` and `outcome` (`ok`, `error`).
    pub const PROTECTION_CALLS: &str = "leader_protection_calls_total";
}
