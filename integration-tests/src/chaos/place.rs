//! The round's place in the store: a fresh container, table, bucket, parent node or folder.

use std::path::Path;

use super::{BackendKind, open_store_patiently, quorum_folders};

/// Creates a fresh container, table or bucket (a folder `dir/store` for the file store, and
/// the member folders in it for the quorum of folders) and returns (emulator URL, place).
///
/// # Errors
/// A message if the emulator is not available or the place cannot be created.
pub async fn prepare(kind: BackendKind, dir: &Path) -> Result<(String, String), String> {
    let Some(emulator) = kind.emulator() else {
        let store = dir.join("store");
        std::fs::create_dir_all(&store).map_err(|e| format!("creating {store:?}: {e}"))?;
        if kind == BackendKind::QuorumFile {
            for folder in quorum_folders(&store) {
                std::fs::create_dir(&folder).map_err(|e| format!("creating {folder:?}: {e}"))?;
            }
        }
        return Ok((store.display().to_string(), String::new()));
    };
    let endpoint = crate::endpoint(emulator)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("{emulator} is not available"))?;
    let place = crate::unique_name("chaos");
    create_place(kind, &endpoint.url, &place).await?;
    Ok((endpoint.url, place))
}

/// Creates `place` (container, table, bucket, or ZooKeeper's parent node; nothing for etcd's
/// key prefix) in the store of `kind` at `url`, if missing.
///
/// # Errors
/// A message if it cannot be created.
pub(super) async fn create_place(kind: BackendKind, url: &str, place: &str) -> Result<(), String> {
    match kind {
        BackendKind::Gcs => crate::gcs::GcsClient::new(url)
            .create_bucket(place)
            .await
            .map_err(|e| format!("creating bucket {place}: {e}"))?,
        BackendKind::S3 | BackendKind::S3LocalStack => crate::s3::create_bucket(url, place).await?,
        _ => {
            open_store_patiently(kind, url, place, true)
                .await
                .map_err(|e| format!("creating {place}: {e}"))?;
        }
    }
    Ok(())
}
