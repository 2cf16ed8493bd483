//! The README's example, runnable: writes the nightly report once, from whichever instance
//! leads the store URL given (a folder by default).
//!
//! ```sh
//! cargo run -p leader --example nightly_report -- file:///tmp/leases/nightly-report
//! ```
//!
//! Start two at once: one writes, the other waits for the term it never gets, and takes it
//! if the first is killed before it is done.
#![allow(clippy::print_stdout)] // an example prints what it does

use leader::{Elector, ObjectName, OpenOptions};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "file:///tmp/leases/nightly-report".to_owned());
    let options = OpenOptions::new().with_create_if_missing(url.starts_with("file://"));
    let (store, key) = leader::from_url(&url, &options).await?;
    let handle = Elector::builder(store.clone(), key).build()?.spawn();
    let term = handle.wait_for_term().await?; // this instance leads
    println!("leading with token {}", term.token());
    let report = ObjectName::new("nightly-report")?;
    // The work, until it is done or the term ends; a deposed leader's write is refused.
    let work = store.fenced_write(term.fence(), &report, b"done");
    match term.run_until_over(work).await {
        Some(written) => println!("wrote the report with token {}", written?.fence),
        None => println!("the term ended before the report was written"),
    }
    drop(term); // the work has stopped
    handle.shutdown().await; // release the lease: a follower takes over at once
    Ok(())
}
