//! The Redis TLS flags every example binary takes (the coordinator's are the same).

use std::path::PathBuf;

/// `--redis-tls-ca`, `--redis-tls-cert`, `--redis-tls-key`, `--redis-tls-insecure-skip-verify` (flattened into
/// each binary's own flags); they apply to `rediss://` URLs.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct RedisTlsArgs {
    /// PEM file of CA certificates that verify the Redis servers (rediss://), trusted besides the system's roots.
    #[arg(long, env = "REDIS_TLS_CA")]
    pub redis_tls_ca: Option<PathBuf>,
    /// PEM client certificate presented to Redis (for `tls-auth-clients yes`), with --redis-tls-key.
    #[arg(long, env = "REDIS_TLS_CERT")]
    pub redis_tls_cert: Option<PathBuf>,
    /// PEM private key of --redis-tls-cert.
    #[arg(long, env = "REDIS_TLS_KEY")]
    pub redis_tls_key: Option<PathBuf>,
    /// Do not verify the Redis servers' certificates (tests only; every connection logs a warning).
    #[arg(long, env = "REDIS_TLS_INSECURE_SKIP_VERIFY")]
    pub redis_tls_insecure_skip_verify: bool,
}

impl RedisTlsArgs {
    /// The settings for the SDK builders' `redis_tls`; `None` when no flag is given.
    pub fn options(&self) -> Option<redis_link::TlsOptions> {
        redis_link::TlsOptions::from_flags(
            self.redis_tls_ca.clone(),
            self.redis_tls_cert.clone(),
            self.redis_tls_key.clone(),
            self.redis_tls_insecure_skip_verify,
        )
    }
}
