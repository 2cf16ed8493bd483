//! Store URLs: which backend, where, and which key.

use std::sync::Arc;

use clap::Args;
use leader::Store;
use leader::{Error, LeaseKey};

use crate::{Exit, exit};

/// Options shared by every command that opens a store.
#[derive(Clone, Debug, Default, Args)]
pub(crate) struct StoreOptions {
    /// The store's endpoint URL (a private or regional endpoint; https:// uses TLS, http://
    /// does not). Credentials and region still come from the cloud's usual chain.
    #[arg(long, env = "LEADER_ENDPOINT")]
    pub(crate) endpoint: Option<String>,
    /// Talk to a local emulator with its conventions instead of the cloud's credentials:
    /// Azurite's development account and key, DynamoDB and S3 with dummy keys in us-east-1
    /// (S3 path-style), GCS without credentials. The endpoint is --endpoint, else the emulator's own variable
    /// (AWS_ENDPOINT_URL, STORAGE_EMULATOR_HOST) or Azurite's default port.
    #[arg(long, env = "LEADER_EMULATOR")]
    pub(crate) emulator: bool,
    /// Create the folder (file://), container (azblob://), table (dynamodb://) or parent
    /// node (zk://) if it is missing (off: a missing one is an error). Not supported for
    /// s3:// and gs://: create the bucket first. etcd:// has nothing to create.
    #[arg(long, env = "LEADER_CREATE_IF_MISSING")]
    pub(crate) create_if_missing: bool,
    /// raft:// only: this instance's own address, one of the URL's HOST:PORT (bound exactly,
    /// unless --raft-bind; the group's members talk to it there).
    #[arg(long, env = "LEADER_RAFT_LISTEN", value_name = "HOST:PORT")]
    pub(crate) raft_listen: Option<String>,
    /// raft:// only: bind this HOST:PORT instead of --raft-listen, which stays the address
    /// the other members dial (a member behind a proxy, NAT or a container's published port).
    #[arg(long, env = "LEADER_RAFT_BIND", value_name = "HOST:PORT")]
    pub(crate) raft_bind: Option<String>,
    /// raft:// only: this member's data folder (Raft log, vote, snapshots), created with mode
    /// 0700. Keep it across restarts: a member whose folder was wiped is refused unless
    /// --raft-rejoin.
    #[arg(long, env = "LEADER_RAFT_DIR", value_name = "DIR")]
    pub(crate) raft_dir: Option<std::path::PathBuf>,
    /// raft:// only: this member's folder was emptied (its data lost) while the group ran:
    /// join anyway, taking no part in elections until it has caught up. Needs every other
    /// member up. Never run two members with the same --raft-listen address.
    #[arg(long, env = "LEADER_RAFT_REJOIN")]
    pub(crate) raft_rejoin: bool,
    /// rafts:// only: the CA (PEM) that signed every member's certificate.
    #[arg(long, env = "LEADER_RAFT_CA", value_name = "FILE")]
    pub(crate) raft_ca: Option<std::path::PathBuf>,
    /// rafts:// only: this member's certificate (PEM), naming its host.
    #[arg(long, env = "LEADER_RAFT_CERT", value_name = "FILE")]
    pub(crate) raft_cert: Option<std::path::PathBuf>,
    /// rafts:// only: this member's private key (PEM).
    #[arg(long, env = "LEADER_RAFT_KEY", value_name = "FILE")]
    pub(crate) raft_key: Option<std::path::PathBuf>,
}

pub(crate) use leader::StoreUrl;

impl StoreOptions {
    /// The library's options for these flags.
    pub(crate) fn open_options(&self) -> leader::OpenOptions {
        let mut open = leader::OpenOptions::new()
            .with_emulator(self.emulator)
            .with_create_if_missing(self.create_if_missing);
        if let Some(endpoint) = &self.endpoint {
            open = open.with_endpoint(endpoint.clone());
        }
        if let (Some(listen), Some(dir)) = (&self.raft_listen, &self.raft_dir) {
            open = open
                .with_raft_member(listen.clone(), dir.clone())
                .with_raft_rejoin(self.raft_rejoin);
            if let Some(bind) = &self.raft_bind {
                open = open.with_raft_bind(bind.clone());
            }
        }
        if let (Some(ca), Some(cert), Some(key)) = (&self.raft_ca, &self.raft_cert, &self.raft_key)
        {
            open = open.with_raft_tls(ca.clone(), cert.clone(), key.clone());
        }
        open
    }
}

/// Parses the store URL (a malformed one is a usage error).
pub(crate) fn parse(url: &str) -> Result<StoreUrl, Exit> {
    StoreUrl::parse(url).map_err(|e| Exit::new(exit::USAGE, e.to_string()))
}

/// Opens the store through the `leader` crate, checking that its folder, container, table or
/// bucket exists (or creating it, if asked).
pub(crate) async fn open(
    url: &StoreUrl,
    options: &StoreOptions,
) -> Result<(Arc<dyn Store>, LeaseKey), Exit> {
    let store = leader::open(url, &options.open_options())
        .await
        .map_err(|e| unavailable(&e))?;
    Ok((store, url.key().clone()))
}

/// The exit for a store error that ends the command. The library's text of a transient error
/// says that it is being retried; here it is not, so that text is replaced.
pub(crate) fn unavailable(e: &Error) -> Exit {
    let code = match e.kind() {
        leader::ErrorKind::InvalidConfig => exit::CONFIG,
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
    use std::time::Duration;

    #[test]
    fn a_malformed_url_is_a_usage_error() {
        for bad in [
            "/no/scheme",
            "ftp://x/y",
            "gs://bucket-only",
            "file:///a/bad key",
        ] {
            assert_eq!(parse(bad).unwrap_err().code, exit::USAGE, "{bad}");
        }
        assert!(parse("gs://b/k").is_ok());
        assert!(parse("s3://my-leases/prod/k").is_ok());
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
