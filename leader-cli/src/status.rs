//! `leader status`: who holds the lease.

use clap::Args;
use leader_core::wall_clock_unix_ms;

use crate::{Exit, store};

#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// Where the lease lives (see `leader run --help`).
    #[arg(long, env = "LEADER_STORE")]
    store: String,
    #[command(flatten)]
    store_options: store::StoreOptions,
    /// Print one JSON object.
    #[arg(long, env = "LEADER_JSON")]
    json: bool,
}

pub(crate) async fn run(args: StatusArgs) -> Result<u8, Exit> {
    let url = store::parse(&args.store)?;
    let (backend, key) = store::open(&url, &args.store_options).await?;
    let current = backend
        .read(&key)
        .await
        .map_err(|e| store::unavailable(&e))?;
    let now_ms = wall_clock_unix_ms();
    match current {
        None => {
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({"key": key.as_str(), "state": "absent", "holder": null, "token": null, "metadata": {}})
                );
            } else {
                println!("{key}: nobody holds the lease (no record)");
            }
        }
        Some(s) => {
            let r = &s.record;
            let state = if r.is_held() { "held" } else { "released" };
            // The writer's wall clock, not ours: informational only.
            let age_ms = now_ms.saturating_sub(r.written_unix_ms);
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({
                        "key": key.as_str(),
                        "holder": r.holder.as_str(),
                        "token": r.token.get(),
                        "state": state,
                        "metadata": r.metadata,
                        "ttl_ms": u64::try_from(r.ttl.as_millis()).unwrap_or(u64::MAX),
                        "written_unix_ms": r.written_unix_ms,
                        "term_started_unix_ms": r.term_started_unix_ms,
                        "approx_age_ms": age_ms,
                        "revision": s.revision.as_str(),
                    })
                );
            } else {
                println!("{key}: {state} by {} with token {}", r.holder, r.token);
                println!(
                    "  ttl {:?}; last written about {:.1} s ago (by the writer's clock)",
                    r.ttl,
                    age_ms as f64 / 1000.0
                );
                for (k, v) in &r.metadata {
                    println!("  {k} = {v}");
                }
            }
        }
    }
    Ok(0)
}
