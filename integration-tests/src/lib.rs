//! Test harness for the emulator-backed tests of the leader-lease suite.
//!
//! Backend tests ask for an emulator with [`require`] (or [`endpoint`] for the `Result`):
//!
//! 1. If the emulator's environment variable is set (see [`Emulator::env_var`]), that endpoint is
//!    used. `scripts/emulators run -- cargo test ...` sets all of them, together with
//!    `LEADER_EMULATORS_REQUIRED=1`.
//! 2. Otherwise, if `LEADER_EMULATORS_REQUIRED=1`, the test fails: CI must never skip silently.
//! 3. Otherwise, with the `docker` feature and a Docker engine that answers, a pinned image is
//!    started with `testcontainers` (see [`images`]) and shared by all tests (the containers are
//!    marked reusable, so later runs reuse them too).
//! 4. Otherwise the test fails with a message that tells how to start the emulators, unless
//!    `LEADER_ALLOW_SKIP=1`, in which case [`require`] returns `None` and the test skips.
//!
//! The client helpers talk to the emulators the way the backends will: [`azure`] signs Blob
//! requests with Shared Key, [`dynamodb`] builds an `aws-sdk-dynamodb` client, [`gcs`] does JSON
//! API uploads with generation preconditions, [`s3`] builds a path-style `aws-sdk-s3` client
//! (for buckets, which the S3 store never creates). etcd and ZooKeeper are the real servers, not
//! emulators; [`tcp_proxy`] puts byte-level faults between them and their clients.

pub mod autoscaling;
pub mod azure;
pub mod chaos;
pub mod cluster;
pub mod docs;
pub mod dynamodb;
pub mod etcd;
pub mod gcs;
pub mod metadata;
pub mod proxy;
pub mod s3;
pub mod tcp_proxy;
pub mod tls;

#[cfg(feature = "docker")]
mod docker;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// Set to `1` by `scripts/emulators` (and so by CI): a missing emulator is a hard failure.
pub const REQUIRED_VAR: &str = "LEADER_EMULATORS_REQUIRED";
/// Set to `1` to let tests skip (pass without running) when an emulator is missing.
pub const ALLOW_SKIP_VAR: &str = "LEADER_ALLOW_SKIP";

/// The container images the `docker` feature starts; `docker/compose.yaml` pins the same ones.
pub mod images {
    /// Azurite (blob service only).
    pub const AZURITE: (&str, &str) = ("mcr.microsoft.com/azure-storage/azurite", "3.35.0");
    /// LocalStack for DynamoDB and for S3 (a container of each); 4.14.0 is the last tag that
    /// runs without an auth token.
    pub const LOCALSTACK: (&str, &str) = ("localstack/localstack", "4.14.0");
    /// fake-gcs-server, the same version as the binary `scripts/emulators` installs.
    pub const FAKE_GCS: (&str, &str) = ("fsouza/fake-gcs-server", "1.54.0");
    /// etcd, the same version as Debian bookworm's `etcd-server` that `scripts/emulators` unpacks.
    pub const ETCD: (&str, &str) = ("quay.io/coreos/etcd", "v3.4.23");
    /// ZooKeeper, the same version as Debian bookworm's `zookeeper` that `scripts/emulators`
    /// unpacks.
    pub const ZOOKEEPER: (&str, &str) = ("zookeeper", "3.8.0");
}

/// One of the storage services the tests run against: an emulator of a cloud store, or a real
/// server (etcd, ZooKeeper) on loopback.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Emulator {
    /// Azure Blob Storage (Azurite).
    Azurite,
    /// DynamoDB (moto behind a request lock, or LocalStack in Docker).
    DynamoDb,
    /// Google Cloud Storage (fake-gcs-server).
    Gcs,
    /// A single-member etcd server (v3 API over gRPC).
    Etcd,
    /// A standalone ZooKeeper server.
    ZooKeeper,
    /// Amazon S3 on moto: the same server as [`DynamoDb`](Self::DynamoDb), path-style (or
    /// LocalStack's S3 in Docker).
    MotoS3,
    /// Amazon S3 on LocalStack's S3 provider.
    LocalStackS3,
}

impl Emulator {
    /// All emulators.
    pub const ALL: [Emulator; 7] = [
        Emulator::Azurite,
        Emulator::DynamoDb,
        Emulator::Gcs,
        Emulator::Etcd,
        Emulator::ZooKeeper,
        Emulator::MotoS3,
        Emulator::LocalStackS3,
    ];

