//! The background batching mode: an accumulator that callers append records to, and one task that sends the
//! batches it seals (like a Kafka producer's record accumulator and sender).
//!
//! # How a record moves
//! 1. [`Producer::enqueue`](crate::Producer::enqueue) waits for room (`queue_capacity` records accepted and not
//!    yet sent: backpressure), appends the record to the open batch under a short lock and returns a
//!    [`Delivery`] that points at the batch's shared outcome and the record's place in it. The calling task does
//!    this work itself: no message per record to a task, no channel per record.
//! 2. The open batch is sealed when it holds `max_batch_size` records (by the caller that filled it), when
//!    `linger` has passed since its first record and the in-flight budget lets it go, on
//!    [`Producer::flush`](crate::Producer::flush), and on close. The batcher task sends sealed batches in the
//!    order they were sealed, one pipeline per shard each. At most `max_in_flight_batches` batches, and
//!    `max_in_flight_bytes` of records, are written at once (one batch may always go); while the budget is spent,
//!    sealed batches wait, the open batch keeps filling, and once `queue_capacity` records wait, `enqueue` waits.
//! 3. When the batch's pipelines answer, its outcome is stored once and every waiting [`Delivery`] is woken; each
//!    takes its own record's outcome.
//!
//! A flush seals the open batch and resolves once every batch sealed before it has its outcome. Closing (on
//! `close`) seals the open batch and makes the batcher send what is left and wait for it before it exits: nothing
//! accepted is lost. Only cancellation (the producer was dropped without `close`) abandons records: records not
//! sent fail as [`PublishError::Closed`] (not written), in-flight ones as [`PublishError::Abandoned`] (unknown).
//!
//! # Why an accumulator (issue 17)
//! A bounded channel of records with a oneshot per record made the batcher task receive, buffer and answer every
//! record alone: profiled, the channel's send and receive and the oneshot per record (allocate, send, wake, poll)
//! were about a fifth of `enqueue`'s client CPU, on the one task that also sends. Now the callers append in
//! parallel, the batcher is woken once per batch, and an outcome costs one shared allocation per batch.

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{oneshot, Notify, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::BatchingConfig;
use crate::error::PublishError;
use crate::published::Published;
use crate::record::Record;
use crate::routed_publisher::RoutedPublisher;

/// The outcome of one queued record, delivered when its batch was written (or failed).
///
/// Awaiting a `Delivery` is optional: the record is published either way. Dropping it only discards the outcome.
///
/// # Cancel safety
/// Cancel safe: the outcome stays with its batch and the record is published whether or not anyone awaits it.
///
/// ```
/// # async fn example(producer: &stream_producer::Producer) -> Result<(), Box<dyn std::error::Error>> {
/// use stream_producer::Record;
///
/// // `enqueue` returns once the record is queued; the `Delivery` resolves when its batch was written.
/// let delivery = producer.enqueue(Record::with_key("customer-42").field("amount", "12.50")).await?;
/// let published = delivery.await?;
/// println!("written to shard {}", published.shard);
/// # Ok(())
/// # }
/// ```
#[must_use = "a Delivery tells whether the record was written"]
pub struct Delivery {
    outcome: Arc<BatchOutcome>,
    index: usize,
    /// Where this delivery's waker sits in the outcome's list, once registered (replaced, not added, on a poll
    /// from another task).
    waker_at: Option<usize>,
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("index", &self.index)
            .field("settled", &self.outcome.lock().settled)
            .finish()
    }
}

impl Future for Delivery {
    type Output = Result<Published, PublishError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let mut state = this.outcome.lock();
        if state.settled {
            // A record's outcome is taken once; a batch failed as a whole has only `failure`.
            return Poll::Ready(match state.results.get_mut(this.index).and_then(Option::take) {
                Some(own) => own,
                None => Err(state.failure.clone()),
            });
        }
        match this.waker_at {
            Some(at) => {
                if !state.wakers[at].will_wake(cx.waker()) {
                    state.wakers[at] = cx.waker().clone();
                }
            }
            None => {
                this.waker_at = Some(state.wakers.len());
                state.wakers.push(cx.waker().clone());
            }
        }
        Poll::Pending
    }
}

