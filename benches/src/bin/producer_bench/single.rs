//! The single-server run: the raw shapes and the SDK modes against one private `redis-server` (and its replica
//! with `--replica`), interleaved rounds, then the table of medians.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use protocol::names::StreamName;
use redis::aio::MultiplexedConnection;
use stream_producer::{BatchingConfig, Durability, Producer};

use crate::args::{Args, RawShape};
use crate::measure::{
    clear, command_usec, load_average, median_of, on_path, process_cpu, rate, redis_benchmark_run, redis_cpu,
    total_len, Sample,
};
use crate::modes::{calibrate, Mode, SDK_MODES, SHAPE_LEGEND};
use crate::raw::{raw_run, Workload};
use crate::sdk::{bench_producer, sdk_batch_run, sdk_enqueue_run};
use crate::server::{wait_ready, wait_replicating, PrivateRedis};
use benches::group::coordinator as bench_coordinator;

/// The producers of the SDK modes, one per configuration (fenced, plain, idempotent, durable, durable plain).
struct Producers {
    producer: Arc<Producer>,
    plain: Arc<Producer>,
    idempotent: Arc<Producer>,
    durable: Arc<Producer>,
    durable_plain: Arc<Producer>,
}

impl Producers {
    /// Builds every producer and waits until each can publish (the durable ones only when a replica runs).
    async fn ready(args: &Args, stream: &StreamName, coordinator: &str, redis: &str, replica: bool) -> Result<Self> {
        let durability = Durability::replicas(args.durable_replicas, Duration::from_millis(args.durable_timeout_ms));
        let build_with = |fencing: bool, idempotence: bool, durability: Durability| {
            bench_producer(args, stream, (coordinator, redis), (fencing, idempotence), durability)
        };
        let build = |fencing: bool, idempotence: bool| build_with(fencing, idempotence, Durability::Primary);
        let producers = Producers {
            producer: build(true, false)?,
            plain: build(false, false)?,
            idempotent: build(true, true)?,
            durable: build_with(true, false, durability)?,
            durable_plain: build_with(false, false, durability)?,
        };
        for p in [&producers.plain, &producers.idempotent] {
            p.ready().await?;
        }
        if replica {
            for p in [&producers.durable, &producers.durable_plain] {
                p.ready().await?;
            }
        }
        producers.producer.ready().await?;
        Ok(producers)
    }

    /// Closes every producer once every task has finished with it.
    async fn close(self) -> Result<()> {
        for p in [self.plain, self.idempotent, self.durable, self.durable_plain] {
            Arc::into_inner(p).context("all tasks finished")?.close().await?;
        }
        let producer = Arc::into_inner(self.producer).context("all tasks finished")?;
        producer.close().await?;
        Ok(())
    }
}

/// What every round of a mode needs.
struct Bench {
    args: Args,
    redis: PrivateRedis,
    con: MultiplexedConnection,
    stream: StreamName,
    work: Arc<Workload>,
    producers: Producers,
}

/// The run against one server: start, choose the modes, interleaved rounds, the table.
pub(crate) async fn single_main(args: Args) -> Result<()> {
    let redis = PrivateRedis::start(&args.redis_server)?;
    let con = wait_ready(&redis.url()).await?;
    let replica = match args.replica {
        true => {
            let replica = PrivateRedis::start_replica(&args.redis_server, &redis)?;
            wait_replicating(&replica.url()).await?;
            Some(replica)
        }
        false => None,
    };
    let stream = StreamName::new("bench")?;
    let coordinator = bench_coordinator(&redis.url(), &stream, args.shards).await?;
    let producers = Producers::ready(&args, &stream, &coordinator.url(), &redis.url(), replica.is_some()).await?;
    let work = Arc::new(Workload::new(&args, &stream));
    let shapes = args.shapes();
    ensure!(!shapes.is_empty(), "--raw-shapes: no shape");
    print_setup(&args, shapes.len(), replica.as_ref());
    let mut bench = Bench {
        args,
        redis,
        con,
        stream,
        work,
        producers,
    };
    let modes = bench.choose_modes(&shapes, replica.is_some()).await?;
    let samples = bench.rounds(&modes).await?;
    clear(&mut bench.con, &bench.stream, bench.args.shards).await?;
    print_summary(&bench.args, &modes, &samples);
    bench.producers.close().await?;
    coordinator.shutdown().await;
    Ok(())
}

