//! The assignment lease: how long the consumer may keep reading without a fresh coordinator answer.
//!
//! The pure lease ([`Lease`], [`effective_lease`]) is shared with the test models in [`client_core::lease`]; the
//! caller passes the monotonic [`Instant`] it captured *before sending* the heartbeat whose answer granted the
//! lease. This module adds what the readers need at run time: the lock-free [`LeaseView`], [`UnderLease`] and
//! [`lease_deadline`].
//!
//! Why the lease counts from the send time, and the safety margin: see [`client_core::lease`].

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::time::Sleep;

pub(crate) use client_core::lease::{effective_lease, Lease};

/// A lock-free copy of the lease end shared with the shard readers, so a reader checks the lease itself before
/// every read and every message instead of waiting for the heartbeat loop to stop it.
#[derive(Debug)]
pub(crate) struct LeaseView {
    /// Reference point of the stored offsets (an `Instant` cannot be stored atomically).
    base: Instant,
    /// Nanoseconds from `base` to the lease end; 0 when no lease is held.
    until_nanos: AtomicU64,
}

impl LeaseView {
    /// A view with no lease, measuring from `base`.
    pub(crate) fn new(base: Instant) -> Self {
        LeaseView {
            base,
            until_nanos: AtomicU64::new(0),
        }
    }

    /// Publishes `lease`.
    pub(crate) fn publish(&self, lease: &Lease) {
        let nanos = lease.expires_at().map_or(0, |until| {
            // An end at or before `base` stores 0, which reads as "no lease": right, as every `now` is past it.
            u64::try_from(until.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
        });
        self.until_nanos.store(nanos, Ordering::Release);
    }

    /// Whether the published lease is valid at `now`.
    pub(crate) fn is_valid_at(&self, now: Instant) -> bool {
        self.deadline().is_some_and(|until| now < until)
    }

    /// Whether the published lease is valid now.
    pub(crate) fn is_valid(&self) -> bool {
        self.is_valid_at(now())
    }

    /// The published lease end, if a lease is held.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        match self.until_nanos.load(Ordering::Acquire) {
            0 => None,
            // Cannot overflow for any end the lease could publish; a saturated end reads as "no lease".
            nanos => self.base.checked_add(Duration::from_nanos(nanos)),
        }
    }
}

/// Now, on the clock the lease is measured with: Tokio's, so that tests under paused time move it, and equal to
/// [`Instant::now`] otherwise.
pub(crate) fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// A future polled under the shard's lease ran past the lease end: its output, if any, does not count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeaseExpired;

thread_local! {
    /// The lease end of the handler being polled on this thread (see [`lease_deadline`]).
    static POLLED_UNDER: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// The assignment-lease end of the shard whose handler calls this; `None` outside a handler.
///
/// Read from within a [`Handler`](crate::Handler)'s future: the consumer drops that future at its first poll past
/// this instant, so a handler can use it to bound its own work (skip a side effect that cannot finish in time).
/// It can move later while the handler runs (each successful heartbeat extends the lease): read it again rather
/// than keeping it. Holding the lease until this instant does not make a side effect safe on its own; fence it
/// (see the fencing token on [`Message`](crate::Message)).
///
/// The instant is on Tokio's clock, given as a [`std::time::Instant`]: the same as `Instant::now()` normally, and
/// under Tokio's paused time (tests) to be compared with `tokio::time::Instant::now().into_std()`.
///
/// # Example
/// A handler that skips a slow side call it could not finish under the lease, instead of being dropped in it:
/// ```no_run
/// use std::time::{Duration, Instant};
/// use stream_consumer::{lease_deadline, Message};
///
/// # async fn enrich(_msg: &Message) {}
/// async fn handle(msg: Message) -> Result<(), std::io::Error> {
///     let time_left = lease_deadline().map_or(Duration::ZERO, |end| end.saturating_duration_since(Instant::now()));
///     if time_left < Duration::from_secs(1) {
///         // Left pending: delivered again once the lease is renewed (or to the shard's next owner).
///         return Err(std::io::Error::other("too close to the lease end"));
///     }
///     enrich(&msg).await;
///     Ok(())
/// }
/// ```
pub fn lease_deadline() -> Option<Instant> {
    POLLED_UNDER.with(Cell::get)
}

/// Polls `inner` only while the lease is valid: the lease end is read from `lease` (so an extension while the
/// inner future runs counts) and checked *before* every poll; once past it, the inner future is dropped unpolled
/// and the output is [`LeaseExpired`], whatever else became ready at the same time. A timer wakes the task at
/// the lease end, so an inner future that waits on something else is dropped on time too.
///
/// This is what makes a stalled process (SIGSTOP, a long GC pause, a frozen VM) safe on resume: every task wakes
/// at once and the scheduler's order decides which runs first, but whichever it is, the handler cannot complete,
/// because its next poll sees the expired lease first.
pub(crate) struct UnderLease<'a, F> {
    // Borrowed: one is made per handler call, and an `Arc` clone and drop per entry showed in the read loop.
    lease: &'a LeaseView,
    /// `None` once dropped because the lease ran out.
    inner: Option<F>,
    /// When the lease was last checked, i.e. just before the last poll of `inner`.
    checked_at: Option<Instant>,
    /// Created at the first `Pending` (a handler that completes in its first poll costs no timer).
    timer: Option<Pin<Box<Sleep>>>,
    /// The lease end the timer is set to.
    timer_at: Option<Instant>,
}

