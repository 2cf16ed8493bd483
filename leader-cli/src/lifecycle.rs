//! `leader run` and the autoscaler: scale-in and preemption notices (`--watch-notices`), the
//! lifecycle hook completed after the handover (`--complete-lifecycle-hook`), scale-in
//! protection while leading (`--protect-leader`), and a step-down signal
//! (`--step-down-on`). The cloud side is `leader::notice`; this module wires it to the run.

use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use leader::notice::{
    AutoScaling, NoticeError, NoticeKind, NoticeWatch, NoticeWatcher, ProtectOn, Protection,
    Protector, Watch, protector,
};
use leader::{ElectorHandle, Leadership};
use nix::sys::signal::Signal;
use tokio::sync::watch;
use tracing::{error, info, warn};

use crate::signals::{Received, Signals, StepDown};
use crate::{Exit, exit};

#[derive(Debug, Args)]
#[command(next_help_heading = "Autoscalers (see \"Autoscalers\" below)")]
pub(crate) struct LifecycleArgs {
    /// Watch this machine's metadata service for a scale-in or preemption notice: auto (each
    /// cloud whose service answers), aws, azure, gcp, or off. On a notice the leader stops the
    /// command (the grace period) and releases at once, so a follower takes over within a
    /// poll; a follower stops campaigning; then the instance waits for its stop signal (see
    /// "Autoscalers" below).
    #[arg(long, env = "LEADER_WATCH_NOTICES", value_name = "CLOUD", default_value = "off",
          value_parser = parse_watch)]
    watch_notices: WatchArg,
    /// How often to read the notices on AWS and Azure, 100ms to 60s (default: their
    /// recommended 5s and 1s; GCE answers a waiting request at once).
    #[arg(long, env = "LEADER_NOTICE_POLL", value_parser = crate::parse_duration)]
    notice_poll: Option<Duration>,
    /// After handing over on an Auto Scaling scale-in notice, complete this terminate
    /// lifecycle hook (CONTINUE), so the instance leaves now rather than at the hook's
    /// timeout. Needs --watch-notices aws or auto.
    #[arg(long, env = "LEADER_COMPLETE_LIFECYCLE_HOOK", value_name = "NAME")]
    complete_lifecycle_hook: Option<String>,
    /// Protect this instance from scale-in while it leads: aws (Auto Scaling instance
    /// protection), azure (VMSS protectFromScaleIn) or k8s (the pod deletion cost). Cleared
    /// when the term ends, at start-up and every --protect-every while following.
    #[arg(long, env = "LEADER_PROTECT_LEADER", value_name = "WHERE",
          value_parser = parse_protect)]
    protect_leader: Option<ProtectOn>,
    /// How often the protection is written again (set while leading, cleared otherwise),
    /// 1s to 1h: one call to the cloud's control plane per instance and period.
    #[arg(long, env = "LEADER_PROTECT_EVERY", value_parser = crate::parse_duration,
          default_value = "5m")]
    protect_every: Duration,
    /// Step down on this signal (USR1 or USR2; otherwise it is passed on to the command): the
    /// command is stopped as at a stop signal, the lease released, and the instance keeps
    /// following (it does not campaign for one ttl, so another instance takes over).
    #[arg(long, env = "LEADER_STEP_DOWN_ON", value_name = "SIGNAL",
          value_parser = parse_step_down_signal)]
    pub(crate) step_down_on: Option<Signal>,
}

/// `--watch-notices`: `off` (None) or what to watch. A type of its own because clap takes a
/// field's type from its parser's, and `Option` would make the flag optional instead.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WatchArg(Option<Watch>);

fn parse_watch(s: &str) -> Result<WatchArg, String> {
    if s.trim().eq_ignore_ascii_case("off") {
        return Ok(WatchArg(None));
    }
    s.parse()
        .map(|w| WatchArg(Some(w)))
        .map_err(|e: NoticeError| e.to_string())
}

fn parse_protect(s: &str) -> Result<ProtectOn, String> {
    s.parse().map_err(|e: NoticeError| e.to_string())
}

