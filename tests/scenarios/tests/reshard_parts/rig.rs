//! The load and the growth rig of `reshard.rs`: groups of slow consumers, keyed producers, and the checks and
//! figures of a growth.

use super::*;

/// How long a routing stays valid for the producers of these scenarios: long enough that a producer never
/// refreshes by itself during a test.
pub(crate) const LONG_ROUTING_LEASE: Duration = Duration::from_secs(600);
pub(crate) const GROUPS: usize = 3;
pub(crate) const CONSUMERS_PER_GROUP: usize = 2;
pub(crate) const KEYS_PER_PRODUCER: u64 = 24;
/// How many records the load writes between two steps of a scenario (a backlog in the parents before a growth,
/// writes into the children after one).
pub(crate) const BACKLOG: u64 = 400;

/// A stream with three groups, two consumers each, and a history per group.
pub(crate) struct Grow {
    pub(crate) s: Scenario,
    pub(crate) groups: Vec<GroupName>,
    pub(crate) histories: Vec<History>,
    pub(crate) consumers: Vec<ConsumerHandle>,
    /// Where clients reach Redis.
    pub(crate) client_redis: String,
}

impl Grow {
    /// The stream with `shards` shards and the routing lease [`LONG_ROUTING_LEASE`], three groups, consumers.
    pub(crate) async fn start(name: &str, shards: u32) -> Grow {
        init_tracing();
        let redis = RedisServer::start().await;
        let url = redis.url();
        Self::on(redis, name, shards, url).await
    }

    /// As [`Grow::start`] on `redis`; clients reach Redis at `client_redis`.
    pub(crate) async fn on(redis: RedisServer, name: &str, shards: u32, client_redis: String) -> Grow {
        // The stream's routing is created by the first group, with the creating coordinator's routing lease.
        let mut config = coord_config(&redis.url(), "127.0.0.1:0".parse().unwrap());
        config.routing_lease = LONG_ROUTING_LEASE;
        let creator = CoordinatorHandle::spawn(config).await.expect("coordinator starts");
        let stream = protocol::names::StreamName::new(format!("{name}-stream")).unwrap();
        let mut groups = Vec::new();
        for i in 1..GROUPS {
            let g = GroupName::new(format!("{name}-group{i}")).unwrap();
            creator
                .coordinator()
                .create_group(
                    &stream,
                    &g,
                    &CreateGroupRequest {
                        shard_count: Some(shards),
                        timings: Some(timings()),
                    },
                )
                .await
                .expect("group created");
            groups.push(g);
        }
        creator.shutdown().await;
        let s = Scenario::on(redis, name, shards).await;
        let client_redis_url = client_redis.clone();
        groups.insert(0, s.group.clone());
        let histories: Vec<History> = groups.iter().map(|_| History::new()).collect();
        let mut consumers = Vec::new();
        for (g, h) in groups.iter().zip(&histories) {
            for c in 0..CONSUMERS_PER_GROUP {
                let member = format!("{g}-c{c}");
                let builder = consumer_builder(&s.stream, g, &member, s.urls(), client_redis.clone());
                consumers.push(spawn_slow(builder, &member, h));
            }
        }
        Grow {
            s,
            groups,
            histories,
            consumers,
            client_redis: client_redis_url,
        }
    }

    /// A producer of the stream (its routing lease is the stream's: it refreshes only when told to).
    pub(crate) async fn producer(&self) -> Arc<Producer> {
        let p = self
            .s
            .producer()
            .redis(self.client_redis.clone())
            .build()
            .expect("producer configuration");
        p.ready().await.expect("producer ready");
        Arc::new(p)
    }

    /// The group's metadata as Redis stores it.
    pub(crate) async fn metadata(&self, group: &GroupName) -> GroupMetadata {
        metadata_on(&self.s.redis, &self.s.stream, group).await
    }

