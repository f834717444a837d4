//! The command-line flags every example worker takes to name its group and its Redis.

/// Stream, group, member id and Redis URL of a worker (flattened into each binary's own flags).
#[derive(clap::Args, Debug, Clone)]
pub struct MemberArgs {
    /// Logical stream (prefix of the shard keys).
    #[arg(long, env = "STREAM")]
    pub stream: String,
    /// Consumer group.
    #[arg(long, env = "GROUP")]
    pub group: String,
    /// Stable member id (for example the pod name); random when absent.
    #[arg(long, env = "MEMBER_ID")]
    pub member_id: Option<String>,
    /// Redis URL of the shard streams (and, for the fenced writer, of the hashes it writes).
    #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379")]
    pub redis_url: String,
    /// TLS of `rediss://` URLs.
    #[command(flatten)]
    pub redis_tls: crate::redis_tls_args::RedisTlsArgs,
}

impl MemberArgs {
    /// A redis-rs client of the worker's own (progress lines, the fenced hashes) with the same TLS settings as the
    /// consumer's.
    ///
    /// # Errors
    /// The URL or the TLS files cannot be used.
    pub fn redis_client(&self) -> anyhow::Result<redis::Client> {
        let tls = self
            .redis_tls
            .options()
            .map(|o| redis_link::RedisTls::load(&o))
            .transpose()?;
        Ok(redis_link::tls_client(&self.redis_url, tls.as_ref())?)
    }
}
