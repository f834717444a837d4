//! The command-line flags of TLS to the coordinator (`https://` URLs), shared by every example binary.

use client_core::TlsOptions;
use std::path::PathBuf;

/// A private CA and an optional client certificate for `https://` coordinator URLs (flattened into each
/// binary's own flags). Without `--coordinator-tls-ca` the coordinator's certificate is checked against the
/// system's roots.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct CoordinatorTlsArgs {
    /// PEM file of the CA that signed the coordinator's certificate (besides the system's roots).
    #[arg(long, env = "COORD_TLS_CA")]
    pub coordinator_tls_ca: Option<PathBuf>,
    /// PEM client certificate, for coordinators that require one (`--tls-client-ca`); with
    /// --coordinator-tls-key.
    #[arg(long, env = "COORD_TLS_CERT", requires = "coordinator_tls_key")]
    pub coordinator_tls_cert: Option<PathBuf>,
    /// PEM private key of --coordinator-tls-cert.
    #[arg(long, env = "COORD_TLS_KEY", requires = "coordinator_tls_cert")]
    pub coordinator_tls_key: Option<PathBuf>,
}

impl CoordinatorTlsArgs {
    /// The SDKs' TLS settings for these flags.
    pub fn options(&self) -> TlsOptions {
        let mut tls = TlsOptions::new();
        if let Some(ca) = &self.coordinator_tls_ca {
            tls = tls.ca_file(ca);
        }
        if let (Some(cert), Some(key)) = (&self.coordinator_tls_cert, &self.coordinator_tls_key) {
            tls = tls.client_identity(cert, key);
        }
        tls
    }
}
