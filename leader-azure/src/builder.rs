//! Configuration of an [`AzureLeaseStore`]: endpoint, container, credentials.

use std::fmt;
use std::sync::Arc;

use azure_core::credentials::TokenCredential;
use azure_core::http::policies::Policy;
use azure_core::http::{ClientOptions, RetryOptions, Transport, Url};
use azure_identity::{
    DeveloperToolsCredential, ManagedIdentityCredential, ManagedIdentityCredentialOptions,
    UserAssignedId, WorkloadIdentityCredential,
};
use azure_storage_blob::{BlobContainerClient, BlobContainerClientOptions};
use leader_core::Error;
use leader_core::backend::check_prefix;

use crate::auth::SharedKeyPolicy;
use crate::client::AzureLeaseStore;
use crate::error::AzureError;

/// Azurite's development account name.
pub const EMULATOR_ACCOUNT: &str = "devstoreaccount1";
/// Azurite's published development account key (documented by Microsoft; not a secret).
pub const EMULATOR_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
/// Azurite's default blob endpoint, as `UseDevelopmentStorage=true` means it.
pub const EMULATOR_ENDPOINT: &str = "http://127.0.0.1:10000/devstoreaccount1";

/// How the store authenticates.
#[derive(Clone)]
enum Credential {
    /// Shared Key with the account's base64 key.
    AccessKey(String),
    /// A SAS token (the query string, with or without the leading `?`).
    Sas(String),
    /// A Microsoft Entra ID credential.
    Token(Arc<dyn TokenCredential>),
    /// A managed identity, system-assigned or the given user-assigned one.
    ManagedIdentity(Option<UserAssignedId>),
    /// Workload identity (AKS): `AZURE_TENANT_ID`, `AZURE_CLIENT_ID`, `AZURE_FEDERATED_TOKEN_FILE`.
    WorkloadIdentity,
    /// The developer's `az` or `azd` login.
    DeveloperTools,
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Keys and SAS tokens are never shown.
        f.write_str(match self {
            Credential::AccessKey(_) => "AccessKey(<redacted>)",
            Credential::Sas(_) => "Sas(<redacted>)",
            Credential::Token(_) => "Token",
            Credential::ManagedIdentity(None) => "ManagedIdentity(system-assigned)",
            Credential::ManagedIdentity(Some(_)) => "ManagedIdentity(user-assigned)",
            Credential::WorkloadIdentity => "WorkloadIdentity",
            Credential::DeveloperTools => "DeveloperTools",
        })
    }
}

/// Builds an [`AzureLeaseStore`].
///
/// Set the account (or a full blob endpoint), the container and one credential; or start from
/// [`from_env`](Self::from_env), a [connection string](Self::with_connection_string), or the
/// [emulator](Self::with_emulator). [`build`](Self::build) validates everything.
#[derive(Clone, Debug)]
pub struct AzureLeaseStoreBuilder {
    account: Option<String>,
    endpoint: Option<String>,
    container: Option<String>,
    prefix: String,
    credential: Option<Credential>,
    create_container: bool,
}

impl Default for AzureLeaseStoreBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl AzureLeaseStoreBuilder {
    /// An empty configuration: set an endpoint (or account), a container and credentials.
    pub fn new() -> Self {
        Self {
            account: None,
            endpoint: None,
            container: None,
            prefix: String::new(),
            credential: None,
            create_container: false,
        }
    }

    /// The Azurite development account at `endpoint` (e.g. `http://127.0.0.1:10000/devstoreaccount1`,
    /// the value of `AZURITE_BLOB_ENDPOINT`), with its published key.
    pub fn with_emulator(self, endpoint: impl Into<String>) -> Self {
        self.with_account(EMULATOR_ACCOUNT)
            .with_endpoint(endpoint)
            .with_access_key(EMULATOR_KEY)
    }