/// The run's first line: the workload, the SDK's settings, the allocator and the replica.
fn print_setup(args: &Args, shapes: usize, replica: Option<&PrivateRedis>) {
    println!(
        "{} records of {} B payload, {} keys, {} shards; raw shapes tried: {}; sdk: {} connections, {} tasks, \
         send_batch of {}, batching max {} with {} batches in flight, enqueue {} tasks with a window of {} each; \
         allocator {}; {}",
        args.records,
        args.payload_bytes,
        args.keys,
        args.shards,
        shapes,
        args.sdk_connections,
        args.sdk_tasks,
        args.sdk_batch,
        args.max_batch_size,
        args.max_in_flight_batches
            .unwrap_or(BatchingConfig::default().max_in_flight_batches),
        args.enqueue_tasks,
        args.delivery_window,
        benches::ALLOCATOR,
        match replica {
            Some(r) => format!(
                "a replica attached ({}); durable modes: WAIT {} {}",
                r.url(),
                args.durable_replicas,
                args.durable_timeout_ms
            ),
            None => "no replica".to_owned(),
        }
    );
}

impl Bench {
    /// The modes of `--modes`, `raw` replaced by the calibration's finalists, and redis-benchmark when asked for
    /// and installed.
    async fn choose_modes(&mut self, shapes: &[RawShape], replica: bool) -> Result<Vec<Mode>> {
        let args = &self.args;
        let mut modes: Vec<Mode> = Vec::new();
        for name in &args.modes {
            if name == "raw" {
                let finalists = if shapes.len() > 1 && args.calibration_records > 0 {
                    calibrate(&self.redis, &mut self.con, &self.stream, args, &self.work, shapes).await?
                } else {
                    shapes.to_vec()
                };
                modes.extend(finalists.into_iter().map(Mode::Raw));
            } else {
                let (name, _) = SDK_MODES
                    .iter()
                    .find(|(m, _)| m == name)
                    .with_context(|| format!("unknown mode {name:?}"))?;
                ensure!(
                    replica || !name.contains("durable"),
                    "{name} waits for a replica: add --replica"
                );
                modes.push(Mode::Sdk(name));
            }
        }
        if args.redis_benchmark {
            if on_path("redis-benchmark") {
                modes.push(Mode::RedisBenchmark);
            } else {
                println!("redis-benchmark is not on PATH: no physical reference in this run");
            }
        }
        Ok(modes)
    }

