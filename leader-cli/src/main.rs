//! `leader`: run a command only while this instance is leader.
//!
//! See `leader --help` and `leader run --help` for the timing rules and exit codes.
#![allow(clippy::print_stdout, clippy::print_stderr)] // a command-line program

mod demo;
mod endpoints;
mod process_tree;
mod run;
mod signals;
mod status;
mod store;
mod supervise;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

/// Exit codes (from sysexits.h).
pub(crate) mod exit {
    /// A malformed store URL, an unknown scheme, a backend not compiled in, bad arguments.
    pub(crate) const USAGE: u8 = 64;
    /// The store cannot be used and retrying will not help (missing place, credentials,
    /// permissions).
    pub(crate) const UNAVAILABLE: u8 = 69;
    /// `--wait` ran out before this instance became leader.
    pub(crate) const NOT_LEADER_IN_TIME: u8 = 73;
    /// Leadership was lost while the command ran, or the term ended before it could start
    /// (without `--supervise`).
    pub(crate) const LOST: u8 = 75;
    /// `leader status --watch` cannot write its stdout (a closed pipe is not an error).
    pub(crate) const IO_ERROR: u8 = 74;
    /// A configuration error (timing rules, `--grace`, metadata, an invalid store setting).
    pub(crate) const CONFIG: u8 = 78;
}

/// An error that ends the program with a given exit code.
#[derive(Debug)]
pub(crate) struct Exit {
    pub(crate) code: u8,
    pub(crate) message: String,
}

