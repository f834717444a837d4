//! Write boundaries: for each workflow, the coordinator is killed just before and just after its metadata write
//! (a [`coord_server::fault`] hook makes the section hang there, then the instance is aborted and a new one starts
//! on the same URL), and the client's retry converges to the state a fault-free run records, with no shard
//! readable by two members.
//!
//! Before the write Redis holds the old state plus the dead section's mutex (until its TTL); after it, the new
//! state. docs/failure-handling.md "Generic Failure Checkpoints" lists what each retry gets.

mod common;

use common::*;
use coord_server::fault::Point;
use protocol::messages::RevokeState;
use protocol::Status;
use reqwest::StatusCode;
use std::collections::BTreeSet;
use std::time::Duration;

/// Heartbeats every member in turn (acknowledging drains) until `done` holds for the stored group.
async fn settle(
    s: &Scenario,
    members: &mut [&mut WireMember],
    what: &str,
    done: impl Fn(&protocol::messages::GroupDescription) -> bool,
) {
    let members = tokio::sync::Mutex::new(members);
    let last = std::sync::Mutex::new(None);
    let converged = test_support::poll_every(Duration::from_millis(100), DEADLINE, || async {
        for m in members.lock().await.iter_mut() {
            m.ok_retrying(&s.api()).await;
        }
        let g = s.describe().await;
        assert_no_split(&g);
        let converged = done(&g);
        *last.lock().unwrap() = Some(g);
        converged.then_some(())
    })
    .await;
    assert!(
        converged.is_some(),
        "timed out waiting for {what}: {:#?}",
        last.lock().unwrap()
    );
    // One more answer each, so every member has applied the converged state.
    for m in members.into_inner().iter_mut() {
        m.ok_retrying(&s.api()).await;
    }
}

