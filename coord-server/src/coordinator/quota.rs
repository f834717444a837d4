//! The quotas of a token (see [`crate::quota`]) where they need Redis: group creates counted and done under the
//! token's group-create mutex ([`lock`]), the groups its prefixes reach (from the groups index, so every replica
//! counts the same), the shard count of a stream; and the heartbeat with the member quota of its token (the rule
//! itself is pure: `state_machine::quota`). Add-shards checks its quota in the routing section's decision
//! (`routing_section::grow`).

mod lock;

use protocol::messages::{
    CreateGroupRequest, GroupDescription, GroupRef, HeartbeatRequest, HeartbeatResponse, QuotaUsage,
    RecreateGroupRequest,
};
use protocol::metadata::MAX_SHARDS;
use protocol::names::{GroupName, StreamName};
use tracing::Instrument;

use super::Coordinator;
use crate::auth::Access;
use crate::error::Error;
use crate::quota::{self, Quota, TokenQuota};
use crate::spans;
use crate::store;

/// What a token uses of its quotas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Groups on the streams it reaches, and the limit.
    pub groups: QuotaUsage,
    /// The largest shard count among those groups' streams, and the limit.
    pub shards_per_group: QuotaUsage,
    /// The most members with a lease in one of those groups, and the limit.
    pub members_per_group: QuotaUsage,
}

impl Coordinator {
    /// A `QUOTA_EXCEEDED` refusal of the `quota` named, counted.
    fn exceeded(&self, quota: &'static str, message: String) -> Error {
        quota::exceeded(&self.inner.stats, quota, message)
    }

    /// Creates a group (see [`Coordinator::create_group`]) within `who`'s quotas (`None`: an open caller, no
    /// quota): the count and the create run under the token's group-create mutex, so concurrent creates of one
    /// token, on any replicas, never take it past its group quota.
    ///
    /// # Errors
    /// `QUOTA_EXCEEDED` (nothing is written); `STORE_UNAVAILABLE` when the token's other creates held the mutex
    /// for the whole critical-section timeout; those of [`Coordinator::create_group`].
    pub async fn create_group_within(
        &self,
        who: Option<&TokenQuota>,
        access: &Access,
        stream: &StreamName,
        group: &GroupName,
        req: &CreateGroupRequest,
    ) -> Result<GroupDescription, Error> {
        let Some(who) = who else {
            return self.create_group(stream, group, req).await;
        };
        self.counted_create(
            who,
            access,
            stream,
            group,
            req.shard_count,
            self.create_group(stream, group, req),
        )
        .await
    }

    /// Recreates a group (see [`Coordinator::recreate_group`]) within `who`'s quotas, as
    /// [`Coordinator::create_group_within`] creates one; a group the index lists adds none to the count.
    ///
    /// # Errors
    /// As [`Coordinator::create_group_within`], and those of [`Coordinator::recreate_group`].
    pub async fn recreate_group_within(
        &self,
        who: Option<&TokenQuota>,
        access: &Access,
        stream: &StreamName,
        group: &GroupName,
        req: &RecreateGroupRequest,
    ) -> Result<GroupDescription, Error> {
        let Some(who) = who else {
            return self.recreate_group(stream, group, req).await;
        };
        let create = self.recreate_group(stream, group, req);
        self.counted_create(who, access, stream, group, Some(req.shard_count), create)
            .await
    }

    /// Runs `create` once [`Coordinator::check_create_quota`] admitted it under `who`'s group-create mutex,
    /// which is held until the group is indexed (where the next count finds it).
    async fn counted_create(
        &self,
        who: &TokenQuota,
        access: &Access,
        stream: &StreamName,
        group: &GroupName,
        shard_count: Option<u32>,
        create: impl std::future::Future<Output = Result<GroupDescription, Error>>,
    ) -> Result<GroupDescription, Error> {
        // Without the mutex first: a token at its quota is refused without queueing behind its own creates. A
        // refusal is sound unlocked (the groups counted were there); an admission is not, so it is counted again.
        self.check_create_quota(who, access, stream, group, shard_count).await?;
        let lock = self.take_quota_lock(who).await?;
        let result = match self.check_create_quota(who, access, stream, group, shard_count).await {
            Ok(()) => create.await,
            Err(e) => Err(e),
        };
        lock.release().await;
        result
    }

    /// Handles a consumer heartbeat; a join that would take its group past `max_members` members is refused with
    /// `QUOTA_EXCEEDED` and writes nothing (`None`: no limit).
    ///
    /// # Errors
    /// [`Error::Rejected`] for fenced, unknown, invalid or refused members; see [`Error`] for the rest.
    pub async fn heartbeat_within(
        &self,
        stream: &StreamName,
        group: &GroupName,
        req: &HeartbeatRequest,
        max_members: Option<u32>,
    ) -> Result<HeartbeatResponse, Error> {
        // Group commit: queued heartbeats of the group run as one section (see `GroupSlot::group_commit`).
        let slot = self.inner.slots.slot(stream, group);
        let span = || spans::heartbeat(stream, group, &req.member_id, req.member_epoch);
        let result = slot
            .group_commit(req, max_members, |batch| {
                self.heartbeat_batch(stream, group, &slot, batch).instrument(span())
            })
            .await;
        self.inner.slots.forget_if_absent(stream, group, slot);
        if let Ok(resp) = &result {
            if req.max_routing_version > resp.routing_version || req.max_shard_count > resp.shard_count {
                self.check_routing_report(stream, req.max_routing_version, req.max_shard_count);
            }
        }
        result
    }

