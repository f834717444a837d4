//! The in-process coordinator of a bench, and its group.

use anyhow::{Context, Result};
use coord_server::server::CoordinatorHandle;
use coord_server::Config;
use protocol::messages::CreateGroupRequest;
use protocol::metadata::GroupTimings;
use protocol::names::{GroupName, StreamName};

/// Creates `group` of `stream` with `shards` shards (and so the stream's routing) on `coordinator`; `timings`
/// `None` keeps the coordinator's defaults.
pub async fn create(
    coordinator: &CoordinatorHandle,
    stream: &StreamName,
    group: &str,
    shards: u32,
    timings: Option<GroupTimings>,
) -> Result<()> {
    let request = CreateGroupRequest {
        shard_count: Some(shards),
        timings,
    };
    coordinator
        .coordinator()
        .create_group(stream, &GroupName::new(group)?, &request)
        .await
        .with_context(|| format!("create the group {group} of {stream}"))?;
    Ok(())
}

/// An in-process coordinator on `redis_url` with `stream`'s routing of `shards` shards (through group `bench`).
pub async fn coordinator(redis_url: &str, stream: &StreamName, shards: u32) -> Result<CoordinatorHandle> {
    let mut config = Config::new(redis_url);
    config.listen = "127.0.0.1:0".parse()?;
    let coordinator = CoordinatorHandle::spawn(config).await.context("coordinator")?;
    create(&coordinator, stream, "bench", shards, None).await?;
    Ok(coordinator)
}
