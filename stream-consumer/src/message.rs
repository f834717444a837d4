//! What a handler receives: one stream entry of one shard.

use protocol::names::StreamName;
use protocol::{FencingToken, ShardId};
use std::sync::Arc;

/// A Redis stream entry id, `<milliseconds>-<sequence>`, ordered as Redis orders entries (the same type as the
/// producer SDK's `Published::id`).
pub use protocol::EntryId;

/// A string that is not a stream entry id (what [`EntryId`]'s `FromStr` answers).
pub use protocol::reshard::EntryIdError as ParseEntryIdError;

/// One entry of one shard, handed to the handler.
///
/// Delivery is at-least-once: the same entry can be handed over again (after a handler error, a crash, or a
/// rebalance that interrupted it), with a higher [`delivery_count`](Message::delivery_count).
///
/// # Example
/// A handler that credits an account in another Redis, fenced by the shard's token so that an owner which lost
/// the shard during a pause cannot overwrite the next owner's write ([`docs/fencing.md`]; the full script, with
/// input checks, is [`examples/src/fenced_hset.lua`]).
/// ```no_run
/// use redis::aio::ConnectionManager;
/// use stream_consumer::{Consumer, Message};
///
/// // Applies the HSET only if this shard's token is not below the highest one the hash has accepted.
/// const FENCED_HSET: &str = r"
///     local fence = 'fence:' .. ARGV[1]
///     if tonumber(ARGV[2]) < tonumber(redis.call('HGET', KEYS[1], fence) or '0') then return 0 end
///     redis.call('HSET', KEYS[1], fence, ARGV[2], 'balance', ARGV[3])
///     return 1";
///
/// async fn handle(mut ledger: ConnectionManager, msg: Message) -> Result<(), redis::RedisError> {
///     let (Some(account), Some(balance)) = (msg.get_str("account"), msg.get_str("balance")) else {
///         return Ok(()); // malformed: retrying cannot help (or return an error to dead-letter it)
///     };
///     let applied: i64 = redis::Script::new(FENCED_HSET)
///         .key(format!("account:{account}"))
///         .arg(msg.shard().0)
///         .arg(msg.fencing_token().0)
///         .arg(balance)
///         .invoke_async(&mut ledger)
///         .await?;
///     if applied == 0 {
///         // The shard has a newer owner, which handles this entry itself: drop the work, don't retry it.
///         println!("entry {} refused: shard {} moved", msg.id(), msg.shard());
///     }
///     Ok(())
/// }
///
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let ledger = redis::Client::open("redis://ledger:6379")?.get_connection_manager().await?;
/// let consumer = Consumer::builder("payments", "ledger")
///     .coordinator("http://coordinator:7400")
///     .redis("redis://redis:6379")
///     .handler(move |msg: Message| handle(ledger.clone(), msg))
///     .build()?;
/// # let _ = consumer;
/// # Ok(())
/// # }
/// ```
///
/// [`docs/fencing.md`]: https://github.com/redis-stream-coord/redis-stream-coord/blob/main/docs/fencing.md
/// [`examples/src/fenced_hset.lua`]: https://github.com/redis-stream-coord/redis-stream-coord/blob/main/examples/src/fenced_hset.lua
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    // Shared, not copied: the reader keeps the message for retries and the dead letter while the handler owns its
    // copy, so a clone per handler call must not copy the fields (it was a measurable share of the read loop).
    pub(crate) stream: Arc<StreamName>,
    pub(crate) shard: ShardId,
    pub(crate) id: EntryId,
    pub(crate) fields: Arc<Vec<(Vec<u8>, Vec<u8>)>>,
    pub(crate) delivery_count: u32,
    pub(crate) fencing_token: FencingToken,
}

impl Message {
    /// A message, for tests of handlers.
    pub fn new(
        stream: StreamName,
        shard: ShardId,
        id: EntryId,
        fields: Vec<(Vec<u8>, Vec<u8>)>,
        delivery_count: u32,
    ) -> Self {
        Message {
            stream: Arc::new(stream),
            shard,
            id,
            fields: Arc::new(fields),
            delivery_count,
            fencing_token: FencingToken::default(),
        }
    }

    /// The message with another fencing token, for tests of handlers.
    #[must_use]
    pub fn with_fencing_token(mut self, token: FencingToken) -> Self {
        self.fencing_token = token;
        self
    }

    /// The logical stream (prefix) the entry belongs to.
    pub fn stream(&self) -> &StreamName {
        &self.stream
    }

    /// The shard the entry was read from.
    pub fn shard(&self) -> ShardId {
        self.shard
    }

    /// The entry's id in its shard stream.
    pub fn id(&self) -> EntryId {
        self.id
    }

    /// How many times the entry has been delivered to this consumer group, this delivery included (1 on the
    /// first delivery).
    pub fn delivery_count(&self) -> u32 {
        self.delivery_count
    }

    /// The fencing token of the shard for this member: strictly greater than the token of every earlier owner of
    /// the shard. Pass it with the handler's side effects so that the target refuses writes carrying a lower one
    /// (a worker that resumed after a pause, while the shard's next owner already wrote): see [`docs/fencing.md`].
    /// `0` when the coordinator sent no token (an older coordinator).
    ///
    /// [`docs/fencing.md`]: https://github.com/redis-stream-coord/redis-stream-coord/blob/main/docs/fencing.md
    pub fn fencing_token(&self) -> FencingToken {
        self.fencing_token
    }

    /// The entry's fields, in the order they were written.
    pub fn fields(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.fields.iter().map(|(k, v)| (k.as_slice(), v.as_slice()))
    }

    /// The value of the first field called `name`.
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|(k, _)| k.as_slice() == name.as_bytes())
            .map(|(_, v)| v.as_slice())
    }

    /// The value of the first field called `name`, if it is UTF-8.
    pub fn get_str(&self, name: &str) -> Option<&str> {
        self.get(name).and_then(|v| std::str::from_utf8(v).ok())
    }

    /// Takes the fields out of the message.
    pub fn into_fields(self) -> Vec<(Vec<u8>, Vec<u8>)> {
        Arc::try_unwrap(self.fields).unwrap_or_else(|shared| (*shared).clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_ids_parse_print_and_order_like_redis() {
        let a: EntryId = "1700000000000-2".parse().unwrap();
        let b: EntryId = "1700000000000-10".parse().unwrap();
        let c: EntryId = "1700000000001-0".parse().unwrap();
        assert!(a < b && b < c, "numeric, not lexical, order");
        assert_eq!(a.to_string(), "1700000000000-2");
        assert!("12".parse::<EntryId>().is_err());
        assert!("a-1".parse::<EntryId>().is_err());
    }

    #[test]
    fn fields_keep_their_order_and_are_found_by_name() {
        let m = Message::new(
            StreamName::new("s").unwrap(),
            ShardId(1),
            EntryId { ms: 1, seq: 0 },
            vec![
                (b"k".to_vec(), b"v1".to_vec()),
                (b"bin".to_vec(), vec![0xff]),
                (b"k".to_vec(), b"v2".to_vec()),
            ],
            1,
        );
        assert_eq!(m.get_str("k"), Some("v1"));
        assert_eq!(m.get("bin"), Some(&[0xff][..]));
        assert_eq!(m.get_str("bin"), None);
        assert_eq!(m.fields().count(), 3);
    }
}
