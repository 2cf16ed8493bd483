//! The host's clocks and process tree, as `leader run` and its supervisor see them.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::time::{ClockId, clock_gettime};
use nix::unistd::Pid;

/// Now on `CLOCK_BOOTTIME`, in nanoseconds: a clock shared by every process of the host that
/// keeps counting while the machine is suspended, so that a resumed host never believes in a
/// term that ended while it slept.
pub(crate) fn boottime_ns() -> u64 {
    clock_gettime(ClockId::CLOCK_BOOTTIME)
        .map(|t| u64::try_from(Duration::from(t).as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The parent of every process we can see, read from `/proc/PID/stat`. Processes that exit
/// while we read are skipped.
fn parents() -> HashMap<i32, i32> {
    let mut map = HashMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return map;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        if let Some(ppid) = std::fs::read_to_string(entry.path().join("stat"))
            .ok()
            .and_then(|s| parent_in_stat(&s))
        {
            map.insert(pid, ppid);
        }
    }
    map
}

/// The parent pid in a `/proc/PID/stat` line: the second field after the command name, which
/// is in parentheses and may itself contain spaces and parentheses.
fn parent_in_stat(stat: &str) -> Option<i32> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(1)?.parse().ok()
}

/// The parent of `pid`, if it is still there (alive, or not yet reaped).
pub(crate) fn parent_of(pid: Pid) -> Option<Pid> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parent_in_stat(&stat).map(Pid::from_raw)
}

/// The pid by which `/proc` (the host's, mounted outside any PID namespace of ours) knows the
/// child that this process, the init of a PID namespace, knows as `inner`: the child whose
/// innermost pid (the last of `NSpid` in its status) is `inner`.
pub(crate) fn outer_pid_of_child(inner: i32) -> Option<Pid> {
    // `/proc/self` names this process by its pid in the namespace of `/proc`.
    let me: i32 = std::fs::read_link("/proc/self")
        .ok()?
        .to_str()?
        .parse()
        .ok()?;
    parents()
        .into_iter()
        .filter(|(_, parent)| *parent == me)
        .map(|(pid, _)| pid)
        .find(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/status"))
                .ok()
                .and_then(|s| innermost_pid(&s))
                == Some(inner)
        })
        .map(Pid::from_raw)
}

/// The last pid of the `NSpid` line of a `/proc/PID/status`: the pid in the process's own
/// PID namespace.
fn innermost_pid(status: &str) -> Option<i32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

/// Every living (or not yet reaped) descendant of `root`, children first.
pub(crate) fn descendants(root: Pid) -> Vec<Pid> {
    descendants_outside(root, &BTreeSet::new())
}

/// As [`descendants`], without the processes in `spared` and their own descendants.
pub(crate) fn descendants_outside(root: Pid, spared: &BTreeSet<i32>) -> Vec<Pid> {
    let parents = parents();
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for (pid, ppid) in &parents {
        children.entry(*ppid).or_default().push(*pid);
    }
    let mut out = Vec::new();
    let mut next = vec![root.as_raw()];
    while let Some(p) = next.pop() {
        for c in children.get(&p).into_iter().flatten() {
            if spared.contains(c) {
                continue;
            }
            out.push(Pid::from_raw(*c));
            next.push(*c);
        }
    }
    out
}

/// Sends `signal` to every descendant of `root`; returns how many there were.
pub(crate) fn signal_descendants(root: Pid, signal: Signal) -> usize {
    let all = descendants(root);
    for pid in &all {
        let _ = kill(*pid, signal);
    }
    all.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parent_is_read_after_the_last_parenthesis() {
        assert_eq!(parent_in_stat("42 (sh) S 7 42 42 0"), Some(7));
        assert_eq!(parent_in_stat("42 (a b) c) R 9 1 1"), Some(9));
        assert_eq!(parent_in_stat("garbage"), None);
    }

    #[test]
    fn the_innermost_pid_is_the_last_of_nspid() {
        assert_eq!(
            innermost_pid("Name:\tsh\nNSpid:\t4242\t2\nPPid:\t1\n"),
            Some(2)
        );
        assert_eq!(innermost_pid("NSpid:\t4242\n"), Some(4242));
        assert_eq!(innermost_pid("Name:\tsh\n"), None);
        let me = Pid::this();
        assert_eq!(parent_of(me), Some(nix::unistd::getppid()));
    }

    #[test]
    fn spared_processes_are_left_out_with_their_descendants() {
        let parent = nix::unistd::getppid();
        let me = Pid::this();
        let spared = BTreeSet::from([me.as_raw()]);
        assert!(!descendants_outside(parent, &spared).contains(&me));
    }

    #[test]
    fn this_process_is_a_descendant_of_its_parent() {
        let me = Pid::this();
        assert!(descendants(nix::unistd::getppid()).contains(&me));
        assert!(boottime_ns() > 0);
    }
}
