//! `leader`: run a command only while this instance is leader.
//!
//! See `leader --help` and `leader run --help` for the timing rules and exit codes.
#![allow(clippy::print_stdout, clippy::print_stderr)] // a command-line program

mod demo;
mod endpoints;
mod help;
mod lifecycle;
mod process_tree;
mod quorum;
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

#[derive(Debug, Parser)]
#[command(name = "leader", version, about = "Run a command only while this instance is leader", after_help = help::TOP, max_term_width = 100)]
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
    #[command(after_help = help::RUN)]
    Run(Box<run::RunArgs>),
    /// Print who holds the lease (with --shards: who leads which shards of a sharded key; with
    /// --watch: a line per change until interrupted).
    #[command(after_help = help::STATUS)]
    Status(status::StatusArgs),
    /// Three `leader run` processes on a temporary file store; kill the leader; watch failover.
    Demo,
    /// Internal: the supervisor that starts the command and stops it (see `supervise/process.rs`).
    #[command(name = "__supervise", hide = true)]
    Supervise(supervise::process::SuperviseArgs),
    /// Internal: the last step before the command (deadline check, then exec), or the init of
    /// its PID namespace.
    #[command(name = "__exec", hide = true)]
    Exec(supervise::process::ExecArgs),
    /// Internal: whether the kernel lets this process's supervisors use a PID namespace.
    #[command(name = "__probe-pid-namespace", hide = true)]
    ProbePidNamespace,
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
/// per term) at INFO, the certificate verifier logs at ERROR what our error message says
/// too, and openraft logs at ERROR every call to a member that is down (which a group of three
/// outlives; `leader_raft` says what matters).
const DEFAULT_LOG: &str = "info,aws_config=error,aws_runtime=error,aws_smithy_runtime=error,\
aws_smithy_http_client=error,typespec_client_core=warn,azure_core=warn,azure_identity=warn,\
google_cloud_auth=warn,google_cloud_gax_internal=warn,google_cloud_storage=warn,\
zookeeper_client=warn,rustls_platform_verifier=off,openraft=off";

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
        // Single-threaded, as a user namespace requires: before logging starts its thread.
        Command::ProbePidNamespace => return ExitCode::from(supervise::namespace::probe()),
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
            Command::Run(args) => run::run(*args, log_format).await,
            Command::Status(args) => status::run(args).await,
            Command::Demo => demo::run().await,
            Command::Supervise(_) | Command::Exec(_) | Command::ProbePidNamespace => Ok(0),
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

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;
    use crate::supervise::namespace::{Isolation, PidNamespaceMode};

    /// Whole command lines through clap, as `leader run` and the supervisor build them: a
    /// value parser whose type does not match its field panics only when parsed.
    #[test]
    fn whole_command_lines_parse() {
        Cli::command().debug_assert();
        let run = |extra: &[&str]| {
            let mut line = vec!["leader", "run", "--store", "file:///tmp/leases/k"];
            line.extend(extra);
            line.extend(["--", "sleep", "1"]);
            Cli::try_parse_from(line)
        };
        for (extra, want) in [
            (&[][..], PidNamespaceMode::Auto),
            (&["--pid-namespace", "auto"], PidNamespaceMode::Auto),
            (&["--pid-namespace", "on"], PidNamespaceMode::On),
            (&["--pid-namespace", "off"], PidNamespaceMode::Off),
        ] {
            let cli = run(extra).unwrap();
            let Command::Run(args) = cli.command else {
                panic!("not a run: {extra:?}");
            };
            assert_eq!(args.pid_namespace, want, "{extra:?}");
        }
        assert!(run(&["--pid-namespace", "maybe"]).is_err());
        for isolation in [Isolation::Pid, Isolation::UserPid, Isolation::None] {
            let line = [
                "leader",
                "--log-format",
                "json",
                "__supervise",
                "--control",
                "/tmp/leader-x/control",
                "--grace",
                "1500000000ns",
                "--deadline",
                "123",
                "--isolation",
                isolation.as_str(),
                "--require-isolation",
                "--",
                "sleep",
                "1",
            ];
            let cli = Cli::try_parse_from(line).unwrap();
            assert!(matches!(cli.command, Command::Supervise(_)));
        }
        for extra in [&[][..], &["--init-report", "/tmp/leader-x/init"]] {
            let mut line = vec!["leader", "__exec", "--supervisor", "1", "--not-after", "9"];
            line.extend(extra);
            line.extend(["--", "true"]);
            let cli = Cli::try_parse_from(line).unwrap();
            assert!(matches!(cli.command, Command::Exec(_)));
        }
        let cli = Cli::try_parse_from(["leader", "__probe-pid-namespace"]).unwrap();
        assert!(matches!(cli.command, Command::ProbePidNamespace));
    }
}
