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
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

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

/// The first pause after a failed protection call; doubled after each, up to the period.
const RETRY_FIRST: Duration = Duration::from_secs(1);

/// How long [`Protection::finish`] tries to clear the mark.
pub(crate) const FINISH_WITHIN: Duration = Duration::from_secs(5);

/// Keeps the protection equal to "leads", in a task of its own.
pub struct Protection {
    task: JoinHandle<()>,
    /// Asks the task to stop between calls (never in the middle of one).
    stop: CancellationToken,
    protector: Arc<dyn Protector>,
    on: &'static str,
}

impl Protection {
    /// The shortest period [`start`](Self::start) uses (a shorter one is raised to it).
    pub const MIN_EVERY: Duration = Duration::from_secs(1);

    /// Starts the task: the mark follows `leading` at each change, and is written again every
    /// `every` (set while leading, cleared otherwise), so that a mark left by a crashed leader
    /// is undone once this instance runs again. A failed call is retried (1 s, doubling, at most
    /// `every`; a refusal or a configuration error, which a retry cannot fix soon, at `every`)
    /// and never touches leadership. An `every` below 1 s is taken as 1 s.
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
        let every = every.max(Self::MIN_EVERY);
        let stop = CancellationToken::new();
        let task = tokio::spawn(keep(protector.clone(), on, leading, every, stop.clone()));
        Self {
            task,
            stop,
            protector,
            on,
        }
    }

    /// Stops the task and clears the mark, for the end of the process, within 5 s: a call
    /// in flight is let finish first (aborted, it could still land after the clearing), then
    /// the mark is cleared, retried while the service answers that it may pass. A failure is
    /// logged; the next start of the process clears the mark anyway.
    pub async fn finish(mut self) {
        let deadline = tokio::time::Instant::now() + FINISH_WITHIN;
        self.stop.cancel();
        if tokio::time::timeout_at(deadline, &mut self.task)
            .await
            .is_err()
        {
            self.task.abort();
        }
        let target = self.protector.describe();
        let mut pause = Duration::from_millis(200);
        loop {
            match tokio::time::timeout_at(deadline, self.protector.set(false)).await {
                Ok(Ok(())) => {
                    record(self.on, "ok");
                    ::metrics::gauge!(metric::PROTECTED).set(0.0);
                    info!(%target, "scale-in protection cleared");
                    return;
                }
                Ok(Err(e))
                    if e.is_retryable() && tokio::time::Instant::now() + pause < deadline =>
                {
                    record(self.on, "error");
                    debug!(%target, error = %e, "clearing the scale-in protection: retrying");
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                }
                Ok(Err(e)) => {
                    record(self.on, "error");
                    warn!(%target, error = %e, "could not clear the scale-in protection at exit");
                    return;
                }
                Err(_) => {
                    record(self.on, "error");
                    warn!(%target, "clearing the scale-in protection at exit took too long; gave up");
                    return;
                }
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
    stop: CancellationToken,
) {
    let target = protector.describe();
    let mut retry = RETRY_FIRST;
    let mut applied = None;
    let mut refused = false;
    while !stop.is_cancelled() {
        let want = *leading.borrow_and_update();
        let pause = match protector.set(want).await {
            Ok(()) => {
                record(on, "ok");
                ::metrics::gauge!(metric::PROTECTED).set(if want { 1.0 } else { 0.0 });
                if applied != Some(want) || refused {
                    info!(%target, protected = want, "scale-in protection written");
                } else {
                    debug!(%target, protected = want, "scale-in protection written again");
                }
                (applied, refused, retry) = (Some(want), false, RETRY_FIRST);
                every
            }
            // A refusal or a configuration error: said once, tried again each period (a
            // permission may be granted meanwhile), never in a fast loop.
            Err(e) if !e.is_retryable() => {
                record(on, "error");
                if !refused {
                    error!(%target, protected = want, error = %e, "cannot write the scale-in protection; trying again every period (leadership is not affected)");
                }
                refused = true;
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
            () = stop.cancelled() => return,
            changed = leading.changed() => {
                if changed.is_err() {
                    // The leadership's sender is gone: the run is ending; `finish` clears.
                    stop.cancelled().await;
                }
            }
            _ = tokio::time::sleep(pause) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Mutex;

    use super::*;

    /// A protector whose writes land (are recorded) a while after they are sent, whether or
    /// not the caller still waits, as a request that has left the machine: the first after
    /// `first`, the others after `then`. Refuses everything if `deny`.
    struct Recorder {
        first: Duration,
        then: Duration,
        deny: bool,
        sent: std::sync::atomic::AtomicUsize,
        landed: Arc<Mutex<Vec<bool>>>,
    }

    #[async_trait]
    impl Protector for Recorder {
        fn describe(&self) -> String {
            "a recorder".to_owned()
        }

        async fn set(&self, protected: bool) -> Result<(), NoticeError> {
            if self.deny {
                return Err(NoticeError::Denied {
                    service: "aws",
                    message: "no".to_owned(),
                });
            }
            let n = self.sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let delay = if n == 0 { self.first } else { self.then };
            let landed = self.landed.clone();
            let request = tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                landed.lock().unwrap().push(protected);
            });
            request.await.unwrap();
            Ok(())
        }
    }

    fn recorder(first: Duration, then: Duration, deny: bool) -> Arc<Recorder> {
        Arc::new(Recorder {
            first,
            then,
            deny,
            sent: std::sync::atomic::AtomicUsize::new(0),
            landed: Arc::new(Mutex::new(Vec::new())),
        })
    }

    #[tokio::test(start_paused = true)]
    async fn finish_lets_the_write_in_flight_land_before_it_clears() {
        let r = recorder(
            Duration::from_millis(1000),
            Duration::from_millis(10),
            false,
        );
        let (_tx, leading) = watch::channel(true);
        let p = Protection::start(r.clone(), ProtectOn::Aws, leading, Duration::from_secs(60));
        // The first set(true) is in flight.
        tokio::time::sleep(Duration::from_millis(100)).await;
        p.finish().await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        // Aborted, the slow true would land after the quick false; let finish, it lands first.
        assert_eq!(*r.landed.lock().unwrap(), vec![true, false]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_mark_follows_leadership_and_a_refusal_is_not_retried_fast() {
        let r = recorder(Duration::ZERO, Duration::ZERO, false);
        let (tx, leading) = watch::channel(false);
        let p = Protection::start(r.clone(), ProtectOn::Aws, leading, Duration::from_secs(60));
        tokio::time::sleep(Duration::from_millis(10)).await;
        tx.send_replace(true);
        tokio::time::sleep(Duration::from_millis(10)).await;
        tx.send_replace(false);
        // Two periods: written again, cleared, each time.
        tokio::time::sleep(Duration::from_secs(121)).await;
        assert_eq!(
            *r.landed.lock().unwrap(),
            vec![false, true, false, false, false]
        );
        p.finish().await;

        let denied = recorder(Duration::ZERO, Duration::ZERO, true);
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        struct Counting(Arc<Recorder>, Arc<std::sync::atomic::AtomicUsize>);
        #[async_trait]
        impl Protector for Counting {
            fn describe(&self) -> String {
                self.0.describe()
            }
            async fn set(&self, protected: bool) -> Result<(), NoticeError> {
                self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                self.0.set(protected).await
            }
        }
        let (_tx, leading) = watch::channel(true);
        let counting = Arc::new(Counting(denied, calls.clone()));
        let p = Protection::start(counting, ProtectOn::Aws, leading, Duration::from_secs(60));
        tokio::time::sleep(Duration::from_secs(601)).await;
        // One at the start and one per period: a refusal waits for the period.
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 11);
        p.task.abort();
    }
}
