//! A chaos-drill candidate: `chaos_candidate backend=file|azure|dynamo|gcs endpoint=URL|DIR
//! place=CONTAINER|TABLE|BUCKET key=KEY id=ID [ttl_ms= renew_ms= retry_ms= timeout_ms=
//! margin_ms= write_ms=]`. Prints one JSON event per line on stdout; SIGTERM shuts it down.
#![allow(
    clippy::print_stderr,
    reason = "a command-line program reports its errors"
)]

use std::process::ExitCode;

use integration_tests::chaos::candidate::{CandidateArgs, run};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    // The elector's warnings (failed renews, step-downs) go to stderr, next to the events.
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LEADER_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .try_init();
    let args = match CandidateArgs::parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("chaos_candidate: {e}");
            return ExitCode::from(2);
        }
    };
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("chaos_candidate: {e}");
            ExitCode::FAILURE
        }
    }
}