    /// The groups of the index on streams `access` reaches.
    async fn reached_groups(&self, access: &Access) -> Result<Vec<GroupRef>, Error> {
        let raw = self.inner.store.indexed_groups().await?;
        let mut groups = store::group_refs(&raw);
        groups.retain(|g| access.covers(g.stream.as_str()));
        Ok(groups)
    }

    /// The shard count of `stream`, `None` when it has no readable routing.
    async fn stored_shard_count(&self, stream: &StreamName) -> Option<u32> {
        match self.inner.store.read_routing(stream).await {
            Ok(Some((_, json))) => store::decode_routing(&json).ok().map(|r| r.shard_count),
            _ => None,
        }
    }

    /// Refuses a group create that would take `who` past its group quota, or create a group on a stream with more
    /// shards than its shard quota (the stream's count when it exists, else `shard_count`). Nothing is written.
    /// Admits only for the moment of the count: [`Coordinator::create_group_within`] holds the token's mutex
    /// from it to the create.
    ///
    /// # Errors
    /// `QUOTA_EXCEEDED`; Redis errors.
    async fn check_create_quota(
        &self,
        who: &TokenQuota,
        access: &Access,
        stream: &StreamName,
        group: &GroupName,
        shard_count: Option<u32>,
    ) -> Result<(), Error> {
        let quota = who.quota;
        let groups = self.reached_groups(access).await?;
        let exists = groups.iter().any(|g| &g.stream == stream && &g.group == group);
        // An indexed group is refused by the create itself (ALREADY_EXISTS), which says more than a quota would.
        if !exists && groups.len() >= quota.groups as usize {
            return Err(self.exceeded(
                "groups",
                format!(
                    "token {} reaches {} groups, its quota is {}: group {group} of stream {stream} was not created",
                    who.name,
                    groups.len(),
                    quota.groups
                ),
            ));
        }
        let shards = self.stored_shard_count(stream).await.or(shard_count).unwrap_or(0);
        // A count no stream may have is the create's own 400 (a request no quota would ever admit), not a 429.
        if shards > quota.shards_per_group && shards <= MAX_SHARDS {
            return Err(self.exceeded(
                "shards",
                format!(
                    "stream {stream} has or would have {shards} shards, token {}'s quota allows {} per group: group \
                 {group} was not created",
                    who.name, quota.shards_per_group
                ),
            ));
        }
        Ok(())
    }

    /// Refuses a growth of `stream` by `count` that the stored shard count already takes past `who`'s quota,
    /// read without the routing mutex: a token at its quota is refused without queueing on the stream's routing.
    /// A refusal is sound unlocked (the stream had those shards); an admission is not, and `routing_section::grow`
    /// checks again on the count it grows.
    ///
    /// # Errors
    /// `QUOTA_EXCEEDED`.
    pub(super) async fn check_growth_unlocked(
        &self,
        who: &TokenQuota,
        stream: &StreamName,
        count: u32,
    ) -> Result<(), Error> {
        match self.stored_shard_count(stream).await {
            Some(current) => who.check_growth(&self.inner.stats, stream, current, count),
            // A stream without readable routing is the growth's own refusal.
            None => Ok(()),
        }
    }

    /// What a token reaching `access` uses of the limits `q`: groups from the index, the largest stream and the
    /// largest group (one command per group and per stream: for an operator's view, not a hot path).
    ///
    /// # Errors
    /// Redis errors reading the index.
    pub async fn quota_usage(&self, q: Quota, access: &Access) -> Result<Usage, Error> {
        let groups = self.reached_groups(access).await?;
        let mut streams: Vec<&StreamName> = groups.iter().map(|g| &g.stream).collect();
        streams.dedup();
        let mut shards = 0;
        for stream in streams {
            shards = shards.max(self.stored_shard_count(stream).await.unwrap_or(0));
        }
        let mut members = 0u64;
        for g in &groups {
            members = members.max(self.inner.store.leased_members(&g.stream, &g.group).await.unwrap_or(0));
        }
        Ok(Usage {
            groups: QuotaUsage {
                limit: q.groups,
                used: u32::try_from(groups.len()).unwrap_or(u32::MAX),
            },
            shards_per_group: QuotaUsage {
                limit: q.shards_per_group,
                used: shards,
            },
            members_per_group: QuotaUsage {
                limit: q.members_per_group,
                used: u32::try_from(members).unwrap_or(u32::MAX),
            },
        })
    }
}
