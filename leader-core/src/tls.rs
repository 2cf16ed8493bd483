//! The TLS crypto provider of the whole suite: rustls with aws-lc-rs.
//!
//! Every cloud SDK the backends use talks TLS through rustls, and rustls needs one
//! process-level [`CryptoProvider`](rustls::crypto::CryptoProvider). It picks one by itself only
//! when exactly one of its `aws-lc-rs` and `ring` features is compiled in; with both (one
//! dependency asks for each) the first TLS connection panics. The suite compiles only
//! aws-lc-rs - the default of reqwest, the Google Cloud SDK and the AWS SDK's HTTP client, and
//! the provider with a FIPS-validated build (rustls `fips` feature) - and installs it
//! explicitly, so no dependency's choice can bring the panic back:
//!
//! - the `leader` CLI calls [`install_crypto_provider`] first thing in `main`;
//! - every backend's builder calls it before it builds an HTTP client.
//!
//! An application that wants another provider (ring, FIPS aws-lc-rs, a custom one) installs it
//! with `rustls::crypto::CryptoProvider::install_default` before it builds a store; the
//! suite then uses that one and installs nothing.

/// If `error` failed because the server's TLS certificate is not trusted (unknown issuer,
/// expired, wrong name), the permanent configuration error that says so, for `what` (e.g.
/// "reading gs://bucket/key"); `None` for any other failure. Retrying cannot help: the handshake
/// failed before any request was sent, so even a write is known not to have happened.
///
/// Backends call it first when they map a failed request.
pub fn untrusted_certificate(
    error: &(dyn std::error::Error + 'static),
    what: &str,
) -> Option<crate::Error> {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(rustls::Error::InvalidCertificate(why)) = e.downcast_ref::<rustls::Error>() {
            return Some(crate::Error::InvalidConfig {
                message: format!(
                    "{what}: the server's TLS certificate is not trusted ({why:?}); if a \
                     private CA signed it, point SSL_CERT_FILE at a PEM bundle that includes \
                     that CA (it replaces the system's roots)"
                ),
                source: None,
            });
        }
        next = match e.downcast_ref::<std::io::Error>() {
            // An io::Error's `source()` skips the error it wraps (often another io::Error
            // around the rustls error): step into the wrapped one instead.
            Some(io) => io
                .get_ref()
                .map(|inner| inner as &(dyn std::error::Error + 'static)),
            None => e.source(),
        };
    }
    None
}

/// Installs aws-lc-rs as the process-level rustls crypto provider, unless a provider is
/// installed already (then that one stays, and this does nothing). Returns whether this call
/// installed it. Cheap; call it as often as you like.
pub fn install_crypto_provider() -> bool {
    if rustls::crypto::CryptoProvider::get_default().is_some() {
        return false;
    }
    // Err means another thread installed one first: that one is the process's provider.
    rustls::crypto::aws_lc_rs::default_provider()
        .install_default()
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_provider_is_installed_once() {
        // Other tests in this binary may have installed it; either way it is there after.
        let _ = install_crypto_provider();
        assert!(rustls::crypto::CryptoProvider::get_default().is_some());
        assert!(
            !install_crypto_provider(),
            "a second call must not replace it"
        );
    }

    #[derive(Debug, thiserror::Error)]
    #[error("sending the request failed")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn an_untrusted_certificate_is_found_inside_io_errors() {
        let bad = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        // As hyper-util reports it: io::Error(Other) around io::Error(InvalidData) around it.
        let error = Outer(std::io::Error::other(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            bad,
        )));
        let found = untrusted_certificate(&error, "reading x").unwrap();
        assert_eq!(found.kind(), crate::ErrorKind::InvalidConfig);
        let text = found.to_string();
        assert!(
            text.contains("reading x") && text.contains("UnknownIssuer"),
            "{text}"
        );
        assert!(text.contains("SSL_CERT_FILE"), "{text}");

        let refused = Outer(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "refused",
        ));
        assert!(untrusted_certificate(&refused, "reading x").is_none());
        let other_tls = Outer(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::DecryptError,
        ));
        assert!(untrusted_certificate(&other_tls, "reading x").is_none());
    }
}
