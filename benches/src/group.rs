//! The bench group on the in-process coordinator.

use anyhow::{Context, Result};
use coord_server::server::CoordinatorHandle;
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
