//! `leader run`: campaign, run the command while leader, stop it when leadership ends.
//!
//! This process (the *elector*) keeps the lease; a separate supervisor process per term
//! (`crate::supervise`) starts the command and stops it. This module turns the flags into a
//! plan; `single` runs one lease, `sharded` a share of the shards of a key.

mod sharded;
mod single;

use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;
use leader::backend::within;
use leader::{
    ConfigError, Error, ErrorKind, HolderId, MAX_SHARDS, Metadata, Problem, Timing, TimingOverrides,
};
use tracing::warn;

use crate::supervise::namespace::{self, Isolation, PidNamespaceMode};
use crate::{Exit, endpoints, exit, store};

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// Where the lease lives: file:///DIR/KEY, azblob://CONTAINER/[FOLDER/]KEY,
    /// dynamodb://TABLE/KEY, s3://BUCKET/[FOLDER/]KEY, gs://BUCKET/[FOLDER/]KEY,
    /// etcd://HOST:PORT[,...]/[FOLDER/]KEY,
    /// zk://HOST:PORT[,...]/[PATH/]KEY (see "Stores" below). Given 3 or 5 times (or as
    /// space-separated URLs in LEADER_STORE): one leader over a majority of independent
    /// stores, which survives the outage of any minority of them (see "Quorum" below).
    #[arg(long, env = "LEADER_STORE", value_delimiter = ' ', required = true)]
    pub(crate) store: Vec<String>,
    #[command(flatten)]
    pub(crate) store_options: store::StoreOptions,
    /// Lease duration.
    #[arg(long, env = "LEADER_TTL", value_parser = crate::parse_duration, default_value = "15s")]
    ttl: Duration,
    /// How often the leader renews (default: ttl/2, or less where that leaves room for fewer
    /// than three failed renews before the deadline, or for less than --grace).
    #[arg(long, env = "LEADER_RENEW_EVERY", value_parser = crate::parse_duration)]
    renew_every: Option<Duration>,
    /// How long a follower waits at most between attempts while the store fails (default
    /// ttl/5).
    #[arg(long, env = "LEADER_RETRY_EVERY", value_parser = crate::parse_duration)]
    retry_every: Option<Duration>,
    /// How often a follower reads the lease while the store answers: a graceful handover
    /// takes up to one poll (default 500ms, at most ttl/5).
    #[arg(long, env = "LEADER_POLL_EVERY", value_parser = crate::parse_duration)]
    poll_every: Option<Duration>,
    /// This instance's id (default: hostname-pid-random).
    #[arg(long = "id", env = "LEADER_ID")]
    id: Option<String>,
    /// Metadata followers can read, KEY=VALUE (repeatable; comma-separated in LEADER_META).
    #[arg(long = "meta", env = "LEADER_META", value_delimiter = ',')]
    meta: Vec<String>,
    /// Time between the stop signal and SIGKILL. At the end of a term the command gets SIGTERM
    /// at deadline - grace and SIGKILL at the deadline. Default: half the room a healthy term
    /// leaves (ttl - margin - renew_every - request_timeout - 50ms), at most 10s.
    #[arg(long, env = "LEADER_GRACE", value_parser = crate::parse_duration)]
    grace: Option<Duration>,
    /// Give up (exit 73) if not leader within this time.
    #[arg(long, env = "LEADER_WAIT", value_parser = crate::parse_duration)]
    wait: Option<Duration>,
    /// Keep campaigning after the command exits or leadership is lost, and run it again when
    /// leader again. (Implied by --shards.)
    #[arg(long, env = "LEADER_SUPERVISE")]
    supervise: bool,
    /// Lead a share of the N shards of the key, with the other instances of the same key and
    /// N: one command per led shard, with LEADER_SHARD and the shard's LEADER_FENCING_TOKEN
    /// (see "Sharded runs" below). Every instance must give the same N.
    /// (No environment variable: LEADER_SHARDS is what the command gets.)
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_SHARDS)))]
    pub(crate) shards: Option<u32>,
    /// Serve Prometheus metrics at /metrics, and /healthz, /readyz and /leader, on HOST:PORT
    /// (an IP address; 0.0.0.0 for every interface), or on a port alone (9464) of the
    /// loopback address. Port 0 picks a free port (logged as metrics_addr=).
    #[arg(long, env = "LEADER_METRICS_ADDR", value_name = "HOST:PORT",
          value_parser = crate::endpoints::parse_addr)]
    pub(crate) metrics_addr: Option<SocketAddr>,
    /// Run the command in a PID namespace of its own, whose init is leader's, so that nothing
    /// it starts outlives its supervisor, even when leader and the supervisor are killed at
    /// once (pkill -9 leader). auto: where the kernel allows it (root; otherwise in a user
    /// namespace that maps this user to itself); on: refuse to start (78) where it does not;
    /// off: never. Inside, the command's pids are the namespace's (see "How the command
    /// runs" below).
    #[arg(long, env = "LEADER_PID_NAMESPACE", value_enum, value_name = "MODE",
          default_value_t = PidNamespaceMode::Auto)]
    pub(crate) pid_namespace: PidNamespaceMode,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub(crate) command: Vec<String>,
    #[command(flatten)]
    pub(crate) lifecycle: crate::lifecycle::LifecycleArgs,
}

