//! Dead-lettering: where entries go that failed too often.
//!
//! An entry whose delivery count exceeds the consumer's `max_deliveries` is not handed to the handler again.
//! It is appended to its shard's dead-letter stream, [`protocol::keys::dead_letter_stream`]
//! (`redis-stream:dead-letter:{<stream>:<shard>:<salt>}`, in the same hash slot as the shard), and acknowledged on the
//! shard stream, both in one `MULTI`/`EXEC` so the entry is never lost between the two nor dead-lettered twice
//! by the same attempt.
//!
//! The dead-letter entry gets a fresh id (`*`: several groups may dead-letter the same entry, and ids must grow)
//! and carries the original fields, in order, followed by the fields below. They start with
//! [`FIELD_PREFIX`] so they cannot be mistaken for application fields unless an application uses that prefix.

use crate::message::Message;
use protocol::names::{GroupName, MemberId};

/// Prefix of every field the consumer adds to a dead-letter entry.
pub const FIELD_PREFIX: &str = "dead-letter.";
/// The entry's id in its shard stream.
pub const FIELD_ORIGINAL_ID: &str = "dead-letter.original-id";
/// The consumer group that gave up on the entry.
pub const FIELD_GROUP: &str = "dead-letter.group";
/// The member that gave up on it.
pub const FIELD_MEMBER: &str = "dead-letter.member";
/// Its delivery count when it was dead-lettered.
pub const FIELD_DELIVERIES: &str = "dead-letter.deliveries";
/// The last handler error (or why it was not handled again).
pub const FIELD_ERROR: &str = "dead-letter.error";

/// The fields of the dead-letter entry for `message`.
pub(crate) fn entry_fields(
    message: &Message,
    group: &GroupName,
    member: &MemberId,
    error: &str,
) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut fields = (*message.fields).clone();
    fields.extend([
        (FIELD_ORIGINAL_ID.into(), message.id.to_string().into_bytes()),
        (FIELD_GROUP.into(), group.as_str().as_bytes().to_vec()),
        (FIELD_MEMBER.into(), member.as_str().as_bytes().to_vec()),
        (FIELD_DELIVERIES.into(), message.delivery_count.to_string().into_bytes()),
        (FIELD_ERROR.into(), error.as_bytes().to_vec()),
    ]);
    fields
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::EntryId;
    use protocol::names::StreamName;
    use protocol::ShardId;

    #[test]
    fn dead_letter_entry_keeps_the_original_fields_first() {
        let m = Message::new(
            StreamName::new("s").unwrap(),
            ShardId(2),
            EntryId { ms: 5, seq: 1 },
            vec![(b"k".to_vec(), b"v".to_vec())],
            4,
        );
        let f = entry_fields(&m, &GroupName::new("g").unwrap(), &MemberId::new("m").unwrap(), "boom");
        assert_eq!(f[0], (b"k".to_vec(), b"v".to_vec()));
        let get = |name: &str| f.iter().find(|(k, _)| k == name.as_bytes()).map(|(_, v)| v.clone());
        assert_eq!(get(FIELD_ORIGINAL_ID), Some(b"5-1".to_vec()));
        assert_eq!(get(FIELD_DELIVERIES), Some(b"4".to_vec()));
        assert_eq!(get(FIELD_ERROR), Some(b"boom".to_vec()));
        assert!(f[1..].iter().all(|(k, _)| k.starts_with(FIELD_PREFIX.as_bytes())));
    }
}