/// The outcome of one batch, shared by the [`Delivery`] of each of its records.
#[derive(Default)]
struct BatchOutcome(Mutex<OutcomeState>);

struct OutcomeState {
    settled: bool,
    /// One outcome per record, in batch order, each taken by its delivery.
    results: Vec<Option<Result<Published, PublishError>>>,
    /// The outcome of a record without its own (the batch was dropped before it was answered).
    failure: PublishError,
    wakers: Vec<Waker>,
}

impl Default for OutcomeState {
    fn default() -> Self {
        OutcomeState {
            settled: false,
            results: Vec::new(),
            failure: PublishError::Abandoned,
            wakers: Vec::new(),
        }
    }
}

impl BatchOutcome {
    fn lock(&self) -> MutexGuard<'_, OutcomeState> {
        self.0.lock().expect("the outcome lock is never held across a panic")
    }
}

/// The writing end of a [`BatchOutcome`]: settles it once, with every record's result or, when dropped unsettled,
/// with one failure for all (not written if the batch was never sent, unknown if it was).
struct Settle {
    outcome: Arc<BatchOutcome>,
    sent: bool,
}

impl Settle {
    fn new() -> Self {
        Settle {
            outcome: Arc::default(),
            sent: false,
        }
    }

    fn settle(&self, results: Vec<Result<Published, PublishError>>, failure: PublishError) {
        let wakers = {
            let mut state = self.outcome.lock();
            if state.settled {
                return;
            }
            state.settled = true;
            state.results = results.into_iter().map(Some).collect();
            state.failure = failure;
            std::mem::take(&mut state.wakers)
        };
        for waker in wakers {
            waker.wake();
        }
    }
}

impl Drop for Settle {
    fn drop(&mut self) {
        let failure = if self.sent {
            PublishError::Abandoned
        } else {
            PublishError::Closed
        };
        self.settle(Vec::new(), failure);
    }
}

/// A batch sealed and waiting to be sent.
struct Sealed {
    seq: u64,
    records: Vec<Record>,
    bytes: usize,
    settle: Settle,
}

/// What callers, `flush`, `close` and the batcher share.
pub(crate) struct Accumulator {
    config: BatchingConfig,
    /// Room for records accepted and not yet sent; closed when the producer closes or is dropped.
    room: Semaphore,
    /// Wakes the batcher: a batch was sealed, a first record started a linger, a flush or close arrived.
    wake: Notify,
    state: Mutex<State>,
}

struct State {
    /// The batch being filled, its bytes ([`Record::payload_len`]) and its outcome.
    open: Vec<Record>,
    open_bytes: usize,
    open_settle: Settle,
    /// When the open batch must go, whatever its size (its first record's arrival plus `linger`).
    deadline: Option<Instant>,
    /// Sealed batches, in the order they go.
    sealed: VecDeque<Sealed>,
    /// Sequence number of the next sealed batch.
    next_seq: u64,
    /// Flush waiters, each with the sequence number of the last batch it waits for.
    flushes: Vec<(u64, oneshot::Sender<()>)>,
    /// No more records: set by close (drain) and cancellation (abandon).
    closed: bool,
}

impl State {
    fn seal(&mut self, max_batch_size: usize) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.deadline = None;
        self.sealed.push_back(Sealed {
            seq,
            records: std::mem::replace(&mut self.open, Vec::with_capacity(max_batch_size)),
            bytes: std::mem::take(&mut self.open_bytes),
            settle: std::mem::replace(&mut self.open_settle, Settle::new()),
        });
    }
}

impl std::fmt::Debug for Accumulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Accumulator")
            .field("config", &self.config)
            .field("queued", &self.queued())
            .finish_non_exhaustive()
    }
}

