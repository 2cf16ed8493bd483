//! The settings of a member, and the fixed member set every member derives the same ids from.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use openraft::BasicNode;

use crate::error::RaftError;

/// The settings of one member of the group.
///
/// Every member is started with the same `members` (in any order); `listen` is this member's
/// own entry of it.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RaftConfig {
    /// Every member's `host:port`, this one included. Fixed for the life of the group.
    pub members: Vec<String>,
    /// This member's own address; must be one of `members`. The listener binds it exactly,
    /// unless [`bind`](Self::bind) is set.
    pub listen: String,
    /// The address the listener binds instead of `listen`, when the other members reach this
    /// one through something that forwards to it (a proxy, NAT, a container's published
    /// port). `None` (the default): bind `listen`.
    pub bind: Option<String>,
    /// The data folder (vote, log, snapshot), created with mode `0700` if missing.
    pub dir: PathBuf,
    /// Mutual TLS between members; `None` for plaintext (loopback tests only).
    pub tls: Option<TlsConfig>,
    /// Heartbeat, election and request timing.
    pub timing: RaftTiming,
    /// How many applied entries between two snapshots of the state (default 5000); the log
    /// keeps as many entries again behind the last snapshot, for members that lag.
    pub snapshot_every: u64,
    /// Lets a member whose data folder is empty join a group that already has history (it
    /// lost its folder, or it never ran before): it takes no part in elections until it has
    /// caught up with the group. Without it such a member refuses to start. Has no effect on a
    /// member whose folder holds data. See the crate docs on wiped members.
    pub rejoin: bool,
}

impl RaftConfig {
    /// A member at `listen` among `members`, keeping its data in `dir`, plaintext, default
    /// timing.
    pub fn new(
        members: impl IntoIterator<Item = impl Into<String>>,
        listen: impl Into<String>,
        dir: impl Into<PathBuf>,
    ) -> Self {
        Self {
            members: members.into_iter().map(Into::into).collect(),
            listen: listen.into(),
            bind: None,
            dir: dir.into(),
            tls: None,
            timing: RaftTiming::default(),
            snapshot_every: Self::DEFAULT_SNAPSHOT_EVERY,
            rejoin: false,
        }
    }

    /// Sets [`rejoin`](Self::rejoin): an operator's explicit permission for a member with an
    /// empty folder to join a group that has history.
    pub fn with_rejoin(mut self, rejoin: bool) -> Self {
        self.rejoin = rejoin;
        self
    }

    /// Sets [`bind`](Self::bind): the listener binds `address` (`host:port`) instead of
    /// `listen`, which stays the address the other members use.
    pub fn with_bind(mut self, address: impl Into<String>) -> Self {
        self.bind = Some(address.into());
        self
    }

    /// The address the listener binds.
    pub(crate) fn bind_address(&self) -> &str {
        self.bind.as_deref().unwrap_or(&self.listen)
    }

    /// The default of [`snapshot_every`](Self::snapshot_every).
    pub const DEFAULT_SNAPSHOT_EVERY: u64 = 5000;

    /// Takes a snapshot every `entries` applied entries (at least 1).
    pub fn with_snapshot_every(mut self, entries: u64) -> Self {
        self.snapshot_every = entries;
        self
    }

    /// openraft's configuration for these settings, validated; `elect` says whether this
    /// member may start elections.
    pub(crate) fn openraft(&self, elect: bool) -> Result<openraft::Config, RaftError> {
        self.timing.validate()?;
        if self.snapshot_every == 0 {
            return Err(RaftError::config("snapshot_every must be at least 1"));
        }
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let t = &self.timing;
        let config = openraft::Config {
            cluster_name: "leader-raft".to_owned(),
            heartbeat_interval: ms(t.heartbeat),
            election_timeout_min: ms(t.election_min),
            election_timeout_max: ms(t.election_max),
            install_snapshot_timeout: ms(t.request_timeout).max(200),
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(self.snapshot_every),
            max_in_snapshot_log_to_keep: self.snapshot_every,
            enable_elect: elect,
            ..Default::default()
        };
        config
            .validate()
            .map_err(|e| RaftError::config(format!("openraft refused the settings: {e}")))
    }

