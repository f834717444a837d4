//! The producers' side of the run: rate-limited batches of keyed records, every outcome into the ledger and
//! every acknowledged one into the history. A batch a shard fence refused (a reshard while the demo runs) is sent
//! again by the producer itself (`reroute_fenced`, on by default), so its records reach the ledger as written.

use super::settings::{Settings, MAX_BATCH, PRODUCERS, TICKS_PER_SECOND};
use crate::ledger::{Ledger, PublishState};
use anyhow::Result;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use stream_producer::{Producer, Record, WriteState};
use test_support::history::History;

/// Publishes the records of producer `p` (the keys `k` with `k % PRODUCERS == p`, in record order).
pub(crate) async fn publish(
    p: usize,
    producer: Arc<Producer>,
    settings: Arc<Settings>,
    ledger: Arc<Mutex<Ledger>>,
    history: History,
    attempted: Arc<AtomicU64>,
) -> Result<()> {
    let keys = settings.keys;
    let mut mine = (0..settings.records)
        .filter(move |i| (i % keys) as usize % PRODUCERS == p)
        .peekable();
    let per_tick = settings.rate as f64 / PRODUCERS as f64 / TICKS_PER_SECOND as f64;
    let mut tick = tokio::time::interval(Duration::from_millis(1000 / TICKS_PER_SECOND));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut owed = 0f64;
    while mine.peek().is_some() {
        let due = if settings.rate == 0 {
            MAX_BATCH
        } else {
            tick.tick().await;
            owed += per_tick;
            let due = owed.floor();
            owed -= due;
            due as usize
        };
        let mut sent = 0;
        while sent < due {
            let batch: Vec<u64> = mine.by_ref().take((due - sent).min(MAX_BATCH)).collect();
            if batch.is_empty() {
                break;
            }
            sent += batch.len();
            let records = batch
                .iter()
                .map(|&i| {
                    let key = Ledger::key_name(i % keys);
                    Record::with_key(key.as_str())
                        .field("key", key)
                        .field("seq", (i / keys).to_string())
                })
                .collect();
            let key_of = |i: u64| Ledger::key_name(i % keys);
            let states: Vec<PublishState> = match producer.send_batch(records).await {
                Ok(published) => {
                    for (&i, p) in batch.iter().zip(&published) {
                        history.published(Some(&key_of(i)), p);
                    }
                    vec![PublishState::Written; batch.len()]
                }
                Err(e) => batch
                    .iter()
                    .zip(e.outcomes())
                    .map(|(&i, o)| {
                        if let Some(p) = o.published() {
                            history.published(Some(&key_of(i)), p);
                        }
                        match o.write_state() {
                            WriteState::Written => PublishState::Written,
                            WriteState::NotWritten => PublishState::NotWritten,
                            WriteState::Unknown => PublishState::Unknown,
                        }
                    })
                    .collect(),
            };
            let mut ledger = ledger.lock().expect("ledger lock");
            for (&i, state) in batch.iter().zip(states) {
                ledger.published(i, state);
            }
            drop(ledger);
            attempted.fetch_add(batch.len() as u64, Ordering::Relaxed);
        }
    }
    Ok(())
}
