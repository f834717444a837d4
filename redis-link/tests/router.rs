//! [`ClusterRouter`] against a local 3-master cluster of real redis-server processes: a pipeline's commands
//! follow their own redirects (and run once), an unreachable node is retried elsewhere, questions for every
//! master, reads over many slots, and the route of a blocking read.

use std::time::Duration;

use redis::{AsyncConnectionConfig, Cmd, RedisResult, Value};
use redis_link::{
    ClusterRouter, CommandOutcome, KeyRoute, NodeAddr, NodeRequest, Nodes, PipelineDriver, Redirect, Resends,
    RetryPolicy, Route, SendError, TopologyError,
};
use test_support::cluster::{key_slot, RedisCluster};

fn router(cluster: &RedisCluster) -> ClusterRouter {
    ClusterRouter::new(&cluster.urls()[..1], AsyncConnectionConfig::new(), None).unwrap()
}

fn addr(cluster: &RedisCluster, index: usize) -> NodeAddr {
    NodeAddr::new("127.0.0.1", cluster.node(index).port())
}

const POLICY: RetryPolicy = RetryPolicy {
    window: Duration::from_secs(2),
    max_redirects: 5,
};

/// Sends each request as a redis-rs pipeline over the router's shared node connections.
struct Driver<'a> {
    router: &'a ClusterRouter,
    commands: Vec<Cmd>,
    /// Where each request went, and whether with `ASKING`.
    sent: Vec<(NodeAddr, bool, usize)>,
    resends: Resends,
}

impl<'a> Driver<'a> {
    fn new(router: &'a ClusterRouter, commands: Vec<Cmd>) -> Self {
        Driver {
            router,
            commands,
            sent: Vec::new(),
            resends: Resends::default(),
        }
    }
}

impl PipelineDriver for Driver<'_> {
    type Error = String;

    fn no_route(&self, e: TopologyError) -> String {
        e.to_string()
    }

    async fn send(&mut self, request: NodeRequest<'_>) -> Result<Vec<RedisResult<Value>>, SendError<String>> {
        self.sent
            .push((request.node.clone(), request.asking, request.commands.len()));
        let mut conn = self
            .router
            .pool()
            .connection(request.node)
            .await
            .map_err(|e| SendError::Unreachable(e.to_string()))?;
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for &i in request.commands {
            if request.asking {
                pipe.cmd("ASKING").ignore();
            }
            pipe.add_command(self.commands[i].clone());
        }
        pipe.query_async(&mut conn).await.map_err(SendError::Lost)
    }

    fn resent(&mut self, r: Resends) {
        self.resends.moved += r.moved;
        self.resends.asked += r.asked;
        self.resends.retried += r.retried;
    }
}

fn xadds(key: &str, n: usize) -> Vec<Cmd> {
    (0..n)
        .map(|i| {
            let mut cmd = redis::cmd("XADD");
            cmd.arg(key).arg("*").arg("n").arg(i);
            cmd
        })
        .collect()
}

fn all_ran(outcomes: &[CommandOutcome<String>]) {
    for (i, o) in outcomes.iter().enumerate() {
        assert!(matches!(o, CommandOutcome::Reply(Ok(_))), "command {i}: {o:?}");
    }
}

async fn xlen(router: &ClusterRouter, key: &str) -> i64 {
    let node = router.master_of_key(key.as_bytes(), true).await.unwrap();
    let mut conn = router.pool().connection(&node).await.unwrap();
    redis::cmd("XLEN").arg(key).query_async(&mut conn).await.unwrap()
}

#[tokio::test]
async fn a_pipeline_sent_to_the_old_master_follows_moved_and_runs_once() {
    let cluster = RedisCluster::start().await;
    let router = router(&cluster);
    let key = "redis-stream:shard:{orders:1}";
    let slot = key_slot(key.as_bytes());
    let old = router.master_of_slot(slot).await.unwrap();
    let from = cluster.owner_of_slot(slot).await;
    cluster.migrate_slot(slot, (from + 1) % 3).await;

    let mut driver = Driver::new(&router, xadds(key, 10));
    let outcomes = router
        .run_pipeline(slot, 10, Some(old.clone()), POLICY, &mut driver)
        .await;
    all_ran(&outcomes);
    let new = addr(&cluster, (from + 1) % 3);
    assert_eq!(
        driver.sent,
        vec![(old, false, 10), (new.clone(), false, 10)],
        "all ten redirected, then sent to the named master"
    );
    assert_eq!(driver.resends.moved, 10);
    assert_eq!(
        router.master_of_slot(slot).await.unwrap(),
        new,
        "MOVED refreshed the map"
    );
    assert_eq!(xlen(&router, key).await, 10, "each command ran once");
}

