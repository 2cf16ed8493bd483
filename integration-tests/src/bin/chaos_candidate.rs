//! A chaos-drill candidate: `chaos_candidate backend=file|azure|dynamo|gcs endpoint=URL|DIR
//! place=CONTAINER|TABLE|BUCKET key=KEY id=ID [ttl_ms= renew_ms= retry_ms= timeout_ms=
//! margin_ms= write_ms=]`. Prints one JSON event per line on stdout; SIGTERM shuts it down.
use std::process::ExitCode;

use integration_tests::chaos::candidate::{CandidateArgs, candidate_main, run};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    candidate_main("chaos_candidate", CandidateArgs::parse, run).await
}
