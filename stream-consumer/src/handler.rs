//! The application's side: the message handler and the optional rebalance listener.

use futures::future::BoxFuture;
use protocol::{FencingToken, ShardId};
use std::future::Future;

use crate::error::HandlerError;
use crate::message::Message;

/// Handles one message. Implemented for every `Fn(Message) -> Future<Output = Result<(), E>>` closure, so
/// usually you pass a closure to [`ConsumerBuilder::handler`](crate::ConsumerBuilder::handler).
///
/// * `Ok(())`: the entry is acknowledged (`XACK`).
/// * `Err(_)` (or a panic): the entry stays pending and is retried with backoff, in place (the shard waits: order
///   is kept), until it succeeds, the shard is revoked (its next owner retries it), or its delivery count exceeds
///   `max_deliveries` (it is dead-lettered, see [`crate::dead_letter`]).
/// * `Err(`[`Outcome`](crate::Outcome)`)`: the handler chooses: `RetryAfter(delay)` retries after that delay instead
///   of the backoff, `DeadLetter(reason)` dead-letters the entry at once.
///
/// A long entry needs no keep-alive: the member's heartbeats extend the assignment lease while the handler runs,
/// and the entry's idle time in Redis never matters (a next owner claims pending entries with min-idle 0, and only
/// after this member stopped).
///
/// For a pull-style loop instead of a handler, see [`ConsumerBuilder::build_stream`](crate::ConsumerBuilder::build_stream).
///
/// # Cancellation
/// A rebalance (DRAIN) or a graceful close lets a running handler finish. When the member is fenced or forgotten,
/// when its assignment lease runs out, or when the drain deadline of a close passes, the handler's future is
/// *dropped* at its next `.await`: another member may own the shard by then. The entry stays pending and is
/// delivered again, so handlers must be idempotent (at-least-once delivery).
///
/// # The lease deadline
/// The handler's future is polled under its shard's assignment-lease end, and the deadline is checked *before*
/// every poll: once it has passed, the future is dropped without being polled again, its result does not count
/// and nothing is acknowledged for it. This holds after any stall (SIGSTOP, a long GC pause, a frozen VM), whatever
/// order the tasks run in when the process resumes: a handler never completes after its lease ended. A timer
/// wakes the handler's task at the deadline, so a handler waiting on something else is dropped on time too. The
/// deadline follows the lease while the handler runs (each successful heartbeat extends it); read it with
/// [`lease_deadline`](crate::lease_deadline).
///
/// What a handler already did to the outside world before the deadline is not undone: a side effect that must not
/// be applied by a stalled owner needs a fencing token checked by its target, not only the lease.
///
/// # Example
/// A handler with state and a typed error, called directly as a unit test would (with [`Message::new`]). Pass it
/// to the consumer with `.handler(Totals::default())`.
/// ```
/// use std::collections::HashMap;
/// use std::sync::Mutex;
/// use stream_consumer::{EntryId, Handler, Message, ShardId, StreamName};
///
/// /// Cents per customer (in memory for the example; a real target fences its writes, see `Message`).
/// #[derive(Default)]
/// struct Totals(Mutex<HashMap<String, u64>>);
///
/// /// Retried, then dead-lettered after `max_deliveries`: a poison entry never blocks its shard for good.
/// #[derive(Debug, thiserror::Error)]
/// #[error("entry {0} lacks a `customer` or a numeric `cents` field")]
/// struct Malformed(EntryId);
///
/// impl Handler for Totals {
///     type Error = Malformed;
///
///     async fn handle(&self, msg: Message) -> Result<(), Malformed> {
///         let customer = msg.get_str("customer").ok_or(Malformed(msg.id()))?;
///         let cents: u64 = msg.get_str("cents").and_then(|c| c.parse().ok()).ok_or(Malformed(msg.id()))?;
///         let mut totals = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
///         *totals.entry(customer.to_owned()).or_default() += cents;
///         Ok(())
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let totals = Totals::default();
/// let fields = vec![(b"customer".to_vec(), b"c-42".to_vec()), (b"cents".to_vec(), b"1250".to_vec())];
/// let orders = StreamName::new("orders")?;
/// totals.handle(Message::new(orders.clone(), ShardId(3), "1700000000000-0".parse()?, fields, 1)).await?;
/// assert_eq!(totals.0.lock().unwrap()["c-42"], 1250);
/// let empty = Message::new(orders, ShardId(3), "1700000000000-1".parse()?, Vec::new(), 1);
/// assert!(totals.handle(empty).await.is_err());
/// # Ok(())
/// # }
/// ```
pub trait Handler: Send + Sync + 'static {
    /// The handler's error.
    type Error: Into<HandlerError>;

    /// Handles `message`.
    fn handle(&self, message: Message) -> impl Future<Output = Result<(), Self::Error>> + Send;
}

impl<F, Fut, E> Handler for F
where
    F: Fn(Message) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), E>> + Send,
    E: Into<HandlerError>,
{
    type Error = E;

    fn handle(&self, message: Message) -> impl Future<Output = Result<(), E>> + Send {
        self(message)
    }
}

