//! Mutual TLS between members, with the suite's one crypto provider (aws-lc-rs).

use std::sync::Arc;

use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::config::TlsConfig;
use crate::error::RaftError;

/// Both ends of a member's TLS: the listener's acceptor (which demands a client certificate
/// from the CA) and the dialer's connector (which presents this member's certificate).
#[derive(Clone)]
pub(crate) struct Tls {
    pub(crate) acceptor: TlsAcceptor,
    pub(crate) connector: TlsConnector,
}

impl Tls {
    /// Builds both ends from PEM material.
    pub(crate) fn new(config: &TlsConfig) -> Result<Self, RaftError> {
        leader_core::tls::install_crypto_provider();
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&config.ca_pem) {
            let cert = cert.map_err(|e| RaftError::tls(format!("the CA PEM is not valid: {e}")))?;
            roots
                .add(cert)
                .map_err(|e| RaftError::tls(format!("a CA certificate is not usable: {e}")))?;
        }
        if roots.is_empty() {
            return Err(RaftError::tls("the CA PEM holds no certificate"));
        }
        let roots = Arc::new(roots);
        let chain = CertificateDer::pem_slice_iter(&config.cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| RaftError::tls(format!("the certificate PEM is not valid: {e}")))?;
        if chain.is_empty() {
            return Err(RaftError::tls("the certificate PEM holds no certificate"));
        }
        let key = PrivateKeyDer::from_pem_slice(&config.key_pem)
            .map_err(|e| RaftError::tls(format!("the private key PEM is not valid: {e}")))?;
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|e| RaftError::tls(format!("cannot verify clients with this CA: {e}")))?;
        let server = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| RaftError::tls(e.to_string()))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(|e| RaftError::tls(format!("the certificate and key do not fit: {e}")))?;
        let client = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| RaftError::tls(e.to_string()))?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(|e| RaftError::tls(format!("the certificate and key do not fit: {e}")))?;
        Ok(Self {
            acceptor: TlsAcceptor::from(Arc::new(server)),
            connector: TlsConnector::from(Arc::new(client)),
        })
    }
}

/// The TLS name of `host` (a DNS name or an IP address).
pub(crate) fn server_name(host: &str) -> Option<ServerName<'static>> {
    ServerName::try_from(host.to_owned()).ok()
}

/// Whether the (already CA-verified) certificate `cert` names `host` as a subject alternative
/// name.
pub(crate) fn names_host(cert: &CertificateDer<'_>, host: &str) -> bool {
    let Some(name) = server_name(host) else {
        return false;
    };
    webpki::EndEntityCert::try_from(cert)
        .and_then(|c| c.verify_is_valid_for_subject_name(&name))
        .is_ok()
}