    /// Reads the usual variables:
    ///
    /// - `AZURE_STORAGE_CONNECTION_STRING` (everything at once), or
    /// - `AZURE_STORAGE_ACCOUNT` (or `AZURE_STORAGE_ACCOUNT_NAME`), optionally
    ///   `AZURE_STORAGE_BLOB_ENDPOINT`, and `AZURE_STORAGE_KEY` (or `AZURE_STORAGE_ACCOUNT_KEY`)
    ///   or `AZURE_STORAGE_SAS_TOKEN`;
    /// - `AZURE_STORAGE_CONTAINER` for the container.
    ///
    /// Without a key, SAS or connection string, it uses Microsoft Entra ID: workload identity
    /// when `AZURE_FEDERATED_TOKEN_FILE` is set (AKS), else the managed identity (with
    /// `AZURE_CLIENT_ID` as a user-assigned identity if set).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] if the connection string is malformed.
    pub fn from_env() -> Result<Self, Error> {
        Self::from_vars(|name| std::env::var(name).ok().filter(|v| !v.trim().is_empty()))
    }

    fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, Error> {
        let mut builder = Self::new();
        if let Some(conn) = var("AZURE_STORAGE_CONNECTION_STRING") {
            builder = builder.with_connection_string(&conn)?;
        }
        if let Some(account) =
            var("AZURE_STORAGE_ACCOUNT").or_else(|| var("AZURE_STORAGE_ACCOUNT_NAME"))
        {
            builder = builder.with_account(account);
        }
        if let Some(endpoint) = var("AZURE_STORAGE_BLOB_ENDPOINT") {
            builder = builder.with_endpoint(endpoint);
        }
        if let Some(key) = var("AZURE_STORAGE_KEY").or_else(|| var("AZURE_STORAGE_ACCOUNT_KEY")) {
            builder = builder.with_access_key(key);
        } else if let Some(sas) = var("AZURE_STORAGE_SAS_TOKEN") {
            builder = builder.with_sas_token(sas);
        }
        if let Some(container) = var("AZURE_STORAGE_CONTAINER") {
            builder = builder.with_container(container);
        }
        if builder.credential.is_none() {
            builder.credential = Some(if var("AZURE_FEDERATED_TOKEN_FILE").is_some() {
                Credential::WorkloadIdentity
            } else {
                Credential::ManagedIdentity(var("AZURE_CLIENT_ID").map(UserAssignedId::ClientId))
            });
        }
        Ok(builder)
    }

