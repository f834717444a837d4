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
