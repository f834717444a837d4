//! The status every coordinator response carries.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Outcome of a coordinator request, as a stable wire string.
///
/// The first three are answers to a well-formed heartbeat; the rest are errors, sent in an
/// [`ErrorResponse`](crate::messages::ErrorResponse) with the HTTP status of [`Status::http_status`].
///
/// ```
/// use protocol::Status;
///
/// fn what_to_do(status: Status) -> &'static str {
///     if status.is_replaced() {
///         "stop for good"
///     } else if status.requires_rejoin() {
///         "drop the assignment and join again"
///     } else if status.is_retryable() {
///         "try again later"
///     } else if status.is_error() {
///         "give up"
///     } else {
///         "carry on"
///     }
/// }
/// assert_eq!(what_to_do(Status::StoreUnavailable), "try again later");
/// assert_eq!(what_to_do(Status::Ok), "carry on");
/// assert_eq!(Status::StoreUnavailable.as_str(), "STORE_UNAVAILABLE");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[non_exhaustive]
pub enum Status {
    /// The response is the member's current assignment: start `assigned` shards, keep `pending` ones idle,
    /// drain `revoke` ones.
    Ok,
    /// The client reported a metadata version higher than Redis stores (a lost write). Adopt this response as the
    /// truth: keep only shards already being read that are still `assigned`, revoke the rest, start nothing.
    SyncMetadata,
    /// A metadata correction round is still open (other members unsynchronised, or revokes draining): keep
    /// draining, start nothing new.
    RevokePending,
    /// The request's member epoch is stale: this incarnation was replaced or fenced. Stop every reader and rejoin
    /// with epoch 0.
    FencedMemberEpoch,
    /// The member incarnation the request names is not in the group (it expired, was removed, left, or was lost
    /// with a metadata rollback). Stop every reader and rejoin with epoch 0.
    UnknownMember,
    /// Another process joined under this member id and holds it now: this process's incarnation was replaced.
    /// Stop every reader and do not rejoin (two processes under one name would replace each other in turn); it is
    /// the answer to a process that was stalled or partitioned while its replacement started, or to two
    /// processes configured with the same member id.
    MemberReplaced,
    /// The group's metadata is missing or unreadable (unknown schema or layout version, corrupt JSON). The
    /// coordinator fails closed and never rebuilds it from client reports; an operator recreates the group.
    MetadataUnavailable,
    /// The group (or stream) was never created: Redis holds no trace of it (no metadata, no index entry, no
    /// liveness, no consumer group on its shards). Usually a typo or a missing create step: create it. Retrying the
    /// same request does not help; a lost group (traces remain) is [`Status::MetadataUnavailable`] instead.
    NotFound,
    /// This coordinator instance is shutting down: retry against another instance.
    CoordinatorTerminating,
    /// Redis could not be reached, or the group's mutex stayed busy: retry with backoff.
    StoreUnavailable,
    /// The request is malformed or breaks a rule (bad name, bad JSON, oversized body, impossible values).
    InvalidRequest,
    /// An admin mutation's `If-Match` revision is not the stored one: re-read and decide again.
    RevisionConflict,
    /// The group or stream to create exists already.
    AlreadyExists,
    /// The request lacks the bearer token this endpoint requires.
    Unauthorized,
    /// The request would take the token past one of its quotas (groups, shards per group, members per group):
    /// nothing was changed. Retrying the same request does not help until usage drops (a group or member goes) or
    /// an operator raises the quota; `retryAfterMs` says when it is worth looking again, not that it will pass.
    QuotaExceeded,
    /// The token sent more requests than its rate allows on this coordinator replica: nothing was read or
    /// changed. Retry after `retryAfterMs` (the `Retry-After` header, in whole seconds).
    RateLimited,
}

impl Status {
    /// HTTP status code used with this status.
    pub fn http_status(self) -> u16 {
        match self {
            Status::Ok | Status::SyncMetadata | Status::RevokePending => 200,
            Status::InvalidRequest => 400,
            Status::Unauthorized => 401,
            Status::FencedMemberEpoch | Status::UnknownMember | Status::MemberReplaced | Status::AlreadyExists => 409,
            Status::NotFound => 404,
            Status::RevisionConflict => 412,
            Status::QuotaExceeded | Status::RateLimited => 429,
            Status::MetadataUnavailable | Status::CoordinatorTerminating | Status::StoreUnavailable => 503,
        }
    }

