//! Every metric name the coordinator exports. Base units, `_total` for counters, `_seconds` for durations.

/// Gauge, 1 while this instance is terminating (refusing new mutations, `/readyz` unready), else 0.
pub const TERMINATING: &str = "redis_stream_coord_terminating";
/// Gauge: 1 while Redis's `maxmemory-policy` is not `noeviction` (Redis may evict coordinator keys; the
/// instance is unready unless configured to accept it), 0 when it is, absent before the first check.
pub const EVICTION_POLICY_UNSAFE: &str = "redis_stream_coord_redis_eviction_policy_unsafe";
/// Gauge: critical sections running in this instance now.
pub const SECTIONS_IN_FLIGHT: &str = "redis_stream_coord_critical_sections_in_flight";
/// Histogram: time from the first try to take a group's (or stream's) Redis mutex until it was held and the
/// hash loaded, in seconds. Includes the retries while another section held it.
pub const MUTEX_WAIT: &str = "redis_stream_coord_mutex_wait_seconds";
/// Histogram: time the coordinator took to answer one heartbeat (join, heartbeat or leave), from its parsed
/// body to its answer, in seconds: the mutex wait, the batch it joined, the decision and the commit.
pub const HEARTBEAT_DURATION: &str = "redis_stream_coord_heartbeat_duration_seconds";
/// Counter: tries to take a Redis mutex that found it held by another section.
pub const MUTEX_BUSY: &str = "redis_stream_coord_mutex_busy_total";
/// Counter: critical sections that ran a batch of heartbeats (group commit).
pub const HEARTBEAT_BATCHES: &str = "redis_stream_coord_heartbeat_batches_total";
/// Counter: heartbeats run in batches; divided by the batches, the mean batch size.
pub const HEARTBEATS_BATCHED: &str = "redis_stream_coord_heartbeats_batched_total";
/// Counter: sections that gave up on a busy mutex (`STORE_UNAVAILABLE`).
pub const MUTEX_TIMEOUTS: &str = "redis_stream_coord_mutex_timeouts_total";
/// Counter: revision compare-and-set writes that lost to another writer (the section reloaded and decided
/// again). Frequent conflicts mean a writer outlives its mutex (a stalled coordinator) or a foreign writer.
pub const REVISION_CONFLICTS: &str = "redis_stream_coord_revision_conflicts_total";
/// Counter: admin mutations refused because their `If-Match` revision was stale (`REVISION_CONFLICT`).
pub const ADMIN_REVISION_CONFLICTS: &str = "redis_stream_coord_admin_revision_conflicts_total";
/// Counter, label `status`: heartbeat answers by wire status (`OK`, `SYNC_METADATA`, `REVOKE_PENDING`,
/// `FENCED_MEMBER_EPOCH`, `UNKNOWN_MEMBER`, `METADATA_UNAVAILABLE`, `COORDINATOR_TERMINATING`,
/// `STORE_UNAVAILABLE`, `INVALID_REQUEST`).
pub const HEARTBEATS: &str = "redis_stream_coord_heartbeats_total";
/// Gauge per group: the oldest last-renewal among live members, in seconds (computed by the tick from the
/// liveness it loads).
pub const HEARTBEAT_AGE_MAX: &str = "redis_stream_coord_member_heartbeat_age_max_seconds";
/// Gauge per group: the median last-renewal age of live members, in seconds.
pub const HEARTBEAT_AGE_MEDIAN: &str = "redis_stream_coord_member_heartbeat_age_median_seconds";
/// Gauge per group: members that are not fenced.
pub const MEMBERS: &str = "redis_stream_coord_group_members";
/// Gauge per group: fenced members still waiting for their lease to end.
pub const FENCED_MEMBERS: &str = "redis_stream_coord_group_fenced_members";
/// Gauge per group: shards whose owner must drain them (owner set, target elsewhere).
pub const SHARDS_REVOKING: &str = "redis_stream_coord_group_shards_revoking";
/// Gauge per group: shards with a target but no owner yet (pending for their new owner).
pub const SHARDS_UNOWNED: &str = "redis_stream_coord_group_shards_unowned";
/// Gauge per group: how long the oldest unfinished drain (DRAIN issued, REVOKED not yet accepted) of a member
/// that is not fenced has run, in seconds; 0 when nothing drains. (A fenced owner's shards move when its lease
/// ends; [`FENCED_MEMBERS`] shows those.)
pub const REVOKE_AGE_MAX: &str = "redis_stream_coord_group_revoke_age_max_seconds";
/// Gauge per group: 1 while a metadata correction round is open.
pub const CORRECTION_OPEN: &str = "redis_stream_coord_correction_round_open";
/// Gauge per group: age of the open correction round in seconds; 0 when none is open.
pub const CORRECTION_AGE: &str = "redis_stream_coord_correction_round_age_seconds";
/// Gauge per group: the stored metadata version (a drop is a regression).
pub const METADATA_VERSION: &str = "redis_stream_coord_group_metadata_version";
/// Counter: the stored metadata version went below one this coordinator had seen, or the metadata outlived a
/// Redis restart or failover (run id change): lost writes suspected.
pub const METADATA_REGRESSIONS: &str = "redis_stream_coord_metadata_regressions_total";
/// Counter per group: heartbeats whose client reported a higher metadata version than Redis stores.
pub const CLIENT_VERSION_AHEAD: &str = "redis_stream_coord_client_version_ahead_total";
/// Counter: producer routing fetches that reported a higher routing version than Redis stores.
pub const ROUTING_VERSION_AHEAD: &str = "redis_stream_coord_routing_version_ahead_total";
/// Counter, label `why` (`records_beyond`, `fence_above`, `entries_beyond`, `record_lost`): stream routings
/// restored because Redis had lost part of them (see `docs/resharding.md`, "When Redis forgets a growth").
pub const ROUTING_RESTORED: &str = "redis_stream_coord_routing_restored_total";
/// Counter: restorations refused because Redis holds evidence of more shards than the stream's growth ceiling
/// (nothing is written; `docs/runbooks/routing-regressed.md`).
pub const ROUTING_RESTORE_REFUSED: &str = "redis_stream_coord_routing_restore_refused_total";
/// Counter, label `quota` (`groups`, `shards`, `members`, `rate`): requests refused with `429` because a token
/// reached that quota (see `docs/operations.md`, "Quotas").
pub const QUOTA_REFUSALS: &str = "redis_stream_coord_quota_refusals_total";
/// Gauge per stream: shards whose record exists beyond the stored shard count (their entries are unread until
/// the routing is restored, at the next tick); 0 normally.
pub const SHARDS_BEYOND_ROUTING: &str = "redis_stream_coord_stream_shards_beyond_routing";
/// Counter per group: correction rounds opened.
pub const CORRECTIONS_OPENED: &str = "redis_stream_coord_correction_rounds_opened_total";
/// Counter: requests answered `METADATA_UNAVAILABLE` (metadata key missing or unreadable).
pub const METADATA_UNAVAILABLE: &str = "redis_stream_coord_metadata_unavailable_total";
/// Counter, label `kind` (`schema`, `layout`, `decode`): stored metadata this build cannot read.
pub const METADATA_SCHEMA_ERRORS: &str = "redis_stream_coord_metadata_schema_errors_total";
/// Counter, label `phase` (`startup`, `runtime`): Redis lacks a command, refuses one (`NOPERM`), or is too old.
/// `phase="startup"` is process-wide (see the module docs).
pub const COMPATIBILITY_FAILURES: &str = "redis_stream_coord_redis_compatibility_failures_total";
/// Counter per group: members removed because their lease ran out.
pub const MEMBERS_EXPIRED: &str = "redis_stream_coord_members_expired_total";
/// Counter per group: members fenced (rebalance timeout or admin).
pub const MEMBERS_FENCED: &str = "redis_stream_coord_members_fenced_total";
/// Counter per group, label `event`: every recorded state-machine event (`member_joined`, `shard_granted`,
/// `stale_ack_ignored`, `foreign_claim`, ...).
pub const GROUP_EVENTS: &str = "redis_stream_coord_group_events_total";
/// Counter: Redis restarts noticed (run id change), each starting a global expiry grace.
pub const REDIS_RESTARTS: &str = "redis_stream_coord_redis_restarts_total";
/// Counter by `reason` (`due`, `sweep`): groups the tick loop visited (ran a tick section on).
pub const TICK_VISITS: &str = "redis_stream_coord_tick_visits_total";
/// Counter, labels `key` (`due_index`, `groups_index`, `routing`) and `damage` (`wrong_type`, `garbage`, `lost`):
/// damage the coordinator found in one of its keys and worked around (see `docs/failure-handling.md`, "Damaged
/// coordinator keys"). `garbage` counts members of an index that name no group, or routing documents that do not
/// parse; `lost` counts groups an index lacked, or routings missing under a group.
pub const DAMAGED_KEYS: &str = "redis_stream_coord_damaged_keys_total";
/// Counter, label `key` (`due_index`, `groups_index`): indexes of the wrong type the coordinator replaced by
/// rebuilt ones.
pub const DAMAGED_KEY_REPAIRS: &str = "redis_stream_coord_damaged_key_repairs_total";
/// Gauge per (stream, group, shard): entries of the shard stream not yet delivered to the Redis consumer
/// group (`XINFO GROUPS` `lag`; absent when Redis cannot tell, or before Redis 7).
pub const SHARD_LAG: &str = "redis_stream_coord_shard_lag";
/// Gauge per (stream, group, shard): entries delivered but not acknowledged (`XINFO GROUPS` `pending`).
pub const SHARD_PENDING: &str = "redis_stream_coord_shard_pending";
/// Gauge per (stream, shard): entries in the shard stream (`XLEN`).
pub const SHARD_LENGTH: &str = "redis_stream_coord_shard_length";
/// Counter: lag scrapes that failed or timed out (the previous values were served).
pub const LAG_SCRAPE_ERRORS: &str = "redis_stream_coord_lag_scrape_errors_total";
/// Gauge: duration of the last lag scrape, in seconds.
pub const LAG_SCRAPE_DURATION: &str = "redis_stream_coord_lag_scrape_duration_seconds";
/// Histogram per group: how long the children of a growth were held (from the group's adoption of the growth
/// until every parent was drained up to its seal), in seconds.
pub const RESHARD_CHILDREN_WAIT: &str = "redis_stream_coord_reshard_children_wait_seconds";
/// Gauge per group: parents of open reshards the group has not yet drained up to their seal (0 when no
/// growth is open).
pub const RESHARD_PARENTS_NOT_DRAINED: &str = "redis_stream_coord_group_reshard_parents_not_drained";
/// Gauge per tenant (label `tenant`: a token-table prefix, or `default`): entries over the tenant's shard streams
/// (sum of `XLEN`, from the usage scrape every 10 s).
pub const TENANT_STREAM_LENGTH: &str = "redis_stream_coord_tenant_stream_length";
/// Gauge per tenant: bytes of the tenant's shard streams (sum of `MEMORY USAGE`, sampled; every 10 s).
pub const TENANT_MEMORY: &str = "redis_stream_coord_tenant_memory_bytes";
/// Gauge, label `redis` (`data`; `metadata` when the coordinator's keys have a Redis of their own): Redis
/// `used_memory` in bytes (summed over a cluster's masters).
pub const REDIS_USED_MEMORY: &str = "redis_stream_coord_redis_used_memory_bytes";
/// Gauge, label `redis`: Redis `maxmemory` in bytes (0: no limit).
pub const REDIS_MAXMEMORY: &str = "redis_stream_coord_redis_maxmemory_bytes";
/// Counter: usage scrapes that failed or timed out (the previous values were served).
pub const USAGE_SCRAPE_ERRORS: &str = "redis_stream_coord_usage_scrape_errors_total";