    /// Waits until every group adopted `shards` shards and released every child.
    pub(crate) async fn wait_released(&self, shards: u32, timeout: Duration) {
        for g in &self.groups {
            test_support::wait_until(timeout, &format!("{g} to read all {shards} shards"), || async move {
                let m = self.metadata(g).await;
                m.shard_count == shards && m.reshards.is_empty()
            })
            .await;
        }
    }

    /// Grows the stream by `count` shards.
    pub(crate) async fn add_shards(&self, count: u32) -> RoutingVersion {
        self.s
            .coordinator()
            .add_shards(&self.s.stream, count, None)
            .await
            .expect("add shards")
            .routing_version
    }

    /// Per group: the children-wait histogram (sum in seconds, count) from the coordinator's `/metrics`.
    pub(crate) async fn children_wait(&self, url: &str) -> Vec<(f64, u64)> {
        let text = reqwest::get(format!("{url}/metrics"))
            .await
            .expect("scrape")
            .text()
            .await
            .expect("scrape body");
        let value = |suffix: &str, g: &GroupName| -> f64 {
            let name = format!("redis_stream_coord_reshard_children_wait_seconds_{suffix}{{");
            text.lines()
                .filter(|l| l.starts_with(&name) && l.contains(&format!("group=\"{g}\"")))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        };
        self.groups
            .iter()
            .map(|g| (value("sum", g), value("count", g) as u64))
            .collect()
    }

    /// Waits until every group handled every acknowledged publish, then checks the rules; returns the figures.
    pub(crate) async fn check(&self, timeout: Duration) -> Vec<Figures> {
        for h in &self.histories {
            wait_all_handled(h, timeout).await;
        }
        self.histories
            .iter()
            .zip(&self.groups)
            .map(|(h, g)| {
                let report = h.check();
                let order = cross_shard_order(h);
                let f = Figures {
                    records: report.publishes,
                    invocations: report.invocations,
                    violations: report.violations.len(),
                    order_violations: order.violations.len(),
                    keys_moved: order.keys_moved,
                };
                println!("{g}: {f:?}");
                assert!(report.is_ok(), "{g}: {report}");
                assert!(
                    order.violations.is_empty(),
                    "{g}: {} per-key order violations across shards, first: {:?}",
                    order.violations.len(),
                    &order.violations[..order.violations.len().min(5)]
                );
                f
            })
            .collect()
    }

    pub(crate) async fn stop(self) {
        for c in self.consumers {
            c.close().await.ok();
        }
    }
}

/// How long a handler takes: slower than the load on 4 shards, faster on 8, so the parents have a backlog
/// when a growth comes and the children really wait.
pub(crate) const HANDLING: Duration = Duration::from_millis(8);

/// A consumer whose handler records into `history` and takes [`HANDLING`].
pub(crate) fn spawn_slow(builder: stream_consumer::ConsumerBuilder, member: &str, history: &History) -> ConsumerHandle {
    let (history, who) = (history.clone(), member.to_owned());
    builder
        .handler(move |msg: stream_consumer::Message| {
            let handling = history.begin(&who, &msg, None);
            Box::pin(async move {
                // Real time: the handler's work, which makes the backlog the growth must wait for.
                tokio::time::sleep(HANDLING).await;
                handling.succeeded();
                Ok::<(), std::io::Error>(())
            }) as futures::future::BoxFuture<'static, Result<(), std::io::Error>>
        })
        .build()
        .expect("valid consumer configuration")
        .spawn()
}

/// What one group's history showed.
#[derive(Debug, Clone, Copy)]
#[allow(dead_code)] // printed
pub(crate) struct Figures {
    pub(crate) records: usize,
    pub(crate) invocations: usize,
    pub(crate) violations: usize,
    pub(crate) order_violations: usize,
    pub(crate) keys_moved: usize,
}