    /// Talks to the other members over mutual TLS.
    pub fn with_tls(mut self, tls: TlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Uses `timing` instead of the defaults.
    pub fn with_timing(mut self, timing: RaftTiming) -> Self {
        self.timing = timing;
        self
    }
}

/// Heartbeat, election and request timing of a member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RaftTiming {
    /// How often the Raft leader sends heartbeats (default 100 ms). Also the limit of each
    /// heartbeat that confirms leadership for a linearizable read.
    pub heartbeat: Duration,
    /// The shortest election timeout (default 300 ms).
    pub election_min: Duration,
    /// The longest election timeout (default 600 ms).
    pub election_max: Duration,
    /// The limit of one store call (read or write, forwarding included) when the core gives
    /// none shorter (default 2 s).
    pub request_timeout: Duration,
}

impl Default for RaftTiming {
    fn default() -> Self {
        Self {
            heartbeat: Duration::from_millis(100),
            election_min: Duration::from_millis(300),
            election_max: Duration::from_millis(600),
            request_timeout: Duration::from_secs(2),
        }
    }
}

impl RaftTiming {
    /// Checks the rules: nothing zero, `heartbeat < election_min < election_max`.
    ///
    /// # Errors
    /// [`RaftError::InvalidConfig`] naming the rule broken.
    pub fn validate(&self) -> Result<(), RaftError> {
        for (name, d) in [
            ("heartbeat", self.heartbeat),
            ("election_min", self.election_min),
            ("election_max", self.election_max),
            ("request_timeout", self.request_timeout),
        ] {
            if d.as_millis() == 0 {
                return Err(RaftError::config(format!(
                    "{name} must be at least 1 ms (got {d:?})"
                )));
            }
        }
        if self.heartbeat >= self.election_min {
            return Err(RaftError::config(format!(
                "heartbeat {:?} must be shorter than election_min {:?}, or followers start \
                 elections against a healthy leader",
                self.heartbeat, self.election_min
            )));
        }
        if self.election_min >= self.election_max {
            return Err(RaftError::config(format!(
                "election_min {:?} must be shorter than election_max {:?}, so that election \
                 timeouts differ between members",
                self.election_min, self.election_max
            )));
        }
        Ok(())
    }
}

/// Mutual TLS material of a member, PEM-encoded: the CA that signed every member's certificate,
/// and this member's certificate chain and private key.
///
/// Each member's certificate must name its host (the host part of its address) as a subject
/// alternative name (a DNS name, or an IP address for a numeric host): members check it both
/// ways.
#[derive(Clone)]
#[non_exhaustive]
pub struct TlsConfig {
    /// The CA certificate(s), PEM.
    pub ca_pem: Vec<u8>,
    /// This member's certificate chain, PEM, leaf first.
    pub cert_pem: Vec<u8>,
    /// This member's private key, PEM (PKCS#8, PKCS#1 or SEC1).
    pub key_pem: Vec<u8>,
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key.
        f.debug_struct("TlsConfig").finish_non_exhaustive()
    }
}

impl TlsConfig {
    /// TLS material from PEM bytes.
    pub fn from_pem(
        ca_pem: impl Into<Vec<u8>>,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        Self {
            ca_pem: ca_pem.into(),
            cert_pem: cert_pem.into(),
            key_pem: key_pem.into(),
        }
    }

    /// TLS material from PEM files.
    ///
    /// # Errors
    /// [`RaftError::Tls`] naming a file that cannot be read.
    pub fn from_files(ca: &Path, cert: &Path, key: &Path) -> Result<Self, RaftError> {
        let read = |p: &Path| {
            std::fs::read(p)
                .map_err(|e| RaftError::tls(format!("cannot read {}: {e}", p.display())))
        };
        Ok(Self::from_pem(read(ca)?, read(cert)?, read(key)?))
    }
}

/// The fixed member set: sorted addresses, node id = position + 1, and a digest every RPC
/// carries so that members configured with different sets refuse each other.
#[derive(Clone, Debug)]
pub(crate) struct Members {
    sorted: Vec<String>,
    digest: String,
    me: u64,
}

