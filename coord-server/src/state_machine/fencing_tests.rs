//! Fencing tokens through the transitions that move a shard: every new owner gets a higher token, an owner that
//! keeps its shard keeps its token, and a Redis rollback never hands out a token at or below a lost one.

use protocol::messages::{HeartbeatResponse, ShardToken};
use protocol::{FencingToken, MetadataVersion, ShardId, Status};

use super::harness::*;
use super::Input;

/// The tokens an answer gives, by shard, checking they cover exactly the assigned shards in order.
fn tokens(r: &HeartbeatResponse) -> Vec<(u32, u64)> {
    let shards: Vec<ShardId> = r.fencing_tokens.iter().map(|t| t.shard).collect();
    assert_eq!(shards, r.assigned, "one token per assigned shard, in order");
    r.fencing_tokens.iter().map(|t| (t.shard.0, t.token.0)).collect()
}

fn token_of(r: &HeartbeatResponse, shard: u32) -> FencingToken {
    r.fencing_tokens
        .iter()
        .find(|t| t.shard == ShardId(shard))
        .map(|t: &ShardToken| t.token)
        .unwrap_or_else(|| panic!("no token for shard {shard} in {r:?}"))
}

#[test]
fn a_first_grant_mints_the_redis_time_and_the_answer_carries_it() {
    let mut h = Harness::new(3);
    h.now = 1_700_000_000_000;
    let r = h.join("a");
    assert_eq!(
        tokens(&r),
        vec![(0, 1_700_000_000_000), (1, 1_700_000_000_000), (2, 1_700_000_000_000)]
    );
    assert_eq!(h.token(1), FencingToken(1_700_000_000_000), "recorded in the metadata");
}

#[test]
fn an_owner_that_keeps_its_shards_keeps_its_tokens() {
    let mut h = Harness::new(2);
    let a = h.join("a");
    let before = tokens(&a);
    let mut last = a;
    for _ in 0..5 {
        h.advance(INTERVAL);
        let t = h.apply(Input::Heartbeat(&follow_up(&last, &[])));
        assert!(t.next.is_none(), "a steady heartbeat writes no token");
        let super::Outcome::Heartbeat(r) = t.outcome else {
            panic!("answer")
        };
        assert_eq!(tokens(&r), before);
        h.tick();
        last = r;
    }
}

#[test]
fn a_rebalance_gives_the_next_owner_a_higher_token_even_within_one_millisecond() {
    let mut h = Harness::new(4);
    let a = h.join("a");
    let b = h.join("b");
    let a2 = h.send(&follow_up(&a, &[])).unwrap();
    // No time passes: the `+ 1` alone orders the owners.
    h.send(&follow_up(&a2, &[2, 3])).unwrap();
    let b2 = h.send(&follow_up(&b, &[])).unwrap();
    assert_eq!(ids(&b2.assigned), vec![2, 3]);
    for s in [2, 3] {
        assert!(token_of(&b2, s) > token_of(&a, s), "shard {s}: {b2:?}");
    }
    // Shards a kept keep their tokens.
    assert_eq!(token_of(&a2, 0), token_of(&a, 0));
}

#[test]
fn a_shard_that_comes_back_to_its_old_owner_still_gets_a_new_token() {
    let mut h = Harness::new(2);
    let a = h.join("a");
    let b = h.join("b");
    let a2 = h.send(&follow_up(&a, &[])).unwrap();
    h.send(&follow_up(&a2, &[1])).unwrap();
    let b2 = h.send(&follow_up(&b, &[])).unwrap();
    let mut leave = follow_up(&b2, &[]);
    leave.member_epoch = protocol::MemberEpoch::LEAVE;
    leave.owned.clear();
    h.send(&leave).unwrap();
    let a3 = h.send(&follow_up(&a2, &[])).unwrap();
    assert!(ids(&a3.assigned).contains(&1));
    assert!(
        token_of(&a3, 1) > token_of(&b2, 1),
        "a -> b -> a: a's second token is above b's"
    );
}

#[test]
fn expiry_gives_the_next_owner_a_higher_token() {
    let mut h = Harness::new(2);
    let a = h.join("a");
    h.advance(INTERVAL);
    let mut b = h.join("b");
    // a stalls; b keeps heartbeating until a's lease ends and a is expired.
    for _ in 0..(TTL / INTERVAL) {
        h.advance(INTERVAL);
        b = h.send(&follow_up(&b, &[])).unwrap();
        h.tick();
    }
    assert!(!h.meta.members.contains_key(&member("a")));
    let b2 = h.send(&follow_up(&b, &[])).unwrap();
    assert_eq!(ids(&b2.assigned), vec![0, 1]);
    for s in [0, 1] {
        assert!(token_of(&b2, s) > token_of(&a, s));
    }
}