    /// Whether this is an error status (sent in an error body).
    pub fn is_error(self) -> bool {
        !matches!(self, Status::Ok | Status::SyncMetadata | Status::RevokePending)
    }

    /// Whether the same request may succeed if retried unchanged (against this or another coordinator).
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            Status::CoordinatorTerminating
                | Status::StoreUnavailable
                | Status::MetadataUnavailable
                | Status::RateLimited
        )
    }

    /// Whether the client must drop its assignment and rejoin with epoch 0.
    pub fn requires_rejoin(self) -> bool {
        matches!(self, Status::FencedMemberEpoch | Status::UnknownMember)
    }

    /// Whether the client must drop its assignment and stop for good: another process holds its member id.
    pub fn is_replaced(self) -> bool {
        self == Status::MemberReplaced
    }

    /// The wire string.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "OK",
            Status::SyncMetadata => "SYNC_METADATA",
            Status::RevokePending => "REVOKE_PENDING",
            Status::FencedMemberEpoch => "FENCED_MEMBER_EPOCH",
            Status::UnknownMember => "UNKNOWN_MEMBER",
            Status::MemberReplaced => "MEMBER_REPLACED",
            Status::MetadataUnavailable => "METADATA_UNAVAILABLE",
            Status::NotFound => "NOT_FOUND",
            Status::CoordinatorTerminating => "COORDINATOR_TERMINATING",
            Status::StoreUnavailable => "STORE_UNAVAILABLE",
            Status::InvalidRequest => "INVALID_REQUEST",
            Status::RevisionConflict => "REVISION_CONFLICT",
            Status::AlreadyExists => "ALREADY_EXISTS",
            Status::Unauthorized => "UNAUTHORIZED",
            Status::QuotaExceeded => "QUOTA_EXCEEDED",
            Status::RateLimited => "RATE_LIMITED",
        }
    }

    /// Every status, for documentation and exhaustive tests.
    pub const ALL: [Status; 16] = [
        Status::Ok,
        Status::SyncMetadata,
        Status::RevokePending,
        Status::FencedMemberEpoch,
        Status::UnknownMember,
        Status::MemberReplaced,
        Status::MetadataUnavailable,
        Status::NotFound,
        Status::CoordinatorTerminating,
        Status::StoreUnavailable,
        Status::InvalidRequest,
        Status::RevisionConflict,
        Status::AlreadyExists,
        Status::Unauthorized,
        Status::QuotaExceeded,
        Status::RateLimited,
    ];
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_strings_match_serde() {
        for s in Status::ALL {
            assert_eq!(serde_json::to_string(&s).unwrap(), format!("\"{}\"", s.as_str()));
        }
    }

    #[test]
    fn never_created_is_a_final_404() {
        assert_eq!(Status::NotFound.http_status(), 404);
        assert_eq!(Status::NotFound.as_str(), "NOT_FOUND");
        assert!(Status::NotFound.is_error());
        assert!(!Status::NotFound.is_retryable(), "retrying a typo only adds load");
        assert!(!Status::NotFound.requires_rejoin());
    }

    #[test]
    fn a_replaced_member_stops_instead_of_rejoining() {
        let s = Status::MemberReplaced;
        assert_eq!((s.http_status(), s.as_str()), (409, "MEMBER_REPLACED"));
        assert!(s.is_replaced() && !s.requires_rejoin() && !s.is_retryable());
    }

    #[test]
    fn quota_refusals_are_429_and_only_the_rate_limit_is_retried() {
        for s in [Status::QuotaExceeded, Status::RateLimited] {
            assert_eq!(s.http_status(), 429, "{s}");
            assert!(s.is_error() && !s.requires_rejoin() && !s.is_replaced(), "{s}");
        }
        assert!(Status::RateLimited.is_retryable());
        assert!(
            !Status::QuotaExceeded.is_retryable(),
            "a join over the member quota must reach the user, not loop"
        );
    }

    #[test]
    fn only_heartbeat_answers_are_200() {
        for s in Status::ALL {
            assert_eq!(s.http_status() == 200, !s.is_error(), "{s}");
        }
    }
}
