//! The member quota: how many members one group may hold, checked before a join is applied.
//!
//! A join that would add a member id the group does not record, to a group that already holds `max_members`,
//! is refused with `QUOTA_EXCEEDED` and changes nothing (no member, no liveness, no correction round). A join of
//! a member id the group records (a restart of the same process, a retried join) never grows the group and is
//! never refused here. Fenced members still count: they hold shards until their lease ends.
//!
//! The limit is the quota of the token that sent the join (see `docs/operations.md`, "Quotas"); the caller passes
//! it in, so the rule stays a pure function of the metadata and the request.

use protocol::messages::HeartbeatRequest;
use protocol::metadata::GroupMetadata;
use protocol::Status;

use super::transition::Rejection;

/// The refusal of `req` when it is a join past `max_members`; `None` when it may be applied.
pub fn refuse_join(meta: &GroupMetadata, req: &HeartbeatRequest, max_members: u32) -> Option<Rejection> {
    if !req.member_epoch.is_join() || meta.members.contains_key(&req.member_id) {
        return None;
    }
    let members = meta.members.len();
    if members < usize::try_from(max_members).unwrap_or(usize::MAX) {
        return None;
    }
    Some(Rejection {
        status: Status::QuotaExceeded,
        message: format!(
            "group {} of stream {} holds {members} members, the most this token's quota allows ({max_members}): \
             member {} was not added",
            meta.group, meta.stream, req.member_id
        ),
        member_epoch: None,
    })
}
