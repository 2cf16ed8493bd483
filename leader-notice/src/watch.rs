//! The notice watcher: one polling task per cloud, the first notice for this instance
//! published once.

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use crate::{Cloud, Notice, NoticeError, metric};

/// Which metadata services to watch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Watch {
    /// Each cloud whose metadata service answers here (none, off any cloud).
    Auto,
    /// This cloud's only; an absent service is logged and looked at again.
    Only(Cloud),
}

impl FromStr for Watch {
    type Err = NoticeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Watch::Auto,
            "aws" | "ec2" => Watch::Only(Cloud::Aws),
            "azure" => Watch::Only(Cloud::Azure),
            "gcp" | "gce" | "google" => Watch::Only(Cloud::Gcp),
            other => {
                return Err(NoticeError::Config(format!(
                    "unknown notice source {other:?}: expected auto, aws, azure or gcp"
                )));
            }
        })
    }
}

/// A waiting look (no pause of its own) that answers sooner than this is followed by a pause
/// of this long.
const QUICK_LOOK: Duration = Duration::from_secs(1);

/// Counts a source's first look once, in the watch's `looked`.
struct FirstLook(Option<Arc<watch::Sender<usize>>>);

impl FirstLook {
    fn done(&mut self) {
        if let Some(tx) = self.0.take() {
            tx.send_modify(|n| *n += 1);
        }
    }
}

/// A source, shared by its polling task and [`NoticeWatch::approve`].
type Shared = Arc<tokio::sync::Mutex<Box<dyn Source>>>;

/// One cloud's metadata service, as the watcher uses it.
#[async_trait]
pub(crate) trait Source: Send + Sync {
    fn cloud(&self) -> Cloud;

    /// Whether this cloud's metadata service answers here (for [`Watch::Auto`]): one quick
    /// request, `false` on any failure.
    async fn present(&self) -> bool;

    /// One look for a notice for this instance. GCE's look is a hanging GET that returns
    /// when the value changes or after about a minute.
    async fn look(&mut self) -> Result<Option<Notice>, NoticeError>;

    /// The pause after a look: the cloud's recommended rate (AWS 5 s, Azure 1 s, GCE none:
    /// the next hanging GET at once).
    fn pause(&self) -> Duration;

    /// Approves this notice's event so that the platform goes ahead at once (Azure
    /// `StartRequests`, only for an event that names this instance alone). `Ok(false)`: there
    /// is nothing to approve on this cloud or for this notice.
    async fn approve(&self, notice: &Notice) -> Result<bool, NoticeError>;
}

/// Watches this instance's metadata services for a notice. Build it, [`spawn`] it, and wait
/// on [`NoticeWatch::notice`].
///
/// [`spawn`]: NoticeWatcher::spawn
pub struct NoticeWatcher {
    which: Watch,
    every: Option<Duration>,
}

impl NoticeWatcher {
    /// The shortest [`poll_every`](Self::poll_every) a metadata service is asked at.
    pub const MIN_POLL: Duration = Duration::from_millis(100);

    /// A watcher of `which` cloud(s), at each cloud's recommended rate.
    pub fn new(which: Watch) -> Self {
        Self { which, every: None }
    }

    /// Looks this often on AWS and Azure instead of their recommended 5 s and 1 s (GCE's
    /// hanging GET answers at once anyway). Must be at least 100 ms.
    ///
    /// # Errors
    /// [`NoticeError::Config`] below 100 ms.
    pub fn poll_every(mut self, every: Duration) -> Result<Self, NoticeError> {
        if every < Self::MIN_POLL {
            return Err(NoticeError::Config(format!(
                "a notice poll of {every:?} is too fast for a metadata service; at least {:?}",
                Self::MIN_POLL
            )));
        }
        self.every = Some(every);
        Ok(self)
    }

    /// Starts watching, in tasks of the current tokio runtime, from now on: Azure enrols an
    /// instance in Scheduled Events only at its first request, and switches them off after a
    /// day without one.
    ///
    /// # Errors
    /// [`NoticeError::Config`] if an endpoint setting does not parse.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn spawn(self) -> Result<NoticeWatch, NoticeError> {
        let clouds = match self.which {
            Watch::Auto => vec![Cloud::Aws, Cloud::Azure, Cloud::Gcp],
            Watch::Only(c) => vec![c],
        };
        let mut sources: Vec<Box<dyn Source>> = Vec::new();
        for cloud in clouds {
            sources.push(match cloud {
                Cloud::Aws => Box::new(crate::aws::ImdsSource::from_env()?),
                Cloud::Azure => Box::new(crate::azure::ScheduledEvents::from_env()?),
                Cloud::Gcp => Box::new(crate::gcp::GceMetadata::from_env()?),
            });
        }
        let (tx, rx) = watch::channel(None);
        let tx = Arc::new(tx);
        let mut tasks = JoinSet::new();
        // With Auto: how many clouds may still be here (each absent one counts down).
        let auto = (self.which == Watch::Auto).then(|| Arc::new(AtomicUsize::new(sources.len())));
        let sources: Vec<(Cloud, Shared)> = sources
            .into_iter()
            .map(|s| (s.cloud(), Arc::new(tokio::sync::Mutex::new(s))))
            .collect();
        let (looked_tx, looked) = watch::channel(0usize);
        let looked_tx = Arc::new(looked_tx);
        for (_, source) in &sources {
            let first = FirstLook(Some(looked_tx.clone()));
            tasks.spawn(poll(
                source.clone(),
                tx.clone(),
                auto.clone(),
                self.every,
                first,
            ));
        }
        Ok(NoticeWatch {
            rx,
            looked,
            sources,
            _tasks: tasks,
        })
    }
}

