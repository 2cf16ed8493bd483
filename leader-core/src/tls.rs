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
        assert!(!install_crypto_provider(), "a second call must not replace it");
    }
}