impl Exit {
    pub(crate) fn new(code: u8, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

const AFTER_HELP: &str = "\
Timing (measured on this machine's clocks, never another machine's):
  A term is valid until (send time of its last successful renew) + ttl - margin: the deadline.
  The command gets SIGTERM at deadline - grace and SIGKILL at the deadline, whether or not the
  store answered, together with every process it started. A follower takes over only after
  seeing the lease unchanged for a full ttl, which is after the deadline. A released lease is
  taken over within one --poll-every. Defaults: renew every ttl/2 (less if that leaves no
  room for three failed renews, or for --grace), poll every 500ms (at most ttl/5), retry a
  failing store every ttl/5 at most, request timeout min(ttl/10, 2s), margin
  max(ttl/10, 2 x request timeout), grace half of
  (ttl - margin - renew_every - request_timeout - 50ms), at most 10s.

How the command runs:
  A supervisor process, in a session of its own (Ctrl-C, `kill -- -PGID`, `timeout` and
  SIGSTOP of leader's group do not reach it), starts the command in its own process group
  and keeps every process it starts below itself (child subreaper), even one that calls
  setsid or daemonizes. The command is killed by the kernel if the supervisor dies
  (PR_SET_PDEATHSIG), and is never started once the term's deadline has passed (checked on
  CLOCK_BOOTTIME right before exec). The lease is released only after the command and
  everything it started are gone. The command shares leader's stdin, stdout and stderr but
  has no controlling terminal: keys typed at the terminal reach leader, which passes the
  signals on.

Signals:
  SIGTERM, SIGINT, SIGHUP, SIGQUIT to leader (or its whole process group): passed on to the
    command and everything it started; SIGKILL after --grace (or at the deadline, if sooner);
    then the lease is released and leader exits 128+N. Another such signal a second or more
    later kills at once.
  SIGUSR1, SIGUSR2: passed on to the command's process group; nothing else changes.
  SIGTERM etc. sent to the supervisor too (systemd's stop, pkill leader): handled the same.
  SIGKILL of leader (or its group): the supervisor stops the command (SIGTERM, SIGKILL after
    --grace or at the deadline); the lease expires after its ttl.
  SIGKILL of the supervisor: the kernel kills the command; leader kills whatever the command
    started, leaves the lease to expire and exits 75. A supervisor that does not act (frozen)
    is killed by leader the same way, half a margin after the deadline or a second after the
    grace period of a requested stop.
  SIGSTOP of leader (or its group, Ctrl-Z): the supervisor still stops the command at the
    deadline; resumed, leader exits 75 (or campaigns again with --supervise).
  Not covered: SIGKILL of leader and the supervisor at once (pkill -9 leader) kills the
    command but not what it started (run it under `unshare --pid --fork --kill-child`, or
    systemd); SIGSTOP of the supervisor and leader at once leaves the command running.

Environment of the command:
  LEADER_FENCING_TOKEN  the term's fencing token (pass it to the protected resource)
  LEADER_HOLDER_ID      this instance's id     LEADER_KEY      the lease key
  LEADER_STORE          the store URL          LEADER_TTL_MS   the lease duration, in ms
  LEADER_GRACE_MS       time between the stop signal and SIGKILL, in ms
  LEADER_SHARD          with --shards: the shard, 0 to N-1 (LEADER_FENCING_TOKEN is its token)
  LEADER_SHARDS         with --shards: N

Sharded runs (--shards N):
  Every instance of one store URL and N shares the N shards: each leads its share (within
  one of the others'), rebalanced as instances come and go, and runs one command per led
  shard, each under its own supervisor by the rules above (started only within the term,
  SIGTERM at deadline - grace, SIGKILL at the deadline, every process it starts). A shard
  moves to another instance only after its command and everything it started have exited.
  A command that exits by itself while its shard is still led is started again in the same
  term (same token) after a pause: 1s, doubled while it keeps exiting within 30s, at most
  30s; so is one whose supervisor was killed. Stop signals reach every shard's command;
  then leader releases the shards and exits 128+N. --supervise is implied; --wait and --meta
  do not apply (64); another N than the key's instances use is refused (78). Exit codes: 128+N, 69, 78 as above, never a command's own. The shards
  are not in `leader status` but in `leader status --shards`.

Logging: LEADER_LOG sets the filter (tracing syntax, e.g. `warn`, `leader_core=debug`, or
  `debug` for everything, the SDKs included). The default is `info` for leader's own lines and
  only errors (AWS) or warnings (Azure, Google) from the cloud SDKs. --log-format text|json
  (LEADER_LOG_FORMAT). Logs go to stderr through a buffer that drops lines rather than block,
  so a stuck stderr never delays a stop.

Exit codes:
  the command's own code (128+N if it died of signal N)
  64   bad arguments or durations, malformed store URL, unknown scheme, backend not compiled in
  69   the store cannot be used and retrying will not help: missing folder, container, table
       or bucket, rejected credentials, permission denied, read-only folder
  73   --wait ran out before becoming leader
  75   leadership lost while the command ran, or the term ended before it could start
       (without --supervise)
  78   configuration error: timing rules, --grace, metadata, a record path that is a folder
  126  the command cannot be executed      127  the command was not found
  128+N  leader was stopped by signal N before or while running the command
  74   leader status --watch: stdout cannot be written (a full disk; a closed pipe exits 0)
  leader status --watch exits 0 when stopped by SIGINT, SIGTERM or SIGHUP or when its reader
  goes away; store errors that may pass print an `unknown` line and it goes on.
  Errors that may pass (store unreachable, throttled, timeouts) are retried, not fatal.

Stores:
  file:///absolute/path/KEY   leases in files, for processes on one host (the embedded default)
  azblob://CONTAINER/BLOB, dynamodb://TABLE/KEY, gs://BUCKET/OBJECT   (when compiled in)
  etcd://HOST:PORT[,HOST:PORT...]/[FOLDER/]KEY (etcds:// for TLS), zk://HOST:PORT[,...]/[PATH/]KEY

Credentials (each cloud's usual chain; nothing to pass on the command line):
  azblob://   AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT with AZURE_STORAGE_KEY
              or AZURE_STORAGE_SAS_TOKEN; else workload identity (AZURE_FEDERATED_TOKEN_FILE,
              AZURE_TENANT_ID, AZURE_CLIENT_ID), else the managed identity (AZURE_CLIENT_ID
              picks a user-assigned one)
  dynamodb:// the AWS chain: AWS_ACCESS_KEY_ID..., AWS_PROFILE and the shared files, web
              identity (AWS_WEB_IDENTITY_TOKEN_FILE, AWS_ROLE_ARN), ECS, the EC2 instance
              profile (IMDSv2); region from AWS_REGION or the profile
  gs://       Application Default Credentials: GOOGLE_APPLICATION_CREDENTIALS, the gcloud
              login, or the metadata server (GCE, GKE, Cloud Run)
  etcd://     LEADER_ETCD_USER and LEADER_ETCD_PASSWORD if the cluster has auth on;
              LEADER_ETCD_CA_FILE adds a CA to trust for etcds://
  zk://       none (open ACLs on the parent node; each term's node is writable only by its
              own session)
  TLS trusts the system's roots; SSL_CERT_FILE (a PEM bundle) replaces them.
  --endpoint URL moves the store (credentials unchanged; for etcd:// and zk:// it replaces
  the hosts). Emulators: --emulator, or their own
  variables (STORAGE_EMULATOR_HOST, an Azurite connection string).";

#[derive(Debug, Parser)]
#[command(name = "leader", version, about = "Run a command only while this instance is leader", after_help = AFTER_HELP)]
struct Cli {
    /// Log format on stderr.
    #[arg(long, env = "LEADER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Campaign for the lease; run CMD while leader; stop it when leadership ends.
    #[command(after_help = AFTER_HELP)]
    Run(run::RunArgs),
    /// Print who holds the lease (with --shards: who leads which shards of a sharded key; with
    /// --watch: a line per change until interrupted).
    Status(status::StatusArgs),
    /// Three `leader run` processes on a temporary file store; kill the leader; watch failover.
    Demo,
    /// Internal: the supervisor that starts the command and stops it (see `supervise/process.rs`).
    #[command(name = "__supervise", hide = true)]
    Supervise(supervise::process::SuperviseArgs),
    /// Internal: the last step before the command (deadline check, then exec).
    #[command(name = "__exec", hide = true)]
    Exec(supervise::process::ExecArgs),
}

/// The longest duration any option accepts.
const MAX_DURATION: Duration = Duration::from_secs(366 * 24 * 3600);

pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 15s, 500ms, 1m)"))?;
    if d > MAX_DURATION {
        return Err(format!(
            "{s:?} is longer than the longest supported duration, 366d"
        ));
    }
    Ok(d)
}

/// Logs to stderr through a writer thread that drops lines rather than block: a stuck stderr
/// (a pager that is not reading, a stalled log collector) must never stop `leader` or its
/// supervisor from acting at a deadline. Keep the guard until exit (it flushes, for 1 s at most).
/// The filter without `LEADER_LOG`: our own lines at INFO; the SDKs only when something is
/// wrong. Their retries and fallbacks are ours to report, once, with the store and the
/// operation: the AWS credential chain warns (multi-line) for every provider it tries,
/// azure_core logs each transport failure at INFO, zookeeper_client each session it opens (one
/// per term) at INFO, and the certificate verifier logs at ERROR what our error message says
/// too.
const DEFAULT_LOG: &str = "info,aws_config=error,aws_runtime=error,aws_smithy_runtime=error,\
aws_smithy_http_client=error,typespec_client_core=warn,azure_core=warn,azure_identity=warn,\
google_cloud_auth=warn,google_cloud_gax_internal=warn,google_cloud_storage=warn,\
zookeeper_client=warn,rustls_platform_verifier=off";

pub(crate) fn init_logging(format: LogFormat) -> tracing_appender::non_blocking::WorkerGuard {
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(true)
        .thread_name("leader-log")
        .finish(std::io::stderr());
    let filter = tracing_subscriber::EnvFilter::try_from_env("LEADER_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    guard
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { exit::USAGE } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    let command = match cli.command {
        Command::Exec(args) => return ExitCode::from(supervise::process::exec(args)),
        // The supervisor starts its logging itself, once its signals are blocked.
        Command::Supervise(args) => {
            return ExitCode::from(supervise::process::run(args, cli.log_format));
        }
        other => other,
    };
    let _log = init_logging(cli.log_format);
    // Before any store builds a TLS client: the suite's one crypto provider (leader-core/src/tls.rs).
    leader::tls::install_crypto_provider();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("leader: cannot start the runtime: {e}");
            return ExitCode::from(exit::UNAVAILABLE);
        }
    };
    let log_format = match cli.log_format {
        LogFormat::Text => "text",
        LogFormat::Json => "json",
    };
    let result = runtime.block_on(async move {
        match command {
            Command::Run(args) => run::run(args, log_format).await,
            Command::Status(args) => status::run(args).await,
            Command::Demo => demo::run().await,
            Command::Supervise(_) | Command::Exec(_) => Ok(0),
        }
    });
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("leader: {}", e.message);
            ExitCode::from(e.code)
        }
    }
}
