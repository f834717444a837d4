//! The Redis commands of one shard's reader, built without I/O (the reader sends them), and the pairing of a
//! claim batch with its delivery counts.

use protocol::names::{GroupName, MemberId};
use redis::{Cmd, Pipeline};
use std::collections::HashMap;
use std::time::Duration;

use super::ack_batch::{entry_id_arg, ENTRY_ID_MAX_LEN};
use crate::message::EntryId;
use crate::stream_reply::RawEntry;

/// The keys and names every command of one shard's reader carries.
#[derive(Debug, Clone)]
pub(crate) struct ShardCommands {
    /// The shard stream.
    pub key: String,
    /// The shard's dead-letter stream.
    pub dead_letter_key: String,
    /// The Redis consumer group (the coordinator group's name).
    group: GroupName,
    /// The Redis consumer (the member id).
    member: MemberId,
}

impl ShardCommands {
    pub(crate) fn new(key: String, dead_letter_key: String, group: GroupName, member: MemberId) -> Self {
        ShardCommands {
            key,
            dead_letter_key,
            group,
            member,
        }
    }

    /// `XGROUP CREATE <key> <group> <start> MKSTREAM`.
    pub(crate) fn create_group(&self, start_id: &str) -> Cmd {
        let mut cmd = redis::cmd("XGROUP");
        cmd.arg("CREATE")
            .arg(&self.key)
            .arg(self.group.as_str())
            .arg(start_id)
            .arg("MKSTREAM");
        cmd
    }

    /// `XAUTOCLAIM <key> <group> <member> 0 <cursor> COUNT <count>`: every pending entry, whoever held it (min-idle
    /// 0, see the reader's order of work).
    pub(crate) fn auto_claim(&self, cursor: &str, count: usize) -> Cmd {
        let mut cmd = redis::cmd("XAUTOCLAIM");
        cmd.arg(&self.key)
            .arg(self.group.as_str())
            .arg(self.member.as_str())
            .arg(0)
            .arg(cursor)
            .arg("COUNT")
            .arg(count);
        cmd
    }

    /// `XPENDING <key> <group> <first> <last> <n> <member>`: the delivery counts of a claimed batch.
    pub(crate) fn delivery_counts(&self, first: EntryId, last: EntryId, n: usize) -> Cmd {
        let mut cmd = redis::cmd("XPENDING");
        cmd.arg(&self.key)
            .arg(self.group.as_str())
            .arg(first.to_string())
            .arg(last.to_string())
            .arg(n)
            .arg(self.member.as_str());
        cmd
    }

    /// `XCLAIM <key> <group> <member> 0 <id>`: counts a retry as a delivery (it increments the delivery count).
    pub(crate) fn count_retry(&self, id: EntryId) -> Cmd {
        let mut cmd = redis::cmd("XCLAIM");
        cmd.arg(&self.key)
            .arg(self.group.as_str())
            .arg(self.member.as_str())
            .arg(0)
            .arg(id.to_string());
        cmd
    }

    /// `XREADGROUP GROUP <group> <member> COUNT <count> BLOCK <ms> STREAMS <key> >`. The block is at least 1 ms:
    /// `BLOCK 0` would block forever.
    pub(crate) fn read_new(&self, count: usize, block: Duration) -> Cmd {
        let block_ms = u64::try_from(block.as_millis()).unwrap_or(u64::MAX).max(1);
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(self.group.as_str())
            .arg(self.member.as_str())
            .arg("COUNT")
            .arg(count)
            .arg("BLOCK")
            .arg(block_ms)
            .arg("STREAMS")
            .arg(&self.key)
            .arg(">");
        cmd
    }

    /// `XACK <key> <group> <id>...`.
    pub(crate) fn ack(&self, ids: impl Iterator<Item = EntryId>) -> Cmd {
        let mut cmd = redis::cmd("XACK");
        cmd.arg(&self.key).arg(self.group.as_str());
        let mut buf = [0u8; ENTRY_ID_MAX_LEN];
        for id in ids {
            cmd.arg(entry_id_arg(id, &mut buf));
        }
        cmd
    }

    /// `MULTI; XADD <dead-letter key> * <fields>; XACK <key> <group> <id>; EXEC`: the entry moves to the dead-letter
    /// stream and leaves the pending list together, or not at all. Answers the dead-letter entry's id.
    pub(crate) fn dead_letter(&self, id: EntryId, fields: &[(Vec<u8>, Vec<u8>)]) -> Pipeline {
        let mut pipe = redis::pipe();
        pipe.atomic();
        let xadd = pipe.cmd("XADD").arg(&self.dead_letter_key).arg("*");
        for (k, v) in fields {
            xadd.arg(k.as_slice()).arg(v.as_slice());
        }
        pipe.cmd("XACK")
            .arg(&self.key)
            .arg(self.group.as_str())
            .arg(id.to_string())
            .ignore();
        pipe
    }
}

