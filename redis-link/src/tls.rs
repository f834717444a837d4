//! TLS settings, one type for every connection the project opens: to Redis (`rediss://`, Cluster nodes,
//! Sentinel-discovered masters) and to the coordinator (`https://`). Verification of the server is always on
//! unless [`TlsOptions::insecure_skip_verify`] says otherwise: against the system's roots, plus
//! [`TlsOptions::ca_file`] when given.
//!
//! ```
//! use redis_link::TlsOptions;
//!
//! let tls = TlsOptions::new()
//!     .ca_file("/etc/redis-stream/ca.pem")
//!     .client_identity("/etc/redis-stream/client.pem", "/etc/redis-stream/client.key");
//! assert!(tls.ca_file.is_some());
//! ```

use std::path::PathBuf;

/// How a TLS connection verifies its server and, optionally, presents a client certificate (mutual TLS).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TlsOptions {
    /// A PEM file of CA certificates trusted besides the system's roots (a private CA).
    pub ca_file: Option<PathBuf>,
    /// A PEM client certificate (chain) presented to the server, with [`TlsOptions::client_key_file`].
    pub client_cert_file: Option<PathBuf>,
    /// The PEM private key of [`TlsOptions::client_cert_file`].
    pub client_key_file: Option<PathBuf>,
    /// The name checked against the server's certificate (and sent as SNI) instead of the URL's host.
    pub server_name: Option<String>,
    /// Accept any server certificate. Only for tests against a server whose certificate cannot be verified;
    /// every connection made with it logs a warning.
    pub insecure_skip_verify: bool,
}

impl TlsOptions {
    /// Verification against the system's roots, no client certificate.
    pub fn new() -> TlsOptions {
        TlsOptions::default()
    }

    /// Trusts the CA certificates of the PEM file at `path` too.
    #[must_use]
    pub fn ca_file(mut self, path: impl Into<PathBuf>) -> TlsOptions {
        self.ca_file = Some(path.into());
        self
    }

    /// Presents the PEM certificate at `cert` with the PEM key at `key` (servers that require client certificates,
    /// e.g. Redis with `tls-auth-clients yes`).
    #[must_use]
    pub fn client_identity(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> TlsOptions {
        self.client_cert_file = Some(cert.into());
        self.client_key_file = Some(key.into());
        self
    }

    /// Checks the server's certificate against `name` (and sends it as SNI) instead of the URL's host.
    #[must_use]
    pub fn server_name(mut self, name: impl Into<String>) -> TlsOptions {
        self.server_name = Some(name.into());
        self
    }

    /// The settings of the binaries' flags (`--redis-tls-ca`, `--redis-tls-cert`, `--redis-tls-key`,
    /// `--redis-tls-insecure-skip-verify`): `None` when none is given, so a `rediss://` URL verifies against the
    /// system's roots alone. A certificate without its key is kept as given, for `build()` to refuse it by name.
    pub fn from_flags(
        ca: Option<PathBuf>,
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
        insecure_skip_verify: bool,
    ) -> Option<TlsOptions> {
        if ca.is_none() && cert.is_none() && key.is_none() && !insecure_skip_verify {
            return None;
        }
        Some(TlsOptions {
            ca_file: ca,
            client_cert_file: cert,
            client_key_file: key,
            server_name: None,
            insecure_skip_verify,
        })
    }

    /// Accepts any server certificate (tests only: logged as a warning on every connection).
    #[must_use]
    pub fn insecure_skip_verify(mut self) -> TlsOptions {
        self.insecure_skip_verify = true;
        self
    }
}