fn parse_step_down_signal(s: &str) -> Result<Signal, String> {
    match s
        .trim()
        .trim_start_matches("SIG")
        .to_ascii_uppercase()
        .as_str()
    {
        "USR1" => Ok(Signal::SIGUSR1),
        "USR2" => Ok(Signal::SIGUSR2),
        other => Err(format!(
            "{other:?}: only USR1 or USR2 (the stop signals already stop; others are not \
             passed on)"
        )),
    }
}

impl LifecycleArgs {
    /// The flags that cannot go with `--shards`, as a usage error.
    pub(crate) fn check_sharded(&self) -> Result<(), Exit> {
        let refuse = |flag: &str, why: &str| {
            Err(Exit::new(
                exit::USAGE,
                format!("{flag} cannot be used with --shards: {why}"),
            ))
        };
        if self.protect_leader.is_some() {
            return refuse(
                "--protect-leader",
                "every instance of a sharded key leads shards, and protecting every instance \
                 would block every scale-in",
            );
        }
        if self.step_down_on.is_some() {
            return refuse(
                "--step-down-on",
                "the shards are balanced over the instances; stop the instance to move its \
                 shards",
            );
        }
        Ok(())
    }

    pub(crate) fn check(&self) -> Result<(), Exit> {
        let aws = matches!(
            self.watch_notices.0,
            Some(Watch::Auto | Watch::Only(leader::notice::Cloud::Aws))
        );
        if !(MIN_PROTECT_EVERY..=MAX_PROTECT_EVERY).contains(&self.protect_every) {
            return Err(Exit::new(
                exit::USAGE,
                format!(
                    "--protect-every {:?}: between {MIN_PROTECT_EVERY:?} and {MAX_PROTECT_EVERY:?} \
                     (each period writes the mark once)",
                    self.protect_every
                ),
            ));
        }
        if let Some(poll) = self.notice_poll {
            if self.watch_notices.0.is_none() {
                return usage("--notice-poll needs --watch-notices".to_owned());
            }
            if !(MIN_NOTICE_POLL..=MAX_NOTICE_POLL).contains(&poll) {
                return usage(format!(
                    "--notice-poll {poll:?}: between {MIN_NOTICE_POLL:?} and {MAX_NOTICE_POLL:?} \
                     (a Spot notice comes 2 minutes ahead, an Azure Preempt 30 s)"
                ));
            }
        }
        if self
            .complete_lifecycle_hook
            .as_deref()
            .is_some_and(|h| h.trim().is_empty())
        {
            return usage("--complete-lifecycle-hook: the hook's name is empty".to_owned());
        }
        if self.complete_lifecycle_hook.is_some() && !aws {
            return Err(Exit::new(
                exit::USAGE,
                "--complete-lifecycle-hook needs --watch-notices aws (or auto): the hook is \
                 completed after the handover that the scale-in notice starts"
                    .to_owned(),
            ));
        }
        Ok(())
    }
}

/// The shortest `--protect-every`: each period is one call to the cloud's control plane.
const MIN_PROTECT_EVERY: Duration = Protection::MIN_EVERY;

/// The longest `--protect-every`: a stale mark is undone within the hour.
const MAX_PROTECT_EVERY: Duration = Duration::from_secs(3600);

/// The bounds of `--notice-poll`.
const MIN_NOTICE_POLL: Duration = NoticeWatcher::MIN_POLL;
const MAX_NOTICE_POLL: Duration = Duration::from_secs(60);

fn usage(message: String) -> Result<(), Exit> {
    Err(Exit::new(exit::USAGE, message))
}

/// What `leader run` keeps of these flags while it runs.
pub(crate) struct Lifecycle {
    watch: Option<Arc<NoticeWatch>>,
    hook: Option<String>,
    protection: Option<Protecting>,
    protect_every: Duration,
}

/// The protection, once its target is known.
enum Protecting {
    /// Found at start-up.
    Ready(ProtectOn, Arc<dyn Protector>),
    /// Not found yet (the service did not answer): looked for again in the background.
    Pending(ProtectOn),
    Running(Protection),
    Background(tokio::task::JoinHandle<Option<Protection>>),
}

/// How long `leader run` waits at start-up for the first look at each metadata service.
const FIRST_LOOKS_WITHIN: Duration = Duration::from_secs(3);

/// How long `leader run` waits at start-up to find what to protect before it goes on and
/// keeps looking in the background.
const DISCOVER_WITHIN: Duration = Duration::from_secs(15);

