//! The field layout against a model of the hash that writes exactly what `GROUP_COMMIT` writes (stamps, log
//! entries, the last `LOG_KEEP` kept): every history of real transitions reads back whole from all fields and
//! from the changes alone, and every cut or stray edit is refused. The scripts themselves run against Redis in
//! `coord-server/tests/group_fields.rs`.

use super::*;
use crate::state_machine::harness::{follow_up, Harness};
use proptest::prelude::*;

/// The stored hash, as the scripts leave it.
#[derive(Clone, Default)]
struct Hash {
    revision: u64,
    fields: BTreeMap<String, Vec<u8>>,
}

impl Hash {
    /// What `GROUP_COMMIT` writes.
    fn commit(&mut self, changes: &[(String, Option<String>)]) {
        self.revision += 1;
        let rev = self.revision;
        let mut log = Vec::new();
        for (name, json) in changes {
            match json {
                Some(json) => {
                    self.fields.insert(name.clone(), format!("{rev}:{json}").into_bytes());
                    log.push(name.clone());
                }
                None => {
                    self.fields.remove(name);
                    log.push(format!("-{name}"));
                }
            }
        }
        self.fields.insert(log_field(rev), log.join(" ").into_bytes());
        if rev > LOG_KEEP {
            self.fields.remove(&log_field(rev - LOG_KEEP));
        }
    }

    /// What `GROUP_LOAD` sends on a miss.
    fn full(&self) -> GroupRead {
        let mut pairs: Vec<(String, Vec<u8>)> = self.fields.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        pairs.push(("revision".into(), self.revision.to_string().into_bytes()));
        GroupRead::Full(pairs)
    }

    /// What `GROUP_LOAD` sends to a caller at `from`.
    fn delta(&self, from: u64) -> GroupRead {
        let mut out = Vec::new();
        let mut wanted = Vec::new();
        for r in from + 1..=self.revision {
            let log = self.fields.get(&log_field(r)).expect("kept").clone();
            for w in String::from_utf8(log.clone())
                .unwrap()
                .split(' ')
                .filter(|w| !w.is_empty())
            {
                let n = w.trim_start_matches('-').to_owned();
                if !wanted.contains(&n) {
                    wanted.push(n);
                }
            }
            out.push((log_field(r), Some(log)));
        }
        for n in wanted {
            let v = self.fields.get(&n).cloned();
            out.push((n, v));
        }
        GroupRead::Delta(DeltaRead {
            fields: out,
            shape: self.shape(),
        })
    }

    /// What `GROUP_LOAD` reports of the stored hash with a delta: the count of data and log fields (the model
    /// holds no header), the length of `group`, and the blocks' lengths up to the first missing block.
    fn shape(&self) -> String {
        let len = |name: &str| self.fields.get(name).map(Vec::len);
        let lens: Vec<usize> = (0..).map_while(|k| len(&block_field(k))).collect();
        format!(
            "len:{}:{}:{}:{}:",
            self.fields.len(),
            len(HEAD).unwrap_or(0),
            lens.len(),
            block_lengths_checksum(&lens)
        )
    }

    fn rev(&self) -> StoreRevision {
        StoreRevision(self.revision)
    }
}

fn created(h: &Harness) -> Hash {
    let mut hash = Hash::default();
    let all: Vec<(String, Option<String>)> = all_fields(&h.meta).into_iter().map(|(n, j)| (n, Some(j))).collect();
    hash.commit(&all);
    hash
}