impl Accumulator {
    pub(crate) fn new(config: BatchingConfig) -> Self {
        Accumulator {
            config,
            room: Semaphore::new(config.queue_capacity),
            wake: Notify::new(),
            state: Mutex::new(State {
                open: Vec::with_capacity(config.max_batch_size),
                open_bytes: 0,
                open_settle: Settle::new(),
                deadline: None,
                sealed: VecDeque::new(),
                next_seq: 0,
                flushes: Vec::new(),
                closed: false,
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .expect("the accumulator lock is never held across a panic")
    }

    /// Appends a checked record to the open batch once there is room.
    ///
    /// # Cancel safety
    /// Cancel safe: dropped while waiting for room, the record was not accepted.
    pub(crate) async fn append(&self, record: Record) -> Result<Delivery, PublishError> {
        let permit = self.room.acquire().await.map_err(|_| PublishError::Closed)?;
        let mut state = self.state();
        if state.closed {
            return Err(PublishError::Closed);
        }
        permit.forget();
        let first = state.open.is_empty();
        if first {
            state.deadline = Some(Instant::now() + self.config.linger);
        }
        state.open_bytes += record.payload_len();
        state.open.push(record);
        let delivery = Delivery {
            outcome: state.open_settle.outcome.clone(),
            index: state.open.len() - 1,
            waker_at: None,
        };
        let full = state.open.len() >= self.config.max_batch_size;
        if full {
            state.seal(self.config.max_batch_size);
        }
        drop(state);
        if first || full {
            self.wake.notify_one();
        }
        Ok(delivery)
    }

    /// A receiver that resolves once every record accepted before this call has its outcome; `None` when closed.
    pub(crate) fn flush(&self) -> Option<oneshot::Receiver<()>> {
        let (tx, rx) = oneshot::channel();
        let mut state = self.state();
        if state.closed {
            return None;
        }
        if !state.open.is_empty() {
            state.seal(self.config.max_batch_size);
        }
        match state.next_seq.checked_sub(1) {
            Some(last) => state.flushes.push((last, tx)),
            None => {
                let _ = tx.send(());
            }
        }
        drop(state);
        self.wake.notify_one();
        Some(rx)
    }

    /// Stops accepting records; the batcher sends what was accepted and exits.
    pub(crate) fn close(&self) {
        let mut state = self.state();
        state.closed = true;
        if !state.open.is_empty() {
            state.seal(self.config.max_batch_size);
        }
        drop(state);
        self.room.close();
        self.wake.notify_one();
    }

    /// Records accepted and not yet sent.
    pub(crate) fn queued(&self) -> usize {
        let state = self.state();
        state.open.len() + state.sealed.iter().map(|b| b.records.len()).sum::<usize>()
    }

    /// The next batch to send: the oldest sealed one, or the open batch sealed now when its linger passed.
    fn next_batch(&self) -> Option<Sealed> {
        let mut state = self.state();
        if state.sealed.is_empty() && state.deadline.is_some_and(|d| Instant::now() >= d) {
            state.seal(self.config.max_batch_size);
        }
        state.sealed.pop_front()
    }

    /// Resolves the flushes whose batches all have their outcome (none waits sealed or in flight).
    fn resolve_flushes(&self, lowest_in_flight: Option<u64>) {
        let mut state = self.state();
        if state.flushes.is_empty() {
            return;
        }
        // The oldest batch without its outcome yet: in flight, or sealed and waiting.
        let lowest = lowest_in_flight
            .into_iter()
            .chain(state.sealed.front().map(|b| b.seq))
            .min();
        let (done, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut state.flushes)
            .into_iter()
            .partition(|(target, _)| lowest.is_none_or(|low| low > *target));
        state.flushes = waiting;
        drop(state);
        for (_, tx) in done {
            let _ = tx.send(());
        }
    }

    /// The producer was dropped without `close`: what was not sent fails as not written (its outcomes settle as
    /// they drop), flushes fail.
    fn abandon(&self) {
        self.room.close();
        let (open, sealed, flushes) = {
            let mut state = self.state();
            state.closed = true;
            state.deadline = None;
            state.open_bytes = 0;
            let open = std::mem::replace(&mut state.open_settle, Settle::new());
            state.open.clear();
            (
                open,
                std::mem::take(&mut state.sealed),
                std::mem::take(&mut state.flushes),
            )
        };
        // Settled outside the lock: waking a delivery may run code that appends again (and is refused).
        drop((open, sealed, flushes));
    }
}

type InFlight = Pin<Box<dyn Future<Output = u64> + Send>>;

/// Sends sealed batches until the accumulator is closed and drained (graceful) or `cancel` fires (abandon).
pub(crate) async fn run(shared: Arc<RoutedPublisher>, acc: Arc<Accumulator>, cancel: CancellationToken) {
    let config = acc.config;
    let mut in_flight: FuturesUnordered<InFlight> = FuturesUnordered::new();
    // The sequence numbers of the batches in flight, with their bytes, and the sum of those bytes.
    let mut in_flight_seqs: BTreeMap<u64, usize> = BTreeMap::new();
    let mut in_flight_bytes = 0usize;
    // Whether the in-flight budget lets another batch go: fewer than `max_in_flight_batches` in flight, and fewer
    // than `max_in_flight_bytes` (or nothing in flight: a batch larger than the budget still goes alone).
    let may_send = |in_flight: &FuturesUnordered<InFlight>, bytes: usize| {
        in_flight.len() < config.max_in_flight_batches && (in_flight.is_empty() || bytes < config.max_in_flight_bytes)
    };
    loop {
        while may_send(&in_flight, in_flight_bytes) {
            let Some(Sealed {
                seq,
                records,
                bytes,
                mut settle,
            }) = acc.next_batch()
            else {
                break;
            };
            acc.room.add_permits(records.len());
            settle.sent = true;
            in_flight_seqs.insert(seq, bytes);
            in_flight_bytes += bytes;
            shared.stats.batches.fetch_add(1, Ordering::Relaxed);
            let shared = shared.clone();
            in_flight.push(Box::pin(async move {
                // Outside tokio's cooperative budget: this one task polls every batch in flight, and under an
                // exhausted budget a pipeline's send into the connection's channel returns Pending without taking
                // its place, so a later batch could reach the connection first and write a key's later records
                // before its earlier ones (measured: 49-385 of 20,000 records of one caller out of key order).
                let results = tokio::task::unconstrained(shared.publish_checked(&records)).await;
                settle.settle(results, PublishError::Abandoned);
                seq
            }));
        }
        acc.resolve_flushes(in_flight_seqs.keys().next().copied());
        let (drained, deadline) = {
            let state = acc.state();
            let drained = state.closed && state.open.is_empty() && state.sealed.is_empty();
            (drained, state.deadline.filter(|_| state.sealed.is_empty()))
        };
        if drained && in_flight.is_empty() {
            break;
        }
        let lingering = deadline.is_some() && may_send(&in_flight, in_flight_bytes);
        let deadline = deadline.unwrap_or_else(Instant::now);
        tokio::select! {
            biased;
            _ = cancel.cancelled() => {
                acc.abandon();
                // The batches in flight drop with this task: their outcomes settle as unknown.
                return;
            }
            Some(seq) = in_flight.next(), if !in_flight.is_empty() => {
                in_flight_bytes -= in_flight_seqs.remove(&seq).unwrap_or(0);
            }
            _ = acc.wake.notified() => {}
            _ = tokio::time::sleep_until(deadline), if lingering => {}
        }
    }
    acc.resolve_flushes(None);
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::FutureExt;
    use protocol::{EntryId, RoutingVersion, ShardId};

    use super::*;

    fn config(queue_capacity: usize, max_batch_size: usize) -> BatchingConfig {
        BatchingConfig {
            queue_capacity,
            max_batch_size,
            linger: Duration::from_secs(60),
            ..BatchingConfig::default()
        }
    }

    fn record(n: usize) -> Record {
        Record::with_key(n.to_string()).field("n", "1")
    }

    fn published(seq: u64) -> Published {
        Published {
            shard: ShardId(0),
            id: EntryId { ms: 1, seq },
            routing_version: RoutingVersion(1),
            duplicate: false,
        }
    }

    #[tokio::test]
    async fn each_delivery_takes_its_own_records_outcome_and_is_woken_when_the_batch_settles() {
        let acc = Accumulator::new(config(10, 3));
        let mut deliveries = Vec::new();
        for n in 0..3 {
            deliveries.push(acc.append(record(n)).await.unwrap());
        }
        // The third record filled the batch: sealed, nothing left open.
        assert_eq!(acc.queued(), 3);
        let batch = acc.next_batch().expect("a full batch is sealed");
        assert_eq!((batch.seq, batch.records.len()), (0, 3));
        let mut waiting = tokio::spawn(deliveries.pop().unwrap());
        assert!((&mut waiting).now_or_never().is_none());
        batch.settle.settle(
            vec![Ok(published(0)), Err(PublishError::Closed), Ok(published(2))],
            PublishError::Abandoned,
        );
        drop(batch);
        assert_eq!(waiting.await.unwrap().unwrap(), published(2));
        assert_eq!(deliveries.remove(0).await.unwrap(), published(0));
        assert!(matches!(deliveries.remove(0).await, Err(PublishError::Closed)));
    }

    #[tokio::test]
    async fn a_batch_dropped_before_it_was_sent_is_not_written_and_after_it_is_unknown() {
        let acc = Accumulator::new(config(10, 2));
        let unsent = [
            acc.append(record(0)).await.unwrap(),
            acc.append(record(1)).await.unwrap(),
        ];
        let sent = acc.append(record(2)).await.unwrap();
        let _open = acc.append(record(3)).await.unwrap();
        drop(acc.next_batch().unwrap());
        let mut second = acc.next_batch().unwrap();
        second.settle.sent = true;
        drop(second);
        for d in unsent {
            assert!(matches!(d.await, Err(PublishError::Closed)));
        }
        assert!(matches!(sent.await, Err(PublishError::Abandoned)));
    }

    #[tokio::test]
    async fn append_waits_for_room_until_a_batch_is_sent_and_fails_once_closed() {
        let acc = Accumulator::new(config(2, 2));
        let _a = acc.append(record(0)).await.unwrap();
        let _b = acc.append(record(1)).await.unwrap();
        let mut blocked = Box::pin(acc.append(record(2)));
        assert!((&mut blocked).now_or_never().is_none(), "no room: append waits");
        // Sending a batch gives its records' room back (as the batcher does).
        let batch = acc.next_batch().unwrap();
        acc.room.add_permits(batch.records.len());
        let _c = blocked.await.unwrap();
        assert_eq!(acc.queued(), 1);
        acc.close();
        assert!(matches!(acc.append(record(3)).await, Err(PublishError::Closed)));
        // Close sealed the open batch: it still goes.
        assert_eq!(acc.next_batch().map(|b| b.records.len()), Some(1));
    }

    #[tokio::test]
    async fn flush_seals_the_open_batch_and_waits_for_every_batch_sealed_before_it() {
        let acc = Accumulator::new(config(10, 2));
        assert!(acc.flush().unwrap().await.is_ok(), "nothing accepted: resolved at once");
        for n in 0..3 {
            drop(acc.append(record(n)).await.unwrap());
        }
        let mut done = acc.flush().unwrap();
        assert_eq!(acc.queued(), 3, "flush sealed the open record");
        let first = acc.next_batch().unwrap();
        let second = acc.next_batch().unwrap();
        assert_eq!((first.seq, second.seq), (0, 1));
        acc.resolve_flushes(Some(0));
        assert!((&mut done).now_or_never().is_none(), "batch 0 is in flight");
        acc.resolve_flushes(Some(1));
        assert!((&mut done).now_or_never().is_none(), "batch 1 is in flight");
        acc.resolve_flushes(None);
        assert!(done.await.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn the_open_batch_goes_once_its_linger_passed() {
        let acc = Accumulator::new(BatchingConfig {
            linger: Duration::from_millis(5),
            ..config(10, 100)
        });
        let _d = acc.append(record(0)).await.unwrap();
        assert!(acc.next_batch().is_none(), "lingering");
        tokio::time::advance(Duration::from_millis(5)).await;
        assert_eq!(acc.next_batch().map(|b| b.records.len()), Some(1));
    }
}
