//! TLS to the coordinator (`https://` URLs): the rustls client configuration built from a
//! [`redis_link::TlsOptions`], the HTTP client that uses it, and the classification of a failed handshake.
//!
//! The server is verified against the system's roots plus [`TlsOptions::ca_file`] (the platform verifier), with
//! the aws-lc-rs provider, reqwest's own: one crypto library in the build. A client certificate is presented when
//! [`TlsOptions::client_cert_file`] and [`TlsOptions::client_key_file`] are set (coordinators started with
//! `--tls-client-ca`).
//!
//! A handshake the server or the client refuses (unknown issuer, wrong name, expired, no or rejected client
//! certificate) fails the same way on every retry, so [`tls_failure`] tells it apart from a network error and the
//! callers report it as a final error naming the URL and the cause.

use redis_link::TlsOptions;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;

/// TLS settings for the coordinator that cannot be used; nothing was connected.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TlsConfigError {
    /// A PEM file could not be read or parsed.
    #[error("cannot read the TLS file {path}: {source}")]
    File {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    /// A CA or certificate file holds no certificate.
    #[error("the TLS file {0} holds no PEM certificate")]
    NoCertificate(PathBuf),
    /// Only one of the client certificate and its key was given.
    #[error("a client certificate needs both a certificate file and a key file")]
    IncompleteIdentity,
    /// An option this client cannot honour for coordinator connections (refused rather than ignored).
    #[error("TLS option `{0}` is not supported for coordinator connections")]
    Unsupported(&'static str),
    /// rustls refused the settings (a key that does not match its certificate, an unusable CA).
    #[error("TLS settings refused: {0}")]
    Rustls(#[source] rustls::Error),
}

/// The aws-lc-rs provider, the one reqwest uses too.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// Every certificate of the PEM file at `path` (at least one).
fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsConfigError> {
    let file_error = |source| TlsConfigError::File {
        path: path.to_owned(),
        source,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(file_error)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(file_error)?;
    if certs.is_empty() {
        return Err(TlsConfigError::NoCertificate(path.to_owned()));
    }
    Ok(certs)
}

/// The rustls client configuration of `tls` (files read now, so a missing or broken one is reported here).
///
/// # Errors
/// [`TlsConfigError`].
pub fn client_config(tls: &TlsOptions) -> Result<ClientConfig, TlsConfigError> {
    if tls.server_name.is_some() {
        // reqwest takes the name from the URL; put the certificate's name in the URL instead.
        return Err(TlsConfigError::Unsupported("server_name"));
    }
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(TlsConfigError::Rustls)?;
    let verifier: Arc<dyn ServerCertVerifier> = if tls.insecure_skip_verify {
        Arc::new(AcceptAnyServer(provider.clone()))
    } else {
        let extra = match &tls.ca_file {
            Some(path) => certificates(path)?,
            None => Vec::new(),
        };
        let verifier = if extra.is_empty() {
            rustls_platform_verifier::Verifier::new(provider.clone())
        } else {
            rustls_platform_verifier::Verifier::new_with_extra_roots(extra, provider.clone())
        };
        Arc::new(verifier.map_err(TlsConfigError::Rustls)?)
    };
    let builder = builder.dangerous().with_custom_certificate_verifier(verifier);
    match (&tls.client_cert_file, &tls.client_key_file) {
        (None, None) => Ok(builder.with_no_client_auth()),
        (Some(cert), Some(key)) => {
            let chain = certificates(cert)?;
            let key = PrivateKeyDer::from_pem_file(key).map_err(|source| TlsConfigError::File {
                path: key.clone(),
                source,
            })?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(TlsConfigError::Rustls)
        }
        _ => Err(TlsConfigError::IncompleteIdentity),
    }
}

/// What both coordinator clients failed to build: the TLS settings or the HTTP stack.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum HttpClientError {
    /// The TLS settings.
    #[error(transparent)]
    Tls(#[from] TlsConfigError),
    /// The HTTP stack refused its settings.
    #[error(transparent)]
    Http(#[from] reqwest::Error),
}

/// The HTTP client of the coordinator clients: `timeout` per request, `connect_timeout` per connection, TLS
/// from `tls` for `https://` URLs.
pub(crate) fn http_client(
    timeout: Duration,
    connect_timeout: Option<Duration>,
    tls: &TlsOptions,
) -> Result<reqwest::Client, HttpClientError> {
    let config = client_config(tls)?;
    if tls.insecure_skip_verify {
        tracing::warn!("coordinator TLS: server certificates are NOT verified (insecure_skip_verify)");
    }
    let mut builder = reqwest::Client::builder()
        .timeout(timeout)
        .tls_backend_preconfigured(config);
    if let Some(connect) = connect_timeout {
        builder = builder.connect_timeout(connect);
    }
    Ok(builder.build()?)
}

/// The TLS cause of a failed request, when the handshake failed (verification, a refused or missing client
/// certificate, no common protocol): a final answer, unlike a network error. `None` for every other error.
pub fn tls_failure(e: &reqwest::Error) -> Option<String> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cause {
        if let Some(tls) = err.downcast_ref::<rustls::Error>() {
            return Some(tls.to_string());
        }
        // io::Error's `source()` skips the error it wraps, which is where rustls puts its own (inside another
        // io::Error from the connector).
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if let Some(inner) = io.get_ref() {
                cause = Some(inner);
                continue;
            }
        }
        cause = err.source();
    }
    None
}

/// [`TlsOptions::insecure_skip_verify`]: any certificate, any name; handshake signatures are still checked.
#[derive(Debug)]
struct AcceptAnyServer(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
