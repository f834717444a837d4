//! The Redis check every server or node takes before its first connection is used: the Redis version, every
//! command the producer sends ([`REDIS_REQUIREMENTS`]) and whether the ACL user may send them ([`AclProbes`]),
//! and [`ConnectFailure`], what a lane answers when no connection can be used (the check's refusal among them).

use std::sync::Arc;

use client_core::redis_check::MIN_REDIS_VERSION;
use client_core::{check_permissions, check_redis, PermissionProbe, RedisCheckError, RedisFailure, RedisRequirements};
use protocol::{keys, ShardId};
use redis::RedisError;
use redis_link::PipelinedConnection;

use crate::config::ProducerConfig;
use crate::error::PublishError;
use crate::publish_script::PublishScript;

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

/// The Redis client's error inside a failed check: the check wraps it for the public API, the lanes keep the
/// client's own type (a [`RedisFailure`] is built from it again when it reaches the caller).
fn unwrapped(f: &RedisFailure) -> RedisError {
    std::error::Error::source(f)
        .and_then(|s| s.downcast_ref::<RedisError>())
        .cloned()
        .unwrap_or_else(|| RedisError::from((redis::ErrorKind::Io, "Redis check failed", f.to_string())))
}

impl ConnectFailure {
    pub(crate) fn into_publish_error(self, shard: ShardId) -> PublishError {
        match self {
            ConnectFailure::Redis(source) => PublishError::Connect {
                shard,
                source: RedisFailure::from_redis_arc(source),
            },
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
    /// What the ACL user must be allowed to send.
    probes: Arc<AclProbes>,
}

impl RedisGate {
    pub(crate) fn new(url: String, also: Option<&'static RedisRequirements>, probes: Arc<AclProbes>) -> Self {
        RedisGate {
            url,
            verdict: tokio::sync::OnceCell::new(),
            also,
            probes,
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
                if checked.is_ok() {
                    if let Err(e) = self.probes.check(&mut con, &self.url).await {
                        checked = Err(e);
                    }
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
            Err(RedisCheckError::Query { source, .. }) => Err(ConnectFailure::Redis(Arc::new(unwrapped(&source)))),
            Err(other) => Err(ConnectFailure::Unsupported(Arc::new(other))),
        }
    }
}

/// Which commands a write path sends, for [`AclProbes::of`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PathCommands {
    /// Pipelined `XADD`s.
    Plain,
    /// A checked transaction: `WATCH` and `HMGET` of the fences, `MULTI`, the `XADD`s, `EXEC` or `DISCARD`.
    Transaction,
    /// The publish script (`SCRIPT LOAD`, `EVALSHA`), which runs `HMGET`, `TYPE`, `XADD`, `HSET` and `PEXPIRE`.
    Script,
}

/// The permission probes of one producer: harmless commands on the keys of its stream's shard 0 (every shard's
/// keys match the same ACL patterns), each standing for a command the producer's write path sends. Redis checks
/// a command's ACL before its arguments, so `NOPERM` is the only refusal that counts (see
/// [`PermissionProbe`]).
#[derive(Debug)]
pub(crate) struct AclProbes {
    /// Probes that change nothing whatever their answer.
    first: Vec<PermissionProbe>,
    /// `MULTI` then `DISCARD`, sent only once the first probes passed (`DISCARD` among them): a `MULTI` taken
    /// must be left again.
    transaction: bool,
}

impl AclProbes {
    /// The probes of a producer with `config` whose write path sends `path`'s commands.
    pub(crate) fn of(config: &ProducerConfig, path: PathCommands) -> Self {
        let shard = ShardId(0);
        let stream = keys::shard_stream(&config.stream, shard);
        let fence = keys::shard_fence(&config.stream, shard);
        // The key an idempotent producer's sequence state lives in matches the same pattern as this one, the name
        // non-idempotent script calls give (and never write).
        let sequence = keys::producer_sequence(&config.stream, shard, "-");
        let cmd = |args: &[&str]| {
            let mut c = redis::cmd(args[0]);
            for a in &args[1..] {
                c.arg(*a);
            }
            c
        };
        let on = |name: &str, key: &str| format!("{name} {key}");
        // `0-0` is an id XADD refuses after the ACL check: nothing is written.
        let mut first = vec![PermissionProbe::new(
            on("XADD", &stream),
            cmd(&["XADD", &stream, "NOMKSTREAM", "0-0", "f", "v"]),
        )];
        match path {
            PathCommands::Plain => {}
            PathCommands::Transaction => first.extend([
                PermissionProbe::new("UNWATCH", cmd(&["UNWATCH"])),
                PermissionProbe::new("EXEC", cmd(&["EXEC"])),
                PermissionProbe::new("DISCARD", cmd(&["DISCARD"])),
                PermissionProbe::new(on("HMGET", &fence), cmd(&["HMGET", &fence, "routingVersion"])),
                PermissionProbe::new(on("WATCH", &fence), cmd(&["WATCH", &fence])),
                PermissionProbe::new("UNWATCH", cmd(&["UNWATCH"])),
            ]),
            PathCommands::Script => first.extend([
                PermissionProbe::new("SCRIPT LOAD", cmd(&["SCRIPT", "LOAD", PublishScript::source()])),
                // An unknown SHA: `NOSCRIPT` once the ACL let the command and its three keys through.
                PermissionProbe::new(
                    format!("EVALSHA with keys {stream} {fence} {sequence}"),
                    cmd(&["EVALSHA", &"0".repeat(40), "3", &stream, &fence, &sequence]),
                ),
                PermissionProbe::new(on("HMGET", &fence), cmd(&["HMGET", &fence, "routingVersion"])),
                PermissionProbe::new(on("TYPE", &stream), cmd(&["TYPE", &stream])),
                PermissionProbe::new(on("HMGET", &sequence), cmd(&["HMGET", &sequence, "epoch"])),
                // An odd number of field arguments: refused after the ACL check, nothing is written.
                PermissionProbe::new(on("HSET", &sequence), cmd(&["HSET", &sequence, "f", "v", "f"])),
                // XX: only a key that exists is touched, and then with the longest idle expiry it could hold.
                PermissionProbe::new(on("PEXPIRE", &sequence), cmd(&["PEXPIRE", &sequence, "86400000", "XX"])),
            ]),
        }
        if config.durability != crate::config::Durability::Primary {
            first.push(PermissionProbe::new("WAIT", cmd(&["WAIT", "0", "1"])));
        }
        AclProbes {
            first,
            transaction: path == PathCommands::Transaction,
        }
    }

    /// No probes (a route whose probes are set once it is configured).
    pub(crate) fn none() -> Self {
        AclProbes {
            first: Vec::new(),
            transaction: false,
        }
    }

    async fn check(&self, con: &mut PipelinedConnection, url: &str) -> Result<(), RedisCheckError> {
        check_permissions(con, url, &self.first).await?;
        if self.transaction {
            let pair = [
                PermissionProbe::new("MULTI", redis::cmd("MULTI")),
                PermissionProbe::new("DISCARD", redis::cmd("DISCARD")),
            ];
            check_permissions(con, url, &pair).await?;
        }
        Ok(())
    }
}
