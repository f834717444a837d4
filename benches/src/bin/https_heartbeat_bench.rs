//! Cost of TLS to the coordinator (issue 40, item 7): heartbeat latency over HTTPS against plain HTTP, one
//! private `redis-server` (started through `test_support::RedisServer`) and two in-process coordinators on it,
//! one plain and one serving a certificate of a test CA made at run time (`test_support::pki`).
//!
//! ```text
//! cargo run --release -p benches --bin https_heartbeat_bench -- --rounds 10 --per-round 500
//! ```
//!
//! Each mode has one member of its own group, driven by the SDKs' HTTP client (`client_core::CoordClient`, the
//! consumer's) and membership rules (`client_core::membership`), heartbeating back to back. Rounds alternate
//! plain and HTTPS; a round's p50 and p99 are taken over its heartbeats, and the medians of the rounds are
//! printed (never best-of). Steady state: the connection is kept alive, so a round pays no handshake. The
//! `--fresh` samples build a new client (a new connection, so a TCP and, over HTTPS, a TLS handshake) for every
//! heartbeat: the cost after an idle timeout or a failover.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use client_core::membership::Membership;
use client_core::{CoordClient, TlsOptions};
use coord_server::server::CoordinatorHandle;
use coord_server::{Config, ServerTls};
use protocol::messages::CreateGroupRequest;
use protocol::names::{GroupName, MemberId, StreamName};
use protocol::MetadataVersion;
use test_support::pki::TestCa;
use test_support::RedisServer;

#[derive(Parser, Debug)]
#[command(about = "Heartbeat latency over HTTPS against plain HTTP")]
struct Args {
    /// Rounds per mode (interleaved).
    #[arg(long, default_value_t = 10)]
    rounds: usize,
    /// Heartbeats per round, back to back on one kept-alive connection.
    #[arg(long, default_value_t = 500)]
    per_round: usize,
    /// Heartbeats per round that each open a new connection.
    #[arg(long, default_value_t = 50)]
    fresh: usize,
}

/// One mode: a coordinator URL, the client TLS settings, and the member heartbeating there.
struct Mode {
    name: &'static str,
    url: String,
    tls: TlsOptions,
    client: CoordClient,
    stream: StreamName,
    group: GroupName,
    membership: Membership,
}

impl Mode {
    async fn new(name: &'static str, coord: &CoordinatorHandle, tls: TlsOptions) -> Result<Mode> {
        let stream = StreamName::new(format!("bench-{name}"))?;
        let group = GroupName::new("g")?;
        coord
            .coordinator()
            .create_group(
                &stream,
                &group,
                &CreateGroupRequest {
                    shard_count: Some(8),
                    timings: None,
                },
            )
            .await
            .context("group created")?;
        let client = client(&coord.url(), &tls)?;
        let membership = Membership::new(MemberId::new("m")?, "m-1".into(), MetadataVersion(0));
        let mut mode = Mode {
            name,
            url: coord.url(),
            tls,
            client,
            stream,
            group,
            membership,
        };
        mode.heartbeat_with(None).await?; // the join
        Ok(mode)
    }

    /// One heartbeat (on `fresh`'s new connection when given); its latency.
    async fn heartbeat_with(&mut self, fresh: Option<&CoordClient>) -> Result<Duration> {
        let req = self.membership.request();
        let client = fresh.unwrap_or(&self.client);
        let sent = Instant::now();
        let resp = client.heartbeat(&self.stream, &self.group, &req).await?;
        let took = sent.elapsed();
        self.membership.apply(&resp, true);
        Ok(took)
    }

    /// p50 and p99 of one steady round, then of one round of fresh connections.
    async fn round(&mut self, per_round: usize, fresh: usize) -> Result<([Duration; 2], [Duration; 2])> {
        let mut steady = Vec::with_capacity(per_round);
        for _ in 0..per_round {
            steady.push(self.heartbeat_with(None).await?);
        }
        let mut opened = Vec::with_capacity(fresh);
        for _ in 0..fresh {
            let new = client(&self.url, &self.tls)?;
            opened.push(self.heartbeat_with(Some(&new)).await?);
        }
        Ok((percentiles(steady), percentiles(opened)))
    }
}

fn client(url: &str, tls: &TlsOptions) -> Result<CoordClient> {
    Ok(CoordClient::with_tls(
        vec![url.to_owned()],
        Duration::from_secs(5),
        None,
        tls,
    )?)
}

/// p50 and p99 of `samples` (zero when there are none).
fn percentiles(mut samples: Vec<Duration>) -> [Duration; 2] {
    if samples.is_empty() {
        return [Duration::ZERO; 2];
    }
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    [at(0.50), at(0.99)]
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values.get(values.len() / 2).copied().unwrap_or_default()
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let redis = RedisServer::builder().try_start().await?;
    let ca = TestCa::new("bench CA");
    let server = ca.server("coordinator");
    let listen = |mut config: Config| {
        config.listen = "127.0.0.1:0".parse().expect("literal address");
        config
    };
    let plain = CoordinatorHandle::spawn(listen(Config::new(redis.url()))).await?;
    let mut config = listen(Config::new(redis.url()));
    config.tls = Some(ServerTls::new(&server.cert, &server.key));
    let https = CoordinatorHandle::spawn(config).await?;
    let mut modes = [
        Mode::new("http", &plain, TlsOptions::new()).await?,
        Mode::new("https", &https, TlsOptions::new().ca_file(&ca.ca_file)).await?,
    ];
    let mut results: Vec<[Vec<Duration>; 4]> = vec![Default::default(), Default::default()];
    for _ in 0..args.rounds {
        for (mode, result) in modes.iter_mut().zip(results.iter_mut()) {
            let ([p50, p99], [f50, f99]) = mode.round(args.per_round, args.fresh).await?;
            for (list, value) in result.iter_mut().zip([p50, p99, f50, f99]) {
                list.push(value);
            }
        }
    }
    println!(
        "heartbeat latency, medians of {} interleaved rounds ({} kept-alive + {} fresh-connection heartbeats each)",
        args.rounds, args.per_round, args.fresh
    );
    println!(
        "{:<6} {:>12} {:>12} {:>14} {:>14}",
        "mode", "p50", "p99", "fresh p50", "fresh p99"
    );
    for (mode, result) in modes.iter().zip(results) {
        let [p50, p99, f50, f99] = result.map(median);
        println!(
            "{:<6} {:>12} {:>12} {:>14} {:>14}",
            mode.name,
            ms(p50),
            ms(p99),
            ms(f50),
            ms(f99)
        );
    }
    plain.shutdown().await;
    https.shutdown().await;
    Ok(())
}
