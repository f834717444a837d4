//! The `# HELP` line of every metric, given once to each recorder.

use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};

use super::{names, Metrics};

impl Metrics {
    /// `# HELP` lines.
    pub(super) fn describe(&self) {
        self.record(|| {
            describe_sections();
            describe_groups();
            describe_lag();
            describe_usage();
        });
    }
}

/// The coordinator's own work: termination, Redis's eviction policy, critical sections and their mutexes, the
/// waits of resharding.
fn describe_sections() {
    describe_gauge!(names::TERMINATING, "1 while this coordinator is terminating, else 0");
    describe_gauge!(
        names::EVICTION_POLICY_UNSAFE,
        "1 while Redis maxmemory-policy is not noeviction, else 0"
    );
    describe_gauge!(names::SECTIONS_IN_FLIGHT, "Critical sections running now");
    describe_histogram!(names::MUTEX_WAIT, Unit::Seconds, "Time to take a Redis mutex and load");
    describe_histogram!(
        names::HEARTBEAT_DURATION,
        Unit::Seconds,
        "Time to answer one heartbeat, join or leave"
    );
    describe_histogram!(
        names::RESHARD_CHILDREN_WAIT,
        Unit::Seconds,
        "How long the children of a growth were held per group"
    );
    describe_gauge!(
        names::RESHARD_PARENTS_NOT_DRAINED,
        "Parents of open reshards not yet drained per group"
    );
    describe_counter!(names::MUTEX_BUSY, "Mutex tries that found it held");
    describe_counter!(
        names::HEARTBEAT_BATCHES,
        "Critical sections that ran a batch of heartbeats"
    );
    describe_counter!(names::HEARTBEATS_BATCHED, "Heartbeats run in batched critical sections");
    describe_counter!(names::MUTEX_TIMEOUTS, "Sections that gave up on a busy mutex");
    describe_counter!(names::REVISION_CONFLICTS, "Revision compare-and-set writes that lost");
    describe_counter!(
        names::ADMIN_REVISION_CONFLICTS,
        "Admin mutations refused for a stale If-Match"
    );
}

/// Members, shards and versions of each group, and what the state machine saw happen to them.
fn describe_groups() {
    describe_counter!(names::HEARTBEATS, "Heartbeat answers by wire status");
    describe_gauge!(
        names::HEARTBEAT_AGE_MAX,
        Unit::Seconds,
        "Oldest member heartbeat per group"
    );
    describe_gauge!(
        names::HEARTBEAT_AGE_MEDIAN,
        Unit::Seconds,
        "Median member heartbeat age per group"
    );
    describe_gauge!(names::MEMBERS, "Members not fenced, per group");
    describe_gauge!(
        names::FENCED_MEMBERS,
        "Fenced members whose lease has not ended, per group"
    );
    describe_gauge!(names::SHARDS_REVOKING, "Shards an owner must drain, per group");
    describe_gauge!(names::SHARDS_UNOWNED, "Shards pending for their new owner, per group");
    describe_gauge!(
        names::REVOKE_AGE_MAX,
        Unit::Seconds,
        "Age of the oldest unfinished drain per group"
    );
    describe_gauge!(names::CORRECTION_OPEN, "1 while a metadata correction round is open");
    describe_gauge!(names::CORRECTION_AGE, Unit::Seconds, "Age of the open correction round");
    describe_gauge!(names::METADATA_VERSION, "Stored metadata version per group");
    describe_counter!(
        names::METADATA_REGRESSIONS,
        "Stored metadata went back or outlived a Redis restart"
    );
    describe_counter!(
        names::CLIENT_VERSION_AHEAD,
        "Heartbeats reporting a version above the stored one"
    );
    describe_counter!(
        names::ROUTING_VERSION_AHEAD,
        "Routing fetches reporting a version above the stored one"
    );
    describe_counter!(
        names::ROUTING_RESTORED,
        "Stream routings restored after Redis lost part of them, by evidence"
    );
    describe_counter!(
        names::ROUTING_RESTORE_REFUSED,
        "Routing restorations refused: Redis holds evidence of more shards than the stream's growth ceiling"
    );
    describe_counter!(
        names::QUOTA_REFUSALS,
        "Requests refused with 429 because a token reached a quota, by quota"
    );
    // Present at 0 from the start, so `rate()` and `increase()` see the first refusal.
    for quota in ["groups", "shards", "members", "rate"] {
        metrics::counter!(names::QUOTA_REFUSALS, "quota" => quota).increment(0);
    }
    metrics::counter!(names::ROUTING_RESTORE_REFUSED).increment(0);
    describe_gauge!(
        names::SHARDS_BEYOND_ROUTING,
        "Shards recorded beyond the stored shard count (unread until restored)"
    );
    describe_counter!(names::CORRECTIONS_OPENED, "Metadata correction rounds opened");
    describe_counter!(names::METADATA_UNAVAILABLE, "Requests answered METADATA_UNAVAILABLE");
    describe_counter!(
        names::METADATA_SCHEMA_ERRORS,
        "Stored metadata this build cannot read, by kind"
    );
    describe_counter!(
        names::COMPATIBILITY_FAILURES,
        "Redis lacks or refuses a required command, by phase"
    );
    describe_counter!(names::MEMBERS_EXPIRED, "Members removed after their lease ran out");
    describe_counter!(names::MEMBERS_FENCED, "Members fenced");
    describe_counter!(names::GROUP_EVENTS, "State machine events by group and kind");
    describe_counter!(names::REDIS_RESTARTS, "Redis restarts noticed (run id change)");
    describe_counter!(
        names::TICK_VISITS,
        "Groups the tick loop visited, by reason (due, sweep)"
    );
    describe_counter!(
        names::DAMAGED_KEYS,
        "Damage found in a coordinator key (due index, groups index, routing), by kind"
    );
    describe_counter!(
        names::DAMAGED_KEY_REPAIRS,
        "Indexes of the wrong type replaced by rebuilt ones"
    );
}

/// The lag family and its scrape.
fn describe_lag() {
    describe_gauge!(
        names::SHARD_LAG,
        "Entries not yet delivered to the group (XINFO GROUPS lag)"
    );
    describe_gauge!(
        names::SHARD_PENDING,
        "Entries delivered but not acknowledged (XINFO GROUPS pending)"
    );
    describe_gauge!(names::SHARD_LENGTH, "Entries in the shard stream (XLEN)");
    describe_counter!(names::LAG_SCRAPE_ERRORS, "Lag scrapes that failed or timed out");
    describe_gauge!(
        names::LAG_SCRAPE_DURATION,
        Unit::Seconds,
        "Duration of the last lag scrape"
    );
}

/// The usage family: per tenant and per Redis.
fn describe_usage() {
    describe_gauge!(
        names::TENANT_STREAM_LENGTH,
        "Entries over the tenant's shard streams (sum of XLEN)"
    );
    describe_gauge!(
        names::TENANT_MEMORY,
        Unit::Bytes,
        "Memory of the tenant's shard streams (sum of sampled MEMORY USAGE)"
    );
    describe_gauge!(names::REDIS_USED_MEMORY, Unit::Bytes, "Redis used_memory");
    describe_gauge!(names::REDIS_MAXMEMORY, Unit::Bytes, "Redis maxmemory (0: no limit)");
    describe_counter!(names::USAGE_SCRAPE_ERRORS, "Usage scrapes that failed or timed out");
}
