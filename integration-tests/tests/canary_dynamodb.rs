//! Fidelity canary for the DynamoDB emulator: conditional `PutItem` / `UpdateItem` (the calls
//! the DynamoDB backend makes) must reject stale conditions and have exactly one winner when
//! racing. Stock `moto_server` fails the races (it does not serialize requests); see
//! `stock_moto_loses_races`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test helpers outside #[test] fns: a failure should fail the test"
)]

use std::collections::HashMap;
use std::sync::Arc;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::AttributeValue;
use integration_tests::dynamodb::{PARTITION_KEY, client, create_table};
use integration_tests::{Emulator, require, unique_name};
use tokio::sync::Barrier;

const RACERS: usize = 8;
const ROUNDS: usize = 5;

/// Always-true terms appended to every condition. An emulator that reads the item, then parses
/// and evaluates the condition, then writes (moto) has a check-then-write window as long as the
/// parse: about 10 ms with these terms, so that a non-serialized emulator loses the races
/// reliably instead of once in a few hundred rounds. The expression stays under DynamoDB's 4 KB.
const PAD_TERMS: usize = 60;

fn padded(condition: &str) -> String {
    let mut out = format!("({condition})");
    for _ in 0..PAD_TERMS {
        out.push_str(" AND (attribute_not_exists(#pad) OR #pad <> :pad)");
    }
    out
}

fn s(v: &str) -> AttributeValue {
    AttributeValue::S(v.to_owned())
}

fn n(v: u64) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

async fn setup() -> Option<(Client, String)> {
    let endpoint = require(Emulator::DynamoDb).await?;
    let client = client(&endpoint);
    let table = unique_name("canary");
    create_table(&client, &table).await.unwrap();
    Some((client, table))
}

/// `UpdateItem` that moves `version` from `expected` to `expected + 1` and sets `holder`;
/// `Ok(false)` when the condition failed.
async fn cas_update(
    client: &Client,
    table: &str,
    key: &str,
    expected: u64,
    holder: &str,
) -> Result<bool, aws_sdk_dynamodb::Error> {
    let result = client
        .update_item()
        .table_name(table)
        .key(PARTITION_KEY, s(key))
        .update_expression("SET #v = :new, holder = :holder")
        .condition_expression(padded("#v = :expected"))
        .expression_attribute_names("#v", "version")
        .expression_attribute_names("#pad", "never_set")
        .expression_attribute_values(":pad", s("x"))
        .expression_attribute_values(":new", n(expected + 1))
        .expression_attribute_values(":expected", n(expected))
        .expression_attribute_values(":holder", s(holder))
        .send()
        .await;
    match result {
        Ok(_) => Ok(true),
        Err(e) => {
            let e = e.into_service_error();
            if e.is_conditional_check_failed_exception() {
                Ok(false)
            } else {
                Err(e.into())
            }
        }
    }
}

/// Create-only `PutItem`; `Ok(false)` when the item already existed.
async fn create_only(
    client: &Client,
    table: &str,
    key: &str,
    holder: &str,
) -> Result<bool, aws_sdk_dynamodb::Error> {
    let result = client
        .put_item()
        .table_name(table)
        .item(PARTITION_KEY, s(key))
        .item("version", n(1))
        .item("holder", s(holder))
        .condition_expression(padded("attribute_not_exists(#pk)"))
        .expression_attribute_names("#pk", PARTITION_KEY)
        .expression_attribute_names("#pad", "never_set")
        .expression_attribute_values(":pad", s("x"))
        .send()
        .await;
    match result {
        Ok(_) => Ok(true),
        Err(e) => {
            let e = e.into_service_error();
            if e.is_conditional_check_failed_exception() {
                Ok(false)
            } else {
                Err(e.into())
            }
        }
    }
}

async fn item(client: &Client, table: &str, key: &str) -> HashMap<String, AttributeValue> {
    client
        .get_item()
        .table_name(table)
        .key(PARTITION_KEY, s(key))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item
        .expect("item exists")
}

/// One round: `racers` tasks start together; returns the winners' names.
async fn race(client: &Client, table: &str, key: &str, update: bool, racers: usize) -> Vec<String> {
    let barrier = Arc::new(Barrier::new(racers));
    let mut tasks = Vec::new();
    for racer in 0..racers {
        let (client, table, key, barrier) = (
            client.clone(),
            table.to_owned(),
            key.to_owned(),
            barrier.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let me = format!("racer-{racer}");
            barrier.wait().await;
            let won = if update {
                cas_update(&client, &table, &key, 1, &me).await
            } else {
                create_only(&client, &table, &key, &me).await
            };
            (me, won.unwrap())
        }));
    }
    let mut winners = Vec::new();
    for task in tasks {
        let (me, won) = task.await.unwrap();
        if won {
            winners.push(me);
        }
    }
    winners
}

