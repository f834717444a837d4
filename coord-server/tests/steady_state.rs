//! The cost of the steady state, measured on a real redis-server with `INFO commandstats`: a no-change heartbeat
//! is two round trips (the LOAD and COMMIT scripts), writes no aggregate and leaves the revision alone.

use coord_server::{Config, Coordinator};
use protocol::messages::{CreateGroupRequest, HeartbeatRequest};
use protocol::metadata::GroupTimings;
use protocol::names::{GroupName, MemberId, StreamName};
use protocol::{MemberEpoch, MetadataVersion, Status};
use std::collections::BTreeMap;
use test_support::RedisServer;

async fn commandstats(server: &RedisServer) -> BTreeMap<String, u64> {
    let info = server.info("commandstats").await;
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest.split(',').find_map(|kv| kv.strip_prefix("calls="))?.parse().ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

#[tokio::test]
async fn no_change_heartbeat_is_two_round_trips_and_writes_no_aggregate() {
    let server = RedisServer::start().await;
    let coordinator = Coordinator::connect(Config::new(server.url())).await.unwrap();
    let (stream, group) = (StreamName::new("orders").unwrap(), GroupName::new("billing").unwrap());
    let timings = GroupTimings {
        member_ttl_ms: 60_000,
        heartbeat_interval_ms: 1_000,
        rebalance_timeout_ms: 60_000,
        assignment_lease_ms: 50_000,
    };
    coordinator
        .create_group(
            &stream,
            &group,
            &CreateGroupRequest {
                shard_count: Some(64),
                timings: Some(timings),
            },
        )
        .await
        .unwrap();
    let mut req = HeartbeatRequest {
        member_id: MemberId::new("m1").unwrap(),
        instance_id: "i1".into(),
        incarnation: protocol::Incarnation::NONE,
        member_epoch: MemberEpoch::JOIN,
        metadata_version: MetadataVersion(0),
        max_observed_version: MetadataVersion(0),
        owned: vec![],
        revoking: vec![],
        max_routing_version: protocol::RoutingVersion(0),
        max_shard_count: 0,
    };
    let joined = coordinator.heartbeat(&stream, &group, &req).await.unwrap();
    assert_eq!(joined.status, Status::Ok);
    assert_eq!(joined.assigned.len(), 64);
    req.incarnation = joined.incarnation;
    req.member_epoch = joined.member_epoch;
    req.metadata_version = joined.metadata_version;
    req.max_observed_version = joined.metadata_version;
    req.owned = joined.assigned.clone();
    // Warm the cache (first sight) and the script cache.
    coordinator.heartbeat(&stream, &group, &req).await.unwrap();
    let revision_before = coordinator.describe_group(&stream, &group).await.unwrap().revision;

    let before = commandstats(&server).await;
    const N: u64 = 50;
    for _ in 0..N {
        let r = coordinator.heartbeat(&stream, &group, &req).await.unwrap();
        assert_eq!(
            r.metadata_version, joined.metadata_version,
            "no metadata change in the steady state"
        );
        assert_eq!(r.assigned, joined.assigned);
    }
    let after = commandstats(&server).await;
    let delta = |name: &str| after.get(name).copied().unwrap_or(0) - before.get(name).copied().unwrap_or(0);

    // Round trips: the client sends only EVALSHA (LOAD, COMMIT); every other command runs inside the scripts.
    assert_eq!(delta("evalsha"), 2 * N, "LOAD + COMMIT per heartbeat");
    assert_eq!(delta("eval") + delta("script"), 0, "scripts stay cached");
    // At most one liveness HSET per heartbeat (none when the lease end did not move within the millisecond).
    assert!(delta("hset") <= N, "hset calls: {}", delta("hset"));
    let revision_after = coordinator.describe_group(&stream, &group).await.unwrap().revision;
    assert_eq!(
        revision_before, revision_after,
        "no aggregate write: the revision did not move"
    );
    println!(
        "commandstats deltas over {N} no-change heartbeats: {:?}",
        after
            .iter()
            .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
            .filter(|(_, d)| *d > 0)
            .collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_heartbeats_share_critical_sections() {
    use coord_server::stats::Stats;
    let server = RedisServer::start().await;
    let coordinator = Coordinator::connect(Config::new(server.url())).await.unwrap();
    let (stream, group) = (StreamName::new("orders").unwrap(), GroupName::new("billing").unwrap());
    coordinator
        .create_group(
            &stream,
            &group,
            &CreateGroupRequest {
                shard_count: Some(256),
                timings: None,
            },
        )
        .await
        .unwrap();
    const N: usize = 200;
    let joins = (0..N).map(|i| {
        let (c, s, g) = (coordinator.clone(), stream.clone(), group.clone());
        tokio::spawn(async move {
            let req = HeartbeatRequest {
                member_id: MemberId::new(format!("m{i}")).unwrap(),
                instance_id: format!("i{i}"),
                incarnation: protocol::Incarnation::NONE,
                member_epoch: MemberEpoch::JOIN,
                metadata_version: MetadataVersion(0),
                max_observed_version: MetadataVersion(0),
                owned: vec![],
                revoking: vec![],
                max_routing_version: protocol::RoutingVersion(0),
                max_shard_count: 0,
            };
            c.heartbeat(&s, &g, &req).await
        })
    });
    let before = commandstats(&server).await;
    let answers = futures::future::join_all(joins).await;
    let after = commandstats(&server).await;
    for a in answers {
        assert_eq!(a.unwrap().unwrap().status, Status::Ok);
    }
    let d = coordinator.describe_group(&stream, &group).await.unwrap();
    assert_eq!(d.members.len(), N, "every join was recorded");
    let mut targets: Vec<_> = d.shards.iter().filter_map(|s| s.target.clone()).collect();
    targets.sort();
    targets.dedup();
    assert_eq!(targets.len(), N, "the batch's final assignment covers every member");
    let batches = Stats::get(&coordinator.stats().heartbeat_batches);
    let batched = Stats::get(&coordinator.stats().heartbeats_batched);
    assert_eq!(batched, N as u64);
    assert!(
        batches < N as u64,
        "{batches} sections for {N} concurrent joins: no batching happened"
    );
    let evalsha = after.get("evalsha").copied().unwrap_or(0) - before.get("evalsha").copied().unwrap_or(0);
    assert_eq!(evalsha, 2 * batches, "one LOAD and one COMMIT per batch");
    println!("{N} concurrent joins in {batches} critical sections");
}