impl<'a, F: Future + Unpin> UnderLease<'a, F> {
    /// `inner` under `lease`.
    pub(crate) fn new(lease: &'a LeaseView, inner: F) -> Self {
        UnderLease {
            lease,
            inner: Some(inner),
            checked_at: None,
            timer: None,
            timer_at: None,
        }
    }

    /// The time read for the last lease check: once the output is ready, a moment at or just before the inner
    /// future finished (the caller can stamp its result with it instead of reading the clock again).
    pub(crate) fn checked_at(&self) -> Option<Instant> {
        self.checked_at
    }
}

impl<F: Future + Unpin> Future for UnderLease<'_, F> {
    type Output = Result<F::Output, LeaseExpired>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        loop {
            let Some(inner) = this.inner.as_mut() else {
                return Poll::Ready(Err(LeaseExpired));
            };
            // The deadline first: after a stall, the inner future may be ready too, and must not win.
            let checked_at = now();
            this.checked_at = Some(checked_at);
            let deadline = match this.lease.deadline() {
                Some(d) if checked_at < d => d,
                _ => {
                    this.inner = None;
                    return Poll::Ready(Err(LeaseExpired));
                }
            };
            let previous = POLLED_UNDER.with(|c| c.replace(Some(deadline)));
            let polled = Pin::new(inner).poll(cx);
            POLLED_UNDER.with(|c| c.set(previous));
            if let Poll::Ready(out) = polled {
                return Poll::Ready(Ok(out));
            }
            let at = tokio::time::Instant::from_std(deadline);
            let timer = this.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
            if this.timer_at != Some(deadline) {
                timer.as_mut().reset(at);
                this.timer_at = Some(deadline);
            }
            match timer.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                // The lease end came: expired, unless it was extended meanwhile (then check again). Also when the
                // timer's rounding fires a hair before `now()` reaches the end: early is safe, a busy loop is not.
                Poll::Ready(()) => {
                    if this.lease.deadline() == Some(deadline) {
                        this.inner = None;
                        return Poll::Ready(Err(LeaseExpired));
                    }
                    this.timer_at = None;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn view_follows_the_published_lease() {
        let base = Instant::now();
        let view = LeaseView::new(base);
        assert!(!view.is_valid_at(base));
        let mut lease = Lease::default();
        lease.grant(base + 100 * MS, 1000 * MS);
        view.publish(&lease);
        assert!(view.is_valid_at(base + 500 * MS));
        assert!(!view.is_valid_at(base + 1100 * MS));
        lease.revoke();
        view.publish(&lease);
        assert!(!view.is_valid_at(base + 500 * MS));
    }

    mod under_lease {
        use super::super::*;
        use super::MS;
        use std::sync::atomic::AtomicUsize;
        use std::sync::Arc;

        /// A lease view whose lease ends `lease` from now (Tokio's clock).
        fn view_ending_in(lease: Duration) -> Arc<LeaseView> {
            let view = Arc::new(LeaseView::new(now()));
            let mut l = Lease::default();
            l.grant(now(), lease);
            view.publish(&l);
            view
        }

        /// A future that is ready once `at` passed, counting its polls.
        fn ready_after(d: Duration, polls: Arc<AtomicUsize>) -> impl Future<Output = u32> + Unpin {
            let mut sleep = Box::pin(tokio::time::sleep(d));
            std::future::poll_fn(move |cx| {
                polls.fetch_add(1, Ordering::SeqCst);
                sleep.as_mut().poll(cx).map(|()| 7)
            })
        }

        #[tokio::test(start_paused = true)]
        async fn completes_within_the_lease() {
            let view = view_ending_in(100 * MS);
            let polls = Arc::new(AtomicUsize::new(0));
            let start = now();
            let mut fut = UnderLease::new(&view, ready_after(50 * MS, Arc::clone(&polls)));
            assert_eq!(fut.checked_at(), None, "not polled yet");
            assert_eq!((&mut fut).await, Ok(7));
            let checked = fut.checked_at().expect("checked before the last poll");
            assert!(checked <= now() && view.is_valid_at(checked));
            assert!(checked >= start + 50 * MS, "the time of the last poll, not the first");
        }

        #[tokio::test(start_paused = true)]
        async fn inner_ready_after_a_stall_past_the_deadline_is_expired_and_not_polled() {
            for stall in [100 * MS, 101 * MS, 1000 * MS] {
                let view = view_ending_in(100 * MS);
                let polls = Arc::new(AtomicUsize::new(0));
                let mut fut = UnderLease::new(&view, ready_after(50 * MS, Arc::clone(&polls)));
                // First poll within the lease: the inner future starts waiting.
                assert!(futures::poll!(&mut fut).is_pending());
                let polled_before = polls.load(Ordering::SeqCst);
                // The stall: time jumps past both the inner future's wake-up and the lease end, and both are ready.
                tokio::time::advance(stall).await;
                assert_eq!(fut.await, Err(LeaseExpired), "stall {stall:?}");
                assert_eq!(
                    polls.load(Ordering::SeqCst),
                    polled_before,
                    "the inner future was polled after the lease"
                );
            }
        }

        #[tokio::test(start_paused = true)]
        async fn expired_before_the_first_poll_never_polls_the_inner_future() {
            let view = view_ending_in(100 * MS);
            let polls = Arc::new(AtomicUsize::new(0));
            let fut = UnderLease::new(&view, ready_after(Duration::ZERO, Arc::clone(&polls)));
            tokio::time::advance(200 * MS).await;
            assert_eq!(fut.await, Err(LeaseExpired));
            assert_eq!(polls.load(Ordering::SeqCst), 0);
        }

        #[tokio::test(start_paused = true)]
        async fn a_pending_inner_future_is_dropped_at_the_deadline() {
            let view = view_ending_in(100 * MS);
            let start = tokio::time::Instant::now();
            let out = UnderLease::new(&view, std::future::pending::<()>()).await;
            assert_eq!(out, Err(LeaseExpired));
            let waited = start.elapsed();
            assert!(
                waited >= 100 * MS && waited <= 102 * MS,
                "woken by its own timer at the lease end: {waited:?}"
            );
        }

        #[tokio::test(start_paused = true)]
        async fn an_extension_while_running_is_followed() {
            let view = view_ending_in(100 * MS);
            let polls = Arc::new(AtomicUsize::new(0));
            let mut fut = UnderLease::new(&view, ready_after(300 * MS, Arc::clone(&polls)));
            assert!(futures::poll!(&mut fut).is_pending());
            tokio::time::advance(80 * MS).await;
            let mut l = Lease::default();
            l.grant(now(), 1000 * MS);
            view.publish(&l);
            assert_eq!(fut.await, Ok(7));
        }

        #[tokio::test(start_paused = true)]
        async fn a_revoked_lease_expires_at_the_next_poll() {
            let view = view_ending_in(100 * MS);
            let polls = Arc::new(AtomicUsize::new(0));
            let mut fut = UnderLease::new(&view, ready_after(30 * MS, Arc::clone(&polls)));
            assert!(futures::poll!(&mut fut).is_pending());
            view.publish(&Lease::default());
            tokio::time::advance(30 * MS).await;
            assert_eq!(fut.await, Err(LeaseExpired));
        }

        #[tokio::test(start_paused = true)]
        async fn the_handler_sees_its_lease_deadline() {
            let view = view_ending_in(100 * MS);
            let expected = view.deadline();
            assert!(expected.is_some());
            assert_eq!(lease_deadline(), None, "outside a handler");
            let seen = UnderLease::new(&view, Box::pin(async { lease_deadline() })).await;
            assert_eq!(seen, Ok(expected));
            assert_eq!(lease_deadline(), None, "restored after the poll");
        }
    }
}
