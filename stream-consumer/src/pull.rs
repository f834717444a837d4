//! Pull-style consumption: a [`Stream`] of [`PulledMessage`]s acknowledged explicitly, built on the handler
//! machinery so the lease, fencing, in-flight and `XACK` rules are the handler's.
//!
//! Each entry is still run by its shard's reader as a handler call: the internal handler hands the message to the
//! stream and waits for its verdict. The handler's future is polled under the shard's lease like any handler, so
//! a verdict counts only if that future observes it while the lease is valid; [`PulledMessage::ack`] waits for
//! that confirmation instead of trusting its own clock.

use futures::Stream;
use std::ops::Deref;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

use crate::builder::ConsumerBuilder;
use crate::consumer::Consumer;
use crate::error::{ConfigError, HandlerError};
use crate::handler::Handler;
use crate::message::Message;
use crate::outcome::Outcome;

/// What the application decided for a pulled message, and where the reader confirms it saw the decision.
type Verdict = (Decision, oneshot::Sender<()>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Decision {
    Ack,
    Nack,
    Outcome(Outcome),
}

/// An acknowledgement that did not count: nothing was sent to Redis for it and the entry stays pending (it is
/// delivered again, to this member or to the shard's next owner).
///
/// ```
/// # async fn example(msg: stream_consumer::PulledMessage) {
/// use stream_consumer::AckError;
///
/// match msg.ack().await {
///     Ok(()) => {}
///     // Nothing was acknowledged: the entry is delivered again, here or to the shard's next owner.
///     Err(AckError::LeaseExpired) => eprintln!("too late to acknowledge"),
///     Err(e) => eprintln!("{e}"),
/// }
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AckError {
    /// The message's delivery ended before the verdict could count: the assignment lease ran out, the shard was
    /// taken away without a drain (the member was fenced or forgotten), or the consumer stopped (aborted, or the
    /// drain deadline of a close passed).
    #[error("the message's lease ran out or its shard was taken away: the entry stays pending")]
    LeaseExpired,
}

/// One message pulled from a [`MessageStream`]; dereferences to [`Message`].
///
/// Settle it with [`ack`](PulledMessage::ack) or [`nack`](PulledMessage::nack). Its shard waits until then
/// (entries of one shard are delivered one at a time, in order). Dropping it without a verdict counts as a
/// [`nack`](PulledMessage::nack).
///
/// ```
/// # async fn example(msg: stream_consumer::PulledMessage) -> Result<(), stream_consumer::AckError> {
/// if msg.is_expired() {
///     return Ok(()); // dropped unsettled: a nack, delivered again
/// }
/// let readable = msg.get_str("amount").is_some_and(|a| a.parse::<u64>().is_ok());
/// if readable {
///     msg.ack().await
/// } else {
///     msg.dead_letter("amount missing or not a number").await
/// }
/// # }
/// ```
#[derive(Debug)]
pub struct PulledMessage {
    message: Message,
    verdict: oneshot::Sender<Verdict>,
}

impl Deref for PulledMessage {
    type Target = Message;

    fn deref(&self) -> &Message {
        &self.message
    }
}

impl PulledMessage {
    /// Acknowledges the message: once this returns `Ok`, the shard's reader accepted it within the lease and
    /// sends the `XACK` (after checking the lease once more, so an entry accepted at the lease's very end can still
    /// be delivered again: delivery stays at-least-once).
    ///
    /// # Errors
    /// [`AckError::LeaseExpired`] when the delivery had already ended: nothing is acknowledged and the entry
    /// stays pending.
    pub async fn ack(self) -> Result<(), AckError> {
        self.settle(Decision::Ack).await
    }

    /// Refuses the message, like a handler error: it stays pending and is delivered again after the retry
    /// backoff (and dead-lettered once its delivery count exceeds `max_deliveries`).
    ///
    /// # Errors
    /// [`AckError::LeaseExpired`] when the delivery had already ended (the entry is pending either way).
    pub async fn nack(self) -> Result<(), AckError> {
        self.settle(Decision::Nack).await
    }

    /// Refuses the message and has it delivered again after `delay` instead of the retry backoff (see
    /// [`Outcome::RetryAfter`]).
    ///
    /// # Errors
    /// [`AckError::LeaseExpired`] when the delivery had already ended (the entry is pending either way).
    pub async fn retry_after(self, delay: Duration) -> Result<(), AckError> {
        self.settle(Decision::Outcome(Outcome::RetryAfter(delay))).await
    }

    /// Moves the message to its shard's dead-letter stream now, with `reason` (see [`Outcome::DeadLetter`]).
    ///
    /// # Errors
    /// [`AckError::LeaseExpired`] when the delivery had already ended: nothing is dead-lettered and the entry
    /// stays pending.
    pub async fn dead_letter(self, reason: impl Into<String>) -> Result<(), AckError> {
        self.settle(Decision::Outcome(Outcome::DeadLetter(reason.into()))).await
    }

    /// Whether the delivery already ended (lease ran out, shard taken away, consumer stopped): an `ack` would
    /// fail.
    pub fn is_expired(&self) -> bool {
        self.verdict.is_closed()
    }

    /// The message, giving up the right to settle it (counts as a [`nack`](PulledMessage::nack)).
    pub fn into_message(self) -> Message {
        self.message
    }

    async fn settle(self, decision: Decision) -> Result<(), AckError> {
        let (confirm, confirmed) = oneshot::channel();
        self.verdict
            .send((decision, confirm))
            .map_err(|_| AckError::LeaseExpired)?;
        // The reader drops its side unpolled once the lease has run out; confirming means it saw the verdict
        // in a poll made within the lease.
        confirmed.await.map_err(|_| AckError::LeaseExpired)
    }
}

/// The consumer's messages as a [`Stream`], the pull-style alternative to a [`Handler`] (like a Kafka
/// `StreamConsumer`). Made with [`ConsumerBuilder::build_stream`].
///
/// The same rules hold as for a handler: one message of a shard at a time, in order; the shard's assignment lease
/// bounds each delivery, and a message whose delivery ended (lease run out, shard fenced or taken away) cannot be
/// acknowledged and is skipped if it had not been pulled yet. A shard revoked in an orderly way (DRAIN) waits for
/// the message in hand to be settled, then delivers nothing more. The stream ends when the consumer has stopped.
///
/// Keep pulling until the consumer is closed: a shard whose message is not settled holds its shard (and a close
/// waits for it up to the drain timeout). Dropping the stream first leaves the remaining deliveries waiting until
/// the consumer stops; their entries stay pending.
///
/// # Example
/// ```no_run
/// use futures::StreamExt;
/// use stream_consumer::Consumer;
///
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let (consumer, mut messages) = Consumer::builder("orders", "billing")
///     .coordinator("http://coordinator-0:7400")
///     .redis("redis://redis:6379")
///     .build_stream()?;
/// let handle = consumer.start().await?;
/// while let Some(msg) = messages.next().await {
///     println!("shard {} entry {}: {:?}", msg.shard(), msg.id(), msg.get_str("amount"));
///     if let Err(e) = msg.ack().await {
///         // Not acknowledged: the entry stays pending and is delivered again.
///         eprintln!("{e}");
///     }
/// #   break;
/// }
/// handle.close().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct MessageStream {
    rx: mpsc::Receiver<PulledMessage>,
}

