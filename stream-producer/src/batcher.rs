//! The background batching mode: a bounded queue of records drained by one task into batches, so many
//! concurrent callers share pipelines (like a Kafka producer's accumulator).
//!
//! # How a record moves
//! 1. [`Producer::enqueue`](crate::Producer::enqueue) waits for room in the bounded queue (backpressure), puts the
//!    record in and returns a [`Delivery`].
//! 2. The batcher task takes records until it holds `max_batch_size` of them or `linger` has passed since the
//!    first one, then hands the batch to the publisher (one pipeline per shard) and starts the next batch. At most
//!    `max_in_flight_batches` batches, and `max_in_flight_bytes` of records, are written at once (one batch may
//!    always go); while the budget is spent and the current batch is full, the batcher stops taking records, the
//!    queue fills, and `enqueue` waits.
//! 3. When the batch's pipelines answer, every record's [`Delivery`] resolves with its own outcome.
//!
//! A flush marker travels through the same queue, so [`Producer::flush`](crate::Producer::flush) resolves once
//! every record accepted before it has its outcome. Closing the queue (on `close`) makes the batcher send what is
//! left and wait for it before it exits: nothing accepted is lost. Only cancellation (the producer was dropped
//! without `close`) abandons records: queued ones fail as [`PublishError::Closed`] (not written), in-flight ones
//! as [`PublishError::Abandoned`] (unknown).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::BatchingConfig;
use crate::error::PublishError;
use crate::publisher::{Published, Record};
use crate::shared::Shared;

/// The outcome of one queued record, delivered when its batch was written (or failed).
///
/// Awaiting a `Delivery` is optional: the record is published either way. Dropping it only discards the outcome.
///
/// # Cancel safety
/// Cancel safe: the outcome stays with the batcher and the record is published whether or not anyone awaits it.
#[derive(Debug)]
#[must_use = "a Delivery tells whether the record was written"]
pub struct Delivery {
    rx: oneshot::Receiver<Result<Published, PublishError>>,
}

impl Future for Delivery {
    type Output = Result<Published, PublishError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.rx)
            .poll(cx)
            .map(|r| r.unwrap_or(Err(PublishError::Abandoned)))
    }
}

/// What travels through the queue.
pub(crate) enum Msg {
    Record(Record, oneshot::Sender<Result<Published, PublishError>>),
    /// Resolve once every record queued before this marker has its outcome.
    Flush(oneshot::Sender<()>),
}

impl Msg {
    pub(crate) fn record(record: Record) -> (Msg, Delivery) {
        let (tx, rx) = oneshot::channel();
        (Msg::Record(record, tx), Delivery { rx })
    }
}

type Reply = oneshot::Sender<Result<Published, PublishError>>;
type InFlight = Pin<Box<dyn Future<Output = u64> + Send>>;

/// The batcher task's state.
struct Batcher {
    shared: Arc<Shared>,
    config: BatchingConfig,
    /// The batch being filled.
    batch: Vec<(Record, Reply)>,
    /// Bytes of the batch being filled ([`Record::payload_len`]).
    batch_bytes: usize,
    /// When the batch being filled must go, whatever its size.
    deadline: Option<Instant>,
    /// Batches being written; each resolves to its sequence number.
    in_flight: FuturesUnordered<InFlight>,
    /// The sequence numbers of the batches in flight, with their bytes.
    in_flight_seqs: BTreeMap<u64, usize>,
    /// The sum of those bytes.
    in_flight_bytes: usize,
    /// Sequence number of the next dispatched batch.
    next_seq: u64,
    /// Flush waiters, each with the sequence number of the last batch it waits for.
    flushes: Vec<(u64, oneshot::Sender<()>)>,
}

/// Runs the batcher until the queue is closed and drained (graceful) or `cancel` fires (abandon).
pub(crate) async fn run(
    shared: Arc<Shared>,
    config: BatchingConfig,
    mut rx: mpsc::Receiver<Msg>,
    cancel: CancellationToken,
) {
    let mut b = Batcher {
        shared,
        config,
        batch: Vec::with_capacity(config.max_batch_size),
        batch_bytes: 0,
        deadline: None,
        in_flight: FuturesUnordered::new(),
        in_flight_seqs: BTreeMap::new(),
        in_flight_bytes: 0,
        next_seq: 0,
        flushes: Vec::new(),
    };
    let mut open = true;
    let mut inbox = Vec::with_capacity(config.max_batch_size);
    loop {
        b.maybe_dispatch(!open);
        if !open && b.batch.is_empty() && b.in_flight.is_empty() {
            break;
        }
        let can_take = open && b.batch.len() < b.config.max_batch_size;
        let lingering = !b.batch.is_empty() && b.may_send();
        let deadline = b.deadline.unwrap_or_else(Instant::now);
        tokio::select! {
            biased;
            _ = cancel.cancelled() => {
                b.abandon(&mut rx);
                return;
            }
            Some(seq) = b.in_flight.next(), if !b.in_flight.is_empty() => {
                b.in_flight_bytes -= b.in_flight_seqs.remove(&seq).unwrap_or(0);
                b.resolve_flushes();
            }
            // Takes whatever is queued already, up to a full batch, in one call.
            n = rx.recv_many(&mut inbox, b.config.max_batch_size - b.batch.len()), if can_take => {
                if n == 0 {
                    open = false;
                }
                for msg in inbox.drain(..) {
                    b.take(msg);
                }
            },
            _ = tokio::time::sleep_until(deadline), if lingering => {
                b.deadline = Some(Instant::now());
            }
        }
    }
    b.resolve_flushes();
}