#[tokio::test]
async fn commands_of_a_migrating_slot_follow_ask_with_asking() {
    let cluster = RedisCluster::start().await;
    let router = router(&cluster);
    let key = "redis-stream:shard:{orders:2}";
    let slot = key_slot(key.as_bytes());
    let from = cluster.owner_of_slot(slot).await;
    let to = (from + 1) % 3;
    let mut driver = Driver::new(&router, xadds(key, 3));
    all_ran(&router.run_pipeline(slot, 3, None, POLICY, &mut driver).await);
    let migration = cluster.begin_migration(slot, to).await;
    migration.move_keys(100).await;

    let mut driver = Driver::new(&router, xadds(key, 4));
    all_ran(&router.run_pipeline(slot, 4, None, POLICY, &mut driver).await);
    assert_eq!(
        driver.sent,
        vec![(addr(&cluster, from), false, 4), (addr(&cluster, to), true, 4)]
    );
    assert_eq!(driver.resends.asked, 4);
    migration.finish().await;
    assert_eq!(xlen(&router, key).await, 7);
}

#[tokio::test]
async fn an_unreachable_node_is_retried_on_the_master_of_a_fresh_map() {
    let cluster = RedisCluster::start().await;
    let router = router(&cluster);
    let key = "redis-stream:shard:{orders:3}";
    let slot = key_slot(key.as_bytes());
    let gone = NodeAddr::new("127.0.0.1", 1);
    let mut driver = Driver::new(&router, xadds(key, 5));
    let outcomes = router
        .run_pipeline(slot, 5, Some(gone.clone()), POLICY, &mut driver)
        .await;
    all_ran(&outcomes);
    let owner = addr(&cluster, cluster.owner_of_slot(slot).await);
    assert_eq!(driver.sent, vec![(gone, false, 5), (owner, false, 5)]);
    assert_eq!(driver.resends.retried, 5);

    // Past the window, commands never sent are NotSent.
    let short = RetryPolicy {
        window: Duration::ZERO,
        max_redirects: 5,
    };
    let mut driver = Driver::new(&router, xadds(key, 2));
    let outcomes = router
        .run_pipeline(slot, 2, Some(NodeAddr::new("127.0.0.1", 1)), short, &mut driver)
        .await;
    assert!(
        outcomes.iter().all(|o| matches!(o, CommandOutcome::NotSent(_))),
        "{outcomes:?}"
    );
    assert_eq!(xlen(&router, key).await, 5);
}

#[tokio::test]
async fn every_master_answers_and_reads_over_many_slots_come_back_in_order() {
    let cluster = RedisCluster::start().await;
    let router = router(&cluster);
    let times = router.on_each_master::<(u64, u64)>(&redis::cmd("TIME")).await.unwrap();
    assert_eq!(times.len(), 3);
    assert!(times.iter().all(|(_, t)| t.is_ok()));

    let shared = redis_link::Connection::cluster(&cluster.urls(), None, Duration::from_secs(2), Duration::from_secs(2))
        .await
        .unwrap();
    let keys: Vec<String> = (0..12).map(|n| format!("{{k{n}}}:v")).collect();
    let mut write = shared.clone();
    for (n, key) in keys.iter().enumerate() {
        let () = redis::cmd("SET").arg(key).arg(n).query_async(&mut write).await.unwrap();
    }
    // One key's slot moves first: its master answers MOVED, and the read is asked again through `shared`.
    let moved = key_slot(keys[5].as_bytes());
    let _ = router.slot_map().await.unwrap();
    cluster
        .migrate_slot(moved, (cluster.owner_of_slot(moved).await + 1) % 3)
        .await;
    let reads: Vec<(String, Cmd)> = keys
        .iter()
        .map(|k| {
            let mut cmd = redis::cmd("GET");
            cmd.arg(k);
            (k.clone(), cmd)
        })
        .collect();
    let values = router.read_many(&reads, &shared).await;
    let values: Vec<i64> = values
        .into_iter()
        .map(|v| redis::from_redis_value(v.unwrap()).unwrap())
        .collect();
    assert_eq!(values, (0..12).collect::<Vec<i64>>());
}

#[tokio::test]
async fn a_blocking_read_route_follows_its_key_redirects_and_failures() {
    let cluster = RedisCluster::start().await;
    let nodes = Nodes::Cluster(std::sync::Arc::new(router(&cluster)));
    let key = "redis-stream:shard:{orders:4}";
    let slot = key_slot(key.as_bytes());
    let from = cluster.owner_of_slot(slot).await;
    let mut route = KeyRoute::new(key);
    let first = route.next(&nodes).await.unwrap();
    assert_eq!(
        first,
        Route::Node {
            node: addr(&cluster, from),
            asking: false
        }
    );
    let to = (from + 1) % 3;
    let ask = Redirect {
        kind: redis_link::RedirectKind::Ask,
        slot,
        to: addr(&cluster, to),
    };
    route.redirected(&nodes, &ask).await;
    let asking = route.next(&nodes).await.unwrap();
    assert!(asking.asking(), "{asking:?}");
    assert_eq!(
        route.next(&nodes).await.unwrap(),
        asking,
        "until something else happens"
    );
    cluster.migrate_slot(slot, to).await;
    route.lost();
    assert_eq!(
        route.next(&nodes).await.unwrap(),
        Route::Node {
            node: addr(&cluster, to),
            asking: false
        },
        "a lost connection reads the map again"
    );
    let client = nodes.client(&asking).unwrap();
    assert_eq!(
        client.get_connection_info().addr().to_string(),
        addr(&cluster, to).to_string()
    );
    let targets = nodes.check_targets().await.unwrap();
    assert_eq!(targets.len(), 3);
}