    /// The environment variable that carries this emulator's endpoint (see [`Endpoint::url`]).
    pub fn env_var(self) -> &'static str {
        self.env_vars()[0]
    }

    /// The variables that may carry its endpoint, the first that is set wins:
    /// [`env_var`](Self::env_var), then for moto's S3 the endpoint of moto itself
    /// (`AWS_ENDPOINT_URL`, which `scripts/emulators` exported before it exported
    /// `LEADER_MOTO_S3_ENDPOINT`).
    pub fn env_vars(self) -> &'static [&'static str] {
        match self {
            Emulator::Azurite => &["AZURITE_BLOB_ENDPOINT"],
            Emulator::DynamoDb => &["AWS_ENDPOINT_URL"],
            Emulator::Gcs => &["STORAGE_EMULATOR_HOST"],
            Emulator::Etcd => &["LEADER_ETCD_ENDPOINT"],
            Emulator::ZooKeeper => &["LEADER_ZOOKEEPER_ENDPOINT"],
            Emulator::MotoS3 => &["LEADER_MOTO_S3_ENDPOINT", "AWS_ENDPOINT_URL"],
            Emulator::LocalStackS3 => &["LEADER_LOCALSTACK_ENDPOINT"],
        }
    }

    /// A short name for messages.
    pub fn name(self) -> &'static str {
        match self {
            Emulator::Azurite => "Azurite (Azure Blob)",
            Emulator::DynamoDb => "DynamoDB emulator",
            Emulator::Gcs => "fake-gcs-server (GCS)",
            Emulator::Etcd => "etcd",
            Emulator::ZooKeeper => "ZooKeeper",
            Emulator::MotoS3 => "moto (S3)",
            Emulator::LocalStackS3 => "LocalStack (S3)",
        }
    }
}

impl fmt::Display for Emulator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where an endpoint came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// From the environment (`scripts/emulators`, `docker/compose.yaml`, or by hand).
    Env,
    /// From a container this process started (or reused) through Docker.
    Docker,
}

/// A reachable emulator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// Which emulator.
    pub emulator: Emulator,
    /// Base URL without a trailing slash. For Azurite it includes the account
    /// (`http://127.0.0.1:P/devstoreaccount1`); for ZooKeeper it is `host:port` (no scheme: the
    /// form of a ZooKeeper connect string); for the others it is `http://host:port`.
    pub url: String,
    /// Where it came from.
    pub source: Source,
}

/// Why no endpoint could be had.
#[derive(Debug)]
pub enum HarnessError {
    /// The emulator is not configured and nothing could start it.
    Missing {
        /// The emulator.
        emulator: Emulator,
        /// Whether `LEADER_EMULATORS_REQUIRED=1` made this a hard failure.
        required: bool,
        /// What was tried (e.g. "no Docker engine answered").
        tried: String,
    },
    /// Docker answered but the container did not start.
    Docker {
        /// The emulator.
        emulator: Emulator,
        /// The error from testcontainers.
        message: String,
    },
}

impl fmt::Display for HarnessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HarnessError::Missing {
                emulator,
                required,
                tried,
            } => {
                write!(
                    f,
                    "{emulator} is not available: {} is not set",
                    emulator.env_var()
                )?;
                if *required {
                    write!(
                        f,
                        " although {REQUIRED_VAR}=1 (the emulators should have been started \
                         by scripts/emulators; did one of them die? see .emulators/logs/)"
                    )?;
                } else {
                    write!(f, " ({tried})")?;
                }
                write!(
                    f,
                    ". Start the emulators with `scripts/emulators run -- cargo test -p \
                     integration-tests` (installs pinned versions into .emulators/), or export \
                     the variables of `docker compose -f docker/compose.yaml up` (see \
                     docker/README.md), or build with `--features docker` on a machine with \
                     Docker"
                )?;
                if !*required {
                    write!(f, "; set {ALLOW_SKIP_VAR}=1 to skip these tests instead")?;
                }
                Ok(())
            }
            HarnessError::Docker { emulator, message } => write!(
                f,
                "could not start {emulator} in Docker: {message}. Alternatively run \
                 `scripts/emulators run -- cargo test -p integration-tests`"
            ),
        }
    }
}

impl std::error::Error for HarnessError {}

fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v.trim() == "1")
}

fn env_nonempty(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .map(|v| v.trim().trim_end_matches('/').to_owned())
        .filter(|v| !v.is_empty())
}

