//! SDK builders whose handlers and publishes record into a [`History`] (level 3), and background publishers.

use super::*;

pub use test_support::consumer::wait_status;
pub use test_support::Gate;

/// Where a recording handler finds its consumer's status (set once the consumer is built).
#[derive(Clone, Default)]
pub struct StatusSlot(pub Arc<OnceLock<watch::Receiver<ConsumerStatus>>>);

impl StatusSlot {
    pub fn lease_until(&self) -> Option<Instant> {
        self.0.get().and_then(|rx| rx.borrow().lease_expires_at)
    }
}

/// A handler that records every invocation into `history` (with the member's lease end as its consumer knows
/// it) and waits for `gate` before finishing.
pub fn recording_handler(
    member: &str,
    history: &History,
    gate: Gate,
    status: &StatusSlot,
) -> impl Fn(Message) -> futures::future::BoxFuture<'static, Result<(), std::io::Error>> + Send + Sync + 'static {
    let history = history.clone();
    let who = member.to_owned();
    let status = status.clone();
    move |msg: Message| {
        let history = history.clone();
        let who = who.clone();
        let gate = gate.clone();
        let lease = status.lease_until();
        Box::pin(async move {
            let handling = history.begin(&who, &msg, lease);
            gate.wait().await;
            handling.succeeded();
            Ok(())
        })
    }
}

/// A consumer builder with the short timings (`test_support::consumer::builder`) and no handler.
pub fn consumer_builder(
    stream: &StreamName,
    group: &GroupName,
    member: &str,
    coordinators: Vec<String>,
    redis_url: String,
) -> ConsumerBuilder {
    test_support::consumer::builder(stream.as_str(), group.as_str(), member)
        .coordinators(coordinators)
        .redis(redis_url)
}

/// Publishes `n` records with keys `key-0..key-<keys>` (the key also in field `key`, a sequence number in
/// `n`), recording every acknowledged one. Returns how many were acknowledged.
pub async fn publish(producer: &Producer, history: &History, from: u64, n: u64, keys: u64) -> u64 {
    let mut acked = 0;
    for i in from..from + n {
        if publish_one(producer, history, i, keys).await.is_ok() {
            acked += 1;
        }
    }
    acked
}

/// Publishes record `i` (key `key-<i % keys>`), recording it if acknowledged.
pub async fn publish_one(producer: &Producer, history: &History, i: u64, keys: u64) -> Result<Published, PublishError> {
    let key = format!("key-{}", i % keys.max(1));
    let r = producer
        .send(&key, &[("key", key.as_str()), ("n", i.to_string().as_str())])
        .await;
    if let Ok(p) = &r {
        history.published(Some(&key), p);
    }
    r
}

/// A background publisher: one record every `every` until stopped, counting outcomes.
pub struct Publisher {
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<Outcomes>,
}

/// What a [`Publisher`] saw.
#[derive(Debug, Default, Clone)]
pub struct Outcomes {
    pub written: u64,
    pub not_written: u64,
    pub unknown: u64,
    pub routing_unavailable: u64,
}

impl Publisher {
    pub fn spawn(producer: Arc<Producer>, history: &History, every: Duration, keys: u64) -> Publisher {
        let stop = tokio_util::sync::CancellationToken::new();
        let history = history.clone();
        let task = {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut o = Outcomes::default();
                let mut i = 0;
                while !stop.is_cancelled() {
                    match publish_one(&producer, &history, i, keys).await {
                        Ok(_) => o.written += 1,
                        Err(e) => {
                            if e.is_routing_unavailable() {
                                o.routing_unavailable += 1;
                            }
                            match e.write_state() {
                                stream_producer::WriteState::Unknown => o.unknown += 1,
                                _ => o.not_written += 1,
                            }
                        }
                    }
                    i += 1;
                    tokio::select! {
                        _ = stop.cancelled() => {}
                        // Real time: the load's pace, as a producer process writes.
                        _ = tokio::time::sleep(every) => {}
                    }
                }
                o
            })
        };
        Publisher { stop, task }
    }

    pub async fn stop(self) -> Outcomes {
        self.stop.cancel();
        self.task.await.expect("publisher task")
    }
}

/// Waits until every acknowledged publish was handled successfully.
pub async fn wait_all_handled(history: &History, timeout: Duration) {
    test_support::wait_until(timeout, "every acknowledged publish to be handled", || {
        let done = history.all_published_handled();
        async move { done }
    })
    .await;
}

/// Where a member process (`src/bin/stall_worker.rs`) runs: the group it joins, with the scenario timings.
pub struct StallWorker {
    pub coordinators: String,
    pub redis: String,
    pub stream: String,
    pub group: String,
    /// How long each handler sleeps.
    pub handle: Duration,
    /// The consumer's `read_failure_timeout` (its default when `None`).
    pub read_failure: Option<Duration>,
}

impl StallWorker {
    /// Starts member `member`, recording into `<dir>/<name>.log` (stderr into `<dir>/<name>.stderr`).
    pub fn spawn(&self, member: &str, dir: &std::path::Path, name: &str) -> std::process::Child {
        use std::process::{Command, Stdio};
        let stderr = std::fs::File::create(dir.join(format!("{name}.stderr"))).expect("worker stderr file");
        let mut command = Command::new(env!("CARGO_BIN_EXE_stall_worker"));
        if let Some(d) = self.read_failure {
            command.arg(format!("read_failure_ms={}", d.as_millis()));
        }
        command
            .arg(format!("coordinators={}", self.coordinators))
            .arg(format!("redis={}", self.redis))
            .arg(format!("stream={}", self.stream))
            .arg(format!("group={}", self.group))
            .arg(format!("member={member}"))
            .arg(format!("out={}", dir.join(format!("{name}.log")).display()))
            .arg(format!("handle_ms={}", self.handle.as_millis()))
            .arg(format!("heartbeat_ms={}", HEARTBEAT.as_millis()))
            .arg(format!("ttl_ms={}", TTL.as_millis()))
            .arg(format!("lease_ms={}", LEASE.as_millis()))
            .arg(format!("margin_ms={}", MARGIN.as_millis()))
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn stall_worker")
    }
}