impl Batcher {
    /// Whether the in-flight budget lets another batch go: fewer than `max_in_flight_batches` in flight, and
    /// fewer than `max_in_flight_bytes` (or nothing in flight: a batch larger than the budget still goes alone).
    fn may_send(&self) -> bool {
        self.in_flight.len() < self.config.max_in_flight_batches
            && (self.in_flight.is_empty() || self.in_flight_bytes < self.config.max_in_flight_bytes)
    }

    fn take(&mut self, msg: Msg) {
        match msg {
            Msg::Record(record, reply) => {
                if self.batch.is_empty() {
                    self.deadline = Some(Instant::now() + self.config.linger);
                }
                self.batch_bytes += record.payload_len();
                self.batch.push((record, reply));
            }
            Msg::Flush(done) => {
                // Wait for the batch being filled (it goes at once) or, if empty, for the last dispatched one.
                let target = if self.batch.is_empty() {
                    self.next_seq.checked_sub(1)
                } else {
                    self.deadline = Some(Instant::now());
                    Some(self.next_seq)
                };
                match target {
                    Some(seq) => self.flushes.push((seq, done)),
                    None => {
                        let _ = done.send(());
                    }
                }
                self.resolve_flushes();
            }
        }
    }

    /// Sends the batch if it is full, its linger passed, or the queue is closed, and a slot is free.
    fn maybe_dispatch(&mut self, closing: bool) {
        if self.batch.is_empty() || !self.may_send() {
            return;
        }
        let due = self.deadline.is_some_and(|d| Instant::now() >= d);
        if !(closing || due || self.batch.len() >= self.config.max_batch_size) {
            return;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.deadline = None;
        let batch = std::mem::replace(&mut self.batch, Vec::with_capacity(self.config.max_batch_size));
        let bytes = std::mem::take(&mut self.batch_bytes);
        let shared = self.shared.clone();
        self.in_flight_seqs.insert(seq, bytes);
        self.in_flight_bytes += bytes;
        shared.stats.batches.fetch_add(1, Ordering::Relaxed);
        self.in_flight.push(Box::pin(async move {
            let (records, replies): (Vec<Record>, Vec<Reply>) = batch.into_iter().unzip();
            // Outside tokio's cooperative budget: this one task polls every batch in flight, and under an
            // exhausted budget a pipeline's send into the connection's channel returns Pending without taking its
            // place, so a later batch could reach the connection first and write a key's later records before its
            // earlier ones (measured: 49-385 of 20,000 records of one caller out of key order).
            let results = tokio::task::unconstrained(shared.publish_checked(&records)).await;
            for (reply, result) in replies.into_iter().zip(results) {
                // The caller may have dropped its Delivery: the outcome is then nobody's business.
                let _ = reply.send(result);
            }
            seq
        }));
    }

    fn resolve_flushes(&mut self) {
        let lowest_in_flight = self.in_flight_seqs.keys().next().copied();
        let next_seq = self.next_seq;
        let (done, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.flushes)
            .into_iter()
            .partition(|(target, _)| *target < next_seq && lowest_in_flight.is_none_or(|low| low > *target));
        self.flushes = waiting;
        for (_, tx) in done {
            let _ = tx.send(());
        }
    }

    /// The producer was dropped without `close`: fail what never left as not written; in-flight batches are
    /// dropped with this task, so their deliveries report `Abandoned` (unknown).
    fn abandon(&mut self, rx: &mut mpsc::Receiver<Msg>) {
        rx.close();
        let fail = |reply: Reply| {
            let _ = reply.send(Err(PublishError::Closed));
        };
        for (_, reply) in self.batch.drain(..) {
            fail(reply);
        }
        self.batch_bytes = 0;
        while let Ok(msg) = rx.try_recv() {
            if let Msg::Record(_, reply) = msg {
                fail(reply);
            }
        }
    }
}