/// Every shard owned by its target, and every member reads exactly what it owns.
fn converged(g: &protocol::messages::GroupDescription) -> bool {
    g.shards.iter().all(|s| s.owner.is_some() && s.owner == s.target)
        && g.members.iter().all(|m| m.pending.is_empty() && m.revoke.is_empty())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_killed_before_or_after_its_write_converges_on_the_retry() {
    let mut s = Scenario::start("wb-join", 4).await;
    let empty = s.describe().await;

    // Before: nothing recorded; the retry (after the dead section's mutex expired) writes the join.
    let mut a = WireMember::new("a");
    let fut = send_heartbeat(&s.api(), a.request(RevokeState::Revoked));
    crash_at(&mut s, 0, Point::BeforeWrite, on::joined("a"), fut).await;
    let g = s.describe().await;
    assert!(g.members.is_empty() && g.revision == empty.revision, "{g:#?}");
    let r = a.ok_retrying(&s.api()).await;
    assert_eq!((r.status, r.assigned.len()), (Status::Ok, 4), "{r:?}");

    // After: the join is recorded; the retry from the same instance is answered from the record, without a write.
    let mut b = WireMember::new("b");
    let fut = send_heartbeat(&s.api(), b.request(RevokeState::Revoked));
    crash_at(&mut s, 0, Point::AfterWrite, on::joined("b"), fut).await;
    let g = s.describe().await;
    let recorded = member(&g, "b").expect("b's join is recorded").clone();
    let r = b.ok_retrying(&s.api()).await;
    assert_eq!(r.member_epoch, recorded.epoch);
    assert_eq!(
        (r.assigned.clone(), r.pending.clone()),
        (recorded.assigned, recorded.pending)
    );
    assert_eq!(
        s.describe().await.revision,
        g.revision,
        "the retry wrote no second join"
    );
    settle(&s, &mut [&mut a, &mut b], "a and b to share the shards", converged).await;
    assert_no_two_readers(&[&a, &b]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebalance_drain_killed_before_or_after_its_write_converges_on_the_retry() {
    let mut s = Scenario::start("wb-drain", 6).await;
    let mut a = WireMember::new("a");
    a.ok(&s.api()).await;

    // Before: the retarget (W1) is not recorded, so a is not asked to drain; b's retry records it.
    let mut b = WireMember::new("b");
    let fut = send_heartbeat(&s.api(), b.request(RevokeState::Revoked));
    crash_at(&mut s, 0, Point::BeforeWrite, on::joined("b"), fut).await;
    let r = a.ok_retrying(&s.api()).await;
    assert!(r.revoke.is_empty() && r.assigned.len() == 6, "{r:?}");
    let r = b.ok_retrying(&s.api()).await;
    assert_eq!(r.pending.len(), 3, "{r:?}");
    let r = a.beat(&s.api(), RevokeState::Draining).await.unwrap();
    assert_eq!(r.revoke.len(), 3, "the DRAIN is recorded now: {r:?}");
    settle(&s, &mut [&mut a, &mut b], "a and b to share the shards", converged).await;

    // After: c's join retargets shards of a and b; the DRAIN is recorded although c never got its answer.
    let mut c = WireMember::new("c");
    let fut = send_heartbeat(&s.api(), c.request(RevokeState::Revoked));
    crash_at(&mut s, 0, Point::AfterWrite, on::joined("c"), fut).await;
    let g = s.describe().await;
    let moving: usize = g.members.iter().map(|m| m.revoke.len()).sum();
    assert_eq!(moving, 2, "a and b are told to drain c's shards: {g:#?}");
    let ra = a.beat(&s.api(), RevokeState::Draining).await.unwrap();
    let rb = b.beat(&s.api(), RevokeState::Draining).await.unwrap();
    assert_eq!(ra.revoke.len() + rb.revoke.len(), 2, "{ra:?} {rb:?}");
    settle(
        &s,
        &mut [&mut a, &mut b, &mut c],
        "three members to share the shards",
        |g| converged(g) && g.members.iter().all(|m| m.assigned.len() == 2),
    )
    .await;
    assert_no_two_readers(&[&a, &b, &c]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoke_ack_killed_before_or_after_its_write_converges_on_the_retry() {
    let mut s = Scenario::start("wb-ack", 6).await;
    let (mut a, mut b) = (WireMember::new("a"), WireMember::new("b"));
    a.ok(&s.api()).await;
    b.ok(&s.api()).await;
    a.beat(&s.api(), RevokeState::Draining).await.unwrap();
    let drained = a.revoking.clone();

    // Before: the release is not recorded; b keeps waiting; a's retried ack releases.
    let fut = send_heartbeat(&s.api(), a.request(RevokeState::Revoked));
    crash_at(&mut s, 0, Point::BeforeWrite, on::released_by("a"), fut).await;
    let g = s.describe().await;
    assert!(drained
        .iter()
        .all(|sh| g.shards[sh.index()].owner.as_ref().map(|m| m.as_str()) == Some("a")));
    let r = b.ok_retrying(&s.api()).await;
    assert!(drained.iter().all(|sh| r.pending.contains(sh)), "{r:?}");
    a.ok_retrying(&s.api()).await;
    let r = b.ok(&s.api()).await;
    assert!(drained.iter().all(|sh| r.assigned.contains(sh)), "{r:?}");

    // After: c joins; the member told to drain acks, the release is recorded, its answer is lost.
    let mut c = WireMember::new("c");
    c.ok(&s.api()).await;
    a.beat(&s.api(), RevokeState::Draining).await.unwrap();
    b.beat(&s.api(), RevokeState::Draining).await.unwrap();
    let (x, name) = if a.revoking.is_empty() {
        (&mut b, "b")
    } else {
        (&mut a, "a")
    };
    let ack = x.request(RevokeState::Revoked);
    let fut = send_heartbeat(&s.api(), ack.clone());
    crash_at(&mut s, 0, Point::AfterWrite, on::released_by(name), fut).await;
    let g = s.describe().await;
    let r = c.ok_retrying(&s.api()).await;
    assert!(!r.assigned.is_empty(), "c gets the released shard at once: {r:?}");
    let retry = s.api().hb(&ack).await;
    x.apply(&retry, RevokeState::Revoked);
    assert!(
        x.revoking.is_empty(),
        "the duplicate ack is answered from the record: {retry:?}"
    );
    assert_eq!(
        s.describe().await.revision,
        g.revision,
        "the duplicate ack changed nothing"
    );
    settle(
        &s,
        &mut [&mut a, &mut b, &mut c],
        "three members to share the shards",
        |g| converged(g) && g.members.iter().all(|m| m.assigned.len() == 2),
    )
    .await;
    assert_no_two_readers(&[&a, &b, &c]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_killed_before_or_after_its_write_converges_on_the_next_tick() {
    let mut s = Scenario::start("wb-expiry", 4).await;
    let (mut a, mut b) = (WireMember::new("a"), WireMember::new("b"));
    a.ok(&s.api()).await;
    b.ok(&s.api()).await;
    settle(&s, &mut [&mut a, &mut b], "a and b to share the shards", converged).await;

    // b goes silent. Before: its expiry is not recorded; the new coordinator expires it (after its start-up
    // grace) while a keeps heartbeating.
    let keep_a = keep_alive(&s.api(), &a);
    crash_at(&mut s, 0, Point::BeforeWrite, on::expired("b"), async {}).await;
    keep_a.abort();
    assert!(
        member(&s.describe().await, "b").is_some(),
        "b's expiry was not recorded"
    );
    settle(&s, &mut [&mut a], "b to expire under the new coordinator", |g| {
        member(g, "b").is_none() && converged(g)
    })
    .await;
    assert_eq!(a.reading.len(), 4);

    // After: c joins, takes its half, goes silent; its expiry is recorded and the coordinator dies at once.
    let mut c = WireMember::new("c");
    c.ok(&s.api()).await;
    settle(&s, &mut [&mut a, &mut c], "a and c to share the shards", converged).await;
    let keep_a = keep_alive(&s.api(), &a);
    crash_at(&mut s, 0, Point::AfterWrite, on::expired("c"), async {}).await;
    keep_a.abort();
    let g = s.describe().await;
    assert!(member(&g, "c").is_none(), "c's expiry is recorded: {g:#?}");
    let r = c.beat(&s.api(), RevokeState::Revoked).await;
    assert!(
        matches!(&r, Err((_, e)) if e.status == Status::UnknownMember),
        "c learns it is gone: {r:?}"
    );
    settle(&s, &mut [&mut a], "a to own every shard", |g| {
        converged(g) && g.members.len() == 1
    })
    .await;
    assert_eq!(a.reading.len(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn correction_round_killed_before_or_after_its_writes_converges() {
    let mut s = Scenario::start("wb-round", 4).await;
    let mut a = WireMember::new("a");
    a.ok(&s.api()).await;
    let pattern = s.group_state_pattern();

    // Redis falls back from N to N-1 under a's feet.
    let snap = s.redis.snapshot_keys(&pattern).await;
    let mut b = WireMember::new("b");
    b.ok(&s.api()).await;
    a.ok(&s.api()).await;
    let n = a.version;

    // Opening, before: no round recorded; the retried high-version heartbeat opens it and gets SYNC_METADATA.
    // (Armed before the fall-back: the coordinator's own tick may be the first to notice it.)
    let armed = arm_crash(&s, 0, Point::BeforeWrite, on::correction_opened());
    s.redis.restore_snapshot(&snap).await;
    let task = tokio::spawn(send_heartbeat(&s.api(), a.request(RevokeState::Revoked)));
    crash_when_fired(&mut s, 0, armed, task).await;
    assert!(s.describe().await.correction.is_none(), "the round was not recorded");
    let r = a.ok_retrying(&s.api()).await;
    assert_eq!(r.status, Status::SyncMetadata, "{r:?}");
    assert!(r.metadata_version < n);

    // Closing, before: the round stays open in Redis; the next section closes it and a gets OK.
    let r = a.ok(&s.api()).await;
    assert_eq!(r.status, Status::RevokePending, "{r:?}");
    let keep_a = keep_alive(&s.api(), &a);
    crash_at(&mut s, 0, Point::BeforeWrite, on::correction_closed(), async {}).await;
    keep_a.abort();
    assert!(s.describe().await.correction.is_some(), "the close was not recorded");
    settle(&s, &mut [&mut a], "the round to close", |g| g.correction.is_none()).await;
    let r = a.ok(&s.api()).await;
    assert_eq!(r.status, Status::Ok);
    assert!(
        r.metadata_version > n,
        "the version moved past every reported one: {r:?}"
    );

    // A second fall-back. Opening, after: the round is recorded, the SYNC_METADATA answer is lost; the retry
    // gets the same SYNC_METADATA.
    let snap = s.redis.snapshot_keys(&pattern).await;
    let mut c = WireMember::new("c");
    c.ok(&s.api()).await;
    a.ok(&s.api()).await;
    let armed = arm_crash(&s, 0, Point::AfterWrite, on::correction_opened());
    s.redis.restore_snapshot(&snap).await;
    let req = a.request(RevokeState::Revoked);
    let task = tokio::spawn(send_heartbeat(&s.api(), req.clone()));
    crash_when_fired(&mut s, 0, armed, task).await;
    let g = s.describe().await;
    assert!(g.correction.is_some(), "the round is recorded: {g:#?}");
    let r = s.api().hb_retrying(&req).await.unwrap();
    assert_eq!(
        (r.status, r.metadata_version),
        (Status::SyncMetadata, g.metadata_version),
        "{r:?}"
    );
    a.apply(&r, RevokeState::Revoked);

    // Closing, after: the close is recorded; a's next heartbeat gets OK.
    let r = a.ok(&s.api()).await;
    assert_eq!(r.status, Status::RevokePending, "{r:?}");
    let keep_a = keep_alive(&s.api(), &a);
    crash_at(&mut s, 0, Point::AfterWrite, on::correction_closed(), async {}).await;
    keep_a.abort();
    assert!(s.describe().await.correction.is_none(), "the close is recorded");
    let r = a.ok_retrying(&s.api()).await;
    assert_eq!((r.status, r.assigned.len()), (Status::Ok, 4), "{r:?}");
    assert_no_split(&s.describe().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_shards_killed_before_or_after_the_groups_adoption_converges() {
    let mut s = Scenario::start("wb-shards", 2).await;
    let mut a = WireMember::new("a");
    a.ok(&s.api()).await;

    // The group's adoption (a tick), before: not recorded by the dead coordinator; the next one adopts.
    let grow = {
        let api = s.api();
        async move {
            let _ = api.add_shards(2, None).await;
        }
    };
    crash_at(&mut s, 0, Point::BeforeWrite, on::routing_adopted(), grow).await;
    settle(&s, &mut [&mut a], "the group to adopt 4 shards", |g| {
        g.shard_count == 4 && converged(g)
    })
    .await;
    assert_eq!(a.reading.len(), 4);

    // After: the routing write and the group's adoption are recorded, and the coordinator dies before answering
    // the add-shards request. Its retry with the same If-Match is refused instead of adding the shards again, and
    // the new coordinator serves the grown group at once.
    let routing = s.api().describe_routing().await.unwrap();
    let grow = {
        let api = s.api();
        async move {
            let _ = api.add_shards(2, Some(routing.revision.0)).await;
        }
    };
    crash_at(&mut s, 0, Point::AfterWrite, on::routing_adopted(), grow).await;
    let (status, body) = s.api().add_shards(2, Some(routing.revision.0)).await.unwrap_err();
    assert_eq!(
        (status, body.status),
        (StatusCode::PRECONDITION_FAILED, Status::RevisionConflict)
    );
    assert_eq!(s.api().describe_routing().await.unwrap().shard_count, 6, "added once");
    assert_eq!(s.describe().await.shard_count, 6, "the adoption is recorded");
    // The new shards are held until the new coordinator's tick observed the (empty) old ones drained.
    let member = tokio::sync::Mutex::new(&mut a);
    let last = std::sync::Mutex::new(None);
    test_support::poll_every(HEARTBEAT, DEADLINE, || async {
        let mut a = member.lock().await;
        let r = a.ok_retrying(&s.api()).await;
        *last.lock().unwrap() = Some(r);
        (a.reading.len() == 6).then_some(())
    })
    .await;
    let r = last.into_inner().unwrap().expect("at least one answer");
    assert_eq!(r.shard_count, 6);
    assert_eq!(a.reading.len(), 6, "{r:?}");
    assert_no_split(&s.describe().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_fence_killed_before_or_after_its_write_converges_on_the_retry() {
    let mut s = Scenario::start("wb-fence", 4).await;
    let (mut a, mut b) = (WireMember::new("a"), WireMember::new("b"));
    a.ok(&s.api()).await;
    b.ok(&s.api()).await;
    settle(&s, &mut [&mut a, &mut b], "a and b to share the shards", converged).await;

    // Before: not fenced; the retry with the same If-Match fences.
    let rev = s.describe().await.revision.0;
    let fence = {
        let api = s.api();
        async move {
            let _ = api.fence("b", Some(rev)).await;
        }
    };
    crash_at(&mut s, 0, Point::BeforeWrite, on::fenced("b"), fence).await;
    let g = s.describe().await;
    assert!(!member(&g, "b").unwrap().fenced && g.revision.0 == rev, "{g:#?}");
    let api = s.api();
    let g = wait_for_ok(|| api.fence("b", Some(rev))).await;
    assert!(member(&g, "b").unwrap().fenced);

    // After: fenced and recorded; the retry with the old If-Match is refused (never overwrites), and an
    // unconditional retry changes nothing.
    let rev = g.revision.0;
    let fence = {
        let api = s.api();
        async move {
            let _ = api.fence("a", Some(rev)).await;
        }
    };
    crash_at(&mut s, 0, Point::AfterWrite, on::fenced("a"), fence).await;
    let g = s.describe().await;
    assert!(member(&g, "a").unwrap().fenced, "{g:#?}");
    let (status, body) = s.api().fence("a", Some(rev)).await.unwrap_err();
    assert_eq!(
        (status, body.status),
        (StatusCode::PRECONDITION_FAILED, Status::RevisionConflict)
    );
    let api = s.api();
    let again = wait_for_ok(|| api.fence("a", None)).await;
    assert_eq!(again.revision, g.revision, "fencing a fenced member changes nothing");
    assert_no_split(&again);
    let owners: BTreeSet<_> = owners(&again).into_iter().flatten().collect();
    assert!(
        owners.is_subset(&["a".to_owned(), "b".to_owned()].into()),
        "shards stay with their fenced owners until their leases end"
    );
}

/// Retries an admin call while it answers a retryable 503 (the dead section's mutex).
async fn wait_for_ok<T, F, Fut>(f: F) -> T
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, Refusal>>,
{
    test_support::wait_for(DEADLINE, "the admin call to pass the dead section's mutex", || {
        let call = f();
        async move {
            match call.await {
                Ok(v) => Some(v),
                Err((StatusCode::SERVICE_UNAVAILABLE, _)) => None,
                Err(e) => panic!("admin call refused: {e:?}"),
            }
        }
    })
    .await
}