/// What the supervisor needs beyond the grace period: for this process to pass a renewed
/// deadline on, and for the supervisor to wake up and signal.
pub(crate) const SUPERVISOR_SLACK: Duration = Duration::from_millis(50);

/// What a `--grace` given without `--renew-every` leaves between a healthy renew's answer and
/// the command's signal, beyond [`SUPERVISOR_SLACK`].
const GRACE_ROOM_SPARE: Duration = Duration::from_millis(50);

/// The longest default grace period.
const MAX_DEFAULT_GRACE: Duration = Duration::from_secs(10);

/// The room a healthy term leaves before its deadline: a renew is sent `renew_every` after
/// the last one, answers within `request_timeout`, and must reach the supervisor before the
/// command is signalled at `deadline - grace`.
fn grace_room(t: &Timing) -> Duration {
    t.ttl
        .saturating_sub(t.margin + t.renew_every + t.request_timeout + SUPERVISOR_SLACK)
}

fn check_grace(grace: Option<Duration>, t: &Timing) -> Result<Duration, Exit> {
    let room = grace_room(t);
    if room.is_zero() {
        return Err(Exit::new(
            exit::CONFIG,
            format!(
                "no room for a grace period: ttl {:?} - margin {:?} - renew_every {:?} - request_timeout {:?} - {SUPERVISOR_SLACK:?} is not positive; raise --ttl or lower --renew-every",
                t.ttl, t.margin, t.renew_every, t.request_timeout
            ),
        ));
    }
    let grace = grace.unwrap_or_else(|| (room / 2).min(MAX_DEFAULT_GRACE));
    if grace >= room {
        return Err(Exit::new(
            exit::CONFIG,
            format!(
                "--grace {grace:?} is too long for this timing: the command would be signalled even while renewals succeed. It must be below ttl - margin - renew_every - request_timeout - {SUPERVISOR_SLACK:?} = {room:?}; lower --grace or raise --ttl"
            ),
        ));
    }
    Ok(grace)
}

fn metadata(pairs: &[String]) -> Result<Metadata, Exit> {
    let mut m = Metadata::new();
    for p in pairs.iter().filter(|p| !p.is_empty()) {
        let Some((k, v)) = p.split_once('=') else {
            return Err(Exit::new(
                exit::CONFIG,
                format!("--meta {p:?}: expected KEY=VALUE"),
            ));
        };
        m.insert(k.to_owned(), v.to_owned());
    }
    Ok(m)
}

/// The exit for a campaign that ended on an error retrying cannot fix.
pub(crate) fn campaign_failed(problem: Option<&Problem>) -> Exit {
    match problem {
        Some(p) => {
            let code = match p.kind {
                ErrorKind::InvalidConfig => exit::CONFIG,
                _ => exit::UNAVAILABLE,
            };
            Exit::new(code, format!("giving up: {}", p.message))
        }
        None => Exit::new(exit::UNAVAILABLE, "the elector stopped"),
    }
}

/// The flags a sharded run cannot honour, as a usage error.
fn check_sharded_flags(args: &RunArgs) -> Result<(), Exit> {
    let refuse = |flag: &str, why: &str| {
        Err(Exit::new(
            exit::USAGE,
            format!("{flag} cannot be used with --shards: {why}"),
        ))
    };
    if args.wait.is_some() {
        return refuse(
            "--wait",
            "an instance that leads no shard is a standby, not a failure",
        );
    }
    if args.meta.iter().any(|m| !m.is_empty()) {
        return refuse(
            "--meta",
            "a member's record carries its claimed shards, not metadata",
        );
    }
    args.lifecycle.check_sharded()
}

/// What `leader run` works out from its flags before it opens the store.
pub(crate) struct Plan {
    pub(crate) timing: Timing,
    pub(crate) grace: Duration,
    pub(crate) holder: Option<HolderId>,
    pub(crate) metadata: Metadata,
    pub(crate) log_format: &'static str,
    /// `--metrics-addr`, if given.
    pub(crate) endpoint: Option<Endpoint>,
    /// What keeps the command's descendants from outliving its supervisor.
    pub(crate) isolation: Isolation,
    /// Which protection is in force, said after the store's first read.
    pub(crate) isolation_note: namespace::Note,
    /// `--pid-namespace on`.
    pub(crate) require_isolation: bool,
}

/// `--metrics-addr`, bound, with the recorder installed.
pub(crate) struct Endpoint {
    pub(crate) listener: tokio::net::TcpListener,
    pub(crate) prometheus: metrics_exporter_prometheus::PrometheusHandle,
}

pub(crate) fn config_error(e: ConfigError) -> Exit {
    Exit::new(exit::CONFIG, e.to_string())
}