/// Finds (or starts) the endpoint of one emulator; `Ok(None)` means: skip, as the user allowed
/// with `LEADER_ALLOW_SKIP=1`. See the crate docs for the order of the attempts.
pub async fn endpoint(emulator: Emulator) -> Result<Option<Endpoint>, HarnessError> {
    if let Some(url) = emulator.env_vars().iter().find_map(|v| env_nonempty(v)) {
        return Ok(Some(Endpoint {
            emulator,
            url,
            source: Source::Env,
        }));
    }
    if env_flag(REQUIRED_VAR) {
        return Err(HarnessError::Missing {
            emulator,
            required: true,
            tried: String::new(),
        });
    }
    let tried = from_docker(emulator).await?;
    match tried {
        Ok(endpoint) => Ok(Some(endpoint)),
        Err(_) if env_flag(ALLOW_SKIP_VAR) => Ok(None),
        Err(tried) => Err(HarnessError::Missing {
            emulator,
            required: false,
            tried,
        }),
    }
}

/// `Ok(Ok(endpoint))` when Docker started it, `Ok(Err(what was tried))` when there is no Docker.
#[cfg(feature = "docker")]
async fn from_docker(emulator: Emulator) -> Result<Result<Endpoint, String>, HarnessError> {
    if !docker::engine_answers().await {
        return Ok(Err("no Docker engine answered".to_owned()));
    }
    match docker::start(emulator).await {
        Ok(url) => Ok(Ok(Endpoint {
            emulator,
            url,
            source: Source::Docker,
        })),
        Err(message) => Err(HarnessError::Docker { emulator, message }),
    }
}

#[cfg(not(feature = "docker"))]
async fn from_docker(_emulator: Emulator) -> Result<Result<Endpoint, String>, HarnessError> {
    Ok(Err(
        "built without the `docker` feature, so Docker was not tried".to_owned(),
    ))
}

/// For tests: the endpoint, or `None` to skip (only with `LEADER_ALLOW_SKIP=1`, after telling so
/// on stderr). Fails the calling test with instructions when the emulator is missing.
#[allow(
    clippy::panic,
    clippy::print_stderr,
    reason = "a test helper: failing the test with a message is its job"
)]
pub async fn require(emulator: Emulator) -> Option<Endpoint> {
    match endpoint(emulator).await {
        Ok(Some(endpoint)) => Some(endpoint),
        Ok(None) => {
            eprintln!(
                "SKIPPED: {emulator} not available and {ALLOW_SKIP_VAR}=1 (set {} or run \
                 under scripts/emulators to run this test)",
                emulator.env_var()
            );
            None
        }
        Err(error) => panic!("{error}"),
    }
}

/// A name that no other test, run or process uses: lowercase letters, digits and `-`, at most
/// 40 characters, valid for Azure containers, DynamoDB tables and GCS buckets.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let random = leader_core::conformance::Rng::from_entropy().next_u64();
    let prefix: String = prefix
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .map(|c| c.to_ascii_lowercase())
        .take(16)
        .collect();
    format!("{prefix}-{n}-{:08x}", random & 0xffff_ffff)
}

/// Every process below `root` (its children, theirs, ...), from `/proc`; none where there is
/// no `/proc`.
pub fn descendants(root: u32) -> Vec<u32> {
    descendants_among(&parents(), root)
}

/// Every process's (pid, parent pid), from `/proc`: one scan, for [`descendants_among`].
pub(crate) fn parents() -> Vec<(u32, u32)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            // The command may hold spaces and parentheses: the fields after its last ')'.
            let (_, rest) = stat.rsplit_once(')')?;
            let ppid = rest.split_whitespace().nth(1)?.parse().ok()?;
            Some((pid, ppid))
        })
        .collect()
}

/// Every process below `root` among `parents` ([`parents`]).
pub(crate) fn descendants_among(parents: &[(u32, u32)], root: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut next = vec![root];
    while let Some(p) = next.pop() {
        for (pid, ppid) in parents {
            if *ppid == p {
                out.push(*pid);
                next.push(*pid);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_names_are_unique_and_valid() {
        let a = unique_name("Canary_Azure!");
        let b = unique_name("Canary_Azure!");
        assert_ne!(a, b);
        for name in [a, b] {
            assert!(name.len() >= 3 && name.len() <= 40, "{name}");
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
                "{name}"
            );
            assert!(name.starts_with("canaryazure-"), "{name}");
        }
    }

    #[test]
    fn missing_error_tells_how_to_start() {
        let error = HarnessError::Missing {
            emulator: Emulator::Gcs,
            required: true,
            tried: String::new(),
        };
        let text = error.to_string();
        assert!(text.contains("STORAGE_EMULATOR_HOST"), "{text}");
        assert!(
            text.contains("scripts/emulators run -- cargo test"),
            "{text}"
        );
    }
}
