//! The batch of handled entries waiting for one `XACK`, and when it must go out. Pure: the caller passes the
//! time, and sends the command.

use std::time::{Duration, Instant};

use crate::message::EntryId;

/// Within one read, the batched `XACK` goes out as soon as an entry finishes this long or more after the oldest
/// handled-but-unacknowledged one (so slow handlers do not hold a whole read's acknowledgements back).
pub(crate) const ACK_WINDOW: Duration = Duration::from_millis(10);

/// Entries handled and not yet acknowledged, each with what keeps it counted as in flight (`G`, dropped once the
/// `XACK` answered or the entries were given up), and when the oldest of them was handled.
///
/// It holds at most one read's or one claim batch's entries (`batch_size`): every read, claim batch, retry pause
/// and stop sends it first.
#[derive(Debug)]
pub(crate) struct AckBatch<G> {
    entries: Vec<(EntryId, G)>,
    oldest_at: Option<Instant>,
}

impl<G> Default for AckBatch<G> {
    fn default() -> Self {
        AckBatch {
            entries: Vec::new(),
            oldest_at: None,
        }
    }
}

impl<G> AckBatch<G> {
    /// Queues `id`, handled at `now`. Returns whether the batch must be sent now: its oldest entry has waited
    /// [`ACK_WINDOW`] or more.
    pub(crate) fn push(&mut self, id: EntryId, guard: G, now: Instant) -> bool {
        let oldest = *self.oldest_at.get_or_insert(now);
        self.entries.push((id, guard));
        now.saturating_duration_since(oldest) >= ACK_WINDOW
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The queued ids, oldest first (the arguments of the `XACK`).
    pub(crate) fn ids(&self) -> impl Iterator<Item = EntryId> + '_ {
        self.entries.iter().map(|(id, _)| *id)
    }

    /// Acknowledged or given up: the entries stop being in flight.
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.oldest_at = None;
    }
}

/// Longest `<ms>-<seq>`: two 20-digit numbers and the dash.
pub(crate) const ENTRY_ID_MAX_LEN: usize = 41;

/// `<ms>-<seq>`, formatted into `buf` without allocating (an acknowledgement carries one per entry; `to_string`
/// was a visible share of the read loop's CPU).
pub(crate) fn entry_id_arg(id: EntryId, buf: &mut [u8; ENTRY_ID_MAX_LEN]) -> &[u8] {
    let mut at = buf.len();
    for (i, mut n) in [id.seq, id.ms].into_iter().enumerate() {
        if i == 1 {
            at -= 1;
            buf[at] = b'-';
        }
        loop {
            at -= 1;
            buf[at] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
    }
    &buf[at..]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    const MS: Duration = Duration::from_millis(1);

    fn id(seq: u64) -> EntryId {
        EntryId { ms: 1, seq }
    }

    #[test]
    fn entry_id_arg_matches_display() {
        let mut buf = [0u8; ENTRY_ID_MAX_LEN];
        for (ms, seq) in [
            (0, 0),
            (1, 0),
            (0, 9),
            (1_700_000_000_123, 42),
            (u64::MAX, u64::MAX),
            (10, 100),
        ] {
            let id = EntryId { ms, seq };
            assert_eq!(entry_id_arg(id, &mut buf), id.to_string().as_bytes());
        }
    }

    #[test]
    fn the_batch_goes_out_once_its_oldest_entry_waited_the_window() {
        let t0 = Instant::now();
        let mut batch = AckBatch::default();
        assert!(!batch.push(id(1), (), t0), "a fresh batch waits for the next read");
        assert!(!batch.push(id(2), (), t0 + ACK_WINDOW - MS));
        assert!(
            batch.push(id(3), (), t0 + ACK_WINDOW),
            "counted from the oldest entry, not the last"
        );
        assert_eq!(
            batch.ids().collect::<Vec<_>>(),
            vec![id(1), id(2), id(3)],
            "in handling order"
        );
        assert_eq!(batch.len(), 3);
    }

    #[test]
    fn clearing_restarts_the_window_and_releases_the_guards() {
        let t0 = Instant::now();
        let guard = Rc::new(());
        let mut batch = AckBatch::default();
        batch.push(id(1), Rc::clone(&guard), t0);
        assert_eq!(
            Rc::strong_count(&guard),
            2,
            "held while queued: the entry is still in flight"
        );
        batch.clear();
        assert!(batch.is_empty());
        assert_eq!(Rc::strong_count(&guard), 1, "released once acknowledged");
        assert!(
            !batch.push(id(2), Rc::clone(&guard), t0 + 100 * MS),
            "the window counts from the first entry after the clear"
        );
    }

    #[test]
    fn a_clock_that_reads_earlier_never_flushes_early_nor_panics() {
        let t0 = Instant::now() + 100 * MS;
        let mut batch = AckBatch::default();
        batch.push(id(1), (), t0);
        assert!(!batch.push(id(2), (), t0 - 50 * MS));
    }
}