/// Sequential keyed publishers (one per producer, each with its own keys), pausable between two sends.
pub(crate) struct Load {
    pub(crate) pause: Arc<RwLock<()>>,
    pub(crate) stop: tokio_util::sync::CancellationToken,
    pub(crate) tasks: Vec<tokio::task::JoinHandle<()>>,
    pub(crate) written: Arc<AtomicU64>,
    pub(crate) refused: Arc<AtomicU64>,
}

impl Load {
    pub(crate) fn new() -> Load {
        Load {
            pause: Arc::new(RwLock::new(())),
            stop: tokio_util::sync::CancellationToken::new(),
            tasks: Vec::new(),
            written: Arc::new(AtomicU64::new(0)),
            refused: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Publishes keys `<prefix>-0..` from `producer` every `every`, recording acknowledged ones in every history.
    /// `pausable`: takes part in [`Load::pause`].
    pub(crate) fn spawn(
        &mut self,
        producer: Arc<Producer>,
        prefix: &str,
        histories: &[History],
        every: Duration,
        pausable: bool,
    ) {
        let (pause, stop, written, refused) = (
            Arc::clone(&self.pause),
            self.stop.clone(),
            Arc::clone(&self.written),
            Arc::clone(&self.refused),
        );
        let histories = histories.to_vec();
        let prefix = prefix.to_owned();
        self.tasks.push(tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.is_cancelled() {
                let key = format!("{prefix}-{}", i % KEYS_PER_PRODUCER);
                let n = i.to_string();
                let guard = if pausable { Some(pause.read().await) } else { None };
                let r = producer.send(&key, &[("key", key.as_str()), ("n", n.as_str())]).await;
                drop(guard);
                match r {
                    Ok(p) => {
                        for h in &histories {
                            h.published(Some(&key), &p);
                        }
                        written.fetch_add(1, Ordering::Relaxed);
                        i += 1;
                    }
                    // Not written (or unknown): the same record is sent again, so the key's order is kept.
                    Err(_) => {
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                }
                tokio::select! {
                    _ = stop.cancelled() => {}
                    // Real time: the load's pace, as a producer process writes.
                    _ = tokio::time::sleep(every) => {}
                }
            }
        }));
    }

    /// Waits until the load has written `more` records from now (the backlog or the share of writes a step needs,
    /// which a fixed sleep would only make likely).
    pub(crate) async fn wait_written(&self, more: u64) {
        let target = self.written.load(Ordering::Relaxed) + more;
        test_support::wait_until(DEADLINE, &format!("{more} more records written"), || {
            let written = self.written.load(Ordering::Relaxed);
            async move { written >= target }
        })
        .await;
    }

    /// Holds every pausable publisher between two sends until the guard is dropped.
    pub(crate) async fn pause(&self) -> tokio::sync::RwLockWriteGuard<'_, ()> {
        self.pause.write().await
    }

    pub(crate) async fn stop(self) -> (u64, u64) {
        self.stop.cancel();
        for t in self.tasks {
            t.await.expect("publisher task");
        }
        (
            self.written.load(Ordering::Relaxed),
            self.refused.load(Ordering::Relaxed),
        )
    }
}

/// Tells `producers` about `version` and waits until they route with it.
pub(crate) async fn hint(producers: &[Arc<Producer>], version: RoutingVersion) {
    for p in producers {
        p.observe_routing_version(version);
    }
    for p in producers {
        test_support::wait_until(DEADLINE, "the producer to route with the new version", || {
            let v = p.routing().map(|r| r.version);
            async move { v == Some(version) }
        })
        .await;
    }
}

pub(crate) fn reshard_parents_not_drained(m: &GroupMetadata) -> usize {
    m.reshards.iter().map(|r| r.parents as usize - r.drained.len()).sum()
}

pub(crate) async fn metadata_on(
    redis: &RedisServer,
    stream: &protocol::names::StreamName,
    group: &GroupName,
) -> GroupMetadata {
    let store = coord_server::store::Store::connect(&redis.url()).await.expect("Redis");
    store
        .group_metadata(stream, group)
        .await
        .expect("stored metadata decodes")
        .expect("the group has metadata")
}
