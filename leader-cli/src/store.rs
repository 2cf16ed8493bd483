//! Store URLs: which backend, where, and which key.

use std::path::PathBuf;
use std::sync::Arc;

use leader_core::{Error, FileStore, LeaseBackend, LeaseKey};

use crate::{Exit, exit};

/// A parsed store URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum StoreUrl {
    /// `file:///dir/KEY`: the record is `dir/KEY.lease`.
    File { dir: PathBuf, key: LeaseKey },
}

pub(crate) fn parse(url: &str) -> Result<StoreUrl, Exit> {
    let usage = |why: &str| Exit::new(exit::USAGE, format!("store URL {url:?}: {why}"));
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(usage(
            "expected SCHEME://..., e.g. file:///var/lib/leases/KEY",
        ));
    };
    match scheme {
        "file" => {
            if !rest.starts_with('/') {
                return Err(usage("a file URL needs an absolute path: file:///dir/KEY"));
            }
            let path = PathBuf::from(rest);
            let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
                return Err(usage("the path must end with the lease key"));
            };
            let key = LeaseKey::new(name.to_string_lossy().into_owned())
                .map_err(|e| usage(&e.to_string()))?;
            Ok(StoreUrl::File {
                dir: dir.to_path_buf(),
                key,
            })
        }
        "azblob" | "dynamodb" | "gs" => Err(usage(&format!(
            "the {scheme} backend is not compiled into this build of `leader`"
        ))),
        other => Err(usage(&format!(
            "unknown scheme {other:?}; use file://, azblob://, dynamodb:// or gs://"
        ))),
    }
}

/// Opens the store (checking that its folder, container, table or bucket exists).
pub(crate) fn open(url: &StoreUrl) -> Result<(Arc<dyn LeaseBackend>, LeaseKey), Exit> {
    match url {
        StoreUrl::File { dir, key } => {
            let store = FileStore::open(dir).map_err(|e| unavailable(&e))?;
            Ok((Arc::new(store), key.clone()))
        }
    }
}

pub(crate) fn unavailable(e: &Error) -> Exit {
    Exit::new(exit::UNAVAILABLE, e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            parse("file:///var/lib/leases/jobs").unwrap(),
            StoreUrl::File {
                dir: PathBuf::from("/var/lib/leases"),
                key: LeaseKey::new("jobs").unwrap()
            }
        );
        for bad in [
            "file://relative/jobs",
            "/no/scheme",
            "ftp://x/y",
            "azblob://c/b",
            "file:///var/lib/bad key",
        ] {
            let e = parse(bad).unwrap_err();
            assert_eq!(e.code, exit::USAGE, "{bad}");
        }
        assert!(
            parse("ftp://x")
                .unwrap_err()
                .message
                .contains("unknown scheme")
        );
        assert!(
            parse("gs://b/o")
                .unwrap_err()
                .message
                .contains("not compiled")
        );
    }
}