/// Pairs each claimed entry with its delivery count from `XPENDING`. `XAUTOCLAIM` counted this delivery, so an
/// entry missing from the counts (acknowledged or trimmed in between) gets 2, the least a re-delivered entry can
/// have.
pub(crate) fn with_delivery_counts(entries: Vec<RawEntry>, counts: &HashMap<EntryId, u32>) -> Vec<(RawEntry, u32)> {
    entries
        .into_iter()
        .map(|e| {
            let count = counts.get(&e.id).copied().unwrap_or(2);
            (e, count)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::Arg;

    fn cmds() -> ShardCommands {
        ShardCommands::new(
            "orders:{0}".into(),
            "orders:dlq:{0}".into(),
            GroupName::new("billing").unwrap(),
            MemberId::new("m1").unwrap(),
        )
    }

    fn args(cmd: &Cmd) -> Vec<String> {
        cmd.args_iter()
            .map(|a| match a {
                Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                _ => "<cursor>".into(),
            })
            .collect()
    }

    fn id(ms: u64, seq: u64) -> EntryId {
        EntryId { ms, seq }
    }

    #[test]
    fn every_command_names_the_shard_group_and_member() {
        let c = cmds();
        assert_eq!(
            args(&c.create_group("$")),
            ["XGROUP", "CREATE", "orders:{0}", "billing", "$", "MKSTREAM"]
        );
        assert_eq!(
            args(&c.auto_claim("0-0", 100)),
            ["XAUTOCLAIM", "orders:{0}", "billing", "m1", "0", "0-0", "COUNT", "100"]
        );
        assert_eq!(
            args(&c.delivery_counts(id(1, 0), id(5, 2), 3)),
            ["XPENDING", "orders:{0}", "billing", "1-0", "5-2", "3", "m1"]
        );
        assert_eq!(
            args(&c.count_retry(id(7, 1))),
            ["XCLAIM", "orders:{0}", "billing", "m1", "0", "7-1"]
        );
        assert_eq!(
            args(&c.ack([id(1, 0), id(1, 1), id(2, 0)].into_iter())),
            ["XACK", "orders:{0}", "billing", "1-0", "1-1", "2-0"]
        );
    }

    #[test]
    fn a_read_blocks_for_at_least_one_millisecond() {
        let c = cmds();
        assert_eq!(
            args(&c.read_new(10, Duration::from_millis(300))),
            [
                "XREADGROUP",
                "GROUP",
                "billing",
                "m1",
                "COUNT",
                "10",
                "BLOCK",
                "300",
                "STREAMS",
                "orders:{0}",
                ">"
            ]
        );
        assert_eq!(
            args(&c.read_new(10, Duration::from_micros(10)))[7],
            "1",
            "BLOCK 0 would block forever"
        );
        assert_eq!(args(&c.read_new(10, Duration::MAX))[7], u64::MAX.to_string());
    }

    #[test]
    fn a_dead_letter_adds_and_acknowledges_in_one_transaction() {
        let c = cmds();
        let fields = vec![(b"n".to_vec(), b"1".to_vec())];
        let pipe = c.dead_letter(id(3, 4), &fields);
        let all: Vec<Vec<String>> = pipe.cmd_iter().map(args).collect();
        assert_eq!(
            all,
            vec![
                vec!["XADD", "orders:dlq:{0}", "*", "n", "1"],
                vec!["XACK", "orders:{0}", "billing", "3-4"],
            ]
        );
        let packed = String::from_utf8_lossy(&pipe.get_packed_pipeline()).into_owned();
        assert!(packed.contains("MULTI") && packed.contains("EXEC"), "atomic: {packed}");
    }

    #[test]
    fn claimed_entries_get_their_counts_or_the_least_a_redelivery_has() {
        let entries = vec![
            RawEntry {
                id: id(1, 0),
                fields: Some(vec![]),
            },
            RawEntry {
                id: id(2, 0),
                fields: None,
            },
        ];
        let counts = HashMap::from([(id(1, 0), 5)]);
        let paired: Vec<(EntryId, u32)> = with_delivery_counts(entries, &counts)
            .into_iter()
            .map(|(e, n)| (e.id, n))
            .collect();
        assert_eq!(paired, vec![(id(1, 0), 5), (id(2, 0), 2)]);
    }
}
