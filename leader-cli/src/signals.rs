//! The signals `leader run` handles: stop signals end the run (and are passed on to the
//! command), the user signals are passed on; in a sharded run one task reads them and relays
//! them to every shard's run.

use nix::sys::signal::Signal;
use tokio::signal::unix::{Signal as UnixSignal, SignalKind, signal};
use tokio::sync::broadcast;

use crate::{Exit, exit};

/// What `leader` does with the signals it receives.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Received {
    /// Stop the command (second time: kill it), release, exit 128+N.
    Stop(Signal),
    /// Pass on to the command.
    Forward(Signal),
}

pub(crate) struct Signals {
    term: UnixSignal,
    int: UnixSignal,
    hup: UnixSignal,
    quit: UnixSignal,
    usr1: UnixSignal,
    usr2: UnixSignal,
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
        })
    }

    /// The next signal.
    pub(crate) async fn recv(&mut self) -> Received {
        tokio::select! {
            biased;
            _ = self.term.recv() => Received::Stop(Signal::SIGTERM),
            _ = self.int.recv() => Received::Stop(Signal::SIGINT),
            _ = self.hup.recv() => Received::Stop(Signal::SIGHUP),
            _ = self.quit.recv() => Received::Stop(Signal::SIGQUIT),
            _ = self.usr1.recv() => Received::Forward(Signal::SIGUSR1),
            _ = self.usr2.recv() => Received::Forward(Signal::SIGUSR2),
        }
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
