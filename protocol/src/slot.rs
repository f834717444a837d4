//! Redis Cluster hash slots of keys: which slot, and so which master, serves a key.
//!
//! A key's slot is `CRC16(tag) mod 16384`, where `tag` is the text between the key's first `{` and the next `}`
//! when that is non-empty, else the whole key (the Redis Cluster specification). The producer groups its
//! pipelines by the slot of each shard key, and the consumer sends a shard's blocking reads to the master of its
//! slot; the layout in [`crate::keys`] gives every key of one shard, one group or one stream the same tag.

/// Number of hash slots of a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// The hash slot of `key`.
pub fn key_slot(key: &[u8]) -> u16 {
    crc16(hash_tag(key)) % SLOTS
}

/// The part of `key` Redis Cluster hashes: the bytes between the first `{` and the next `}` when non-empty, else
/// the whole key.
pub fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        let rest = &key[open + 1..];
        if let Some(len) = rest.iter().position(|&b| b == b'}') {
            if len > 0 {
                return &rest[..len];
            }
        }
    }
    key
}

/// CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), the checksum of Redis Cluster key slots.
pub fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_the_redis_cluster_spec() {
        // The check value of the spec's CRC16 (XMODEM) and slots from the Redis Cluster documentation;
        // test-support checks many more keys against a live `CLUSTER KEYSLOT`.
        assert_eq!(crc16(b"123456789"), 0x31c3);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") % SLOTS);
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
        assert_eq!(key_slot(b"foo{bar}{zap}"), key_slot(b"bar"));
        assert_eq!(hash_tag(b"a{}b"), b"a{}b");
    }
}
