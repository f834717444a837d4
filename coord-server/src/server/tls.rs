//! HTTPS on the API listener: the certificate and key of [`ServerTls`], reloaded without a restart, and an
//! optional CA that client certificates must chain to.
//!
//! # Rotation
//! [`CertStore::watch`] looks at the files' modification time and size every `Config::tls_reload_interval`, and
//! at once on SIGHUP (Unix), and loads them again when they changed. A new connection gets the configuration
//! loaded last; connections already open keep theirs. A set that does not load (a key that does not match its
//! certificate because only one of them was replaced so far, a file half written) is logged and the previous
//! configuration stays, tried again on the next look, so replacing the certificate and then the key is safe.
//!
//! The probe listener stays plain HTTP: kubelets and load balancers probe it without certificates.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, SystemTime};
use thiserror::Error;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::ServerTls;

/// Why the TLS files cannot serve.
#[derive(Debug, Clone, Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A file could not be read or holds no usable PEM item.
    #[error("TLS file {path}: {reason}")]
    File {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// rustls refused the set (a key that does not match the certificate, an unusable client CA).
    #[error("TLS settings refused: {0}")]
    Rustls(String),
}

/// Loads the files of `tls` once: what a start checks before it binds anything.
///
/// # Errors
/// [`TlsError`].
pub fn check(tls: &ServerTls) -> Result<(), TlsError> {
    load(tls).map(drop)
}

/// The aws-lc-rs provider, the one the SDKs' HTTP client uses too.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

fn file_error(path: &Path, reason: impl ToString) -> TlsError {
    TlsError::File {
        path: path.to_owned(),
        reason: reason.to_string(),
    }
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(path, e))?;
    if certs.is_empty() {
        return Err(file_error(path, "no PEM certificate"));
    }
    Ok(certs)
}

fn load(tls: &ServerTls) -> Result<ServerConfig, TlsError> {
    let chain = certificates(&tls.cert_file)?;
    let key = PrivateKeyDer::from_pem_file(&tls.key_file).map_err(|e| file_error(&tls.key_file, e))?;
    let provider = provider();
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Rustls(e.to_string()))?;
    let builder = match &tls.client_ca_file {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in certificates(ca)? {
                roots.add(cert).map_err(|e| file_error(ca, e))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| TlsError::Rustls(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| TlsError::Rustls(e.to_string()))?;
    // The API is HTTP/1 only (see `connections`).
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// What identifies one version of a file: a replaced file differs in one of them.
type Stamp = Option<(SystemTime, u64)>;

fn stamp(path: &Path) -> Stamp {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

/// The TLS configuration new connections get, and the files it was loaded from.
pub(crate) struct CertStore {
    files: ServerTls,
    current: RwLock<Arc<ServerConfig>>,
    /// The files' stamps when `current` was loaded: a change makes [`CertStore::watch`] load them again.
    loaded: Mutex<Vec<Stamp>>,
}

impl CertStore {
    /// Loads `files`.
    pub fn load(files: ServerTls) -> Result<CertStore, TlsError> {
        let stamps = stamps(&files);
        let config = load(&files)?;
        Ok(CertStore {
            files,
            current: RwLock::new(Arc::new(config)),
            loaded: Mutex::new(stamps),
        })
    }

    /// An acceptor with the configuration loaded last.
    pub fn acceptor(&self) -> TlsAcceptor {
        let config = self.current.read().unwrap_or_else(PoisonError::into_inner).clone();
        TlsAcceptor::from(config)
    }

    /// Loads the files again when they changed since the last load (or always, with `force`); keeps the
    /// previous configuration when they do not load.
    fn reload(&self, force: bool) {
        let now = stamps(&self.files);
        if !force && *self.loaded.lock().unwrap_or_else(PoisonError::into_inner) == now {
            return;
        }
        match load(&self.files) {
            Ok(config) => {
                *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(config);
                *self.loaded.lock().unwrap_or_else(PoisonError::into_inner) = now;
                info!(cert = %self.files.cert_file.display(), "TLS certificate reloaded");
            }
            Err(e) => warn!(error = %e, "TLS files changed but do not load; keeping the previous certificate"),
        }
    }

    /// Reloads on change every `interval` and on SIGHUP until `stop` is cancelled.
    pub async fn watch(self: Arc<Self>, interval: Duration, stop: CancellationToken) {
        let mut hangup = hangups();
        loop {
            let forced = tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(interval) => false,
                () = next_hangup(&mut hangup) => true,
            };
            if forced {
                info!("SIGHUP: reloading the TLS files");
            }
            self.reload(forced);
        }
    }
}

fn stamps(files: &ServerTls) -> Vec<Stamp> {
    let mut paths = vec![files.cert_file.as_path(), files.key_file.as_path()];
    paths.extend(files.client_ca_file.as_deref());
    paths.into_iter().map(stamp).collect()
}

#[cfg(unix)]
type Hangups = Option<tokio::signal::unix::Signal>;
#[cfg(not(unix))]
type Hangups = ();

#[cfg(unix)]
fn hangups() -> Hangups {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(signal) => Some(signal),
        Err(e) => {
            warn!(error = %e, "cannot listen for SIGHUP; TLS files are reloaded on change only");
            None
        }
    }
}

#[cfg(not(unix))]
fn hangups() -> Hangups {}

#[cfg(unix)]
async fn next_hangup(hangup: &mut Hangups) {
    let Some(signal) = hangup else {
        return std::future::pending().await;
    };
    if signal.recv().await.is_none() {
        std::future::pending::<()>().await;
    }
}

#[cfg(not(unix))]
async fn next_hangup(_: &mut Hangups) {
    std::future::pending().await
}
