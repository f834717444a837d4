//! Shard routing: which shard a record key goes to.
//!
//! ```text
//! shard = jump_consistent_hash(xxh64(key_bytes, seed = 0), shard_count)
//! ```
//!
//! * `xxh64` is xxHash64 (<https://xxhash.com>, spec `doc/xxhash_spec.md`) of the raw key bytes with seed 0; every
//!   mainstream language has it, so producers written elsewhere route exactly like this crate.
//! * `jump_consistent_hash` is Lamping & Veach, "A Fast, Minimal Memory, Consistent Hash Algorithm" (2014),
//!   implemented like the paper's C++ (64-bit LCG `key * 2862933555777941757 + 1`, `f64` division). Growing a
//!   stream from `N` to `N + 1` shards moves about `1 / (N + 1)` of the keys, and only onto the new shard.
//!
//! `protocol/testdata/routing-vectors.json` holds (key, shard count, shard) triples, keys as hex bytes, including
//! the empty key, binary and non-ASCII keys; a test checks this implementation against them.
//! Records without a key are not routed here: the producer spreads them round-robin (see its docs).

use crate::version::ShardId;

/// The documented 64-bit hash of a record key: xxHash64 with seed 0.
pub fn key_hash(key: &[u8]) -> u64 {
    xxhash_rust::xxh64::xxh64(key, 0)
}

/// Jump consistent hash: maps a 64-bit key to a bucket in `0..buckets`. `buckets == 0` is treated as 1.
pub fn jump_consistent_hash(mut key: u64, buckets: u32) -> u32 {
    let buckets = i64::from(buckets.max(1));
    let mut b: i64 = -1;
    let mut j: i64 = 0;
    while j < buckets {
        b = j;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        // Same float arithmetic as the reference implementation: other languages must match bit for bit.
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    // b is in 0..buckets <= u32::MAX
    u32::try_from(b).unwrap_or(0)
}

/// The shard of a record key in a stream of `shard_count` shards.
///
/// `shard_count` must be at least 1; 0 is treated as 1.
pub fn shard_for_key(key: &[u8], shard_count: u32) -> ShardId {
    ShardId(jump_consistent_hash(key_hash(key), shard_count))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn xxh64_matches_reference_values() {
        assert_eq!(key_hash(b""), 0xEF46_DB37_51D8_E999);
        assert_eq!(key_hash(b"abc"), 0x44BC_2CF5_AD77_0999);
    }

    #[test]
    fn jump_hash_matches_published_values() {
        // Values published with the reference implementations of the paper (C++, Go, Python ports).
        assert_eq!(jump_consistent_hash(0, 60), 0);
        assert_eq!(jump_consistent_hash(1, 60), 55);
        assert_eq!(jump_consistent_hash(2, 60), 46);
        assert_eq!(jump_consistent_hash(1, 1), 0);
        assert_eq!(jump_consistent_hash(42, 57), 43);
        assert_eq!(jump_consistent_hash(256, 1024), 520);
        assert_eq!(jump_consistent_hash(0xDEAD_10CC, 666), 361);
    }

    #[derive(serde::Deserialize)]
    struct Vector {
        key_hex: String,
        shard_count: u32,
        shard: u32,
    }

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn shipped_test_vectors_hold() {
        let text = include_str!("../testdata/routing-vectors.json");
        let vectors: Vec<Vector> = serde_json::from_str(text).unwrap();
        assert!(vectors.len() >= 50);
        assert!(vectors.iter().any(|v| v.key_hex.is_empty()), "the empty key is covered");
        for v in vectors {
            let got = shard_for_key(&unhex(&v.key_hex), v.shard_count);
            assert_eq!(got, ShardId(v.shard), "key {} count {}", v.key_hex, v.shard_count);
        }
    }

    #[test]
    fn growing_by_one_shard_moves_about_one_in_n_plus_one_keys_and_only_to_the_new_shard() {
        let n = 8u32;
        let keys: Vec<String> = (0..20_000).map(|i| format!("key-{i}")).collect();
        let moved: Vec<_> = keys
            .iter()
            .filter(|k| shard_for_key(k.as_bytes(), n) != shard_for_key(k.as_bytes(), n + 1))
            .collect();
        for k in &moved {
            assert_eq!(shard_for_key(k.as_bytes(), n + 1), ShardId(n));
        }
        let share = moved.len() as f64 / keys.len() as f64;
        assert!((share - 1.0 / 9.0).abs() < 0.02, "moved share {share}");
    }

    proptest! {
        #[test]
        fn shard_is_always_in_range(key in proptest::collection::vec(any::<u8>(), 0..64), count in 1u32..5000) {
            prop_assert!(shard_for_key(&key, count).0 < count);
        }
    }
}
