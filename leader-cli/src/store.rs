//! Store URLs: which backend, where, and which key.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use leader_core::{Error, FileStore, LeaseBackend, LeaseKey};

use crate::{Exit, exit};

/// Options shared by every command that opens a store.
#[derive(Clone, Debug, Default, Args)]
pub(crate) struct StoreOptions {
    /// The store's endpoint URL (a private or regional endpoint; https:// uses TLS, http://
    /// does not). Credentials and region still come from the cloud's usual chain.
    #[arg(long, env = "LEADER_ENDPOINT")]
    pub(crate) endpoint: Option<String>,
    /// Talk to a local emulator with its conventions instead of the cloud's credentials:
    /// Azurite's development account and key, DynamoDB with dummy keys in us-east-1, GCS
    /// without credentials. The endpoint is --endpoint, else the emulator's own variable
    /// (AWS_ENDPOINT_URL, STORAGE_EMULATOR_HOST) or Azurite's default port.
    #[arg(long, env = "LEADER_EMULATOR")]
    pub(crate) emulator: bool,
    /// Create the folder (file://), container (azblob://) or table (dynamodb://) if it is
    /// missing (off: a missing one is an error). Not supported for gs://: create the bucket
    /// first.
    #[arg(long, env = "LEADER_CREATE_IF_MISSING")]
    pub(crate) create_if_missing: bool,
}

/// A parsed store URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum StoreUrl {
    /// `file:///dir/KEY`: the record is `dir/KEY.lease`.
    File { dir: PathBuf, key: LeaseKey },
    /// `azblob://CONTAINER/KEY`.
    Azure { container: String, key: LeaseKey },
    /// `dynamodb://TABLE/KEY`.
    Dynamo { table: String, key: LeaseKey },
    /// `gs://BUCKET/KEY`.
    Gcs { bucket: String, key: LeaseKey },
}

pub(crate) fn parse(url: &str) -> Result<StoreUrl, Exit> {
    let usage = |why: &str| Exit::new(exit::USAGE, format!("store URL {url:?}: {why}"));
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(usage(
            "expected SCHEME://..., e.g. file:///var/lib/leases/KEY",
        ));
    };
    let key_of = |name: &str| LeaseKey::new(name.to_owned()).map_err(|e| usage(&e.to_string()));
    let place_and_key = || -> Result<(String, LeaseKey), Exit> {
        match rest.split_once('/') {
            Some((place, key)) if !place.is_empty() && !key.is_empty() => {
                Ok((place.to_owned(), key_of(key)?))
            }
            _ => Err(usage(&format!("expected {scheme}://PLACE/KEY"))),
        }
    };
    match scheme {
        "file" => {
            if !rest.starts_with('/') {
                return Err(usage("a file URL needs an absolute path: file:///dir/KEY"));
            }
            if rest.ends_with('/') {
                return Err(usage(
                    "the path must end with the lease key, not with '/': file:///dir/KEY",
                ));
            }
            let path = PathBuf::from(rest);
            let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
                return Err(usage("the path must end with the lease key"));
            };
            Ok(StoreUrl::File {
                dir: dir.to_path_buf(),
                key: key_of(&name.to_string_lossy())?,
            })
        }
        "azblob" if cfg!(feature = "azure") => {
            let (container, key) = place_and_key()?;
            Ok(StoreUrl::Azure { container, key })
        }
        "dynamodb" if cfg!(feature = "dynamo") => {
            let (table, key) = place_and_key()?;
            Ok(StoreUrl::Dynamo { table, key })
        }
        "gs" if cfg!(feature = "gcs") => {
            let (bucket, key) = place_and_key()?;
            Ok(StoreUrl::Gcs { bucket, key })
        }
        "azblob" | "dynamodb" | "gs" => Err(usage(&format!(
            "the {scheme} backend is not compiled into this build of `leader` (cargo feature)"
        ))),
        other => Err(usage(&format!(
            "unknown scheme {other:?}; use file://, azblob://, dynamodb:// or gs://"
        ))),
    }
}