impl Lifecycle {
    /// Finds what to protect (a permanent error ends the run now), and starts the notice
    /// watcher, whose notice arrives through `signals` as a step-down. The flags were checked
    /// before the store was opened (`LifecycleArgs::check`, from `run`).
    pub(crate) async fn start(args: &LifecycleArgs, signals: &mut Signals) -> Result<Self, Exit> {
        let protection = match args.protect_leader {
            Some(on) => Some(discover(on).await?),
            None => None,
        };
        let watch = match args.watch_notices.0 {
            Some(which) => {
                let mut watcher = NoticeWatcher::new(which);
                if let Some(every) = args.notice_poll {
                    watcher = watcher.poll_every(every).map_err(config)?;
                }
                let watch = Arc::new(watcher.spawn().map_err(config)?);
                // Not campaigning on a machine whose notice is already out (a restart there):
                // the first looks, briefly (Azure's enrolment may take longer; then the check
                // as each term begins still keeps the command from starting).
                watch.first_looks(FIRST_LOOKS_WITHIN).await;
                let tx = signals.sender();
                let w = watch.clone();
                tokio::spawn(async move {
                    let notice = w.notice().await;
                    warn!(%notice, "a notice for this instance: handing over, and not campaigning again");
                    let _ = tx.send(Received::StepDown(StepDown::Notice));
                });
                Some(watch)
            }
            None => None,
        };
        Ok(Self {
            watch,
            hook: args.complete_lifecycle_hook.clone(),
            protection,
            protect_every: args.protect_every,
        })
    }

    /// Whether a notice for this instance has come.
    pub(crate) fn doomed(&self) -> bool {
        self.watch.as_ref().is_some_and(|w| w.current().is_some())
    }

    /// Starts the protection (if asked for): it follows `leading`.
    pub(crate) fn protect(&mut self, leading: watch::Receiver<bool>) {
        let every = self.protect_every;
        self.protection = match self.protection.take() {
            Some(Protecting::Ready(on, p)) => Some(Protecting::Running(Protection::start(
                p, on, leading, every,
            ))),
            Some(Protecting::Pending(on)) => {
                Some(Protecting::Background(tokio::spawn(async move {
                    let p = discover_in_background(on).await?;
                    Some(Protection::start(p, on, leading, every))
                })))
            }
            other => other,
        };
    }

    /// After the handover that a notice started: lets the platform go ahead now (Azure: this
    /// instance's own event approved; AWS with `--complete-lifecycle-hook`: the hook
    /// completed). Failures are logged: the platform then goes ahead at its own deadline.
    pub(crate) async fn after_handover(&self) {
        let Some(watch) = &self.watch else { return };
        let Some(notice) = watch.current() else {
            return;
        };
        match watch.approve().await {
            Ok(true) => {
                info!(event = ?notice.event_id, "approved this instance's event: it may go now")
            }
            Ok(false) if notice.event_id.is_some() && !notice.only_this_instance => info!(
                event = ?notice.event_id,
                "the event names other machines too: not approved (it starts at its own time)"
            ),
            Ok(false) => {}
            Err(e) => {
                warn!(error = %e, "could not approve the event; the platform goes ahead at its own time")
            }
        }
        if let (Some(hook), NoticeKind::ScaleIn) = (&self.hook, notice.kind) {
            let outcome = match complete_hook(hook).await {
                Ok((group, instance)) => {
                    info!(%hook, %group, %instance, "lifecycle action completed (CONTINUE): the instance may go now");
                    "ok"
                }
                Err(e) => {
                    error!(%hook, error = %e, "could not complete the lifecycle action; the group goes ahead at the hook's timeout");
                    "error"
                }
            };
            metrics::counter!(leader::notice::metric::NOTICE_ACKS, "cloud" => "aws", "outcome" => outcome).increment(1);
        }
    }

    /// After the handover (or instead of campaigning, on a machine whose notice was out at
    /// start-up): lets the platform go ahead, then waits for the stop signal; the exit code.
    pub(crate) async fn stand_down(&self, signals: &mut Signals) -> u8 {
        self.after_handover().await;
        128 + wait_for_stop(signals).await as u8
    }

