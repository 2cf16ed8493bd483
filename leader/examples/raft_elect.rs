//! Starts a three-member Raft group on loopback ports in this one process (each member with
//! its own folder, as three machines would have), campaigns for a key through one member, leads
//! for a few seconds with a fenced write, and releases:
//!
//! ```sh
//! cargo run -p leader --example raft_elect
//! ```
//!
//! On three machines, each runs one member: the same member list, its own address and folder.
#![allow(clippy::print_stdout)] // an example prints what it does

use std::sync::Arc;
use std::time::Duration;

use leader::raft::{RaftConfig, RaftStore};
use leader::{Elector, FencedStore, LeaseKey, ObjectName};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let folders = tempfile::tempdir()?;
    // Three free loopback ports (held together while picked, so that they differ).
    let picked = (0..3)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<Vec<_>>>()?;
    let members = picked
        .iter()
        .map(|l| Ok(l.local_addr()?.to_string()))
        .collect::<std::io::Result<Vec<String>>>()?;
    drop(picked);
    // A new group forms once every member has answered: start them together.
    let starts: Vec<_> = members
        .iter()
        .enumerate()
        .map(|(i, me)| {
            let dir = folders.path().join(format!("m{i}"));
            tokio::spawn(RaftStore::start(RaftConfig::new(
                members.clone(),
                me.clone(),
                dir,
            )))
        })
        .collect();
    let mut group = Vec::new();
    for start in starts {
        group.push(start.await??);
    }
    let store = group[0].clone();
    let handle = Elector::builder(Arc::new(store.clone()), LeaseKey::new("example")?)
        .ttl(Duration::from_secs(5))
        .build()?
        .spawn();
    let term = handle.wait_for_term().await?;
    println!("leading with token {}", term.token());
    let object = ObjectName::new("example-report")?;
    store
        .fenced_write(
            term.fence(),
            &object,
            format!("written by token {}", term.token()).as_bytes(),
        )
        .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    drop(term);
    handle.shutdown().await;
    // Read through another member: the group answers the same.
    let report = group[2].fenced_read(&object).await?;
    let text = report.map(|o| String::from_utf8_lossy(&o.value).into_owned());
    println!("released; the protected object holds {text:?}");
    for member in &group {
        member.shutdown().await;
    }
    Ok(())
}