/// Opens the store, checking that its folder, container, table or bucket exists (or creating
/// it, if asked), with `request_timeout` on every call.
pub(crate) async fn open(
    url: &StoreUrl,
    options: &StoreOptions,
    request_timeout: Duration,
) -> Result<(Arc<dyn LeaseBackend>, LeaseKey), Exit> {
    let _ = request_timeout;
    match url {
        StoreUrl::File { dir, key } => {
            let store = if options.create_if_missing {
                FileStore::create(dir)
            } else {
                FileStore::open(dir)
            }
            .map_err(|e| unavailable(&e))?;
            Ok((Arc::new(store), key.clone()))
        }
        #[cfg(feature = "azure")]
        StoreUrl::Azure { container, key } => {
            use leader_azure::AzureLeaseStoreBuilder as Builder;
            let mut b = if options.emulator {
                let endpoint = options.endpoint.as_deref();
                Builder::emulator(endpoint.unwrap_or(leader_azure::EMULATOR_ENDPOINT))
            } else {
                Builder::from_env().map_err(|e| unavailable(&e))?
            };
            b = b
                .with_container(container.clone())
                .with_request_timeout(request_timeout)
                .with_create_container_if_missing(options.create_if_missing);
            if let Some(endpoint) = &options.endpoint {
                b = b.with_endpoint(endpoint.clone());
            }
            let store = b.build().map_err(|e| unavailable(&e))?;
            store
                .ensure_container()
                .await
                .map_err(|e| unavailable(&e))?;
            Ok((Arc::new(store), key.clone()))
        }
        #[cfg(feature = "dynamo")]
        StoreUrl::Dynamo { table, key } => {
            let b = if options.emulator {
                let endpoint = options
                    .endpoint
                    .clone()
                    .or_else(|| env_var("AWS_ENDPOINT_URL_DYNAMODB"))
                    .or_else(|| env_var("AWS_ENDPOINT_URL"))
                    .ok_or_else(|| needs_endpoint("AWS_ENDPOINT_URL"))?;
                leader_dynamo::DynamoBuilder::new().with_emulator(&endpoint)
            } else {
                let b = leader_dynamo::DynamoBuilder::from_env().await;
                match &options.endpoint {
                    Some(endpoint) => b.with_endpoint(endpoint.clone()),
                    None => b,
                }
            };
            let store = b
                .with_table(table.clone())
                .with_request_timeout(request_timeout)
                .with_create_table_if_missing(options.create_if_missing)
                .build()
                .await
                .map_err(|e| unavailable(&e))?;
            Ok((Arc::new(store), key.clone()))
        }
        #[cfg(feature = "gcs")]
        StoreUrl::Gcs { bucket, key } => {
            if options.create_if_missing {
                return Err(Exit::new(
                    exit::CONFIG,
                    format!(
                        "--create-if-missing is not supported for gs:// (a bucket needs a project, a location and a storage class); create it first, e.g. `gcloud storage buckets create gs://{bucket}`"
                    ),
                ));
            }
            let mut b = leader_gcs::GcsBuilder::from_env()
                .with_bucket(bucket.clone())
                .with_request_timeout(request_timeout);
            if options.emulator {
                let endpoint = options
                    .endpoint
                    .clone()
                    .or_else(|| env_var(leader_gcs::EMULATOR_VAR))
                    .ok_or_else(|| needs_endpoint(leader_gcs::EMULATOR_VAR))?;
                b = b.emulator(endpoint);
            } else if let Some(endpoint) = &options.endpoint {
                // An explicit endpoint means the usual credentials, even if
                // STORAGE_EMULATOR_HOST is set too.
                b = b
                    .with_endpoint(endpoint.clone())
                    .with_application_default_credentials();
            }
            let store = b.build().await.map_err(|e| unavailable(&e))?;
            Ok((Arc::new(store), key.clone()))
        }
        #[allow(unreachable_patterns)]
        _ => Err(Exit::new(
            exit::USAGE,
            "this backend is not compiled into this build of `leader`",
        )),
    }
}

/// A non-empty environment variable.
#[cfg(any(feature = "dynamo", feature = "gcs"))]
fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

#[cfg(any(feature = "dynamo", feature = "gcs"))]
fn needs_endpoint(variable: &str) -> Exit {
    Exit::new(
        exit::USAGE,
        format!("--emulator needs the emulator's address: pass --endpoint URL or set {variable}"),
    )
}

/// The exit for a store error that ends the command. The library's text of a transient error
/// says that it is being retried; here it is not, so that text is replaced.
pub(crate) fn unavailable(e: &Error) -> Exit {
    let code = match e.kind() {
        leader_core::ErrorKind::InvalidConfig => exit::CONFIG,
        _ => exit::UNAVAILABLE,
    };
    let message = match e {
        Error::Unavailable { message, .. } => format!(
            "the store is unavailable ({message}); check the endpoint and the network, then try again"
        ),
        Error::Throttled { message, .. } => {
            format!("the store is throttling requests ({message}); try again later")
        }
        Error::Timeout { operation, after } => format!(
            "{operation} did not finish within {after:?}; check the endpoint and the network, then try again"
        ),
        other => other.to_string(),
    };
    Exit::new(code, message)
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
        assert_eq!(
            parse("dynamodb://leases/jobs").unwrap(),
            StoreUrl::Dynamo {
                table: "leases".into(),
                key: LeaseKey::new("jobs").unwrap()
            }
        );
        assert!(matches!(
            parse("azblob://c/k").unwrap(),
            StoreUrl::Azure { .. }
        ));
        assert!(matches!(parse("gs://b/k").unwrap(), StoreUrl::Gcs { .. }));
        for bad in [
            "file://relative/jobs",
            "/no/scheme",
            "ftp://x/y",
            "gs://bucket-only",
            "dynamodb:///key",
            "file:///var/lib/bad key",
            "file:///var/lib/leases/jobs/",
            "file:///",
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
    }

    #[test]
    fn an_exit_on_a_transient_error_does_not_say_retrying() {
        for e in [
            Error::unavailable("connection refused"),
            Error::Throttled {
                message: "slow down".into(),
                source: None,
            },
            Error::Timeout {
                operation: "reading the lease",
                after: Duration::from_secs(1),
            },
        ] {
            assert!(
                e.to_string().contains("retrying"),
                "the library's text: {e}"
            );
            let exit = unavailable(&e);
            assert_eq!(exit.code, exit::UNAVAILABLE);
            assert!(!exit.message.contains("retrying"), "{}", exit.message);
            assert!(exit.message.contains("try again"), "{}", exit.message);
        }
        let e = Error::InvalidConfig {
            message: "bad".into(),
            source: None,
        };
        assert_eq!(unavailable(&e).code, exit::CONFIG);
    }
}
