//! A three-member etcd cluster or ZooKeeper ensemble of the tests' own, every member behind
//! fault proxies: `scripts/emulators cluster` starts and stops it (the script knows the
//! command lines; `scripts/cluster.py` runs the members and the proxies), and this module
//! drives it through the cluster's control port: a member stopped, started, killed, paused,
//! resumed, isolated from everybody or from the other members only, healed; and who leads.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde::Deserialize;

/// Which cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterKind {
    /// Three etcd members (Debian's etcd-server, as the single-member tests use).
    Etcd,
    /// Three ZooKeeper servers (Debian's zookeeper).
    ZooKeeper,
}

impl ClusterKind {
    /// The name `scripts/emulators cluster start` takes.
    pub fn name(self) -> &'static str {
        match self {
            ClusterKind::Etcd => "etcd",
            ClusterKind::ZooKeeper => "zookeeper",
        }
    }
}

/// One fault on a member, or its end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberAction {
    /// SIGTERM (SIGKILL 10 s later), and wait until it exited.
    Stop,
    /// Start again with its data.
    Start,
    /// SIGKILL.
    Kill,
    /// SIGSTOP.
    Pause,
    /// SIGCONT.
    Resume,
    /// Cut from the other members and from the clients (a lost network).
    Isolate,
    /// Cut from the other members only: its clients still reach it.
    IsolatePeers,
    /// Every cut of this member ends.
    Heal,
}

impl MemberAction {
    fn path(self) -> &'static str {
        match self {
            MemberAction::Stop => "stop",
            MemberAction::Start => "start",
            MemberAction::Kill => "kill",
            MemberAction::Pause => "pause",
            MemberAction::Resume => "resume",
            MemberAction::Isolate => "isolate",
            MemberAction::IsolatePeers => "isolate-peers",
            MemberAction::Heal => "heal",
        }
    }
}

/// One member as the cluster's control port reports it.
#[derive(Clone, Debug, Deserialize)]
pub struct MemberStatus {
    /// 0, 1 or 2.
    pub index: usize,
    /// Its process runs.
    pub running: bool,
    /// SIGSTOPped.
    pub paused: bool,
    /// Its own view: `leader`, `follower`, `no-leader` (etcd), `not-serving` (ZooKeeper), or
    /// none when it does not answer.
    pub role: Option<String>,
}

/// The cluster as its control port reports it.
#[derive(Clone, Debug, Deserialize)]
pub struct ClusterStatus {
    /// Every member.
    pub members: Vec<MemberStatus>,
    /// The member that leads, as the members that reach each other see it.
    pub leader: Option<usize>,
}

#[derive(Deserialize)]
struct ClusterFile {
    control: String,
    endpoints: String,
}

/// A running cluster; stopped when dropped.
#[derive(Debug)]
pub struct Cluster {
    kind: ClusterKind,
    dir: PathBuf,
    control: String,
    endpoints: Vec<String>,
    http: reqwest::Client,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/emulators")
}

fn run_script(args: &[&str]) -> Result<String, String> {
    let output = Command::new(script())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running scripts/emulators: {e}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    } else {
        Err(format!(
            "`scripts/emulators {}` failed ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

impl Cluster {
    /// Starts a cluster of `kind` with its data and logs in `dir`; returns once a leader is
    /// elected. It stops when dropped, and when this process dies.
    ///
    /// # Errors
    /// A message with the script's output if it could not start.
    pub async fn start(kind: ClusterKind, dir: &Path) -> Result<Self, String> {
        let dir = dir.to_path_buf();
        let owner = std::process::id().to_string();
        let d = dir.clone();
        tokio::task::spawn_blocking(move || {
            let d = d.display().to_string();
            run_script(&["cluster", "start", kind.name(), &d, "--owner", &owner])
        })
        .await
        .map_err(|e| e.to_string())??;
        let text = std::fs::read_to_string(dir.join("cluster.json"))
            .map_err(|e| format!("reading {}/cluster.json: {e}", dir.display()))?;
        let file: ClusterFile = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        Ok(Self {
            kind,
            dir,
            control: file.control,
            endpoints: file.endpoints.split(',').map(str::to_owned).collect(),
            http: reqwest::Client::new(),
        })
    }

    /// Which cluster.
    pub fn kind(&self) -> ClusterKind {
        self.kind
    }

    /// Its folder (data, the members' logs `m0.log`.., the daemon's `daemon.log`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Member `i`'s client endpoint, through its proxy (`http://127.0.0.1:P` for etcd,
    /// `127.0.0.1:P` for ZooKeeper).
    pub fn endpoint(&self, i: usize) -> &str {
        self.endpoints.get(i).map_or("", String::as_str)
    }

    /// Every member's client endpoint, in member order.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// Puts `action` on member `i`.
    ///
    /// # Errors
    /// A message if the control port refused or did not answer.
    pub async fn member(&self, i: usize, action: MemberAction) -> Result<(), String> {
        let url = format!("{}/member/{i}/{}", self.control, action.path());
        let answer = self
            .http
            .post(&url)
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        if answer.status().is_success() {
            Ok(())
        } else {
            Err(format!(
                "{url}: {} {}",
                answer.status(),
                answer.text().await.unwrap_or_default()
            ))
        }
    }

    /// The members and who leads.
    ///
    /// # Errors
    /// A message if the control port did not answer.
    pub async fn status(&self) -> Result<ClusterStatus, String> {
        let url = format!("{}/status", self.control);
        let answer = self
            .http
            .get(&url)
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        answer.json().await.map_err(|e| format!("{url}: {e}"))
    }

    /// Waits up to `limit` for a leader that every running, unpaused member follows; returns
    /// it.
    ///
    /// # Errors
    /// A message with the last status if there was none.
    pub async fn healthy(&self, limit: Duration) -> Result<usize, String> {
        let end = tokio::time::Instant::now() + limit;
        loop {
            let status = self.status().await;
            if let Ok(s) = &status
                && let Some(leader) = s.leader
                && s.members.iter().all(|m| {
                    !m.running
                        || m.paused
                        || matches!(m.role.as_deref(), Some("leader" | "follower"))
                })
            {
                return Ok(leader);
            }
            if tokio::time::Instant::now() >= end {
                return Err(format!(
                    "the {} cluster has no leader all follow after {limit:?}: {status:?}",
                    self.kind.name()
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let d = self.dir.display().to_string();
        if let Err(e) = run_script(&["cluster", "stop", &d]) {
            tracing::warn!(error = %e, "stopping the cluster");
        }
    }
}
