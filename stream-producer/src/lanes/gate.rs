//! The Redis check every server or node takes before its first connection is used: the Redis version and every
//! command the producer sends ([`REDIS_REQUIREMENTS`]), and [`ConnectFailure`], what a lane answers when no
//! connection can be used (the check's refusal among them).

use std::sync::Arc;

use client_core::redis_check::MIN_REDIS_VERSION;
use client_core::{check_redis, RedisCheckError, RedisRequirements};
use protocol::ShardId;
use redis::RedisError;
use redis_link::PipelinedConnection;

use crate::error::PublishError;

/// What the producer needs from its Redis: `XADD` (with `MINID` trimming, hence 6.2), and `EVALSHA` / `SCRIPT`
/// for the fenced publish script.
pub const REDIS_REQUIREMENTS: RedisRequirements = RedisRequirements {
    min_version: MIN_REDIS_VERSION,
    commands: &[
        ("XADD", "publishing"),
        ("EVALSHA", "publishing through the fenced script"),
        ("SCRIPT", "loading the fenced publish script"),
        ("WATCH", "checking the fence of a transaction"),
        ("UNWATCH", "checking the fence of a transaction"),
        ("HGET", "reading a shard's fence"),
        ("MULTI", "writing a checked transaction"),
        ("EXEC", "writing a checked transaction"),
        ("DISCARD", "leaving a fenced transaction"),
    ],
};
/// Why no connection could be used. Cheap to clone: one failure is shared by every caller that waited for it.
#[derive(Debug, Clone)]
pub(crate) enum ConnectFailure {
    /// The connection could not be opened (or the check was cut short): nothing was sent.
    Redis(Arc<RedisError>),
    /// The server cannot serve the producer: nothing was sent, and nothing will be.
    Unsupported(Arc<RedisCheckError>),
}

impl ConnectFailure {
    pub(crate) fn into_publish_error(self, shard: ShardId) -> PublishError {
        match self {
            ConnectFailure::Redis(source) => PublishError::Connect { shard, source },
            ConnectFailure::Unsupported(source) => PublishError::RedisUnsupported { source },
        }
    }
}

/// The capability check, taken once on the first connection any lane opens.
pub(crate) struct RedisGate {
    url: String,
    /// `Ok(Ok)`: passed; `Ok(Err)`: the server cannot serve the producer. A transport failure during the check
    /// leaves it unset, to be taken again.
    verdict: tokio::sync::OnceCell<Result<(), Arc<RedisCheckError>>>,
    /// What the producer's settings need beyond [`REDIS_REQUIREMENTS`] (`WAIT` for durable writes).
    also: Option<&'static RedisRequirements>,
}

impl RedisGate {
    pub(crate) fn new(url: String, also: Option<&'static RedisRequirements>) -> Self {
        RedisGate {
            url,
            verdict: tokio::sync::OnceCell::new(),
            also,
        }
    }

    pub(crate) async fn check(&self, con: &PipelinedConnection) -> Result<(), ConnectFailure> {
        let verdict = self
            .verdict
            .get_or_try_init(|| async {
                let mut con = con.clone();
                let mut checked = check_redis(&mut con, &self.url, &REDIS_REQUIREMENTS).await;
                if let (Ok(_), Some(also)) = (&checked, self.also) {
                    checked = check_redis(&mut con, &self.url, also).await;
                }
                match checked {
                    Ok(caps) => {
                        tracing::debug!(redis_version = %caps.version, "Redis check passed");
                        Ok(Ok(()))
                    }
                    Err(e) if e.is_unsupported() => {
                        tracing::error!(error = %e, "Redis cannot serve the producer; every publish fails");
                        Ok(Err(Arc::new(e)))
                    }
                    Err(e) => Err(e),
                }
            })
            .await;
        match verdict {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(ConnectFailure::Unsupported(e.clone())),
            Err(RedisCheckError::Query { source, .. }) => Err(ConnectFailure::Redis(Arc::new(source))),
            Err(other) => Err(ConnectFailure::Unsupported(Arc::new(other))),
        }
    }
}
