//! Part C: the resident memory of a coordinator holding many large groups. The coordinator is the `coord-server`
//! binary started as a process of its own, so its `VmRSS` is its own; members beat it over HTTP at the default
//! heartbeat interval while the resident set is sampled.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures::StreamExt;
use protocol::messages::{CreateGroupRequest, HeartbeatResponse};
use test_support::RedisServer;
use tokio::sync::Mutex;

use super::member::SimMember;
use super::report::{figure, head, note, Goal};

/// What part C runs.
#[derive(Debug, Clone)]
pub struct Sizes {
    /// Groups, all on one stream.
    pub groups: usize,
    /// Shards of the stream.
    pub shards: u32,
    /// Members per group.
    pub members: usize,
    /// How long members beat while the resident set is sampled.
    pub window: Duration,
    /// The `coord-server` binary.
    pub binary: PathBuf,
}

/// The goal for the resident set.
const RSS_MIB: f64 = 200.0;

/// Kills the coordinator process when dropped, whatever happened.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `kB` line of `/proc/<pid>/status`, in MiB.
fn status_mib(pid: u32, field: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    crate::mem::parse_status_mib(&status, field)
}

/// Runs part C against a fresh `redis-server` and a `coord-server` process.
pub async fn run(sizes: &Sizes) -> Result<()> {
    let redis = RedisServer::start().await;
    let port = test_support::free_port();
    let log = std::env::temp_dir().join(format!("group_scale_bench-coord-{port}.log"));
    let child = Command::new(&sizes.binary)
        .arg("--redis-url")
        .arg(redis.url())
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()
        .with_context(|| format!("start {}", sizes.binary.display()))?;
    let process = Process(child);
    let pid = process.0.id();
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::builder().pool_max_idle_per_host(256).build()?;
    let ready_by = Instant::now() + Duration::from_secs(30);
    loop {
        let ok = http.get(format!("{base}{}", protocol::routes::READYZ)).send().await;
        if ok.is_ok_and(|r| r.status().is_success()) {
            break;
        }
        if Instant::now() > ready_by {
            bail!("coord-server not ready within 30 s; its log: {}", log.display());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let rss_empty = status_mib(pid, "VmRSS").unwrap_or(0.0);

    let stream = "scale-c";
    let create_started = Instant::now();
    for g in 0..sizes.groups {
        let req = CreateGroupRequest {
            shard_count: Some(sizes.shards),
            timings: None,
        };
        let url = format!("{base}{}", protocol::routes::group(stream, &format!("g{g:03}")));
        let r = http.post(url).json(&req).send().await?;
        if !r.status().is_success() {
            bail!(
                "create group {g}: {} {}",
                r.status(),
                r.text().await.unwrap_or_default()
            );
        }
    }
    let create_elapsed = create_started.elapsed();
    let rss_created = status_mib(pid, "VmRSS").unwrap_or(0.0);

    let members: Vec<(String, Mutex<SimMember>)> = (0..sizes.groups)
        .flat_map(|g| {
            let url = format!("{base}{}", protocol::routes::heartbeat(stream, &format!("g{g:03}")));
            (0..sizes.members).map(move |m| (url.clone(), Mutex::new(SimMember::joining(&format!("g{g:03}m{m}")))))
        })
        .collect();
    let members = Arc::new(members);
    let join_started = Instant::now();
    let total_shards = sizes.groups * sizes.shards as usize;
    let mut passes = 0;
    let mut owned = 0;
    while passes < 6 {
        let failures: Vec<bool> = futures::stream::iter(members.iter())
            .map(|(url, m)| {
                let http = http.clone();
                async move { beat(&http, url, &mut *m.lock().await).await }
            })
            .buffer_unordered(16)
            .collect()
            .await;
        passes += 1;
        let failed = failures.iter().filter(|ok| !**ok).count();
        owned = 0;
        for (_, m) in members.iter() {
            owned += m.lock().await.owned();
        }
        if owned == total_shards && failed == 0 {
            break;
        }
    }
    let join_elapsed = join_started.elapsed();
    let rss_joined = status_mib(pid, "VmRSS").unwrap_or(0.0);

    // Every member at the default interval for the window, the resident set sampled every 250 ms.
    let interval = Duration::from_secs(2);
    let started = Instant::now();
    let n = members.len();
    let mut tasks = Vec::new();
    for i in 0..n {
        let (members, http) = (members.clone(), http.clone());
        let window = sizes.window;
        tasks.push(tokio::spawn(async move {
            let first = tokio::time::Instant::now() + interval.mul_f64(i as f64 / n as f64);
            let mut tick = tokio::time::interval_at(first, interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut failed = 0u64;
            loop {
                tick.tick().await;
                if started.elapsed() >= window {
                    return failed;
                }
                let (url, m) = &members[i];
                if !beat(&http, url, &mut *m.lock().await).await {
                    failed += 1;
                }
            }
        }));
    }
    let mut rss_max: f64 = 0.0;
    while started.elapsed() < sizes.window {
        rss_max = rss_max.max(status_mib(pid, "VmRSS").unwrap_or(0.0));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let mut failed = 0;
    for t in tasks {
        failed += t.await.expect("member task");
    }
    let rss_end = status_mib(pid, "VmRSS").unwrap_or(0.0);
    let hwm = status_mib(pid, "VmHWM").unwrap_or(0.0);
    let mut conn = redis.connection().await;
    let info: String = redis::cmd("INFO").arg("memory").query_async(&mut conn).await?;
    let redis_used = info
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:")?.trim().parse::<f64>().ok())
        .unwrap_or(0.0)
        / (1024.0 * 1024.0);

    head(&format!(
        "C. coordinator process RSS: {} groups x {} shards, {} member(s) each",
        sizes.groups, sizes.shards, sizes.members
    ));
    let p = "C";
    figure(p, "VmRSS, no group", rss_empty, "MiB", Goal::None);
    figure(p, "VmRSS after creating the groups", rss_created, "MiB", Goal::None);
    figure(p, "VmRSS after joining and converging", rss_joined, "MiB", Goal::None);
    figure(p, "VmRSS max while heartbeating", rss_max, "MiB", Goal::AtMost(RSS_MIB));
    figure(p, "VmRSS at the end", rss_end, "MiB", Goal::AtMost(RSS_MIB));
    figure(p, "VmHWM (peak over the whole run)", hwm, "MiB", Goal::None);
    figure(p, "Redis used_memory", redis_used, "MiB", Goal::None);
    figure(
        p,
        "shards owned after convergence",
        owned as f64,
        "",
        Goal::AtLeast(total_shards as f64),
    );
    figure(
        p,
        "heartbeats refused or failed while sampling",
        failed as f64,
        "",
        Goal::AtMost(0.0),
    );
    // The report names no path of this machine (it is pasted into BENCHMARKS.md); the log's path goes to stderr.
    eprintln!("C: coord-server {}, its log {}", sizes.binary.display(), log.display());
    let name = |p: &std::path::Path| {
        p.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    note(&format!(
        "{} as its own process, default flags and timings, over HTTP; create {:.1} s, join and converge {:.1} s \
         ({passes} passes), heartbeats every 2 s for {:.0} s; its log: {} in the temporary directory",
        name(&sizes.binary),
        create_elapsed.as_secs_f64(),
        join_elapsed.as_secs_f64(),
        sizes.window.as_secs_f64(),
        name(&log)
    ));
    Ok(())
}

/// One HTTP heartbeat of `m`; false when it was not answered `2xx`.
async fn beat(http: &reqwest::Client, url: &str, m: &mut SimMember) -> bool {
    let sent = http.post(url).json(&m.req).send().await;
    let Ok(resp) = sent else { return false };
    let status = resp.status();
    let ok = status.is_success();
    let resp_is_refusal = |_: &[u8]| status.is_client_error();
    let Ok(body) = resp.bytes().await else { return false };
    if ok {
        match serde_json::from_slice::<HeartbeatResponse>(&body) {
            Ok(r) => m.apply(&r),
            Err(_) => return false,
        }
    } else if resp_is_refusal(&body) {
        m.rejoin();
    }
    ok
}