    /// Applies an Azure Storage connection string: `AccountName`, `AccountKey`,
    /// `SharedAccessSignature`, `BlobEndpoint`, `DefaultEndpointsProtocol`, `EndpointSuffix`,
    /// or `UseDevelopmentStorage=true` for Azurite on its default port.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the malformed part (never its secret value).
    pub fn with_connection_string(mut self, conn: &str) -> Result<Self, Error> {
        let mut protocol = "https".to_owned();
        let mut suffix = "core.windows.net".to_owned();
        let mut endpoint = None;
        for part in conn.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((name, value)) = part.split_once('=') else {
                return Err(AzureError::Config(format!(
                    "connection string part {:?} has no '='",
                    name_only(part)
                ))
                .into());
            };
            match name.trim() {
                "UseDevelopmentStorage" if value.trim().eq_ignore_ascii_case("true") => {
                    self = Self {
                        container: self.container,
                        prefix: self.prefix,
                        create_container: self.create_container,
                        ..Self::new().with_emulator(EMULATOR_ENDPOINT)
                    };
                }
                "AccountName" => self.account = Some(value.trim().to_owned()),
                "AccountKey" => self.credential = Some(Credential::AccessKey(value.to_owned())),
                // An account key, when also given, wins over a SAS.
                "SharedAccessSignature"
                    if !matches!(self.credential, Some(Credential::AccessKey(_))) =>
                {
                    self.credential = Some(Credential::Sas(value.to_owned()));
                }
                "BlobEndpoint" => endpoint = Some(value.trim().to_owned()),
                "DefaultEndpointsProtocol" => protocol = value.trim().to_owned(),
                "EndpointSuffix" => suffix = value.trim().to_owned(),
                _ => {} // other services' endpoints, proxies: not ours
            }
        }
        if let Some(endpoint) = endpoint {
            self.endpoint = Some(endpoint);
        } else if let Some(account) = &self.account
            && self.endpoint.is_none()
        {
            self.endpoint = Some(format!("{protocol}://{account}.blob.{suffix}"));
        }
        Ok(self)
    }

    /// The storage account; the endpoint defaults to `https://{account}.blob.core.windows.net`.
    pub fn with_account(mut self, account: impl Into<String>) -> Self {
        self.account = Some(account.into());
        self
    }

    /// The blob endpoint of the account, e.g. `https://acct.blob.core.windows.net` or, for
    /// Azurite, `http://127.0.0.1:10000/devstoreaccount1`.
    pub fn with_endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.endpoint = Some(endpoint.into());
        self
    }

    /// The container that holds the lease blobs (3-63 lowercase letters, digits and `-`).
    pub fn with_container(mut self, container: impl Into<String>) -> Self {
        self.container = Some(container.into());
        self
    }

    /// Puts every blob name after `prefix`, such as a folder `prod/leases/` (default: none).
    /// The lease of key `k` is then the blob `prod/leases/k`, its token high-water mark
    /// `prod/leases/.k.token`, a protected object `name` `prod/leases/.name.fenced`.
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Authenticates with the account key (Shared Key).
    pub fn with_access_key(mut self, base64_key: impl Into<String>) -> Self {
        self.credential = Some(Credential::AccessKey(base64_key.into()));
        self
    }

    /// Authenticates with a SAS token (the query string of a SAS URL).
    pub fn with_sas_token(mut self, sas: impl Into<String>) -> Self {
        self.credential = Some(Credential::Sas(sas.into()));
        self
    }

    /// Authenticates with any Microsoft Entra ID credential.
    pub fn with_token_credential(mut self, credential: Arc<dyn TokenCredential>) -> Self {
        self.credential = Some(Credential::Token(credential));
        self
    }

    /// Authenticates with the VM's (or App Service's) system-assigned managed identity, or the
    /// given user-assigned one.
    pub fn with_managed_identity(mut self, user_assigned: Option<UserAssignedId>) -> Self {
        self.credential = Some(Credential::ManagedIdentity(user_assigned));
        self
    }

    /// Authenticates with AKS workload identity (from its environment variables).
    pub fn with_workload_identity(mut self) -> Self {
        self.credential = Some(Credential::WorkloadIdentity);
        self
    }

    /// Authenticates with the developer's Azure CLI or Azure Developer CLI login.
    pub fn with_developer_tools(mut self) -> Self {
        self.credential = Some(Credential::DeveloperTools);
        self
    }

    /// Creates the container when [`build`](Self::build) finds it missing (off by default:
    /// a missing container is an error).
    pub fn with_create_container_if_missing(mut self, create: bool) -> Self {
        self.create_container = create;
        self
    }

    /// Validates the configuration, builds the store and checks the container (one `Get
    /// Container Properties`, within the call's time: [`leader_core::backend::within`], else
    /// [`leader_core::backend::DEFAULT_BUDGET`]), creating it only if
    /// [asked](Self::with_create_container_if_missing).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a missing or malformed setting, saying which;
    /// [`Error::Unauthenticated`] if an Entra ID credential cannot be set up or is refused;
    /// [`Error::NotFound`] naming a missing container; [`Error::PermissionDenied`] if the
    /// credentials may not read it; [`Error::Timeout`] if the service does not answer in time.
    ///
    /// # Cancel safety
    /// Cancel-safe: at most the container is created, which a later call sees.
    pub async fn build(self) -> Result<AzureLeaseStore, Error> {
        let store = self.assemble()?;
        store.ensure_container().await?;
        Ok(store)
    }

    /// Validates the configuration and builds the store without a request (tests that point
    /// the store at a server that never answers).
    ///
    /// # Errors
    /// As [`build`](Self::build), less the container check.
    #[cfg(feature = "test-util")]
    pub fn build_unchecked(self) -> Result<AzureLeaseStore, Error> {
        self.assemble()
    }

    fn assemble(self) -> Result<AzureLeaseStore, Error> {
        let container = self.container.ok_or_else(|| {
            AzureError::Config(
                "no container: call with_container or set AZURE_STORAGE_CONTAINER".to_owned(),
            )
        })?;
        check_container_name(&container)?;
        check_prefix(&self.prefix).map_err(|e| AzureError::Config(e.to_string()))?;
        let endpoint = match (&self.endpoint, &self.account) {
            (Some(e), _) => e.trim().trim_end_matches('/').to_owned(),
            (None, Some(account)) => format!("https://{account}.blob.core.windows.net"),
            (None, None) => {
                return Err(AzureError::Config(
                    "no account or endpoint: call with_account or with_endpoint, or set AZURE_STORAGE_ACCOUNT".to_owned(),
                )
                .into());
            }
        };
        let credential = self.credential.ok_or_else(|| {
            AzureError::Config(
                "no credential: set an access key, a SAS token, a connection string or an Entra ID identity".to_owned(),
            )
        })?;
        let mut url = Url::parse(&format!("{endpoint}/{container}")).map_err(|e| {
            AzureError::Config(format!("the endpoint {endpoint:?} is not a URL: {e}"))
        })?;

        let mut per_try: Vec<Arc<dyn Policy>> = Vec::new();
        let mut token: Option<Arc<dyn TokenCredential>> = None;
        match credential {
            Credential::AccessKey(key) => {
                let account = match self.account {
                    Some(a) => a,
                    None => account_from_host(&url).ok_or_else(|| {
                        AzureError::Config(
                            "an access key needs the account name: call with_account".to_owned(),
                        )
                    })?,
                };
                per_try.push(Arc::new(SharedKeyPolicy::new(&account, &key)?));
            }
            Credential::Sas(sas) => url.set_query(Some(sas.trim().trim_start_matches('?'))),
            other => {
                if url.scheme() != "https" {
                    return Err(AzureError::Config(format!(
                        "Entra ID credentials need an https endpoint, not {endpoint:?}"
                    ))
                    .into());
                }
                token = Some(token_credential(other)?);
            }
        }

        leader_core::tls::install_crypto_provider();
        // No timeouts here: each call ends by the elector's request timeout for it
        // (leader_core::backend::within), connection and token requests included.
        let http = reqwest::Client::builder()
            .build()
            .map_err(|e| AzureError::Config(format!("could not build the HTTP client: {e}")))?;
        let client_options = ClientOptions {
            per_try_policies: per_try,
            // Never retried by the SDK: the lease logic decides what may be retried.
            retry: RetryOptions::none(),
            transport: Some(Transport::new(Arc::new(http))),
            ..ClientOptions::default()
        };
        let options = BlobContainerClientOptions {
            client_options,
            ..BlobContainerClientOptions::default()
        };
        let client = BlobContainerClient::new(url, token, Some(options))
            .map_err(|e| AzureError::Config(format!("could not build the blob client: {e}")))?;
        Ok(AzureLeaseStore::new(
            client,
            container,
            self.prefix,
            self.create_container,
        ))
    }
}