impl Members {
    /// Checks `members` and `listen`, and numbers the members.
    pub(crate) fn new(members: &[String], listen: &str) -> Result<Self, RaftError> {
        let mut sorted = members.to_vec();
        sorted.sort();
        for pair in sorted.windows(2) {
            if pair[0] == pair[1] {
                return Err(RaftError::config(format!(
                    "member {} is listed twice; list each member once",
                    pair[0]
                )));
            }
        }
        for m in &sorted {
            host_of(m)?;
        }
        if sorted.is_empty() {
            return Err(RaftError::config("the member list is empty"));
        }
        let me = sorted.iter().position(|m| m == listen).ok_or_else(|| {
            RaftError::config(format!(
                "listen address {listen} is not one of the members {sorted:?}; give this \
                     member's own address exactly as it appears in the list"
            ))
        })?;
        Ok(Self {
            digest: digest_of(&sorted),
            me: me as u64 + 1,
            sorted,
        })
    }

    pub(crate) fn me(&self) -> u64 {
        self.me
    }

    pub(crate) fn digest(&self) -> &str {
        &self.digest
    }

    pub(crate) fn sorted(&self) -> &[String] {
        &self.sorted
    }

    /// The address of member `id`.
    pub(crate) fn address(&self, id: u64) -> Option<&str> {
        let index = usize::try_from(id.checked_sub(1)?).ok()?;
        self.sorted.get(index).map(String::as_str)
    }

    /// Every member as openraft's node map.
    pub(crate) fn nodes(&self) -> BTreeMap<u64, BasicNode> {
        (1u64..)
            .zip(&self.sorted)
            .map(|(id, addr)| (id, BasicNode::new(addr.clone())))
            .collect()
    }
}

/// The host part of `host:port` (brackets of an IPv6 literal removed).
pub(crate) fn host_of(address: &str) -> Result<&str, RaftError> {
    let bad = |why: &str| {
        RaftError::config(format!(
            "member address {address:?} {why}; write it as host:port"
        ))
    };
    let (host, port) = address.rsplit_once(':').ok_or_else(|| bad("has no port"))?;
    port.parse::<u16>()
        .map_err(|_| bad("has a port that is not a number from 0 to 65535"))?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.is_empty() {
        return Err(bad("has no host"));
    }
    Ok(host)
}

/// FNV-1a (64 bits) of the sorted addresses, one per line, in hex.
fn digest_of(sorted: &[String]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in sorted
        .iter()
        .flat_map(|m| m.bytes().chain(std::iter::once(b'\n')))
    {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn ids_and_digest_do_not_depend_on_order() {
        let a = Members::new(&["b:2".into(), "a:1".into(), "c:3".into()], "c:3").unwrap();
        let b = Members::new(&["c:3".into(), "a:1".into(), "b:2".into()], "a:1").unwrap();
        assert_eq!(a.digest(), b.digest());
        assert_eq!((a.me(), b.me()), (3, 1));
        assert_eq!(a.address(2), Some("b:2"));
        assert_eq!(a.address(0), None);
        let other = Members::new(&["a:1".into(), "b:2".into()], "a:1").unwrap();
        assert_ne!(a.digest(), other.digest());
    }

    #[test]
    fn bad_member_lists_are_refused() {
        assert!(Members::new(&["a:1".into(), "a:1".into()], "a:1").is_err());
        assert!(Members::new(&["a:1".into()], "b:1").is_err());
        assert!(Members::new(&["a".into()], "a").is_err());
        assert!(Members::new(&[":1".into()], ":1").is_err());
        assert_eq!(host_of("[::1]:80").unwrap(), "::1");
    }

    #[test]
    fn default_timing_is_valid() {
        RaftTiming::default().validate().unwrap();
        RaftConfig::new(["a:1"], "a:1", "/d")
            .openraft(true)
            .unwrap();
        assert!(
            RaftConfig::new(["a:1"], "a:1", "/d")
                .with_snapshot_every(0)
                .openraft(true)
                .is_err()
        );
        let bad = RaftTiming {
            heartbeat: Duration::from_millis(400),
            ..RaftTiming::default()
        };
        assert!(bad.validate().is_err());
    }
}
