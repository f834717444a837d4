//! Fenced writes to a Redis hash: the side effect of a handler, guarded by the shard's fencing token so that a
//! worker that lost its shard (a long pause, a frozen VM) cannot overwrite what the shard's next owner wrote.
//!
//! The check and the write are one Lua script ([`FENCED_HSET_LUA`], `fenced_hset.lua` next to this file), so no
//! other write can come between them. The hash keeps, per shard that wrote it, the highest token it accepted
//! (field `fence:<shard>`); a write with a lower token is refused and changes nothing. Equal tokens are accepted:
//! one owner writes many times. See `docs/fencing.md` for the pattern and its limits.
//!
//! ```no_run
//! # async fn example(conn: &mut redis::aio::MultiplexedConnection, msg: stream_consumer::Message)
//! # -> redis::RedisResult<()> {
//! use examples::fenced_write::{FencedHash, WriteOutcome};
//!
//! let hash = FencedHash::new();
//! let key = format!("balance:{}", msg.get_str("account").unwrap_or("unknown"));
//! match hash.write(conn, &key, msg.shard(), msg.fencing_token(), &[("last_entry", &msg.id().to_string())]).await? {
//!     WriteOutcome::Applied => {}
//!     // The shard has a newer owner, which handles this entry itself: drop the work.
//!     WriteOutcome::Refused { .. } => {}
//! }
//! # Ok(())
//! # }
//! ```

use protocol::{FencingToken, ShardId};
use redis::aio::ConnectionLike;
use redis::{RedisResult, Script};
use stream_consumer::Message;

/// The script, in one place: `fenced_hset.lua`.
pub const FENCED_HSET_LUA: &str = include_str!("fenced_hset.lua");

/// What became of a fenced write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    /// Written; the writer's token is the highest the hash holds for its shard.
    Applied,
    /// Refused and nothing written: the hash already accepted `stored`, a higher token of the same shard, so the
    /// writer no longer owns the shard.
    Refused {
        /// The highest token the hash holds for the shard.
        stored: FencingToken,
    },
}

/// Writes to hashes through the fencing script (loaded once per connection, then called by its SHA).
#[derive(Debug, Clone)]
pub struct FencedHash {
    script: Script,
}

impl Default for FencedHash {
    fn default() -> Self {
        Self::new()
    }
}

impl FencedHash {
    /// The writer.
    pub fn new() -> Self {
        FencedHash {
            script: Script::new(FENCED_HSET_LUA),
        }
    }

    /// `HSET key field value ...`, unless `key` already accepted a higher token of `shard`.
    ///
    /// # Errors
    /// Redis errors, and a script error when `fields` is empty or the token is above 2^53 - 1 (the coordinator
    /// never mints one).
    pub async fn write<C: ConnectionLike>(
        &self,
        conn: &mut C,
        key: &str,
        shard: ShardId,
        token: FencingToken,
        fields: &[(&str, &str)],
    ) -> RedisResult<WriteOutcome> {
        let mut call = self.script.key(key);
        call.arg(shard.0).arg(token.0);
        for (field, value) in fields {
            call.arg(*field).arg(*value);
        }
        let (applied, stored): (i64, u64) = call.invoke_async(conn).await?;
        Ok(if applied == 1 {
            WriteOutcome::Applied
        } else {
            WriteOutcome::Refused {
                stored: FencingToken(stored),
            }
        })
    }
}

/// The hash an entry of `account` is written to.
pub fn account_key(account: &str) -> String {
    format!("fenced-writer:{account}")
}

/// The `fenced_writer` worker's side effect for one entry: records, in the hash of the entry's `account` field,
/// which entry was applied last, its `amount`, and which member wrote it, fenced by the message's token.
///
/// # Errors
/// Redis errors.
pub async fn apply_entry<C: ConnectionLike>(
    hash: &FencedHash,
    conn: &mut C,
    msg: &Message,
    writer: &str,
) -> RedisResult<WriteOutcome> {
    let account = msg.get_str("account").unwrap_or("unknown");
    let entry = msg.id().to_string();
    let amount = msg.get_str("amount").unwrap_or("0");
    let fields = [("entry", entry.as_str()), ("amount", amount), ("writer", writer)];
    hash.write(conn, &account_key(account), msg.shard(), msg.fencing_token(), &fields)
        .await
}
