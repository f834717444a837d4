//! Handler outcomes beyond success and failure: an error value the reader recognises.

use std::time::Duration;

/// The longest [`Outcome::RetryAfter`] delay honoured; a longer one is cut to this (the shard waits meanwhile).
pub const MAX_RETRY_DELAY: Duration = Duration::from_secs(3600);

/// Return it as the handler's error (it converts into [`HandlerError`](crate::HandlerError)) to choose what
/// happens to the entry instead of the default retry with backoff. The reader acts on it like on any handler
/// error, under the same lease checks: nothing is sent once the lease ran out.
///
/// # Example
/// ```no_run
/// use std::time::Duration;
/// use stream_consumer::{HandlerError, Message, Outcome};
///
/// async fn handle(msg: Message) -> Result<(), HandlerError> {
///     match msg.get_str("amount").map(str::parse::<u64>) {
///         Some(Ok(_amount)) => Ok(()),
///         // Nothing will ever make this entry valid: do not retry it.
///         _ => Err(Outcome::DeadLetter("amount missing or not a number".into()).into()),
///     }
/// }
///
/// async fn handle_later(_msg: Message) -> Result<(), HandlerError> {
///     Err(Outcome::RetryAfter(Duration::from_secs(5)).into())
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Outcome {
    /// Deliver the entry again after this delay (at most [`MAX_RETRY_DELAY`]) instead of the backoff's; it counts
    /// as a delivery, and the shard waits (order is kept). Past `max_deliveries` it is dead-lettered as usual.
    #[error("retry requested after {0:?}")]
    RetryAfter(Duration),
    /// Move the entry to its shard's dead-letter stream now (with this reason as its error field) and
    /// acknowledge it, whatever its delivery count.
    #[error("{0}")]
    DeadLetter(String),
}