/// Callbacks on rebalances, like Kafka's `ConsumerRebalanceListener`: flush or load per-shard state.
///
/// Every method has a no-op default. They run on the consumer's tasks, so keep them short: a slow
/// `on_revoked` delays the handover of the shard, a slow `on_lost` delays the rejoin.
///
/// # Deadlines
/// Every callback is dropped after [`Timings::listener_timeout`](crate::Timings::listener_timeout) (default 5 s).
/// `on_assigned` and `on_revoked` also run under the shard's assignment lease, like the handler: polled only
/// while it is valid, and dropped at their first poll past its end (the shard may have another owner by then).
/// `on_lost` runs after the lease is gone, so the timeout is its only bound.
///
/// # Example
/// Shares the fencing token of every shard this member reads with side effects made outside the handler (a
/// periodic flush of per-shard aggregates, say), and withdraws a shard's token once the shard is gone.
/// ```no_run
/// use std::collections::HashMap;
/// use std::sync::{Arc, Mutex, MutexGuard};
/// use stream_consumer::{Consumer, FencingToken, Message, RebalanceListener, ShardId};
///
/// #[derive(Clone, Default)]
/// struct Tokens(Arc<Mutex<HashMap<ShardId, FencingToken>>>);
///
/// impl Tokens {
///     fn set(&self) -> MutexGuard<'_, HashMap<ShardId, FencingToken>> {
///         self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
///     }
/// }
///
/// impl RebalanceListener for Tokens {
///     async fn on_assigned(&self, shard: ShardId, token: FencingToken) {
///         self.set().insert(shard, token);
///     }
///
///     async fn on_revoked(&self, shard: ShardId) {
///         // The last moment to flush this shard's state: the next owner starts after this returns.
///         self.set().remove(&shard);
///     }
///
///     async fn on_lost(&self, shards: Vec<ShardId>) {
///         // Another member may own them already: forget, don't flush.
///         let mut set = self.set();
///         for shard in shards {
///             set.remove(&shard);
///         }
///     }
/// }
///
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let tokens = Tokens::default();
/// let consumer = Consumer::builder("orders", "billing")
///     .coordinator("http://coordinator:7400")
///     .redis("redis://redis:6379")
///     .handler(|_msg: Message| async { Ok::<_, std::io::Error>(()) })
///     .rebalance_listener(tokens.clone())
///     .build()?;
/// let handle = consumer.start().await?;
/// // Later, in the flush task: write shard 0's aggregate with `tokens.set().get(&ShardId(0))`, or skip it.
/// # let _ = handle;
/// # Ok(())
/// # }
/// ```
pub trait RebalanceListener: Send + Sync + 'static {
    /// `shard` was assigned with fencing `token` (the one every [`Message`] of this assignment carries): called
    /// on the shard's reader task before its first read. A good place to load per-shard state, and to record the
    /// token wherever side effects are fenced.
    fn on_assigned(&self, shard: ShardId, token: FencingToken) -> impl Future<Output = ()> + Send {
        let _ = (shard, token);
        async {}
    }

    /// `shard` was revoked in an orderly way (DRAIN, a metadata correction, or a graceful close): called after its
    /// in-flight work finished and before the consumer reports it released, so the next owner starts after this
    /// returns.
    fn on_revoked(&self, shard: ShardId) -> impl Future<Output = ()> + Send {
        let _ = shard;
        async {}
    }

    /// `shards` were taken away without a drain: the member was fenced or forgotten by the coordinator, or its
    /// assignment lease ran out. Their readers have already stopped (in-flight handlers were dropped), and another
    /// member may own them already: do not commit per-shard state here.
    fn on_lost(&self, shards: Vec<ShardId>) -> impl Future<Output = ()> + Send {
        let _ = shards;
        async {}
    }
}

/// Object-safe form of [`Handler`], so the consumer is not generic over it.
pub(crate) trait DynHandler: Send + Sync {
    fn handle(&self, message: Message) -> BoxFuture<'_, Result<(), HandlerError>>;
}

impl<H: Handler> DynHandler for H {
    fn handle(&self, message: Message) -> BoxFuture<'_, Result<(), HandlerError>> {
        let fut = Handler::handle(self, message);
        Box::pin(async move { fut.await.map_err(Into::into) })
    }
}

/// Object-safe form of [`RebalanceListener`].
pub(crate) trait DynListener: Send + Sync {
    fn on_assigned(&self, shard: ShardId, token: FencingToken) -> BoxFuture<'_, ()>;
    fn on_revoked(&self, shard: ShardId) -> BoxFuture<'_, ()>;
    fn on_lost(&self, shards: Vec<ShardId>) -> BoxFuture<'_, ()>;
}

impl<L: RebalanceListener> DynListener for L {
    fn on_assigned(&self, shard: ShardId, token: FencingToken) -> BoxFuture<'_, ()> {
        Box::pin(RebalanceListener::on_assigned(self, shard, token))
    }

    fn on_revoked(&self, shard: ShardId) -> BoxFuture<'_, ()> {
        Box::pin(RebalanceListener::on_revoked(self, shard))
    }

    fn on_lost(&self, shards: Vec<ShardId>) -> BoxFuture<'_, ()> {
        Box::pin(RebalanceListener::on_lost(self, shards))
    }
}

/// The listener used when the application gives none.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct NoListener;

impl RebalanceListener for NoListener {}