    /// Clears the protection (for the end of the run).
    pub(crate) async fn finish(self) {
        match self.protection {
            Some(Protecting::Running(p)) => p.finish().await,
            Some(Protecting::Background(task)) => {
                task.abort();
                if let Ok(Some(p)) = task.await {
                    p.finish().await;
                }
            }
            _ => {}
        }
    }
}

/// `leading`, as a boolean that follows an elector's leadership.
pub(crate) fn leading(handle: &ElectorHandle) -> watch::Receiver<bool> {
    let mut leadership = handle.leadership();
    let (tx, rx) = watch::channel(leadership.borrow().is_leader());
    tokio::spawn(async move {
        while leadership.changed().await.is_ok() {
            let leads = matches!(*leadership.borrow_and_update(), Leadership::Leader { .. });
            tx.send_if_modified(|now| std::mem::replace(now, leads) != leads);
        }
        tx.send_replace(false);
        // Kept open until the run ends, so that the protection clears rather than stops.
        tx.closed().await;
    });
    rx
}

fn config(e: NoticeError) -> Exit {
    Exit::new(exit::CONFIG, e.to_string())
}

/// Finds what `--protect-leader` protects: a permanent error ends the run (exit 78), a
/// service that does not answer in time is looked for again in the background.
async fn discover(on: ProtectOn) -> Result<Protecting, Exit> {
    match tokio::time::timeout(DISCOVER_WITHIN, protector(on)).await {
        Ok(Ok(p)) => {
            info!(target = %p.describe(), "scale-in protection while leading");
            Ok(Protecting::Ready(on, p))
        }
        Ok(Err(e)) if !e.is_retryable() => Err(Exit::new(
            exit::CONFIG,
            format!("--protect-leader {}: {e}", on.as_str()),
        )),
        Ok(Err(e)) => {
            warn!(error = %e, "could not find what to protect yet; trying again in the background");
            Ok(Protecting::Pending(on))
        }
        Err(_) => {
            warn!("finding what to protect takes long; trying again in the background");
            Ok(Protecting::Pending(on))
        }
    }
}

async fn discover_in_background(on: ProtectOn) -> Option<Arc<dyn Protector>> {
    let mut pause = Duration::from_secs(1);
    loop {
        match tokio::time::timeout(DISCOVER_WITHIN, protector(on)).await {
            Ok(Ok(p)) => {
                info!(target = %p.describe(), "scale-in protection while leading");
                return Some(p);
            }
            Ok(Err(e)) if !e.is_retryable() => {
                error!(error = %e, "--protect-leader: giving up; this instance is not protected");
                return None;
            }
            Ok(Err(e)) => warn!(error = %e, "could not find what to protect yet"),
            Err(_) => warn!("finding what to protect took too long"),
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(60));
    }
}

async fn complete_hook(hook: &str) -> Result<(String, String), NoticeError> {
    let asg = AutoScaling::from_env().await?;
    let (instance, group) = asg.this_instance().await?;
    asg.complete_lifecycle_action(&group, hook, &instance)
        .await?;
    Ok((group, instance))
}

