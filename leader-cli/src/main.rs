//! `leader`: run a command only while this instance is leader.
//!
//! See `leader --help` and `leader run --help` for the timing rules and exit codes.
#![allow(clippy::print_stdout, clippy::print_stderr)] // a command-line program

mod demo;
mod process_tree;
mod run;
mod status;
mod store;
mod supervisor;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

/// Exit codes (from sysexits.h).
pub(crate) mod exit {
    /// A malformed store URL, an unknown scheme, a backend not compiled in, bad arguments.
    pub(crate) const USAGE: u8 = 64;
    /// The store is unreachable at startup, or rejects the credentials.
    pub(crate) const UNAVAILABLE: u8 = 69;
    /// `--wait` ran out before this instance became leader.
    pub(crate) const NOT_LEADER_IN_TIME: u8 = 73;
    /// Leadership was lost while the command ran (without `--supervise`).
    pub(crate) const LOST: u8 = 75;
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
Timing (all measured on this machine's monotonic clock):
  A leader's term is valid until (send time of its last successful renew) + ttl - margin.
  At that instant its command is sent SIGTERM (and SIGKILL after --grace), whether or not the
  store answered. A follower takes over only after seeing the lease unchanged for a full ttl,
  so the command is dead before anyone else can start theirs. A released lease (the command
  exited, or `leader` got SIGTERM/SIGINT/SIGHUP) is taken over within one --retry-every.
  Defaults: renew every ttl/3, poll every ttl/5, request timeout min(ttl/10, 2s),
  margin max(ttl/10, 2 x request timeout), grace margin/2.

Exit codes:
  the command's own code (128+N if it died of signal N)
  64  bad arguments, malformed store URL, unknown scheme, backend not compiled in
  69  store unreachable at startup, or credentials rejected
  73  --wait ran out before becoming leader
  75  leadership lost while the command ran (without --supervise)
  78  configuration error (timing rules, --grace)
  128+N  `leader` itself was stopped by signal N before or while running the command

Stores:
  file:///absolute/path/KEY   leases in files, for processes on one host (the embedded default)
  azblob://CONTAINER/BLOB, dynamodb://TABLE/KEY, gs://BUCKET/OBJECT   (when compiled in)";

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
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Campaign for the lease; run CMD while leader; stop it when leadership ends.
    #[command(after_help = AFTER_HELP)]
    Run(run::RunArgs),
    /// Print who holds the lease.
    Status(status::StatusArgs),
    /// Three `leader run` processes on a temporary file store; kill the leader; watch failover.
    Demo,
    /// Internal: the supervisor that starts the command and stops it (see `supervisor.rs`).
    #[command(name = "__supervise", hide = true)]
    Supervise(supervisor::SuperviseArgs),
    /// Internal: the last step before the command (deadline check, then exec).
    #[command(name = "__exec", hide = true)]
    Exec(supervisor::ExecArgs),
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

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("LEADER_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
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
        Command::Exec(args) => return ExitCode::from(supervisor::exec(args)),
        Command::Supervise(args) => {
            init_logging(cli.log_format);
            return ExitCode::from(supervisor::run(args));
        }
        other => other,
    };
    init_logging(cli.log_format);
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
