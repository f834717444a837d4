//! [`ShardBatch`]: what a write path is given to write, the records of one shard from one publish call.

use protocol::ShardId;

use super::xadd::Xadd;
use crate::fence::Presented;
use crate::record::Record;

/// The records of one shard from one publish call, in the caller's order, with what they are written with.
#[derive(Clone, Copy)]
pub(crate) struct ShardBatch<'a> {
    /// The shard they were routed to.
    pub(crate) shard: ShardId,
    /// The records (checked: each has a field).
    pub(crate) records: &'a [&'a Record],
    /// The routing they were routed with, as the shard's fence is shown it.
    pub(crate) presented: Presented,
    /// Their `XADD`s' trimming, its threshold taken once for the whole publish call.
    pub(crate) xadd: &'a Xadd,
}
