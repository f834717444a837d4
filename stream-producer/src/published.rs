//! [`Published`]: where a record was written, the success half of every publish outcome.

use protocol::{EntryId, RoutingVersion, ShardId};

/// Where a record was written.
///
/// ```
/// # async fn example(producer: &stream_producer::Producer) -> Result<(), stream_producer::PublishError> {
/// let published = producer.send("customer-42", &[("amount", "12.50")]).await?;
/// println!("shard {} entry {} (routing {})", published.shard, published.id, published.routing_version);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Published {
    /// The shard.
    pub shard: ShardId,
    /// The stream entry id Redis assigned (`<ms>-<seq>` when displayed; ordered as Redis orders them).
    pub id: EntryId,
    /// The routing version the shard was chosen with.
    pub routing_version: RoutingVersion,
    /// The idempotent producer retried the record's call after an unknown outcome, and the shard answered that
    /// an earlier attempt had written it: `id` is that attempt's entry id, and the record is in the stream once.
    pub duplicate: bool,
}
