//! The SDK modes: `Producer::send_batch` and `Producer::enqueue` from several tasks over the same records.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use protocol::names::StreamName;
use stream_producer::{BatchingConfig, Durability, Producer, Record};

use crate::args::Args;
use crate::raw::{timed_tasks, Claims, Workload};

pub(crate) async fn sdk_batch_run(producer: &Arc<Producer>, args: &Args, work: &Arc<Workload>) -> Result<Duration> {
    let n = work.keys.len();
    let batch = args.sdk_batch;
    let claims = Claims::new(n, batch);
    timed_tasks(args.sdk_tasks, |_| {
        let (producer, work, claims) = (producer.clone(), work.clone(), claims.clone());
        async move {
            while let Some(range) = claims.next() {
                let expected = range.len();
                let records: Vec<Record> = range.map(|i| work.record(i)).collect();
                let published = producer.send_batch(records).await?;
                ensure!(
                    published.len() == expected,
                    "{} outcomes of {expected}",
                    published.len()
                );
            }
            Ok(())
        }
    })
    .await
}

pub(crate) async fn sdk_enqueue_run(producer: &Arc<Producer>, args: &Args, work: &Arc<Workload>) -> Result<Duration> {
    let n = work.keys.len();
    let per_task = n.div_ceil(args.enqueue_tasks);
    let window = args.delivery_window.max(1);
    let start = Instant::now();
    let tasks: Vec<_> = (0..args.enqueue_tasks)
        .map(|t| {
            let producer = producer.clone();
            let work = work.clone();
            tokio::spawn(async move {
                let mut outstanding = VecDeque::with_capacity(window + 1);
                for i in t * per_task..((t + 1) * per_task).min(n) {
                    outstanding.push_back(producer.enqueue(work.record(i)).await?);
                    if outstanding.len() > window {
                        let oldest = outstanding.pop_front().expect("not empty");
                        oldest.await?;
                    }
                }
                for delivery in outstanding {
                    delivery.await?;
                }
                Ok::<_, anyhow::Error>(())
            })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    Ok(start.elapsed())
}

/// The producer every SDK mode of the bench builds: the bench's batching flags, and `fencing`, `idempotence` and
/// `durability` as the mode asks.
pub(crate) fn bench_producer(
    args: &Args,
    stream: &StreamName,
    (coordinator, redis): (&str, &str),
    (fencing, idempotence): (bool, bool),
    durability: Durability,
) -> Result<Arc<Producer>> {
    Ok(Arc::new(
        Producer::builder(stream.as_str())
            .coordinator(coordinator)
            .redis(redis)
            .connections(args.sdk_connections)
            .max_batch_size(args.max_batch_size)
            .queue_capacity((args.max_batch_size * 16).max(10_000))
            .max_in_flight_batches(
                args.max_in_flight_batches
                    .unwrap_or(BatchingConfig::default().max_in_flight_batches),
            )
            .fencing(fencing)
            .idempotence(idempotence)
            .durability(durability)
            .build()?,
    ))
}
