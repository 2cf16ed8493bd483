//! Elections over several stores: `--store` given 3 or 5 times (`docs/quorum.md`). Opening
//! the quorum from the flags, and what `leader status` prints of it.

use std::time::Duration;

use leader::quorum::{MemberView, Quorum, QuorumStatus};
use leader::{LeaseKey, wall_clock_unix_ms};

use crate::store::{self, StoreOptions, StoreUrl, unavailable};
use crate::{Exit, exit};

/// Opens the quorum of `urls`: a malformed URL, members that name different keys, an even
/// number of members or one given twice are usage errors, before anything is opened; a
/// member that can never be used ends the command (69, or 78 for a configuration error).
pub(crate) async fn open(
    urls: &[String],
    options: &StoreOptions,
) -> Result<(Quorum, LeaseKey), Exit> {
    if options.endpoint.is_some() {
        return Err(Exit::new(
            exit::USAGE,
            "--endpoint moves one store; with several --store, each store's endpoint comes from \
             its own environment (AWS_ENDPOINT_URL, STORAGE_EMULATOR_HOST, ...) or --emulator"
                .to_owned(),
        ));
    }
    let parsed: Vec<StoreUrl> = urls
        .iter()
        .map(|u| store::parse(u))
        .collect::<Result<_, _>>()?;
    let names: Vec<String> = parsed.iter().map(ToString::to_string).collect();
    Quorum::check_names(&names).map_err(|e| Exit::new(exit::USAGE, e.to_string()))?;
    if let (Some(first), Some(other)) = (
        parsed.first(),
        parsed.iter().find(|u| u.key() != parsed[0].key()),
    ) {
        return Err(Exit::new(
            exit::USAGE,
            format!(
                "every --store of a quorum must end with the same lease key: {other} names {}, \
                 {first} names {}",
                other.key(),
                first.key()
            ),
        ));
    }
    leader::quorum_from_urls(urls, &options.open_options())
        .await
        .map_err(|e| unavailable(&e))
}

/// `leader status` over a quorum: each member's record and the term a majority carries.
/// Exits 69 if fewer than a majority of the members answered (the view is printed anyway).
pub(crate) async fn status(
    urls: &[String],
    options: &StoreOptions,
    json: bool,
    request_timeout: Duration,
) -> Result<u8, Exit> {
    let (quorum, key) = open(urls, options).await?;
    let status = leader::quorum::read_status(&quorum, &key, request_timeout)
        .await
        .map_err(|e| unavailable(&e))?;
    if json {
        println!("{}", status_json(&status, wall_clock_unix_ms()));
    } else {
        print!("{}", status_text(&status));
    }
    let answered = status.members.iter().filter(|m| m.error.is_none()).count();
    if answered < status.majority {
        return Err(Exit::new(
            exit::UNAVAILABLE,
            format!(
                "only {answered} of {} quorum members answered; a majority is {}",
                status.members.len(),
                status.majority
            ),
        ));
    }
    Ok(0)
}

/// A member's state word: `held`, `released`, `absent`, or `unknown` (no answer).
fn member_state(m: &MemberView) -> &'static str {
    match (&m.error, &m.holder, m.held) {
        (Some(_), _, _) => "unknown",
        (None, None, _) => "absent",
        (None, Some(_), true) => "held",
        (None, Some(_), false) => "released",
    }
}

/// The text of `leader status` over a quorum.
pub(crate) fn status_text(s: &QuorumStatus) -> String {
    let n = s.members.len();
    let mut out = match &s.leader {
        Some((holder, token, _)) => {
            let carrying = s
                .members
                .iter()
                .filter(|m| m.held && m.token == Some(*token))
                .count();
            format!(
                "{}: held by {holder} with token {token} on {carrying} of {n} members (a majority is {})\n",
                s.key, s.majority
            )
        }
        None => format!(
            "{}: no term is carried by a majority of the {n} members (a majority is {})\n",
            s.key, s.majority
        ),
    };
    for m in &s.members {
        let line = match (&m.error, &m.holder) {
            (Some(e), _) => format!("unknown ({e})"),
            (None, None) => "no record".to_owned(),
            (None, Some(h)) => format!(
                "{} by {h} with token {}",
                member_state(m),
                m.token.unwrap_or_default()
            ),
        };
        let foreign = if m.same_members {
            ""
        } else {
            " [written by a candidate with another set of members]"
        };
        out.push_str(&format!("  {}: {line}{foreign}\n", m.name));
    }
    if let Some((_, _, metadata)) = &s.leader {
        for (k, v) in metadata {
            out.push_str(&format!("  {k} = {v}\n"));
        }
    }
    out
}

/// The JSON of `leader status --json` over a quorum.
pub(crate) fn status_json(s: &QuorumStatus, now_ms: u64) -> serde_json::Value {
    let members: Vec<serde_json::Value> = s
        .members
        .iter()
        .map(|m| {
            serde_json::json!({
                "name": m.name,
                "state": member_state(m),
                "holder": m.holder.as_ref().map(|h| h.as_str()),
                "token": m.token,
                "term": m.term,
                "mark": m.mark,
                "same_members": m.same_members,
                "error": m.error,
            })
        })
        .collect();
    let (state, holder, token, metadata) = match &s.leader {
        Some((h, t, md)) => ("held", Some(h.as_str()), Some(*t), md.clone()),
        None => ("none", None, None, Default::default()),
    };
    serde_json::json!({
        "key": s.key.as_str(),
        "quorum": true,
        "state": state,
        "holder": holder,
        "token": token,
        "metadata": metadata,
        "majority": s.majority,
        "members": members,
        "at_unix_ms": now_ms,
    })
}
