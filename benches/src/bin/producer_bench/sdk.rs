//! The SDK modes: `Producer::send_batch` and `Producer::enqueue` from several tasks over the same records.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use stream_producer::{Producer, Record};

use crate::args::Args;
use crate::raw::Workload;

pub(crate) async fn sdk_batch_run(producer: &Arc<Producer>, args: &Args, work: &Arc<Workload>) -> Result<Duration> {
    let n = work.keys.len();
    let batch = args.sdk_batch;
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..args.sdk_tasks)
        .map(|_| {
            let producer = producer.clone();
            let work = work.clone();
            let next = next.clone();
            tokio::spawn(async move {
                loop {
                    let from = next.fetch_add(batch, Ordering::Relaxed);
                    if from >= n {
                        return Ok::<_, anyhow::Error>(());
                    }
                    let to = (from + batch).min(n);
                    let records: Vec<Record> = (from..to).map(|i| work.record(i)).collect();
                    let published = producer.send_batch(records).await?;
                    ensure!(
                        published.len() == to - from,
                        "{} outcomes of {}",
                        published.len(),
                        to - from
                    );
                }
            })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    Ok(start.elapsed())
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