/// Runs `rounds` create races and `rounds` update races; returns a description of every round
/// that did not have exactly one winner (or whose stored holder is not the winner).
async fn race_rounds(client: &Client, table: &str, rounds: usize, racers: usize) -> Vec<String> {
    let mut bad = Vec::new();
    for round in 0..rounds {
        let key = format!("create-{round}");
        let winners = race(client, table, &key, false, racers).await;
        let stored = item(client, table, &key).await;
        if winners.len() != 1 || stored.get("holder") != Some(&s(&winners[0])) {
            bad.push(format!(
                "create round {round}: winners {winners:?}, stored holder {:?}",
                stored.get("holder")
            ));
        }

        let key = format!("update-{round}");
        assert!(create_only(client, table, &key, "initial").await.unwrap());
        let winners = race(client, table, &key, true, racers).await;
        let stored = item(client, table, &key).await;
        if winners.len() != 1
            || stored.get("holder") != Some(&s(&winners[0]))
            || stored.get("version") != Some(&n(2))
        {
            bad.push(format!(
                "update round {round}: winners {winners:?}, stored holder {:?} version {:?}",
                stored.get("holder"),
                stored.get("version")
            ));
        }
    }
    bad
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stale_conditional_write_is_rejected() {
    let Some((client, table)) = setup().await else {
        return;
    };
    assert!(create_only(&client, &table, "lease", "a").await.unwrap());
    assert!(!create_only(&client, &table, "lease", "b").await.unwrap());
    assert!(cas_update(&client, &table, "lease", 1, "b").await.unwrap());
    // Stale: still expects version 1.
    assert!(!cas_update(&client, &table, "lease", 1, "c").await.unwrap());
    let stored = item(&client, &table, "lease").await;
    assert_eq!(stored.get("holder"), Some(&s("b")));
    assert_eq!(stored.get("version"), Some(&n(2)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_conditional_writes_have_exactly_one_winner() {
    let Some((client, table)) = setup().await else {
        return;
    };
    let bad = race_rounds(&client, &table, ROUNDS, RACERS).await;
    assert!(
        bad.is_empty(),
        "the DynamoDB emulator is not atomic under concurrency (stock moto_server?):\n{}",
        bad.join("\n")
    );
}

/// Demonstrates why `scripts/moto_server.py` exists: races rounds against stock moto until one
/// breaks atomicity (at most `LEADER_STOCK_ROUNDS`, default 300, rounds of each kind). Run:
/// `LEADER_MOTO_STOCK=1 scripts/emulators run -- cargo test -p integration-tests --test
/// canary_dynamodb -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs stock moto: LEADER_MOTO_STOCK=1 scripts/emulators run -- cargo test ..."]
async fn stock_moto_loses_races() {
    assert_eq!(
        std::env::var("LEADER_MOTO_FLAVOUR").as_deref(),
        Ok("stock"),
        "start the emulators with LEADER_MOTO_STOCK=1"
    );
    let Some((client, table)) = setup().await else {
        return;
    };
    let env = |name: &str, default: usize| -> usize {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let max_rounds = env("LEADER_STOCK_ROUNDS", 300);
    let racers = env("LEADER_STOCK_RACERS", RACERS);
    let started = tokio::time::Instant::now();
    for round in 0..max_rounds {
        let bad = race_rounds(&client, &table, 1, racers).await;
        if !bad.is_empty() {
            println!(
                "stock moto broke atomicity in round {} of {max_rounds} ({racers} racers, {:.1?}):\n{}",
                round + 1,
                started.elapsed(),
                bad.join("\n")
            );
            return;
        }
        // Fresh keys per round: race_rounds(.., 1, ..) reuses "create-0"/"update-0".
        let _ = client
            .delete_item()
            .table_name(&table)
            .key(PARTITION_KEY, s("create-0"))
            .send()
            .await;
        let _ = client
            .delete_item()
            .table_name(&table)
            .key(PARTITION_KEY, s("update-0"))
            .send()
            .await;
    }
    panic!(
        "stock moto kept all {max_rounds} rounds atomic ({:.1?})",
        started.elapsed()
    );
}