#[test]
fn an_admin_fence_gives_the_next_owner_a_higher_token() {
    let mut h = Harness::new(2);
    let a = h.join("a");
    let b = h.join("b");
    h.apply(Input::FenceMember(&member("a")));
    let lease_end = h.meta.members[&member("a")].lease_until_ms;
    h.now = lease_end - 1;
    let b = h.send(&follow_up(&b, &[])).unwrap();
    h.now = lease_end;
    h.tick();
    let b2 = h.send(&follow_up(&b, &[])).unwrap();
    assert_eq!(ids(&b2.assigned), vec![0, 1]);
    for s in [0, 1] {
        assert!(token_of(&b2, s) > token_of(&a, s));
    }
}

#[test]
fn a_new_incarnation_gets_higher_tokens_than_its_predecessor_and_a_join_retry_none() {
    let mut h = Harness::new(2);
    let a = h.join("a");
    let writes = h.writes;
    let retry = h.join("a");
    assert_eq!(h.writes, writes, "a retried join writes nothing");
    assert_eq!(tokens(&retry), tokens(&a), "and mints nothing");
    let old_lease = h.liveness[&member("a")];
    // Same member id, another process: the old one may still be running handlers with its tokens.
    let mut other = req("a", 0, MetadataVersion(0), &[], &[]);
    other.instance_id = "second-process".into();
    let r = h.send(&other).unwrap();
    assert!(
        r.fencing_tokens.is_empty(),
        "nothing readable while the predecessor is held"
    );
    let mut hb = other.clone();
    hb.incarnation = r.incarnation;
    hb.member_epoch = r.member_epoch;
    hb.metadata_version = r.metadata_version;
    h.now = old_lease - 1;
    h.send(&hb).unwrap();
    h.now = old_lease;
    h.tick();
    let r2 = h.send(&hb).unwrap();
    assert_eq!(ids(&r2.assigned), vec![0, 1]);
    for s in [0, 1] {
        assert!(token_of(&r2, s) > token_of(&a, s));
    }
}

#[test]
fn metadata_written_before_tokens_existed_gets_them_at_the_next_transition() {
    let mut h = Harness::new(2);
    let a = h.join("a");
    for s in &mut h.meta.shards {
        s.fencing_token = FencingToken(0);
    }
    h.advance(INTERVAL);
    let r = h.send(&follow_up(&a, &[])).unwrap();
    assert_eq!(tokens(&r), vec![(0, h.now), (1, h.now)]);
}

#[test]
fn a_redis_rollback_never_hands_out_a_token_at_or_below_a_lost_one() {
    let mut h = Harness::new(4);
    let a = h.join("a");
    h.advance(INTERVAL);
    let b = h.join("b");
    let a2 = h.send(&follow_up(&a, &[])).unwrap();
    let before = h.clone();
    // The lost history: later, a releases 2 and 3 and b gets them with tokens Redis will forget.
    h.advance(3 * INTERVAL);
    let a3 = h.send(&follow_up(&a2, &[2, 3])).unwrap();
    let b2 = h.send(&follow_up(&b, &[])).unwrap();
    let lost = token_of(&b2, 2).max(token_of(&b2, 3));
    assert!(
        lost > before.token(2),
        "the lost history minted above the stored tokens"
    );
    // Redis falls back; the coordinator notices the run id change.
    let now = h.now;
    let stored_version = before.meta.metadata_version;
    h = before;
    h.now = now;
    h.suspected = Some(b2.metadata_version);
    // Every answer from here on: tokens in OK answers for 2 and 3 are above the lost ones.
    let mut given = Vec::new();
    let sync_b = h.send(&follow_up(&b2, &[])).unwrap();
    assert_eq!(sync_b.status, Status::SyncMetadata);
    given.push(sync_b.clone());
    let mut b_next = follow_up(&sync_b, &[2, 3]);
    b_next.max_observed_version = b2.metadata_version;
    given.push(h.send(&b_next).unwrap());
    let sync_a = h.send(&follow_up(&a3, &[])).unwrap();
    given.push(sync_a.clone());
    let mut a_next = follow_up(&sync_a, &[2, 3]);
    a_next.max_observed_version = a3.metadata_version;
    given.push(h.send(&a_next).unwrap());
    assert_eq!(h.meta.metadata_version, stored_version, "still in the round");
    h.advance(TTL);
    b_next.member_epoch = sync_b.member_epoch;
    b_next.revoking.clear();
    let ok = h.send(&b_next).unwrap();
    assert_eq!(ok.status, Status::Ok);
    assert_eq!(ids(&ok.assigned), vec![2, 3]);
    given.push(ok.clone());
    for s in [2, 3] {
        assert!(
            token_of(&ok, s) > lost,
            "shard {s}: {} <= lost {lost}",
            token_of(&ok, s)
        );
    }
    for r in given.iter().filter(|r| r.status == Status::Ok) {
        for t in &r.fencing_tokens {
            assert!(t.shard.0 < 2 || t.token > lost, "{r:?}");
        }
    }
    // The shards that never moved also got fresh tokens at the close: their owner's tokens only grew.
    assert!(h.token(0) > token_of(&a, 0));
}

fn ids(v: &[ShardId]) -> Vec<u32> {
    v.iter().map(|s| s.0).collect()
}