    /// `--rounds` interleaved rounds of every mode: the samples of each mode, in the order of `modes`.
    async fn rounds(&mut self, modes: &[Mode]) -> Result<Vec<Vec<Sample>>> {
        let peak_resettable = benches::mem::reset_peak_rss();
        if !peak_resettable {
            println!("/proc/self/clear_refs not writable: peak RSS is the process's peak so far");
        }
        let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); modes.len()];
        for round in 1..=self.args.rounds {
            for (&mode, samples) in modes.iter().zip(&mut samples) {
                samples.push(self.round(round, mode, peak_resettable).await?);
            }
        }
        Ok(samples)
    }

    /// One round of one mode: cleared streams, the timed run, the entries counted, the costs; printed.
    async fn round(&mut self, round: usize, mode: Mode, peak_resettable: bool) -> Result<Sample> {
        let (records, shards) = (self.args.records, self.args.shards);
        clear(&mut self.con, &self.stream, shards).await?;
        if self.args.commandstats {
            let () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(&mut self.con).await?;
        }
        let rss_before = benches::mem::status_mib("VmRSS").unwrap_or(0.0);
        benches::mem::reset_peak_rss();
        let redis_before = redis_cpu(&mut self.con).await?;
        let (cpu_before, children_before) = process_cpu();
        let took = self.time(mode).await?;
        let (cpu_after, children_after) = process_cpu();
        let redis_after = redis_cpu(&mut self.con).await?;
        let written = total_len(&mut self.con, &self.stream, shards).await?;
        let label = mode.label(&self.args);
        ensure!(
            written == records as u64,
            "{label}: {written} entries written, expected {}",
            records
        );
        let client_cpu = if mode == Mode::RedisBenchmark {
            children_after - children_before
        } else {
            cpu_after - cpu_before
        };
        let per_record = 1e6 / records as f64;
        let sample = Sample {
            rate: rate(records, took),
            client_cpu_us: client_cpu * per_record,
            redis_cpu_us: (redis_after - redis_before) * per_record,
            rss_before_mib: rss_before,
            peak_rss_mib: if peak_resettable {
                benches::mem::status_mib("VmHWM")
            } else {
                None
            },
        };
        println!(
            "round {round} {label:<40} {:>8.0} records/s ({took:.2?})  client {:.2} us/rec  redis {:.2} us/rec  \
             rss {:.0} -> peak {} MiB  load {}",
            sample.rate,
            sample.client_cpu_us,
            sample.redis_cpu_us,
            sample.rss_before_mib,
            sample
                .peak_rss_mib
                .map_or_else(|| "n/a".to_string(), |p| format!("{p:.0}")),
            load_average()
        );
        if self.args.commandstats {
            println!("        {}", command_usec(&mut self.con).await?);
        }
        Ok(sample)
    }

    /// The timed part of one round of `mode`.
    async fn time(&self, mode: Mode) -> Result<Duration> {
        let (args, work, p) = (&self.args, &self.work, &self.producers);
        Ok(match mode {
            Mode::Raw(shape) => raw_run(&self.redis.url(), shape, args.records, work).await?,
            Mode::Sdk("sdk-batch") => sdk_batch_run(&p.producer, args, work).await?,
            Mode::Sdk("sdk-plain") => sdk_batch_run(&p.plain, args, work).await?,
            Mode::Sdk("sdk-idem") => sdk_batch_run(&p.idempotent, args, work).await?,
            Mode::Sdk("sdk-enqueue") => sdk_enqueue_run(&p.producer, args, work).await?,
            Mode::Sdk("sdk-enqueue-idem") => sdk_enqueue_run(&p.idempotent, args, work).await?,
            Mode::Sdk("sdk-enqueue-plain") => sdk_enqueue_run(&p.plain, args, work).await?,
            Mode::Sdk("sdk-durable") => sdk_batch_run(&p.durable, args, work).await?,
            Mode::Sdk("sdk-durable-plain") => sdk_batch_run(&p.durable_plain, args, work).await?,
            Mode::Sdk("sdk-enqueue-durable") => sdk_enqueue_run(&p.durable, args, work).await?,
            Mode::Sdk(other) => bail!("unknown mode {other:?}"),
            Mode::RedisBenchmark => {
                let port = self.redis.port;
                let a = args.clone();
                let r = tokio::task::spawn_blocking(move || redis_benchmark_run(port, &a)).await??;
                Duration::from_secs_f64(args.records as f64 / r)
            }
        })
    }
}

/// The table of medians, with each mode's ratio to the best raw finalist.
fn print_summary(args: &Args, modes: &[Mode], samples: &[Vec<Sample>]) {
    println!();
    let baseline = modes
        .iter()
        .zip(samples)
        .filter(|(m, _)| matches!(m, Mode::Raw(_)))
        .map(|(m, s)| (*m, median_of(s, |s| s.rate)))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    println!(
        "medians of {} interleaved rounds, {} records each (load average now {}); baseline = {} ({SHAPE_LEGEND}); \
         CPU per record: client = this process (for redis-benchmark: its own process), Redis = INFO cpu; memory: \
         this process's VmRSS before the mode and its peak (VmHWM) during the mode, in round 1:",
        args.rounds,
        args.records,
        load_average(),
        baseline.map_or_else(|| "none (raw not run)".to_string(), |(m, _)| m.label(args))
    );
    println!();
    println!(
        "| mode | median records/s | min - max | ratio to baseline | client CPU us/record | Redis CPU us/record | \
         RSS before / peak MiB |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (mode, s) in modes.iter().zip(samples) {
        let r = median_of(s, |s| s.rate);
        let min = s.iter().map(|s| s.rate).fold(f64::INFINITY, f64::min);
        let max = s.iter().map(|s| s.rate).fold(0.0, f64::max);
        let ratio = baseline.map_or_else(|| "n/a".to_string(), |(_, b)| format!("{:.3}", r / b));
        let mut label = mode.label(args);
        if baseline.is_some_and(|(m, _)| m == *mode) {
            label.push_str(" (baseline)");
        } else if *mode == Mode::RedisBenchmark {
            label.push_str(" (reference)");
        }
        let peak = s.first().and_then(|s| s.peak_rss_mib);
        println!(
            "| {label} | {r:.0} | {min:.0} - {max:.0} | {ratio} | {:.2} | {:.2} | {:.0} / {} |",
            median_of(s, |s| s.client_cpu_us),
            median_of(s, |s| s.redis_cpu_us),
            s.first().map_or(0.0, |s| s.rss_before_mib),
            peak.map_or_else(|| "n/a".to_string(), |p| format!("{p:.0}")),
        );
    }
}