/// A running watcher; dropping it stops the polling.
pub struct NoticeWatch {
    rx: watch::Receiver<Option<Notice>>,
    /// How many sources have made their first look (or found their service absent).
    looked: watch::Receiver<usize>,
    sources: Vec<(Cloud, Shared)>,
    _tasks: JoinSet<()>,
}

impl NoticeWatch {
    /// The notice, once one has come (the first one; later ones are not published).
    pub fn current(&self) -> Option<Notice> {
        self.rx.borrow().clone()
    }

    /// Waits until every watched service has answered its first look (or was found absent),
    /// at most `within`: a program that waits for this before it campaigns does not win a
    /// term on a machine whose notice is already out. (Azure's first request may take up to
    /// two minutes: its enrolment.)
    ///
    /// # Cancel safety
    /// Cancel-safe.
    pub async fn first_looks(&self, within: Duration) {
        let total = self.sources.len();
        let mut looked = self.looked.clone();
        let _ = tokio::time::timeout(within, looked.wait_for(|n| *n >= total)).await;
    }

    /// Waits for the first notice for this instance (forever, if none comes).
    ///
    /// # Cancel safety
    /// Cancel-safe.
    pub async fn notice(&self) -> Notice {
        let mut rx = self.rx.clone();
        let got = rx.wait_for(Option::is_some).await.map(|n| n.clone());
        match got {
            Ok(Some(notice)) => notice,
            // The watcher's tasks are gone (the runtime is shutting down): no notice will come.
            _ => std::future::pending().await,
        }
    }

    /// After the handover: approves the notice's event so that the platform goes ahead now
    /// rather than at its deadline (Azure `StartRequests`, for an event that names this
    /// instance alone). `Ok(false)` when there is nothing to approve (no notice yet, another
    /// cloud, an event of several machines).
    ///
    /// # Errors
    /// The metadata service's error; the platform then goes ahead at its own deadline.
    pub async fn approve(&self) -> Result<bool, NoticeError> {
        let Some(notice) = self.current() else {
            return Ok(false);
        };
        for (cloud, source) in &self.sources {
            if *cloud == notice.cloud {
                // Free: this cloud's polling stopped at the notice.
                let source = source.lock().await;
                let approved = source.approve(&notice).await;
                let outcome = match &approved {
                    Ok(true) => "ok",
                    Ok(false) => "skipped",
                    Err(_) => "error",
                };
                ::metrics::counter!(metric::NOTICE_ACKS, "cloud" => notice.cloud.as_str(), "outcome" => outcome).increment(1);
                return approved;
            }
        }
        Ok(false)
    }
}

/// One cloud's polling loop: until the first notice (then it stops: this instance is doomed).
async fn poll(
    source: Shared,
    tx: Arc<watch::Sender<Option<Notice>>>,
    auto: Option<Arc<AtomicUsize>>,
    every: Option<Duration>,
    mut first: FirstLook,
) {
    let mut source = source.lock().await;
    let cloud = source.cloud();
    if let Some(absent) = &auto
        && !source.present().await
    {
        debug!(%cloud, "no metadata service of this cloud here; not watching it");
        // The last of the clouds found absent says so once: no notice will ever come.
        if absent.fetch_sub(1, Ordering::AcqRel) == 1 {
            warn!(
                "no cloud's metadata service answered (aws, azure, gcp): no notice will be seen; in a container on EC2, IMDSv2 needs a hop limit of 2"
            );
        }
        return;
    }
    info!(%cloud, "watching for scale-in and preemption notices");
    let mut failures = 0u64;
    loop {
        let looked = tokio::time::Instant::now();
        // The first look is counted after its notice (if any) is published.
        match source.look().await {
            Ok(Some(notice)) => {
                ::metrics::counter!(metric::NOTICES, "cloud" => cloud.as_str(), "kind" => notice.kind.as_str()).increment(1);
                warn!(%cloud, kind = %notice.kind, detail = %notice.detail, "notice: this instance is going away");
                tx.send_if_modified(|n| {
                    if n.is_some() {
                        return false;
                    }
                    *n = Some(notice);
                    true
                });
                first.done();
                return;
            }
            Ok(None) => {
                if failures > 0 {
                    info!(%cloud, "the metadata service answers again");
                }
                failures = 0;
            }
            Err(e) => {
                ::metrics::counter!(metric::NOTICE_ERRORS, "cloud" => cloud.as_str()).increment(1);
                failures += 1;
                // The first failure and then one in a hundred: a missing service must not
                // flood the log.
                if failures == 1 || failures.is_multiple_of(100) {
                    warn!(%cloud, error = %e, failures, "could not look for a notice (leadership is not affected)");
                } else {
                    debug!(%cloud, error = %e, "could not look for a notice");
                }
            }
        }
        first.done();
        let pause = match (cloud, every) {
            (Cloud::Gcp, _) => source.pause(),
            (_, Some(every)) => every,
            (_, None) => source.pause(),
        };
        // A look that failed at once (connection refused) must not spin, nor a waiting
        // request that a server answers at once every time (GCE's pause is zero).
        let pause = if failures > 0 {
            pause.max(Duration::from_millis(500))
        } else if pause.is_zero() && looked.elapsed() < QUICK_LOOK {
            QUICK_LOOK
        } else {
            pause
        };
        tokio::time::sleep(pause).await;
    }
}
