//! Lead a lease in a folder, and hand it over when this machine receives a scale-in or
//! preemption notice (off any cloud, none ever comes; Ctrl-C also hands over).
//!
//! ```sh
//! cargo run -p leader-notice --example notice -- /tmp/leases
//! ```
//!
//! To see a notice without a cloud, point the endpoints at the suite's fake metadata service
//! (`scripts/fake_identity.py`) and raise one there.

use std::sync::Arc;

use leader_core::{Elector, FileStore, LeaseKey};
use leader_notice::{NoticeWatcher, Watch};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().init();
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "/tmp/leases".to_owned());
    std::fs::create_dir_all(&dir)?;
    let store = Arc::new(FileStore::open(&dir)?);
    let handle = Elector::builder(store, LeaseKey::new("notice-example")?)
        .build()?
        .spawn();
    // From start-up, whether leading or not (Azure enrols an instance at its first call).
    let notices = NoticeWatcher::new(Watch::Auto).spawn()?;
    tokio::select! {
        term = handle.wait_for_term() => {
            let term = term?;
            tracing::info!(token = %term.token(), "leading");
            tokio::select! {
                () = term.cancelled() => tracing::info!("the term ended"),
                notice = notices.notice() => tracing::warn!(%notice, "handing over"),
                _ = tokio::signal::ctrl_c() => tracing::info!("stopping"),
            }
            drop(term); // the work has stopped
        }
        notice = notices.notice() => tracing::warn!(%notice, "not campaigning on a doomed machine"),
        _ = tokio::signal::ctrl_c() => {}
    }
    handle.shutdown().await; // releases the lease if leading: a follower takes over at once
    // Then let the platform go ahead now rather than at its deadline.
    notices.approve().await?;
    Ok(())
}
