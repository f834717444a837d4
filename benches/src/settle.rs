//! Waiting for a group to settle before a measurement starts.

use std::time::Duration;

use anyhow::{bail, Result};
use stream_consumer::ConsumerHandle;
use tokio::time::Instant;

/// Waits until `members` read all `shards` between them, each at least one, none pending or revoking.
pub async fn settled(members: &[&ConsumerHandle], shards: u32, deadline: Duration) -> Result<()> {
    let until = Instant::now() + deadline;
    loop {
        let statuses: Vec<_> = members.iter().map(|m| m.status()).collect();
        let reading: usize = statuses.iter().map(|s| s.reading.len()).sum();
        if reading == shards as usize
            && statuses
                .iter()
                .all(|s| !s.reading.is_empty() && s.pending.is_empty() && s.revoking.is_empty())
        {
            return Ok(());
        }
        if Instant::now() > until {
            bail!("members did not settle within {deadline:?}: {statuses:?}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