/// Runs `ops` on a group of `shards` shards, committing each change to the model hash; after each, the metadata
/// reads back whole from every field and from the changes since each earlier revision still logged.
fn check_history(shards: u32, ops: &[u8]) {
    let mut h = Harness::new(shards);
    let mut hash = created(&h);
    let mut held: Vec<(GroupMetadata, StoredFields)> = vec![resolve(&hash.full(), hash.rev(), None).unwrap()];
    let mut last = BTreeMap::new();
    for &op in ops {
        let before = h.meta.clone();
        let name = format!("m{}", op % 5);
        match op % 4 {
            0 => {
                last.insert(name.clone(), h.join(&name));
            }
            1 => {
                if let Some(r) = last.get(&name).cloned() {
                    if let Ok(next) = h.send(&follow_up(&r, &[])) {
                        last.insert(name, next);
                    }
                }
            }
            2 => h.advance(u64::from(op) * 100),
            _ => {
                h.tick();
            }
        }
        let changes = changed_fields(&before, &h.meta);
        if changes.is_empty() {
            assert_eq!(before, h.meta, "a change that writes no field");
            continue;
        }
        hash.commit(&changes);
        let (meta, marks) = resolve(&hash.full(), hash.rev(), None).unwrap();
        assert_eq!(meta, h.meta, "full load");
        assert!(
            marks.shape(&[]).starts_with(&hash.shape()),
            "what a load at this revision compares is what the hash holds"
        );
        for (cached, cached_marks) in held.iter().rev().take(LOG_KEEP as usize) {
            let (m, mk) = resolve(
                &hash.delta(cached_marks.revision),
                hash.rev(),
                Some((cached, cached_marks)),
            )
            .unwrap();
            assert_eq!(m, h.meta, "delta from revision {}", cached_marks.revision);
            assert_eq!(mk, marks, "marks after a delta from revision {}", cached_marks.revision);
        }
        let (prev, prev_marks) = held.last().unwrap();
        let named: Vec<(String, Option<String>)> = changes.clone();
        assert_eq!(prev_marks.after(hash.revision, &named), marks, "marks after a commit");
        assert_eq!(
            changes.iter().filter(|(n, _)| n.starts_with("s:")).count(),
            prev.shards
                .chunks(SHARDS_PER_BLOCK)
                .zip(h.meta.shards.chunks(SHARDS_PER_BLOCK))
                .filter(|(a, b)| a != b)
                .count(),
            "only changed blocks are written"
        );
        held.push((meta, marks));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn every_history_reads_back_whole_from_all_fields_and_from_the_changes(
        shards in 1u32..70,
        ops in proptest::collection::vec(any::<u8>(), 1..60),
    ) {
        check_history(shards, &ops);
    }
}

#[test]
fn a_join_in_a_large_group_writes_the_head_the_member_and_the_moved_blocks_only() {
    let mut h = Harness::new(1024);
    for i in 0..200 {
        h.join(&format!("m{i}"));
    }
    let before = h.meta.clone();
    h.join("late");
    let changes = changed_fields(&before, &h.meta);
    let bytes: usize = changes
        .iter()
        .map(|(n, j)| n.len() + j.as_ref().map_or(0, String::len))
        .sum();
    let blocks = changes.iter().filter(|(n, _)| n.starts_with("s:")).count();
    assert!(changes.iter().any(|(n, _)| n == HEAD));
    assert!(changes.iter().any(|(n, _)| n == "m:late"));
    // The whole document is far larger than what the join wrote.
    let whole = h.meta.encode().len();
    assert!(bytes * 4 < whole, "{bytes} of {whole} bytes, {blocks} blocks");
}

fn stored(h: &Harness) -> Hash {
    let mut hash = created(h);
    let mut m = h.clone();
    let before = m.meta.clone();
    m.join("a");
    hash.commit(&changed_fields(&before, &m.meta));
    hash
}

fn err_of(hash: &Hash) -> String {
    resolve(&hash.full(), hash.rev(), None).unwrap_err()
}

#[test]
fn a_change_cut_between_two_fields_is_refused() {
    let h = Harness::new(40);
    let good = stored(&h);
    assert!(resolve(&good.full(), good.rev(), None).is_ok());
    // The revision and its log entry are in, one of the fields it names is not: it still holds the old value.
    let mut cut = good.clone();
    let log = String::from_utf8(cut.fields[&log_field(2)].clone()).unwrap();
    let block = log.split(' ').find(|n| n.starts_with("s:")).unwrap().to_owned();
    let old = created(&h).fields[&block].clone();
    cut.fields.insert(block.clone(), old);
    assert!(err_of(&cut).contains("cut between fields"), "{}", err_of(&cut));
    // A field written, but neither the revision nor the log: its stamp is above the hash's revision.
    let mut cut = good.clone();
    let member = cut.fields["m:a"].clone();
    let text = String::from_utf8(member).unwrap().replacen("2:", "3:", 1);
    cut.fields.insert("m:a".into(), text.into_bytes());
    assert!(
        err_of(&cut).contains("above") || err_of(&cut).contains("written at revision 3"),
        "{}",
        err_of(&cut)
    );
    // A member field deleted by the log's revision that is still there.
    let mut left = good.clone();
    left.commit(&[("m:a".into(), None)]);
    left.fields.insert("m:a".into(), good.fields["m:a"].clone());
    assert!(err_of(&left).contains("still there"), "{}", err_of(&left));
    // The revision's log entry is missing.
    let mut nolog = good.clone();
    nolog.fields.remove(&log_field(2));
    assert!(err_of(&nolog).contains("log entry of revision 2"), "{}", err_of(&nolog));
}

#[test]
fn every_field_is_checked_on_its_own() {
    let h = Harness::new(40);
    let good = stored(&h);
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("m:a", b"2:{\"instanceId\":1}".to_vec(), "unreadable"),
        ("m:a", b"{}".to_vec(), "stamp"),
        ("m:a", b"02:{}".to_vec(), "stamp"),
        ("s:0", b"2:[]".to_vec(), "block 0"),
        ("group", b"2:{\"schemaVersion\":1,\"extra\":1}".to_vec(), "unreadable"),
        ("m:bad{name", b"2:{}".to_vec(), "invalid member"),
        ("s:07", b"2:[]".to_vec(), "unknown"),
        ("aggregate", b"{}".to_vec(), "unknown"),
        ("x", b"1".to_vec(), "unknown"),
    ];
    for (name, value, want) in cases {
        let mut bad = good.clone();
        bad.fields.insert(name.into(), value);
        let e = err_of(&bad);
        assert!(e.contains(want), "{name}: {e}");
    }
    // A shard naming a member the hash does not hold: the document's own invariants.
    let mut bad = good.clone();
    bad.fields.remove("m:a");
    assert!(err_of(&bad).contains("cut between fields") || err_of(&bad).contains("unknown member"));
}

