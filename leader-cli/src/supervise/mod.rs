//! Supervising the command: the elector's side (`client`: it starts a supervisor process per
//! term and tells it of renews and stop signals) and the supervisor process itself
//! (`process`: it starts the command and stops it, and everything it started, by the
//! deadline), with the few messages they exchange over a Unix socket, one line each.
//!
//! The rules they keep together (`docs/protocol.md`, "Supervising a command"): the command is
//! never started once the term's deadline has passed; it gets its stop signal at
//! `deadline - grace` and SIGKILL at the deadline, with every process it started; the lease is
//! released only after all of them have exited; and if `leader` or the supervisor is killed,
//! the other (or the kernel) still stops the command in time. Where the kernel allows it
//! (`namespace`), the command runs in a PID namespace whose init is ours (`init`), so that
//! nothing it started survives even when both are killed at once.

pub(crate) mod client;
mod init;
pub(crate) mod namespace;
pub(crate) mod process;

use nix::sys::signal::Signal;
use nix::sys::wait::WaitStatus;

/// A message from `leader` to its supervisor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Request {
    /// The term now ends at this instant (nanoseconds on CLOCK_BOOTTIME).
    Deadline(u64),
    /// Stop the command: this signal now, SIGKILL after the grace period.
    Stop(Signal),
    /// SIGKILL everything now (a second signal to `leader`).
    Kill,
    /// Pass this signal on to the command's process group; change nothing else.
    Forward(Signal),
}

/// Why the supervisor ended, as it tells `leader`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ended {
    /// The command exited by itself (anything it left behind was stopped).
    Exited,
    /// The term's deadline came: the command was stopped.
    Deadline,
    /// The command was stopped on request (of `leader`, or a signal to the supervisor).
    Stopped,
    /// `leader` went away: the command was stopped.
    Orphaned,
    /// The deadline had passed before the command could start; nothing ran.
    NotStarted,
}

impl Ended {
    fn as_str(self) -> &'static str {
        match self {
            Ended::Exited => "exited",
            Ended::Deadline => "deadline",
            Ended::Stopped => "stopped",
            Ended::Orphaned => "orphaned",
            Ended::NotStarted => "not-started",
        }
    }
}

/// A message from the supervisor to `leader`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Report {
    /// The command runs with this pid.
    Started(i32),
    /// Everything is gone; the command's exit code (128+N for signal N).
    Done(Ended, u8),
}

impl Request {
    pub(crate) fn encode(self) -> String {
        match self {
            Request::Deadline(ns) => format!("deadline {ns}\n"),
            Request::Stop(s) => format!("stop {}\n", s as i32),
            Request::Kill => "kill\n".to_owned(),
            Request::Forward(s) => format!("forward {}\n", s as i32),
        }
    }

    fn parse(line: &str) -> Option<Self> {
        let (word, arg) = line.split_once(' ').unwrap_or((line, ""));
        let signal = || Signal::try_from(arg.parse::<i32>().ok()?).ok();
        match word {
            "deadline" => arg.parse().ok().map(Request::Deadline),
            "stop" => signal().map(Request::Stop),
            "kill" => Some(Request::Kill),
            "forward" => signal().map(Request::Forward),
            _ => None,
        }
    }
}

impl Report {
    fn encode(self) -> String {
        match self {
            Report::Started(pid) => format!("started {pid}\n"),
            Report::Done(why, code) => format!("done {} {code}\n", why.as_str()),
        }
    }

    pub(crate) fn parse(line: &str) -> Option<Self> {
        let mut words = line.split(' ');
        match (words.next()?, words.next()?, words.next()) {
            ("started", pid, None) => pid.parse().ok().map(Report::Started),
            ("done", why, Some(code)) => {
                let why = [
                    Ended::Exited,
                    Ended::Deadline,
                    Ended::Stopped,
                    Ended::Orphaned,
                    Ended::NotStarted,
                ]
                .into_iter()
                .find(|e| e.as_str() == why)?;
                Some(Report::Done(why, code.parse().ok()?))
            }
            _ => None,
        }
    }
}

/// A message from the init of the command's PID namespace to its supervisor, one datagram
/// each (`init`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FromInit {
    /// Init runs, and its supervisor was alive to receive this.
    Ready,
    /// The command runs with this pid, as the supervisor sees it (0: not found).
    Started(i32),
    /// The command exited with this code (128+N for signal N); what it started may still run.
    Exited(u8),
}

impl FromInit {
    fn encode(self) -> String {
        match self {
            FromInit::Ready => "ready".to_owned(),
            FromInit::Started(pid) => format!("started {pid}"),
            FromInit::Exited(code) => format!("exited {code}"),
        }
    }

    fn parse(text: &str) -> Option<Self> {
        match text.split_once(' ').unwrap_or((text, "")) {
            ("ready", "") => Some(FromInit::Ready),
            ("started", pid) => pid.parse().ok().map(FromInit::Started),
            ("exited", code) => code.parse().ok().map(FromInit::Exited),
            _ => None,
        }
    }
}

/// The exit code of a process that ended with `status` (128+N for signal N).
pub(crate) fn code_of(status: WaitStatus) -> Option<u8> {
    match status {
        WaitStatus::Exited(_, code) => Some(u8::try_from(code & 0xff).unwrap_or(1)),
        WaitStatus::Signaled(_, sig, _) => {
            Some(u8::try_from((128 + sig as i32) & 0xff).unwrap_or(1))
        }
        _ => None,
    }
}

/// The exit code for "the term ended before the command could start".
pub(crate) const NOT_STARTED: u8 = crate::exit::LOST;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip() {
        for r in [
            Request::Deadline(123_456_789),
            Request::Stop(Signal::SIGINT),
            Request::Kill,
            Request::Forward(Signal::SIGUSR1),
        ] {
            let line = r.encode();
            assert_eq!(Request::parse(line.trim_end()), Some(r), "{line}");
        }
        for r in [
            Report::Started(42),
            Report::Done(Ended::Deadline, 137),
            Report::Done(Ended::NotStarted, NOT_STARTED),
            Report::Done(Ended::Exited, 0),
        ] {
            let line = r.encode();
            assert_eq!(Report::parse(line.trim_end()), Some(r), "{line}");
        }
        for m in [
            FromInit::Ready,
            FromInit::Started(4242),
            FromInit::Exited(137),
        ] {
            assert_eq!(FromInit::parse(&m.encode()), Some(m), "{m:?}");
        }
        assert_eq!(FromInit::parse("exited 300"), None);
        assert_eq!(Request::parse("stop banana"), None);
        assert_eq!(Report::parse("done maybe 1"), None);
    }
}