/// After a notice: nothing to do but wait for the stop signal that the shutdown sends.
async fn wait_for_stop(signals: &mut Signals) -> Signal {
    info!("this instance is going away; not campaigning, waiting for the stop signal");
    loop {
        if let Received::Stop(sig) = signals.recv().await {
            return sig;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flags_parse_and_refuse_what_they_cannot_do() {
        assert_eq!(parse_watch("off").unwrap().0, None);
        assert_eq!(
            parse_watch("AWS").unwrap().0,
            Some(Watch::Only(leader::notice::Cloud::Aws))
        );
        assert_eq!(parse_watch("auto").unwrap().0, Some(Watch::Auto));
        assert!(
            parse_watch("ibm")
                .unwrap_err()
                .contains("auto, aws, azure or gcp")
        );
        assert_eq!(parse_protect("k8s").unwrap(), ProtectOn::Kubernetes);
        assert!(
            parse_protect("gcp").is_err(),
            "a MIG has no per-VM protection"
        );
        assert_eq!(parse_step_down_signal("SIGUSR1").unwrap(), Signal::SIGUSR1);
        assert_eq!(parse_step_down_signal("usr2").unwrap(), Signal::SIGUSR2);
        assert!(parse_step_down_signal("TERM").is_err());
    }

    /// The flags of a whole `leader run` line, as clap parses them.
    fn parsed(flags: &[&str]) -> Result<LifecycleArgs, clap::Error> {
        use clap::Parser;
        let line = ["leader", "run", "--store", "file:///tmp/x/job"]
            .iter()
            .chain(flags)
            .chain(&["--", "true"]);
        match crate::Cli::try_parse_from(line)?.command {
            crate::Command::Run(run) => Ok(run.lifecycle),
            other => panic!("not a run: {other:?}"),
        }
    }

    #[test]
    fn a_whole_run_line_parses_with_and_without_the_flags() {
        let plain = parsed(&[]).unwrap();
        assert!(plain.watch_notices.0.is_none());
        assert_eq!(plain.protect_every, Duration::from_secs(300));
        let all = parsed(&[
            "--watch-notices",
            "aws",
            "--notice-poll",
            "200ms",
            "--complete-lifecycle-hook",
            "drain",
            "--protect-leader",
            "k8s",
            "--step-down-on",
            "USR1",
        ])
        .unwrap();
        assert_eq!(
            all.watch_notices.0,
            Some(Watch::Only(leader::notice::Cloud::Aws))
        );
        assert_eq!(all.protect_leader, Some(ProtectOn::Kubernetes));
        assert_eq!(all.step_down_on, Some(Signal::SIGUSR1));
        assert!(all.check().is_ok());
        assert!(parsed(&["--watch-notices", "ibm"]).is_err());
    }

    fn args(watch: Option<Watch>, hook: bool, protect: bool, step: bool) -> LifecycleArgs {
        LifecycleArgs {
            watch_notices: WatchArg(watch),
            notice_poll: None,
            complete_lifecycle_hook: hook.then(|| "drain".to_owned()),
            protect_leader: protect.then_some(ProtectOn::Aws),
            protect_every: Duration::from_secs(60),
            step_down_on: step.then_some(Signal::SIGUSR1),
        }
    }

    #[test]
    fn a_lifecycle_hook_needs_the_aws_notices() {
        let azure = Some(Watch::Only(leader::notice::Cloud::Azure));
        assert_eq!(
            args(azure, true, false, false).check().unwrap_err().code,
            exit::USAGE
        );
        assert_eq!(
            args(None, true, false, false).check().unwrap_err().code,
            exit::USAGE
        );
        assert!(args(Some(Watch::Auto), true, false, false).check().is_ok());
        let aws = Some(Watch::Only(leader::notice::Cloud::Aws));
        assert!(args(aws, true, false, false).check().is_ok());
    }

    #[test]
    fn the_protection_period_is_bounded() {
        let mut a = args(None, false, true, false);
        a.protect_every = Duration::ZERO;
        let e = a.check().unwrap_err();
        assert!(e.message.contains("--protect-every"), "{}", e.message);
        a.protect_every = Duration::from_secs(7200);
        assert!(a.check().is_err());
        a.protect_every = Duration::from_secs(1);
        assert!(a.check().is_ok());
    }

    #[test]
    fn the_notice_poll_is_bounded_and_needs_the_notices() {
        let mut a = args(None, false, false, false);
        a.notice_poll = Some(Duration::from_secs(1));
        assert_eq!(a.check().unwrap_err().code, exit::USAGE);
        a.watch_notices = WatchArg(Some(Watch::Auto));
        assert!(a.check().is_ok());
        for bad in [Duration::from_millis(1), Duration::from_secs(600)] {
            a.notice_poll = Some(bad);
            let e = a.check().unwrap_err();
            assert_eq!(e.code, exit::USAGE, "{}", e.message);
        }
        let mut h = args(Some(Watch::Auto), true, false, false);
        h.complete_lifecycle_hook = Some(" ".to_owned());
        assert!(h.check().unwrap_err().message.contains("empty"));
    }

    #[test]
    fn protection_and_step_down_are_refused_with_shards() {
        assert!(
            args(Some(Watch::Auto), false, false, false)
                .check_sharded()
                .is_ok()
        );
        let e = args(None, false, true, false).check_sharded().unwrap_err();
        assert!(e.message.contains("--protect-leader"), "{}", e.message);
        let e = args(None, false, false, true).check_sharded().unwrap_err();
        assert!(e.message.contains("--step-down-on"), "{}", e.message);
    }
}
