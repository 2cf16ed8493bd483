//! The signals `leader run` handles: stop signals end the run (and are passed on to the
//! command), the user signals are passed on (or one of them asks to step down,
//! `--step-down-on`), and a scale-in or preemption notice arrives here too (`--watch-notices`);
//! in a sharded run one task reads them and relays them to every shard's run.

use nix::sys::signal::Signal;
use tokio::signal::unix::{Signal as UnixSignal, SignalKind, signal};
use tokio::sync::{broadcast, mpsc};

use crate::{Exit, exit};

/// What `leader` does with the signals it receives.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Received {
    /// Stop the command (second time: kill it), release, exit 128+N.
    Stop(Signal),
    /// Pass on to the command.
    Forward(Signal),
    /// Stop the command (the grace period, as for a stop signal) and hand the lease over.
    StepDown(StepDown),
}

/// Why `leader run` steps down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StepDown {
    /// The operator's `--step-down-on` signal: hand over, then keep following.
    Asked(Signal),
    /// A scale-in or preemption notice for this instance: hand over, then never campaign
    /// again in this process.
    Notice,
}

pub(crate) struct Signals {
    term: UnixSignal,
    int: UnixSignal,
    hup: UnixSignal,
    quit: UnixSignal,
    usr1: UnixSignal,
    usr2: UnixSignal,
    /// The user signal that asks to step down (`--step-down-on`), if any.
    step_down_on: Option<Signal>,
    /// What arrives other than signals: the notice watcher's step-down.
    other: Option<mpsc::UnboundedReceiver<Received>>,
}

impl Signals {
    pub(crate) fn new() -> Result<Self, Exit> {
        let make = |s: Signal| {
            signal(SignalKind::from_raw(s as i32))
                .map_err(|e| Exit::new(exit::UNAVAILABLE, format!("signal handler for {s}: {e}")))
        };
        Ok(Self {
            term: make(Signal::SIGTERM)?,
            int: make(Signal::SIGINT)?,
            hup: make(Signal::SIGHUP)?,
            quit: make(Signal::SIGQUIT)?,
            usr1: make(Signal::SIGUSR1)?,
            usr2: make(Signal::SIGUSR2)?,
            step_down_on: None,
            other: None,
        })
    }

    /// `sig` (SIGUSR1 or SIGUSR2) asks to step down instead of being passed on.
    pub(crate) fn step_down_on(mut self, sig: Option<Signal>) -> Self {
        self.step_down_on = sig;
        self
    }

    /// A sender through which other tasks (the notice watcher) deliver a [`Received`].
    pub(crate) fn sender(&mut self) -> mpsc::UnboundedSender<Received> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.other = Some(rx);
        tx
    }

    fn user(&self, sig: Signal) -> Received {
        if self.step_down_on == Some(sig) {
            Received::StepDown(StepDown::Asked(sig))
        } else {
            Received::Forward(sig)
        }
    }

    /// The next signal.
    pub(crate) async fn recv(&mut self) -> Received {
        tokio::select! {
            biased;
            _ = self.term.recv() => Received::Stop(Signal::SIGTERM),
            _ = self.int.recv() => Received::Stop(Signal::SIGINT),
            _ = self.hup.recv() => Received::Stop(Signal::SIGHUP),
            _ = self.quit.recv() => Received::Stop(Signal::SIGQUIT),
            _ = self.usr1.recv() => self.user(Signal::SIGUSR1),
            _ = self.usr2.recv() => self.user(Signal::SIGUSR2),
            Some(r) = recv_other(&mut self.other) => r,
        }
    }
}

async fn recv_other(other: &mut Option<mpsc::UnboundedReceiver<Received>>) -> Option<Received> {
    match other {
        Some(rx) => match rx.recv().await {
            Some(r) => Some(r),
            None => {
                *other = None;
                std::future::pending().await
            }
        },
        None => std::future::pending().await,
    }
}

/// Where a supervised run gets `leader`'s signals: from the signal handlers (a single key),
/// or relayed by the task that reads them (one run per shard).
pub(crate) enum Inbox<'a> {
    Signals(&'a mut Signals),
    Relayed(&'a mut broadcast::Receiver<Received>),
}

impl Inbox<'_> {
    /// The next signal.
    ///
    /// # Cancel safety
    /// Cancel-safe.
    pub(crate) async fn recv(&mut self) -> Received {
        match self {
            Inbox::Signals(s) => s.recv().await,
            Inbox::Relayed(rx) => loop {
                match rx.recv().await {
                    Ok(r) => return r,
                    // Signals are few and every run reads them at once; should some be lost,
                    // the next one still arrives.
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => std::future::pending().await,
                }
            },
        }
    }
}
