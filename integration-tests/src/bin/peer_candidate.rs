//! The peer, for the benchmark: `peer_candidate endpoint=URL table=TABLE key=KEY id=ID
//! [ttl_s=15]` campaigns for `KEY` with the [`dynamodb_lease`] crate (0.22) against the
//! DynamoDB at `URL`, in `TABLE` (the crate's schema: a string hash key `key`, time to live on
//! `lease_expiry`), and prints the same JSON events as `chaos_candidate` where the bench needs
//! them: `ready` (the client is built and has checked the table), `term_started` (a lease is
//! held), `term_ended` (SIGTERM, or the lease's background extension stopped) and `exit`.
//! Times are [`mono_us`], so the bench compares them with its own and with other candidates'.
//! The token is always 0: the crate has no fencing token.
//!
//! Everything else is the crate's defaults: a lease of `ttl_s` whole seconds, extended every
//! `ttl_s / 2`, and a follower's acquire attempt (a conditional `PutItem`) every second. On
//! SIGTERM it releases the lease (a conditional `DeleteItem`, awaited) and exits; SIGKILL
//! leaves the lease to expire. Exits 2 on a bad argument, 1 if the client cannot be built.
use std::io::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use aws_sdk_dynamodb::config::retry::RetryConfig;
use integration_tests::chaos::candidate::candidate_main;
use integration_tests::chaos::{EV_EXIT, EV_READY, EV_TERM_ENDED, EV_TERM_STARTED, Event, mono_us};
use integration_tests::{Emulator, Endpoint, Source};
use tokio::signal::unix::{SignalKind, signal};

/// The crate's default pause between acquire attempts (`ClientBuilder::acquire_cooldown`).
const ACQUIRE_COOLDOWN: Duration = Duration::from_secs(1);

/// How often the holder looks at its lease's health (whether the extension task still runs).
const HEALTH_CHECK: Duration = Duration::from_millis(100);

struct Args {
    endpoint: String,
    table: String,
    key: String,
    id: String,
    ttl_s: u32,
}

fn parse(args: impl IntoIterator<Item = String>) -> Result<Args, String> {
    let (mut endpoint, mut table, mut key, mut id) = (None, None, None, None);
    let mut ttl_s = 15;
    for arg in args {
        let Some((name, value)) = arg.split_once('=') else {
            return Err(format!("argument {arg:?} is not name=value"));
        };
        match name {
            "endpoint" => endpoint = Some(value.to_owned()),
            "table" => table = Some(value.to_owned()),
            "key" => key = Some(value.to_owned()),
            "id" => id = Some(value.to_owned()),
            "ttl_s" => match value.parse() {
                // The crate panics below 2 s.
                Ok(n) if n >= 2 => ttl_s = n,
                _ => {
                    return Err(format!(
                        "ttl_s={value:?} is not a whole number of seconds >= 2"
                    ));
                }
            },
            _ => return Err(format!("unknown argument {name:?}")),
        }
    }
    Ok(Args {
        endpoint: endpoint.ok_or("endpoint= is missing")?,
        table: table.ok_or("table= is missing")?,
        key: key.ok_or("key= is missing")?,
        id: id.ok_or("id= is missing")?,
        ttl_s,
    })
}

/// One event line on stdout, as `chaos_candidate` prints them.
fn emit(id: &str, ev: &str, outcome: &str) {
    let event = Event {
        ev: ev.to_owned(),
        t: mono_us(),
        id: id.to_owned(),
        outcome: outcome.to_owned(),
        ..Event::default()
    };
    if let Ok(line) = serde_json::to_string(&event) {
        let mut out = std::io::stdout().lock();
        // Nobody to tell if stdout is gone; the lease rules do not depend on it.
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }
}

async fn run(args: Args) -> Result<(), String> {
    let mut sigterm = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    // The suite's emulator client (static credentials, plain HTTP through our HTTP client),
    // with the SDK's standard retries that a user of the crate gets by default.
    let sdk = integration_tests::dynamodb::client(&Endpoint {
        emulator: Emulator::DynamoDb,
        url: args.endpoint.clone(),
        source: Source::Env,
    });
    let config = sdk
        .config()
        .to_builder()
        .retry_config(RetryConfig::standard())
        .build();
    let sdk = aws_sdk_dynamodb::Client::from_conf(config);
    let client = dynamodb_lease::Client::builder()
        .table_name(args.table.clone())
        .lease_ttl_seconds(args.ttl_s)
        .build_and_check_db(sdk)
        .await
        .map_err(|e| format!("building the dynamodb-lease client: {e:#}"))?;
    emit(&args.id, EV_READY, "");
    loop {
        let lease = tokio::select! {
            _ = sigterm.recv() => break,
            acquired = client.acquire(args.key.clone()) => match acquired {
                Ok(lease) => lease,
                Err(e) => {
                    tracing::warn!(error = format!("{e:#}"), "acquire failed; trying again");
                    tokio::time::sleep(ACQUIRE_COOLDOWN).await;
                    continue;
                }
            },
        };
        emit(&args.id, EV_TERM_STARTED, "");
        let mut check = tokio::time::interval(HEALTH_CHECK);
        let why = loop {
            tokio::select! {
                _ = sigterm.recv() => break "sigterm",
                _ = check.tick() => {
                    if !lease.is_healthy() {
                        break "extend failed";
                    }
                }
            }
        };
        emit(&args.id, EV_TERM_ENDED, why);
        if why == "sigterm" {
            if let Err(e) = lease.release().await {
                tracing::warn!(
                    error = format!("{e:#}"),
                    "release failed; the lease will expire"
                );
            }
            break;
        }
        tracing::warn!("the lease's extension stopped; campaigning again");
        // Dropping the lease releases it in the background (the crate's way).
        drop(lease);
    }
    emit(&args.id, EV_EXIT, "");
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    candidate_main("peer_candidate", parse, run).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Result<Args, String> {
        parse(list.iter().map(|s| (*s).to_owned()))
    }

    #[test]
    fn arguments_are_checked() {
        let a = args(&["endpoint=http://x", "table=t", "key=k", "id=a", "ttl_s=5"]).unwrap();
        assert_eq!((a.table.as_str(), a.ttl_s), ("t", 5));
        let a = args(&["endpoint=http://x", "table=t", "key=k", "id=a"]).unwrap();
        assert_eq!(a.ttl_s, 15);
        for bad in [
            &["table=t", "key=k", "id=a"][..],
            &["endpoint=e", "table=t", "key=k", "id=a", "ttl_s=1"],
            &["endpoint=e", "table=t", "key=k", "id=a", "ttl=3"],
            &["endpoint"],
        ] {
            assert!(args(bad).is_err(), "{bad:?}");
        }
    }
}