fn name_only(part: &str) -> &str {
    part.split_once('=').map(|(n, _)| n).unwrap_or("(unnamed)")
}

fn account_from_host(url: &Url) -> Option<String> {
    let host = url.host_str()?;
    let (account, rest) = host.split_once('.')?;
    rest.starts_with("blob.").then(|| account.to_owned())
}

fn token_credential(credential: Credential) -> Result<Arc<dyn TokenCredential>, Error> {
    let unauthenticated = |e: azure_core::Error| Error::Unauthenticated {
        message: format!("could not set up the Entra ID credential: {e}"),
        source: Some(Box::new(e)),
    };
    Ok(match credential {
        Credential::Token(t) => t,
        Credential::ManagedIdentity(user_assigned) => {
            let options = ManagedIdentityCredentialOptions {
                user_assigned_id: user_assigned,
                ..ManagedIdentityCredentialOptions::default()
            };
            ManagedIdentityCredential::new(Some(options)).map_err(unauthenticated)?
        }
        Credential::WorkloadIdentity => {
            WorkloadIdentityCredential::new(None).map_err(unauthenticated)?
        }
        Credential::DeveloperTools => {
            DeveloperToolsCredential::new(None).map_err(unauthenticated)?
        }
        Credential::AccessKey(_) | Credential::Sas(_) => {
            return Err(AzureError::Config("not an Entra ID credential".to_owned()).into());
        }
    })
}