impl RunArgs {
    /// The store flags as one text (for logs and the command's LEADER_STORE).
    pub(crate) fn store_text(&self) -> String {
        self.store.join(" ")
    }
}

pub(crate) async fn run(args: RunArgs, log_format: &'static str) -> Result<u8, Exit> {
    if args.shards.is_some() {
        check_sharded_flags(&args)?;
    }
    // Before the store is opened or a key joined.
    args.lifecycle.check()?;
    let source = match args.store.as_slice() {
        [one] => single::Source::One(store::parse(one)?),
        several => {
            if args.shards.is_some() {
                return Err(Exit::new(
                    exit::USAGE,
                    "--shards works on one store; an election over several stores leads one \
                     key"
                    .to_owned(),
                ));
            }
            let (quorum, key) = crate::quorum::open(several, &args.store_options).await?;
            single::Source::Quorum(quorum, key)
        }
    };
    let plan = plan(&args, log_format).await?;
    match (args.shards, source) {
        (Some(shards), single::Source::One(url)) => sharded::run(&args, &url, shards, plan).await,
        (_, source) => single::run(&args, source, plan).await,
    }
}

/// The timing rules first, so that a bad --ttl is reported as such; then the other flags, and
/// the metrics endpoint.
async fn plan(args: &RunArgs, log_format: &'static str) -> Result<Plan, Exit> {
    let mut set = TimingOverrides::default();
    set.renew_every = args.renew_every;
    set.retry_every = args.retry_every;
    set.poll_every = args.poll_every;
    let mut timing = Timing::resolve(args.ttl, &set);
    if let (Some(grace), None) = (args.grace, args.renew_every) {
        // Renew often enough that a healthy renew reaches the supervisor before the command
        // is signalled at deadline - grace, if the default would not.
        let room = timing.renew_every + grace_room(&timing);
        let fits = room.saturating_sub(grace + GRACE_ROOM_SPARE);
        if fits < timing.renew_every && fits >= timing.ttl / 10 {
            timing.renew_every = fits;
        }
    }
    timing.validate().map_err(config_error)?;
    let grace = check_grace(args.grace, &timing)?;
    let metadata = metadata(&args.meta)?;
    // For every term (and every shard) of this run; said once the store has been checked.
    let (isolation, isolation_note) = namespace::decide(args.pid_namespace).await?;
    let holder = args
        .id
        .clone()
        .map(HolderId::new)
        .transpose()
        .map_err(config_error)?;
    // Before the elector is built (its metrics register then) and before campaigning (a
    // taken port ends the run before it leads).
    let endpoint = match args.metrics_addr {
        Some(addr) => Some(Endpoint {
            listener: endpoints::bind(addr).await?,
            prometheus: endpoints::install_recorder()?,
        }),
        None => None,
    };
    Ok(Plan {
        timing,
        grace,
        holder,
        metadata,
        log_format,
        endpoint,
        isolation,
        isolation_note,
        require_isolation: args.pid_namespace == PidNamespaceMode::On,
    })
}

/// The first read of the store, before `starting` ("campaigning"): errors that retrying
/// cannot fix end the run now; others are retried by the elector. `what` names what was read.
pub(crate) async fn first_read<T>(
    timing: &Timing,
    (starting, what): (&str, &str),
    read: impl Future<Output = Result<T, Error>>,
) -> Result<(), Exit> {
    match within(timing.request_timeout * 2, read).await {
        Err(_) => warn!("the store did not answer yet; {starting} anyway (retrying)"),
        Ok(Err(e)) if e.kind() == ErrorKind::MalformedRecord => {
            warn!(error = %e, "{what} is malformed; waiting for an operator");
        }
        Ok(Err(e)) if e.is_retryable() => warn!(error = %e, "the store is not usable yet"),
        Ok(Err(e)) => return Err(store::unavailable(&e)),
        Ok(Ok(_)) => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grace_must_leave_room_for_a_healthy_renew() {
        let t = Timing::from_ttl(Duration::from_secs(2));
        // 2000 - 400 (margin) - 1000 (renew) - 200 (request) - 50 = 350 ms.
        let room = grace_room(&t);
        assert_eq!(room, Duration::from_millis(350));
        assert_eq!(check_grace(None, &t).unwrap(), grace_room(&t) / 2);
        assert!(check_grace(Some(Duration::from_millis(300)), &t).is_ok());
        let e = check_grace(Some(Duration::from_millis(400)), &t).unwrap_err();
        assert_eq!(e.code, exit::CONFIG);
        assert!(e.message.contains("--grace"), "{}", e.message);
        let long = Timing::from_ttl(Duration::from_secs(600));
        assert_eq!(check_grace(None, &long).unwrap(), MAX_DEFAULT_GRACE);
    }

    #[test]
    fn no_room_names_the_timing_not_grace() {
        let mut t = Timing::from_ttl(Duration::from_secs(2));
        t.renew_every = Duration::from_millis(1350);
        assert!(t.validate().is_ok());
        let e = check_grace(None, &t).unwrap_err();
        assert!(e.message.contains("no room"), "{}", e.message);
    }
}
