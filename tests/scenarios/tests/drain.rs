//! Rebalance drain (seed scenarios 1-4): the DRAIN instruction is a repeatable view of Redis-recorded state, a
//! drained shard is never resumed without an `OK`, and a shard moves to its new owner only after the previous
//! owner released it or expired.

mod common;

use common::*;
use coord_server::fault::{Action, Point};
use protocol::messages::RevokeState;
use protocol::ShardId;
use scenario_tests::History;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

async fn redis_now_ms(s: &Scenario) -> u64 {
    let mut con = s.redis.connection().await;
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut con).await.expect("TIME");
    secs * 1000 + micros / 1000
}

/// a reads every shard, b joins: a is told to drain half of them and b waits for them.
async fn a_draining_for_b(s: &Scenario) -> (GroupApi, WireMember, WireMember) {
    let api = s.api();
    let mut a = WireMember::new("a");
    a.ok(&api).await;
    assert_eq!(a.reading.len() as u32, s.shards);
    let mut b = WireMember::new("b");
    let joined = b.ok(&api).await;
    assert!(joined.assigned.is_empty() && !joined.pending.is_empty(), "{joined:?}");
    (api, a, b)
}

// ---- level 2 ---------------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed1_drain_answer_lost_after_its_write_is_repeated_by_the_next_heartbeat() {
    let s = Scenario::start("s1", 4).await;
    let (api, a, _b) = a_draining_for_b(&s).await;
    let recorded = s.describe().await;
    let drain = member(&recorded, "a").unwrap().revoke.clone();
    assert_eq!(drain.len(), 2, "{recorded:#?}");

    // a's heartbeat is handled and written (its lease renewal), then the answer carrying DRAIN is lost.
    let lose = Trigger::once(s.coordinator(), Point::AfterWrite, Action::Fail, on::renews("a"));
    let req = a.request(RevokeState::Draining);
    let lost = api.heartbeat(&req).await;
    assert!(lost.is_err(), "the answer was lost: {lost:?}");
    assert_eq!(lose.count(), 1);

    // The same request again: the same DRAIN, from the same recorded state.
    let again = api.hb(&req).await;
    assert_eq!(again.revoke, drain, "{again:?}");
    assert_eq!(again.metadata_version, recorded.metadata_version);
    assert_eq!(again.member_epoch, member(&recorded, "a").unwrap().epoch);
    let third = api.hb(&req).await;
    assert_eq!(third, again, "DRAIN is a repeatable view");
    assert_eq!(
        s.describe().await.revision,
        recorded.revision,
        "repeating it writes no new decision"
    );
    assert_no_split(&s.describe().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed2_drain_delivered_then_coordinator_down_keeps_the_shard_with_its_draining_owner() {
    let mut s = Scenario::start("s2", 4).await;
    let (_, mut a, mut b) = a_draining_for_b(&s).await;
    let api = s.api();
    a.beat(&api, RevokeState::Draining).await.unwrap();
    let drained: BTreeSet<ShardId> = a.revoking.clone();
    assert_eq!(drained.len(), 2);
    let before = s.describe().await;

    // The coordinator dies; a new one starts on the same URL from what Redis recorded.
    s.coords[0].abort();
    s.coords[0].restart().await;
    let api = s.api();
    let after = s.describe().await;
    assert_eq!(
        (targets(&after), owners(&after)),
        (targets(&before), owners(&before)),
        "Redis still records the DRAIN"
    );

    // While a drains (and even if it reports nothing for a while), b only waits.
    for _ in 0..3 {
        let r = b.ok_retrying(&api).await;
        assert!(
            drained.iter().all(|s| r.pending.contains(s) && !r.assigned.contains(s)),
            "{r:?}"
        );
        let r = a.beat(&api, RevokeState::Draining).await.unwrap();
        assert_eq!(r.revoke.iter().copied().collect::<BTreeSet<_>>(), drained, "{r:?}");
        assert!(a.reading.is_disjoint(&drained), "a never reads a drained shard again");
    }
    // Only a's REVOKED hands them over.
    a.ok(&api).await;
    let r = b.ok(&api).await;
    assert!(drained.iter().all(|s| r.assigned.contains(s)), "{r:?}");
    assert_no_two_readers(&[&a, &b]);
    assert_no_split(&s.describe().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed3_revoked_ack_written_answer_lost_new_owner_gets_the_shard_on_its_next_heartbeat() {
    let s = Scenario::start("s3", 4).await;
    let (api, mut a, mut b) = a_draining_for_b(&s).await;
    a.beat(&api, RevokeState::Draining).await.unwrap();
    let drained: BTreeSet<ShardId> = a.revoking.clone();

    let lose = Trigger::once(s.coordinator(), Point::AfterWrite, Action::Fail, on::released_by("a"));
    let ack = a.request(RevokeState::Revoked);
    assert!(api.heartbeat(&ack).await.is_err(), "the answer to the ack was lost");
    assert_eq!(lose.count(), 1);

    // Redis has the release: b gets the shards on its very next heartbeat.
    let r = b.ok(&api).await;
    assert!(drained.iter().all(|s| r.assigned.contains(s)), "{r:?}");
    // a's retry of the same ack is answered from the record: the shards are no longer a's, nothing changes.
    let revision = s.describe().await.revision;
    let retry = api.hb(&ack).await;
    assert!(
        drained
            .iter()
            .all(|s| !retry.revoke.contains(s) && !retry.assigned.contains(s)),
        "{retry:?}"
    );
    a.apply(&retry, RevokeState::Revoked);
    assert!(a.revoking.is_empty());
    assert_eq!(s.describe().await.revision, revision, "a duplicate ack changes nothing");
    assert_no_two_readers(&[&a, &b]);
    assert_no_split(&s.describe().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed4_previous_owner_expiring_while_draining_hands_over_at_its_lease_end_not_before() {
    let s = Scenario::start("s4", 4).await;
    let (api, mut a, mut b) = a_draining_for_b(&s).await;
    a.beat(&api, RevokeState::Draining).await.unwrap();
    let drained: BTreeSet<ShardId> = a.revoking.clone();
    // a goes silent while draining (its process hangs or dies).
    let a_lease_end = member(&s.describe().await, "a").unwrap().lease_until_ms;

    let b = tokio::sync::Mutex::new(&mut b);
    let handed_over_at = test_support::poll_every(Duration::from_millis(100), DEADLINE, || async {
        let r = b.lock().await.ok(&api).await;
        let answered_by = redis_now_ms(&s).await;
        if drained.iter().all(|s| r.assigned.contains(s)) {
            return Some(answered_by);
        }
        assert!(drained.iter().all(|s| r.pending.contains(s)), "{r:?}");
        None
    })
    .await;
    let at = handed_over_at.expect("b never got a's shards");
    assert!(
        at >= a_lease_end,
        "b got the shards at {at}, before a's lease ended at {a_lease_end}"
    );
    let g = s.describe().await;
    assert!(member(&g, "a").is_none(), "a expired: {g:#?}");
    assert_no_split(&g);
}

// ---- level 3 ---------------------------------------------------------------------------------------------------

/// Publishes one record per key `key-0..key-<n>` and waits until a holds an entry of every shard in its handler.
async fn fill_every_shard(s: &Scenario, history: &History, a: &stream_consumer::ConsumerHandle) {
    let producer = s.producer().build().unwrap();
    publish(&producer, history, 0, 16, 16).await;
    let shards = s.shards as usize;
    wait_status(a, DEADLINE, "a holds an entry of every shard", |st| {
        st.in_flight.len() == shards
    })
    .await;
    producer.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed1_consumer_whose_drain_answer_was_lost_gets_it_again_and_hands_over() {
    let s = Scenario::start("s1e2e", 4).await;
    let history = History::new();
    let gate = Gate::closed();
    let a = s.spawn_gated("a", &history, &gate);
    wait_status(&a, DEADLINE, "a reads every shard", |st| st.reading.len() == 4).await;
    fill_every_shard(&s, &history, &a).await;

    let b = s.spawn_consumer("b", &history);
    test_support::wait_until(DEADLINE, "b to be recorded with pending shards", || async {
        s.describe()
            .await
            .members
            .iter()
            .any(|m| m.member_id.as_str() == "b" && m.pending.len() == 2)
    })
    .await;
    // a cannot finish draining (its handlers hang), so each of its answers carries DRAIN: lose one.
    let lose = Trigger::once(s.coordinator(), Point::AfterWrite, Action::Fail, on::renews("a"));
    lose.fired().await;
    wait_status(&a, DEADLINE, "a drains two shards", |st| st.revoking.len() == 2).await;
    assert!(a.status().heartbeats.failed >= 1);

    gate.set(true);
    wait_status(&b, DEADLINE, "b reads the drained shards", |st| st.reading.len() == 2).await;
    wait_all_handled(&history, DEADLINE).await;
    history.assert_holds();
    assert_no_split(&s.describe().await);
    a.close().await.unwrap();
    b.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed2_consumer_told_to_drain_never_resumes_the_shard_while_no_coordinator_answers() {
    let mut s = Scenario::start("s2e2e", 4).await;
    let history = History::new();
    let gate = Gate::closed();
    let a = s.spawn_gated("a", &history, &gate);
    wait_status(&a, DEADLINE, "a reads every shard", |st| st.reading.len() == 4).await;
    fill_every_shard(&s, &history, &a).await;
    let b = s.spawn_consumer("b", &history);
    let st = wait_status(&a, DEADLINE, "a told to drain two shards", |st| st.revoking.len() == 2).await;
    let drained = shard_set(&st.revoking);
    let told = Instant::now();

    s.coords[0].abort();
    gate.set(true);
    // Through the outage, until a's lease ran out: the drained shards never come back to a.
    let mut rx = a.watch_status();
    tokio::time::timeout(DEADLINE, async {
        loop {
            {
                let st = rx.borrow_and_update();
                assert!(
                    shard_set(&st.reading).is_disjoint(&drained),
                    "a resumed a drained shard: {st:?}"
                );
                if st.heartbeats.lease_expiries >= 1 {
                    break;
                }
            }
            rx.changed().await.unwrap();
        }
    })
    .await
    .expect("a's lease runs out during the outage");
    assert!(
        b.status().reading.is_empty(),
        "b got nothing while the drain was unconfirmed"
    );

    s.coords[0].restart().await;
    wait_status(&b, DEADLINE, "b reads the drained shards", |st| {
        shard_set(&st.reading) == drained
    })
    .await;
    let late: Vec<_> = history
        .of_member_since("a", told)
        .into_iter()
        .filter(|h| drained.contains(&h.shard) && h.delivery == 1)
        .collect();
    assert!(late.is_empty(), "a started new entries of drained shards: {late:?}");
    wait_all_handled(&history, DEADLINE).await;
    history.assert_holds();
    a.close().await.unwrap();
    b.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed3_consumer_whose_revoked_answer_was_lost_still_hands_the_shard_over() {
    let s = Scenario::start("s3e2e", 4).await;
    let history = History::new();
    let producer = std::sync::Arc::new(s.producer().build().unwrap());
    let publisher = Publisher::spawn(producer.clone(), &history, Duration::from_millis(10), 8);
    let a = s.spawn_consumer("a", &history);
    wait_status(&a, DEADLINE, "a reads every shard", |st| st.reading.len() == 4).await;

    let lose = Trigger::once(s.coordinator(), Point::AfterWrite, Action::Fail, on::released_by("a"));
    let b = s.spawn_consumer("b", &history);
    lose.fired().await;
    wait_status(&b, DEADLINE, "b reads its half", |st| st.reading.len() == 2).await;
    wait_status(&a, DEADLINE, "a keeps its half", |st| {
        st.reading.len() == 2 && st.revoking.is_empty()
    })
    .await;
    let outcomes = publisher.stop().await;
    assert!(outcomes.written > 0);
    wait_all_handled(&history, DEADLINE).await;
    history.assert_holds();
    assert_no_split(&s.describe().await);
    a.close().await.unwrap();
    b.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed4_consumer_dying_while_draining_hands_over_only_after_its_lease() {
    let s = Scenario::start("s4e2e", 4).await;
    let history = History::new();
    let gate = Gate::closed();
    let a = s.spawn_gated("a", &history, &gate);
    wait_status(&a, DEADLINE, "a reads every shard", |st| st.reading.len() == 4).await;
    fill_every_shard(&s, &history, &a).await;
    let b = s.spawn_consumer("b", &history);
    let st = wait_status(&a, DEADLINE, "a told to drain two shards", |st| st.revoking.len() == 2).await;
    let drained = shard_set(&st.revoking);

    // a dies mid-drain: its handlers never finish, nothing is reported.
    let a_lease = a.status().lease_expires_at.expect("a holds a lease");
    a.abort().await;
    gate.set(true);
    wait_status(&b, DEADLINE, "b reads the drained shards", |st| {
        drained.is_subset(&shard_set(&st.reading))
    })
    .await;
    // a's in-flight entries of the drained shards are re-delivered to b.
    wait_all_handled(&history, DEADLINE).await;
    let first = history
        .handled()
        .into_iter()
        .filter(|h| h.member == "b" && drained.contains(&h.shard))
        .map(|h| h.started)
        .min()
        .expect("b handled the drained shards");
    assert!(
        first >= a_lease,
        "b started {:?} before a's lease ended",
        a_lease - first
    );
    history.assert_holds();
    b.close().await.unwrap();
}