/// Every name above.
pub const ALL: &[&str] = &[
    TERMINATING,
    EVICTION_POLICY_UNSAFE,
    SECTIONS_IN_FLIGHT,
    MUTEX_WAIT,
    HEARTBEAT_DURATION,
    MUTEX_BUSY,
    HEARTBEAT_BATCHES,
    HEARTBEATS_BATCHED,
    MUTEX_TIMEOUTS,
    REVISION_CONFLICTS,
    ADMIN_REVISION_CONFLICTS,
    HEARTBEATS,
    HEARTBEAT_AGE_MAX,
    HEARTBEAT_AGE_MEDIAN,
    MEMBERS,
    FENCED_MEMBERS,
    SHARDS_REVOKING,
    SHARDS_UNOWNED,
    REVOKE_AGE_MAX,
    CORRECTION_OPEN,
    CORRECTION_AGE,
    METADATA_VERSION,
    METADATA_REGRESSIONS,
    CLIENT_VERSION_AHEAD,
    ROUTING_VERSION_AHEAD,
    ROUTING_RESTORED,
    ROUTING_RESTORE_REFUSED,
    QUOTA_REFUSALS,
    SHARDS_BEYOND_ROUTING,
    CORRECTIONS_OPENED,
    METADATA_UNAVAILABLE,
    METADATA_SCHEMA_ERRORS,
    COMPATIBILITY_FAILURES,
    MEMBERS_EXPIRED,
    MEMBERS_FENCED,
    GROUP_EVENTS,
    REDIS_RESTARTS,
    TICK_VISITS,
    DAMAGED_KEYS,
    DAMAGED_KEY_REPAIRS,
    SHARD_LAG,
    SHARD_PENDING,
    SHARD_LENGTH,
    LAG_SCRAPE_ERRORS,
    LAG_SCRAPE_DURATION,
    RESHARD_CHILDREN_WAIT,
    RESHARD_PARENTS_NOT_DRAINED,
    TENANT_STREAM_LENGTH,
    TENANT_MEMORY,
    REDIS_USED_MEMORY,
    REDIS_MAXMEMORY,
    USAGE_SCRAPE_ERRORS,
];