#[test]
fn a_delta_that_does_not_cover_the_revisions_is_refused() {
    let h = Harness::new(8);
    let mut hash = created(&h);
    let held = resolve(&hash.full(), hash.rev(), None).unwrap();
    let mut m = h.clone();
    let before = m.meta.clone();
    m.join("a");
    hash.commit(&changed_fields(&before, &m.meta));
    let before = m.meta.clone();
    m.join("b");
    hash.commit(&changed_fields(&before, &m.meta));
    let GroupRead::Delta(mut read) = hash.delta(1) else {
        unreachable!()
    };
    read.fields.retain(|(n, _)| n != &log_field(2));
    let e = resolve(&GroupRead::Delta(read), hash.rev(), Some((&held.0, &held.1))).unwrap_err();
    assert!(e.contains("incomplete"), "{e}");
}

#[test]
fn the_scripts_keep_as_many_log_entries_as_this_module_reads() {
    let helpers = super::super::scripts::GROUP_HELPERS;
    assert!(helpers.contains(&format!("local LOG_KEEP = {LOG_KEEP}\n")), "{helpers}");
}

#[test]
fn digests_match_what_the_scripts_compute() {
    // redis.sha1hex("group\n1:{}") starts with these 16 hex digits (sha1 of the same bytes).
    let d = field_digest("group", b"1:{}");
    let full = sha1_smol::Sha1::from(b"group\n1:{}".as_slice()).digest().to_string();
    assert_eq!(digest_hex(d), full[..16]);
}

#[test]
fn a_shard_block_edited_outside_a_commit_is_refused_by_a_delta_that_does_not_send_it() {
    let h = Harness::new(40);
    let mut hash = created(&h);
    let held = resolve(&hash.full(), hash.rev(), None).unwrap();
    // A commit that rewrites `group` alone (the same document, newly stamped): the delta sends no block.
    let head = all_fields(&h.meta).remove(0);
    hash.commit(&[(head.0, Some(head.1))]);
    let GroupRead::Delta(read) = hash.delta(1) else {
        unreachable!()
    };
    assert!(resolve(&GroupRead::Delta(read), hash.rev(), Some((&held.0, &held.1))).is_ok());
    // Every block in turn, one byte shorter (stamp kept).
    for k in 0..3 {
        let mut bad = hash.clone();
        let name = block_field(k);
        let mut value = bad.fields[&name].clone();
        value.pop();
        bad.fields.insert(name.clone(), value);
        let GroupRead::Delta(read) = bad.delta(1) else {
            unreachable!()
        };
        assert!(read.fields.iter().all(|(n, _)| n != &name), "{name} is not sent");
        let e = resolve(&GroupRead::Delta(read), bad.rev(), Some((&held.0, &held.1))).unwrap_err();
        assert!(e.contains("outside a commit"), "{name}: {e}");
    }
}

#[test]
fn the_shape_names_every_shard_block_length_in_order() {
    // What the load script computes, in Lua's doubles: ((0 * B + 1021) * B + 7) * B + 350 mod (2^31 - 1).
    let (b, p) = (1_000_003u128, 2_147_483_647u128);
    let want = ((1021 * b + 7) % p * b + 350) % p;
    assert_eq!(u128::from(block_lengths_checksum(&[1021, 7, 350])), want);
    assert_eq!(block_lengths_checksum(&[]), 0);
    // The largest intermediate value stays exact in a double: below 2^53.
    assert!((p - 1) * b + (1 << 29) < 1 << 53);
    let h = Harness::new(40);
    let hash = created(&h);
    let (_, marks) = resolve(&hash.full(), hash.rev(), None).unwrap();
    let shape = marks.shape(&[]);
    let mut swapped = marks.clone();
    let (a, b) = (swapped.marks[&block_field(0)], swapped.marks[&block_field(2)]);
    swapped.marks.insert(block_field(0), (a.0, a.1, a.2 + 1));
    swapped.marks.insert(block_field(2), (b.0, b.1, b.2 - 1));
    assert_ne!(swapped.shape(&[]), shape, "two length changes that keep the sum");
    assert!(
        shape.starts_with(&format!("len:{}:", marks.marks.len() + marks.logs.len())),
        "{shape}"
    );
    assert!(shape.contains(":3:"), "three blocks: {shape}");
}

#[test]
fn a_block_beyond_the_largest_table_is_refused_not_allocated() {
    // A delta would have grown the shard table to the block's position (16 x 10^11 records) before any check.
    let h = Harness::new(8);
    let mut hash = created(&h);
    let held = resolve(&hash.full(), hash.rev(), None).unwrap();
    hash.commit(&[("s:100000000000".into(), Some("[]".into()))]);
    let e = resolve(&hash.delta(1), hash.rev(), Some((&held.0, &held.1))).unwrap_err();
    assert!(e.contains("unknown"), "{e}");
    let e = resolve(&hash.full(), hash.rev(), None).unwrap_err();
    assert!(e.contains("unknown"), "{e}");
}