fn check_container_name(name: &str) -> Result<(), Error> {
    let ok = (3..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--");
    if ok {
        Ok(())
    } else {
        Err(AzureError::Config(format!(
            "invalid container name {name:?}: use 3-63 lowercase letters, digits and single '-', starting and ending with a letter or digit"
        ))
        .into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn connection_string_with_key_and_endpoint() {
        let b = AzureLeaseStoreBuilder::new()
            .with_connection_string(&format!(
                "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={EMULATOR_KEY};BlobEndpoint=http://127.0.0.1:1/devstoreaccount1;"
            ))
            .unwrap();
        assert_eq!(b.account.as_deref(), Some("devstoreaccount1"));
        assert_eq!(
            b.endpoint.as_deref(),
            Some("http://127.0.0.1:1/devstoreaccount1")
        );
        assert!(matches!(b.credential, Some(Credential::AccessKey(_))));
        let shown = format!("{b:?}");
        assert!(
            !shown.contains("Eby8"),
            "the key must not be shown: {shown}"
        );
    }

    #[test]
    fn connection_string_dev_storage_and_suffix() {
        let b = AzureLeaseStoreBuilder::new()
            .with_container("leases")
            .with_connection_string("UseDevelopmentStorage=true")
            .unwrap();
        assert_eq!(b.endpoint.as_deref(), Some(EMULATOR_ENDPOINT));
        assert_eq!(b.container.as_deref(), Some("leases"));
        let b = AzureLeaseStoreBuilder::new()
            .with_connection_string("AccountName=acct;SharedAccessSignature=sv=1&sig=x;EndpointSuffix=core.chinacloudapi.cn")
            .unwrap();
        assert_eq!(
            b.endpoint.as_deref(),
            Some("https://acct.blob.core.chinacloudapi.cn")
        );
        assert!(matches!(b.credential, Some(Credential::Sas(_))));
        let err = AzureLeaseStoreBuilder::new()
            .with_connection_string("AccountName=acct;secretgarbage")
            .unwrap_err();
        assert!(err.to_string().contains("no '='"), "{err}");
    }

    #[test]
    fn env_picks_identity_when_there_is_no_key() {
        let b = AzureLeaseStoreBuilder::from_vars(vars(&[
            ("AZURE_STORAGE_ACCOUNT", "acct"),
            ("AZURE_STORAGE_CONTAINER", "leases"),
        ]))
        .unwrap();
        assert!(matches!(
            b.credential,
            Some(Credential::ManagedIdentity(None))
        ));
        let b = AzureLeaseStoreBuilder::from_vars(vars(&[
            ("AZURE_STORAGE_ACCOUNT", "acct"),
            ("AZURE_FEDERATED_TOKEN_FILE", "/var/run/token"),
        ]))
        .unwrap();
        assert!(matches!(b.credential, Some(Credential::WorkloadIdentity)));
        let b = AzureLeaseStoreBuilder::from_vars(vars(&[
            ("AZURE_STORAGE_ACCOUNT", "acct"),
            ("AZURE_STORAGE_KEY", EMULATOR_KEY),
            ("AZURE_STORAGE_CONTAINER", "leases"),
        ]))
        .unwrap();
        assert!(matches!(b.credential, Some(Credential::AccessKey(_))));
        assert!(b.assemble().is_ok());
    }

    #[test]
    fn build_validates() {
        let no_container =
            AzureLeaseStoreBuilder::new().with_emulator("http://127.0.0.1:1/devstoreaccount1");
        assert!(
            no_container
                .assemble()
                .unwrap_err()
                .to_string()
                .contains("no container")
        );
        let bad = AzureLeaseStoreBuilder::new()
            .with_emulator("http://127.0.0.1:1/devstoreaccount1")
            .with_container("Bad_Name");
        assert!(
            bad.assemble()
                .unwrap_err()
                .to_string()
                .contains("invalid container name")
        );
        let http_identity = AzureLeaseStoreBuilder::new()
            .with_endpoint("http://127.0.0.1:1/devstoreaccount1")
            .with_container("leases")
            .with_managed_identity(None);
        assert!(
            http_identity
                .assemble()
                .unwrap_err()
                .to_string()
                .contains("https")
        );
        let no_account = AzureLeaseStoreBuilder::new()
            .with_endpoint("http://127.0.0.1:1/x")
            .with_container("leases")
            .with_access_key(EMULATOR_KEY);
        assert!(
            no_account
                .assemble()
                .unwrap_err()
                .to_string()
                .contains("account name")
        );
        assert!(
            AzureLeaseStoreBuilder::new()
                .with_container("leases")
                .with_access_key(EMULATOR_KEY)
                .assemble()
                .is_err()
        );
    }
}
