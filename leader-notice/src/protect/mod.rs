//! Scale-in protection for the instance that leads: set while it leads, cleared otherwise,
//! written again every period either way (level-triggered), never on leadership's path.

mod aws;
mod azure;
mod k8s;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::{NoticeError, metric};

/// Where this instance's scale-in protection is kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProtectOn {
    /// EC2 Auto Scaling `SetInstanceProtection` on this instance's group.
    Aws,
    /// Azure VMSS `protectionPolicy.protectFromScaleIn` on this instance.
    Azure,
    /// Kubernetes: the annotation `controller.kubernetes.io/pod-deletion-cost` on this pod.
    Kubernetes,
}

impl ProtectOn {
    /// The name used in flags, logs and metric labels: `aws`, `azure`, `k8s`.
    pub fn as_str(self) -> &'static str {
        match self {
            ProtectOn::Aws => "aws",
            ProtectOn::Azure => "azure",
            ProtectOn::Kubernetes => "k8s",
        }
    }
}

impl FromStr for ProtectOn {
    type Err = NoticeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s.trim().to_ascii_lowercase().as_str() {
            "aws" => ProtectOn::Aws,
            "azure" => ProtectOn::Azure,
            "k8s" | "kubernetes" => ProtectOn::Kubernetes,
            other => {
                return Err(NoticeError::Config(format!(
                    "unknown protection {other:?}: expected aws, azure or k8s"
                )));
            }
        })
    }
}

/// Sets or clears this instance's scale-in protection.
#[async_trait]
pub trait Protector: Send + Sync {
    /// What is protected, for the logs (e.g. `i-0abc in Auto Scaling group web`).
    fn describe(&self) -> String;

    /// Sets (`true`) or clears (`false`) the protection. Idempotent.
    ///
    /// # Errors
    /// The service's error.
    async fn set(&self, protected: bool) -> Result<(), NoticeError>;
}

/// The protector of this instance on `on`: finds out which instance, group, scale set or pod
/// this is (from the metadata service, or the pod's environment).
///
/// # Errors
/// [`NoticeError::Config`] if this is not such an instance (not in an Auto Scaling group, not
/// in a scale set, no service account); the service's error if it could not be asked.
pub async fn protector(on: ProtectOn) -> Result<Arc<dyn Protector>, NoticeError> {
    Ok(match on {
        ProtectOn::Aws => Arc::new(aws::AsgProtector::discover().await?),
        ProtectOn::Azure => Arc::new(azure::VmssProtector::discover().await?),
        ProtectOn::Kubernetes => Arc::new(k8s::PodProtector::discover()?),
    })
}

/// The shortest period [`Protection::start`] uses (a shorter one is raised to it).
const MIN_EVERY: Duration = Duration::from_secs(1);

/// The first pause after a failed protection call; doubled after each, up to the period.
const RETRY_FIRST: Duration = Duration::from_secs(1);

/// How long [`Protection::finish`] tries to clear the mark.
pub(crate) const FINISH_WITHIN: Duration = Duration::from_secs(5);

/// Keeps the protection equal to "leads", in a task of its own.
pub struct Protection {
    task: JoinHandle<()>,
    protector: Arc<dyn Protector>,
    on: &'static str,
}

impl Protection {
    /// Starts the task: the mark follows `leading` at each change, and is written again every
    /// `every` (set while leading, cleared otherwise), so that a mark left by a crashed leader
    /// is undone once this instance runs again. A failed call is retried (1 s, doubling, at most
    /// `every`) and never touches leadership. An `every` below 1 s is taken as 1 s.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn start(
        protector: Arc<dyn Protector>,
        on: ProtectOn,
        leading: watch::Receiver<bool>,
        every: Duration,
    ) -> Self {
        let on = on.as_str();
        // Each period is a call to the cloud's control plane: never a tight loop.
        let every = every.max(MIN_EVERY);
        let task = tokio::spawn(keep(protector.clone(), on, leading, every));
        Self {
            task,
            protector,
            on,
        }
    }

    /// Stops the task and clears the mark (within 5 s): for the end of the process. A failure is logged; the next start of the process clears the mark anyway.
    pub async fn finish(self) {
        self.task.abort();
        let _ = self.task.await;
        match tokio::time::timeout(FINISH_WITHIN, self.protector.set(false)).await {
            Ok(Ok(())) => {
                record(self.on, "ok");
                ::metrics::gauge!(metric::PROTECTED).set(0.0);
                info!(target = %self.protector.describe(), "scale-in protection cleared");
            }
            Ok(Err(e)) => {
                record(self.on, "error");
                warn!(error = %e, "could not clear the scale-in protection at exit");
            }
            Err(_) => {
                record(self.on, "error");
                warn!("clearing the scale-in protection at exit took too long; gave up");
            }
        }
    }
}

fn record(on: &'static str, outcome: &'static str) {
    ::metrics::counter!(metric::PROTECTION_CALLS, "on" => on, "outcome" => outcome).increment(1);
}

async fn keep(
    protector: Arc<dyn Protector>,
    on: &'static str,
    mut leading: watch::Receiver<bool>,
    every: Duration,
) {
    let target = protector.describe();
    let mut retry = RETRY_FIRST;
    let mut applied = None;
    loop {
        let want = *leading.borrow_and_update();
        let pause = match protector.set(want).await {
            Ok(()) => {
                record(on, "ok");
                ::metrics::gauge!(metric::PROTECTED).set(if want { 1.0 } else { 0.0 });
                if applied != Some(want) {
                    info!(%target, protected = want, "scale-in protection written");
                } else {
                    debug!(%target, protected = want, "scale-in protection written again");
                }
                applied = Some(want);
                retry = RETRY_FIRST;
                every
            }
            Err(e) => {
                record(on, "error");
                warn!(%target, protected = want, error = %e, "could not write the scale-in protection; retrying (leadership is not affected)");
                let pause = retry.min(every);
                retry = (retry * 2).min(every);
                pause
            }
        };
        tokio::select! {
            changed = leading.changed() => {
                if changed.is_err() {
                    // The leadership's sender is gone: the run is ending; `finish` clears.
                    std::future::pending::<()>().await;
                }
            }
            _ = tokio::time::sleep(pause) => {}
        }
    }
}
