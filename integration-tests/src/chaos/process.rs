//! The candidate processes of a round as the driver sees them: signals, and their logs read
//! for who leads and when terms started.

use std::path::PathBuf;
use std::process::Child;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::Proxy;
use super::checker::{CandidateLog, parse_log};
use super::{EV_TERM_ENDED, EV_TERM_STARTED};

/// A candidate process.
pub(super) struct Proc {
    /// Its holder id.
    pub(super) id: String,
    /// The process.
    pub(super) child: Child,
    /// Its event log (its stdout).
    pub(super) log: PathBuf,
    /// Its proxy (none for the file store).
    pub(super) proxy: Option<Proxy>,
    /// When it was SIGKILLed, if it was.
    pub(super) killed_at: Option<u64>,
    /// Whether it has exited and been reaped.
    pub(super) done: bool,
}

impl Proc {
    fn pid(&self) -> Option<Pid> {
        i32::try_from(self.child.id()).ok().map(Pid::from_raw)
    }

    pub(super) fn signal(&mut self, signal: Signal) {
        if !self.done
            && let Some(pid) = self.pid()
        {
            let _ = kill(pid, signal);
        }
    }

    /// Whether the kernel has it stopped by a signal now (`T` in `/proc/PID/stat`); `None` if
    /// that cannot be read (it has exited, or this is not Linux).
    pub(super) fn stopped(&self) -> Option<bool> {
        let pid = self.pid()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // `PID (COMM) STATE ...`; COMM may hold spaces and parentheses.
        let state = stat
            .get(stat.rfind(')')? + 1..)?
            .trim_start()
            .chars()
            .next()?;
        Some(matches!(state, 'T' | 't'))
    }

    /// `Some(())` once this candidate has logged the end of term `token`.
    pub(super) fn term_ended(&self, token: u64) -> Option<()> {
        self.read()
            .events
            .iter()
            .any(|e| e.ev == EV_TERM_ENDED && e.token == token)
            .then_some(())
    }

    pub(super) fn read(&self) -> CandidateLog {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        parse_log(&self.id, &text, self.killed_at)
    }

    pub(super) fn exited(&mut self) -> bool {
        if !self.done && matches!(self.child.try_wait(), Ok(Some(_))) {
            self.done = true;
        }
        self.done
    }
}

pub(super) fn logs(procs: &[Proc]) -> Vec<CandidateLog> {
    procs.iter().map(Proc::read).collect()
}

/// The candidate that leads now per its log (a term started and not ended, not killed), with
/// its token.
pub(super) fn leader(procs: &[Proc]) -> Option<(usize, u64)> {
    let mut best = None;
    for (i, p) in procs.iter().enumerate() {
        if p.killed_at.is_some() || p.done {
            continue;
        }
        let log = p.read();
        let mut open = None;
        for e in &log.events {
            match e.ev.as_str() {
                EV_TERM_STARTED => open = Some(e.token),
                EV_TERM_ENDED if open == Some(e.token) => open = None,
                _ => {}
            }
        }
        if let Some(token) = open
            && best.is_none_or(|(_, t)| token > t)
        {
            best = Some((i, token));
        }
    }
    best
}

/// A violation for every term started while the store could answer nobody: after `cut`
/// (once the requests in flight then had timed out, `request_timeout` and 200 ms later) and
/// before `until`. `while_` says what the store was doing.
pub(super) fn terms_started_while_cut_off(
    procs: &[Proc],
    cut: u64,
    request_timeout: Duration,
    until: u64,
    while_: &str,
) -> Vec<String> {
    let quiet_from = cut + super::duration_us(request_timeout) + 200_000;
    let mut violations = Vec::new();
    for log in logs(procs) {
        for e in &log.events {
            if e.ev == EV_TERM_STARTED && e.t > quiet_from && e.t < until {
                violations.push(format!("{} began term {} {while_}", log.id, e.token));
            }
        }
    }
    violations
}

/// The first term started after `t`, not by `not_by`: (candidate, token, start).
pub(super) fn term_after(
    procs: &[Proc],
    t: u64,
    not_by: Option<usize>,
) -> Option<(usize, u64, u64)> {
    let mut first: Option<(usize, u64, u64)> = None;
    for (i, p) in procs.iter().enumerate() {
        if Some(i) == not_by {
            continue;
        }
        for e in p.read().events {
            if e.ev == EV_TERM_STARTED && e.t > t && first.is_none_or(|f| e.t < f.2) {
                first = Some((i, e.token, e.t));
            }
        }
    }
    first
}

pub(super) async fn wait_for<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let end = tokio::time::Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if tokio::time::Instant::now() >= end {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
