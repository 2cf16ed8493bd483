//! Campaigns for a key on the etcd cluster of `LEADER_ETCD_ENDPOINTS`, leads for a few
//! seconds with a fenced write, and releases:
//!
//! ```sh
//! LEADER_ETCD_ENDPOINTS=http://127.0.0.1:2379 cargo run -p leader --example etcd_elect
//! ```
//!
//! Run two at once to see one wait and take over when the other releases.
#![allow(clippy::print_stdout)] // an example prints what it does

use std::sync::Arc;
use std::time::Duration;

use leader::etcd::EtcdBuilder;
use leader::{Elector, FencedStore, LeaseKey, ObjectName};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = EtcdBuilder::from_env()?.build().await?;
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
    tokio::time::sleep(Duration::from_secs(3)).await;
    drop(term);
    handle.shutdown().await;
    let report = store.fenced_read(&object).await?;
    let text = report.map(|o| String::from_utf8_lossy(&o.value).into_owned());
    println!("released; the protected object holds {text:?}");
    Ok(())
}