impl Stream for MessageStream {
    type Item = PulledMessage;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<PulledMessage>> {
        loop {
            match self.rx.poll_recv(cx) {
                // Its delivery ended while it waited in the channel: nobody could settle it.
                Poll::Ready(Some(m)) if m.is_expired() => continue,
                other => return other,
            }
        }
    }
}

/// The handler behind a [`MessageStream`].
struct PullHandler {
    tx: mpsc::Sender<PulledMessage>,
}

#[derive(Debug, thiserror::Error)]
enum PullError {
    #[error("the application refused the message (nack, or dropped without a verdict)")]
    Refused,
}

impl Handler for PullHandler {
    type Error = HandlerError;

    async fn handle(&self, message: Message) -> Result<(), HandlerError> {
        let (verdict, decided) = oneshot::channel();
        if self.tx.send(PulledMessage { message, verdict }).await.is_err() {
            // The stream was dropped. Failing would count a delivery per retry and end in the dead letter;
            // waiting keeps the entry pending until the consumer stops (or the lease drops this future).
            std::future::pending::<()>().await;
        }
        let (decision, confirm) = decided.await.map_err(|_| PullError::Refused)?;
        let _ = confirm.send(());
        match decision {
            Decision::Ack => Ok(()),
            Decision::Nack => Err(PullError::Refused.into()),
            Decision::Outcome(outcome) => Err(outcome.into()),
        }
    }
}

impl ConsumerBuilder {
    /// Builds a consumer whose messages are pulled from the returned [`MessageStream`] instead of handed to a
    /// handler (a handler set with [`handler`](ConsumerBuilder::handler) is replaced). Run the consumer as usual
    /// ([`Consumer::start`], [`Consumer::spawn`] or [`Consumer::run`]); the stream ends when it stops.
    ///
    /// # Errors
    /// [`ConfigError`] naming the first rule broken, as [`build`](ConsumerBuilder::build).
    pub fn build_stream(self) -> Result<(Consumer, MessageStream), ConfigError> {
        // One slot is enough: each shard's reader waits with its own message, so every owned shard still has one
        // delivery under way, and nothing beyond one message per shard is ever held.
        let (tx, rx) = mpsc::channel(1);
        let consumer = self.handler(PullHandler { tx }).build()?;
        Ok((consumer, MessageStream { rx }))
    }
}
