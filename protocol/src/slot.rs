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
    &key[tag_range(key)]
}

/// Where [`hash_tag`] lies in `key`. Its ends are next to ASCII braces (or the ends of `key`), so the range also
/// cuts a `str` key at character boundaries ([`crate::keys::hash_tag`]).
pub(crate) fn tag_range(key: &[u8]) -> std::ops::Range<usize> {
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        if let Some(len) = key[open + 1..].iter().position(|&b| b == b'}') {
            if len > 0 {
                return open + 1..open + 1 + len;
            }
        }
    }
    0..key.len()
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

/// Characters of a [`salt_for`] suffix: letters and digits only, so a salted tag stays readable, never holds a
/// `{`, `}` or `:`, and matches the same ACL key patterns as the unsalted name.
const SALT_ALPHABET: &[u8; 62] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";

/// Length of a [`salt_for`] suffix: every one of the 16384 slots is reachable with three characters.
pub const SALT_LEN: usize = 3;

/// For each 14-bit value `v`, the first three-character string (in [`SALT_ALPHABET`] order) whose CRC16 has low
/// 14 bits `v`. Built once per process (238,328 CRCs of three bytes, a few milliseconds).
fn salt_table() -> &'static [[u8; SALT_LEN]] {
    static TABLE: std::sync::OnceLock<Vec<[u8; SALT_LEN]>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = vec![[0u8; SALT_LEN]; usize::from(SLOTS)];
        let mut seen = vec![false; usize::from(SLOTS)];
        let mut left = usize::from(SLOTS);
        'all: for &a in SALT_ALPHABET {
            for &b in SALT_ALPHABET {
                for &c in SALT_ALPHABET {
                    let v = usize::from(crc16(&[a, b, c]) % SLOTS);
                    if !seen[v] {
                        seen[v] = true;
                        table[v] = [a, b, c];
                        left -= 1;
                        if left == 0 {
                            break 'all;
                        }
                    }
                }
            }
        }
        assert_eq!(left, 0, "three salt characters reach every slot");
        table
    })
}

/// The suffix that puts a hash tag starting with `prefix` into `slot`: `key_slot` of `{<prefix><salt>}` is
/// `slot`.
///
/// CRC16 without final XOR is linear and starts from 0, so `crc(prefix ‖ s) = crc(prefix ‖ 000) ⊕ crc(s)`
/// for a suffix `s` of fixed length (`000`: three zero bytes), and so are its low 14 bits: the salt is the
/// precomputed string whose CRC supplies the missing bits.
pub fn salt_for(prefix: &[u8], slot: u16) -> [u8; SALT_LEN] {
    let mut padded = Vec::with_capacity(prefix.len() + SALT_LEN);
    padded.extend_from_slice(prefix);
    padded.extend_from_slice(&[0; SALT_LEN]);
    let base = crc16(&padded) % SLOTS;
    salt_table()[usize::from((base ^ (slot % SLOTS)) % SLOTS)]
}

/// The 14 low bits of `n` in reverse order (the van der Corput sequence over the slots): consecutive `n` land as
/// far apart as the slots before them allow, so any first `N` of them split every contiguous slot range evenly.
pub fn reverse14(n: u32) -> u16 {
    ((n & 0x3FFF).reverse_bits() >> 18) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_salt_puts_any_prefix_into_any_slot() {
        for prefix in [&b"orders:3:"[..], b"", b"payments-eu:1023:", b"s:0:"] {
            for slot in [0u16, 1, 5460, 5461, 10922, 12345, 16383] {
                let salt = salt_for(prefix, slot);
                assert!(salt.iter().all(u8::is_ascii_alphanumeric));
                let mut tag = prefix.to_vec();
                tag.extend_from_slice(&salt);
                assert_eq!(crc16(&tag) % SLOTS, slot, "{}", String::from_utf8_lossy(&tag));
            }
        }
        assert_eq!(salt_table().len(), usize::from(SLOTS));
    }

    #[test]
    fn reverse14_spreads_the_first_n_evenly() {
        assert_eq!(reverse14(0), 0);
        assert_eq!(reverse14(1), 8192);
        assert_eq!(reverse14(2), 4096);
        assert_eq!(reverse14(3), 12288);
        assert_eq!(reverse14(16384), 0);
        let mut all: Vec<u16> = (0..16384).map(reverse14).collect();
        all.sort_unstable();
        assert!(
            all.iter().enumerate().all(|(i, &v)| usize::from(v) == i),
            "a permutation of the slots"
        );
    }

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
