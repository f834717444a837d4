//! The answer to a request for a group or stream without metadata: never created (`NOT_FOUND`) or lost
//! (`METADATA_UNAVAILABLE`), from the traces Redis still holds (see [`crate::store::traces`]) and the groups this
//! process found recently.

use protocol::names::{GroupName, StreamName};
use std::sync::atomic::Ordering;

use crate::error::Error;
use crate::group_slots::Slots;
use crate::section::unavailable;
use crate::stats::Stats;
use crate::store::traces::{self, Absence};
use crate::store::Store;

/// A group without metadata, when its traces were not looked up (or the lookup failed).
pub(crate) fn missing_group(stream: &StreamName, group: &GroupName) -> Error {
    Error::MetadataUnavailable(format!(
        "no metadata for group {group} of stream {stream}: never created, or lost; the coordinator does not rebuild \
         it from heartbeats: recreate it explicitly"
    ))
}

/// The answer for a group without metadata.
pub(crate) async fn group(
    store: &Store,
    stats: &Stats,
    slots: &Slots,
    stream: &StreamName,
    group: &GroupName,
) -> Error {
    let absence = match traces::of_group(store, stream, group).await {
        Ok(Absence::NeverCreated) if slots.seen_recently(stream, Some(group)) => {
            Ok(Absence::Lost(traces::Trace::SeenByThisCoordinator))
        }
        other => other,
    };
    if let Ok(Absence::NeverCreated) = absence {
        return Error::NotFound(format!(
            "group {group} of stream {stream} was never created (Redis holds no metadata, index entry, liveness or consumer group of it): create it with POST /v1/streams/{stream}/groups/{group}, or check the names"
        ));
    }
    stats.metadata_unavailable.fetch_add(1, Ordering::Relaxed);
    match absence {
        Ok(Absence::Lost(trace)) => Error::MetadataUnavailable(format!(
            "no metadata for group {group} of stream {stream}, but {trace} remains: the group existed and its metadata is lost; the coordinator does not rebuild it from heartbeats: recreate it explicitly"
        )),
        _ => missing_group(stream, group),
    }
}

/// Like [`group`] for a stream without routing.
pub(crate) async fn stream(store: &Store, stats: &Stats, slots: &Slots, stream: &StreamName) -> Error {
    let absence = match traces::of_stream(store, stream).await {
        Ok(Absence::NeverCreated) if slots.seen_recently(stream, None) => {
            Ok(Absence::Lost(traces::Trace::SeenByThisCoordinator))
        }
        other => other,
    };
    if let Ok(Absence::NeverCreated) = absence {
        return Error::NotFound(format!(
            "stream {stream} was never created (Redis holds no routing, index entry or shard of it): create a group of it with a shardCount, or check the name"
        ));
    }
    let trace = match absence {
        Ok(Absence::Lost(trace)) => format!("{trace} remains"),
        _ => "never created, or lost".to_owned(),
    };
    unavailable(stats, format!("stream {stream} has no routing ({trace})"))
}
