//! The store's one multi-operation: replacing a lease node, which proves in the same
//! transaction that the session doing it may write the node.

use zookeeper_client::{
    Client, CreateOptions, Error as ZkError, MultiWriteError, MultiWriteResult, Stat,
};

/// The stat of the node created by operation `index` of a multi.
fn created_stat(results: &[MultiWriteResult], index: usize) -> Option<Stat> {
    match results.get(index) {
        Some(MultiWriteResult::Create { stat, .. }) => Some(*stat),
        _ => None,
    }
}

/// Deletes the node at `path` at `version` (`next` is `version + 1`) in one multi through
/// `client`, and with `create` creates it again with `data`; returns the created node's stat.
///
/// The multi starts with a `setData` of `data` at `version`: a lease node's ACL lets only the
/// session that created it write, so this also proves that the node is the one `client` may
/// end, which a version alone cannot (versions restart when a node is recreated). A failure
/// is the error and the index of the operation that failed.
pub(crate) async fn replace_node(
    client: &Client,
    path: &str,
    data: &[u8],
    version: i32,
    next: i32,
    create: Option<&CreateOptions<'_>>,
) -> Result<Option<Stat>, (ZkError, usize)> {
    let mut multi = client.new_multi_writer();
    multi
        .add_set_data(path, data, Some(version))
        .map_err(|e| (e, 0))?;
    multi.add_delete(path, Some(next)).map_err(|e| (e, 1))?;
    if let Some(options) = create {
        multi.add_create(path, data, options).map_err(|e| (e, 2))?;
    }
    multi
        .commit()
        .await
        .map(|results| created_stat(&results, 2))
        .map_err(multi_failure)
}

/// A failed multi: the error and the failed operation's index (0 if the request failed).
pub(crate) fn multi_failure(error: MultiWriteError) -> (ZkError, usize) {
    match error {
        MultiWriteError::RequestFailed { source } => (source, 0),
        MultiWriteError::OperationFailed { index, source } => (source, index),
    }
}
