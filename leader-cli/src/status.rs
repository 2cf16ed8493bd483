//! `leader status`: who holds the lease, or (`--shards`) how the shards of a sharded key are
//! led.

use clap::Args;
use leader::Store;
use leader_core::{LeaseKey, ShardSet, ShardedStatus, wall_clock_unix_ms};

use crate::{Exit, store};

#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// Where the lease lives (see `leader run --help`).
    #[arg(long, env = "LEADER_STORE")]
    store: String,
    #[command(flatten)]
    store_options: store::StoreOptions,
    /// The key is sharded (`leader run --shards`): print its members, the shards each claims
    /// and the shards nobody claims, read from the members' records (one read per member).
    #[arg(long)]
    shards: bool,
    /// Print one JSON object.
    #[arg(long, env = "LEADER_JSON")]
    json: bool,
}

pub(crate) async fn run(args: StatusArgs) -> Result<u8, Exit> {
    let url = store::parse(&args.store)?;
    let (backend, key) = store::open(&url, &args.store_options).await?;
    if args.shards {
        return sharded(&*backend, &key, args.json).await;
    }
    let current = backend
        .read(&key)
        .await
        .map_err(|e| store::unavailable(&e))?;
    let now_ms = wall_clock_unix_ms();
    match current {
        None => {
            // A sharded key has no record of its own: say so rather than only "nobody".
            let sharded = leader_core::read_status(&*backend, &key)
                .await
                .ok()
                .flatten()
                .map(|s| s.shards);
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({"key": key.as_str(), "state": "absent", "holder": null, "token": null, "metadata": {}, "sharded": sharded.is_some()})
                );
            } else {
                println!("{key}: nobody holds the lease (no record)");
                if let Some(n) = sharded {
                    println!("  {key} is a sharded key ({n} shards): see `leader status --shards`");
                }
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

/// `leader status --shards`.
async fn sharded(backend: &dyn Store, key: &LeaseKey, json: bool) -> Result<u8, Exit> {
    let status = leader_core::read_status(backend, key)
        .await
        .map_err(|e| store::unavailable(&e))?;
    match (status, json) {
        (Some(s), true) => println!("{}", sharded_json(key, Some(&s))),
        (Some(s), false) => print!("{}", sharded_text(key, &s)),
        (None, _) => {
            // Some stores answer "no such object" for a missing bucket too; the key's own
            // record tells them apart (and whether the key is a single lease).
            let single = backend
                .read(key)
                .await
                .map_err(|e| store::unavailable(&e))?;
            if json {
                println!("{}", sharded_json(key, None));
            } else {
                println!("{key}: no instance has joined this sharded key (no roster)");
                if single.is_some() {
                    println!(
                        "  {key} has a lease record of its own: see `leader status` without --shards"
                    );
                }
            }
        }
    }
    Ok(0)
}

/// The shards of `set` as ranges, `0-2,5`; empty for none.
fn ranges(set: &ShardSet) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut run: Option<(u32, u32)> = None;
    for s in set.iter() {
        run = match run {
            Some((a, b)) if s == b + 1 => Some((a, s)),
            Some(done) => {
                out.push(range(done));
                Some((s, s))
            }
            None => Some((s, s)),
        };
    }
    out.extend(run.map(range));
    out.join(",")
}

fn range((a, b): (u32, u32)) -> String {
    if a == b {
        a.to_string()
    } else {
        format!("{a}-{b}")
    }
}

/// The JSON of `leader status --shards` (documented in the README).
fn sharded_json(key: &LeaseKey, status: Option<&ShardedStatus>) -> serde_json::Value {
    let Some(s) = status else {
        return serde_json::json!({
            "key": key.as_str(), "shards": null, "members": [], "unclaimed": [],
            "unclaimed_ranges": "",
        });
    };
    let members: Vec<serde_json::Value> = s
        .members
        .iter()
        .map(|m| {
            serde_json::json!({
                "id": m.id.as_str(),
                "held": m.held,
                "token": m.token.get(),
                "count": m.claims.len(),
                "claims": m.claims.iter().collect::<Vec<u32>>(),
                "ranges": ranges(&m.claims),
            })
        })
        .collect();
    serde_json::json!({
        "key": key.as_str(),
        "shards": s.shards,
        "members": members,
        "unclaimed": s.unclaimed.iter().collect::<Vec<u32>>(),
        "unclaimed_ranges": ranges(&s.unclaimed),
    })
}

fn sharded_text(key: &LeaseKey, s: &ShardedStatus) -> String {
    use std::fmt::Write;
    let held = s.members.iter().filter(|m| m.held).count();
    let mut out = format!(
        "{key}: {} shards; {held} of {} members hold their membership; {} unclaimed\n",
        s.shards,
        s.members.len(),
        s.unclaimed.len()
    );
    for m in &s.members {
        let _ = if m.held {
            let n = m.claims.len();
            let list = if n == 0 {
                String::new()
            } else {
                format!(": {}", ranges(&m.claims))
            };
            writeln!(
                out,
                "  {}: held, membership token {}, {n} shard{}{list}",
                m.id,
                m.token,
                if n == 1 { "" } else { "s" }
            )
        } else {
            writeln!(
                out,
                "  {}: not held (membership token {}), no shards",
                m.id, m.token
            )
        };
    }
    if !s.unclaimed.is_empty() {
        let _ = writeln!(out, "  unclaimed: {}", ranges(&s.unclaimed));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_sets_print_as_ranges() {
        let mut set = ShardSet::new(10);
        assert_eq!(ranges(&set), "");
        for s in [0, 1, 2, 5, 7, 8, 9] {
            set.insert(s);
        }
        assert_eq!(ranges(&set), "0-2,5,7-9");
        let mut one = ShardSet::new(3);
        one.insert(1);
        assert_eq!(ranges(&one), "1");
    }
}
