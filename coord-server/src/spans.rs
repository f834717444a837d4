//! Tracing of the critical sections: one `critical_section` span per section, carrying the fields operators
//! filter on, and the write boundary the section reached.
//!
//! | field | value |
//! |---|---|
//! | `workflow` | `join`, `heartbeat`, `leave`, `tick`, `fence`, `create`, `recreate`, `add_shards`, `routing` |
//! | `stream`, `group`, `member_id` | what the section is about (`group` and `member_id` when there is one) |
//! | `boundary` | the last [`Boundary`] reached: `loaded`, `decided`, `committed` or `released` |
//! | `revision` | the store revision loaded, then the one written |
//!
//! The boundary is what a post-mortem needs after a coordinator died mid-section (see the failure-handling
//! design, "before-write failure must always name the write boundary"): `loaded`/`decided` mean nothing was
//! written and the client's retry repeats the section; `committed` means Redis has the decision and the retry
//! gets the same answer from it; `released` means the section ended without writing. Each boundary is also logged
//! at `debug` level ("write boundary reached"), so `RUST_LOG=coord_server=debug` shows every step with the span's
//! fields, as JSON with `--log-format json`.

use protocol::names::{GroupName, MemberId, StreamName};
use protocol::StoreRevision;
use tracing::{debug, field, info_span, Span};

/// How far a critical section got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Boundary {
    /// The mutex is held and the hash loaded; nothing decided.
    Loaded,
    /// The state machine decided; nothing written yet.
    Decided,
    /// The decision is written (revision compare-and-set succeeded) and the mutex released by the same script.
    Committed,
    /// The mutex was released without a write (nothing to change, a refusal, or an error).
    Released,
}

impl Boundary {
    /// The field value.
    pub fn as_str(self) -> &'static str {
        match self {
            Boundary::Loaded => "loaded",
            Boundary::Decided => "decided",
            Boundary::Committed => "committed",
            Boundary::Released => "released",
        }
    }
}

/// The span of one critical section of `workflow`.
pub(crate) fn section(workflow: &'static str, stream: &StreamName, group: Option<&GroupName>) -> Span {
    let span = info_span!(
        "critical_section",
        workflow,
        stream = %stream,
        group = field::Empty,
        member_id = field::Empty,
        boundary = field::Empty,
        revision = field::Empty,
    );
    if let Some(group) = group {
        span.record("group", field::display(group));
    }
    span
}

/// The span of a heartbeat section; the workflow says whether it is a join, a heartbeat or a leave.
pub(crate) fn heartbeat(
    stream: &StreamName,
    group: &GroupName,
    member: &MemberId,
    epoch: protocol::MemberEpoch,
) -> Span {
    let workflow = if epoch == protocol::MemberEpoch::JOIN {
        "join"
    } else if epoch == protocol::MemberEpoch::LEAVE {
        "leave"
    } else {
        "heartbeat"
    };
    let span = section(workflow, stream, Some(group));
    span.record("member_id", field::display(member));
    span
}

/// Records that the current section reached `boundary` (with the revision loaded or written, when known).
pub(crate) fn reached(boundary: Boundary, revision: Option<StoreRevision>) {
    let span = Span::current();
    span.record("boundary", boundary.as_str());
    if let Some(r) = revision {
        span.record("revision", r.0);
    }
    debug!(
        boundary = boundary.as_str(),
        revision = revision.map(|r| r.0),
        "write boundary reached"
    );
}
