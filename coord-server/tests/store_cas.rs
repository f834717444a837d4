//! The revision compare-and-set protects a decision even when its writer outlived its mutex (a stalled
//! coordinator): the late commit is refused, nothing of it is written, and the coordinator's retry decides again
//! from the newer state.

use coord_server::store::{Committed, FieldWrite, LivenessScope, SectionKeys, Store, Write};
use coord_server::{Config, Coordinator};
use protocol::messages::{CreateGroupRequest, HeartbeatRequest};
use protocol::names::{GroupName, MemberId, StreamName};
use protocol::{MemberEpoch, MetadataVersion, Status};
use std::time::Duration;
use test_support::RedisServer;

fn join(member: &str) -> HeartbeatRequest {
    HeartbeatRequest {
        member_id: MemberId::new(member).unwrap(),
        instance_id: format!("{member}-i"),
        incarnation: protocol::Incarnation::NONE,
        member_epoch: MemberEpoch::JOIN,
        metadata_version: MetadataVersion(0),
        max_observed_version: MetadataVersion(0),
        owned: vec![],
        revoking: vec![],
        max_routing_version: protocol::RoutingVersion(0),
        max_shard_count: 0,
    }
}

#[tokio::test]
async fn a_writer_that_outlived_its_mutex_loses_the_compare_and_set() {
    let redis = RedisServer::start().await;
    let (stream, group) = (StreamName::new("s").unwrap(), GroupName::new("g").unwrap());
    let coordinator = Coordinator::connect(Config::new(redis.url())).await.unwrap();
    coordinator
        .create_group(
            &stream,
            &group,
            &CreateGroupRequest {
                shard_count: Some(2),
                timings: None,
            },
        )
        .await
        .unwrap();
    let store = Store::new(redis.connection_manager().await);
    let keys = SectionKeys::group(&stream, &group);

    // A stalled writer loads (taking the mutex) ...
    let stalled = store
        .try_load(&keys, "stalled", Duration::from_secs(2), None, LivenessScope::None)
        .await
        .unwrap();
    let stalled = stalled.expect("mutex free");
    // ... its mutex expires (simulated), and a live coordinator commits a join in the meantime.
    let mut conn = redis.connection().await;
    let _: () = redis::cmd("DEL").arg(&keys.mutex).query_async(&mut conn).await.unwrap();
    let joined = coordinator.heartbeat(&stream, &group, &join("a")).await.unwrap();
    assert_eq!(joined.status, Status::Ok);

    // The stalled writer's commit is refused and writes nothing.
    let fields = FieldWrite {
        changes: vec![("m:stale".into(), Some("{\"stale\":true}".into()), String::new())],
        converts: String::new(),
    };
    let write = Write {
        fields: Some(&fields),
        now_ms: stalled.now_ms,
        run_id: &stalled.run_id,
        ..Write::default()
    };
    let outcome = store
        .commit(&keys, "stalled", stalled.revision, stalled.liveness_revision, &write)
        .await
        .unwrap();
    assert_eq!(outcome, Committed::Conflict);
    let description = coordinator.describe_group(&stream, &group).await.unwrap();
    assert_eq!(description.members.len(), 1, "the join survived the late writer");

    // A renewal decided before a concurrent aggregate write is refused too: it read an older revision.
    let before = store
        .try_load(&keys, "renewer", Duration::from_secs(2), None, LivenessScope::None)
        .await
        .unwrap()
        .unwrap();
    let _: () = redis::cmd("DEL").arg(&keys.mutex).query_async(&mut conn).await.unwrap();
    coordinator.heartbeat(&stream, &group, &join("b")).await.unwrap();
    let renewals = [(MemberId::new("a").unwrap(), u64::MAX / 2)];
    let renew = Write {
        renew: &renewals,
        now_ms: before.now_ms,
        run_id: &before.run_id,
        ..Write::default()
    };
    let outcome = store
        .commit(&keys, "renewer", before.revision, before.liveness_revision, &renew)
        .await
        .unwrap();
    assert_eq!(
        outcome,
        Committed::Conflict,
        "a renewal based on an old revision could undo an expiry"
    );

    // The coordinator itself retries after a conflict rather than failing: its next heartbeat succeeds.
    let again = coordinator.heartbeat(&stream, &group, &join("a")).await.unwrap();
    assert_eq!(again.status, Status::Ok);
}

/// Issue 30 (the routing model checker's defect 1): a decision loaded from one server is never committed to
/// another. Across a failover between a section's load and its commit the revision can still match while what
/// the section wrote before its commit (a growth's seals and records) was lost; here the server restarts from its
/// append-only file between the two (same data, new run id). The commit is a conflict, nothing is written, and the
/// coordinator's own next decision, loaded again, goes through.
#[tokio::test]
async fn a_decision_loaded_from_another_server_is_a_conflict() {
    let mut redis = RedisServer::builder().persistence(true).start().await;
    let (stream, group) = (StreamName::new("s").unwrap(), GroupName::new("g").unwrap());
    let coordinator = Coordinator::connect(Config::new(redis.url())).await.unwrap();
    coordinator
        .create_group(
            &stream,
            &group,
            &CreateGroupRequest {
                shard_count: Some(2),
                timings: None,
            },
        )
        .await
        .unwrap();
    let store = Store::new(redis.connection_manager().await);
    let keys = SectionKeys::group(&stream, &group);
    let loaded = store
        .try_load(
            &keys,
            "before-restart",
            Duration::from_secs(30),
            None,
            LivenessScope::None,
        )
        .await
        .unwrap()
        .expect("mutex free");
    redis.restart().await;
    let fields = FieldWrite {
        changes: vec![("m:stale".into(), Some("{}".into()), String::new())],
        converts: String::new(),
    };
    let write = Write {
        fields: Some(&fields),
        now_ms: loaded.now_ms,
        run_id: &loaded.run_id,
        ..Write::default()
    };
    let outcome = test_support::wait_for(
        Duration::from_secs(10),
        "the commit to reach the restarted server",
        || {
            let (store, keys, write) = (&store, &keys, &write);
            let loaded = &loaded;
            async move {
                store
                    .commit(keys, "before-restart", loaded.revision, loaded.liveness_revision, write)
                    .await
                    .ok()
            }
        },
    )
    .await;
    assert_eq!(outcome, Committed::Conflict, "same revision, another server");
    let description = test_support::wait_for(Duration::from_secs(10), "a describe", || async {
        coordinator.describe_group(&stream, &group).await.ok()
    })
    .await;
    assert_eq!(description.shards.len(), 2, "the stored group is intact");
    let joined = test_support::wait_for(Duration::from_secs(10), "a join after the restart", || async {
        coordinator.heartbeat(&stream, &group, &join("a")).await.ok()
    })
    .await;
    // Answered: in the correction round a new run id opens, so REVOKE_PENDING, not an error.
    assert!(
        matches!(joined.status, Status::Ok | Status::RevokePending),
        "{joined:?}"
    );
}
