//! Test-only fault injection at the write boundary of a group's critical section (cargo feature
//! `fault-injection`, off by default).
//!
//! Scenario tests need to stop a coordinator *just before* and *just after* it writes a decision to Redis, and to
//! show that the client's retry converges (the failure-handling design: "before-write failure must always name the
//! write boundary"). A [`FaultHook`] installed on a [`crate::Coordinator`] with [`install`] is asked at two points of
//! every group critical section (heartbeats, ticks, admin fences) that has something to write:
//!
//! | [`Point`] | Where | What Redis holds if the process dies there |
//! |---|---|---|
//! | [`Point::BeforeWrite`] | after the state machine decided, before the `COMMIT` script | the old metadata, and the group mutex until its `PX` runs out |
//! | [`Point::AfterWrite`] | after `COMMIT` succeeded, before the answer is returned | the new metadata; the mutex was released by `COMMIT` |
//!
//! The hook answers with an [`Action`]:
//! * [`Action::Fail`]: the section returns an error (`503 STORE_UNAVAILABLE` on the wire) as if the process had
//!   died there. Nothing else is undone or cleaned up: before the write, **the mutex is left behind** (a crashed
//!   process would not release it either): another instance waits for its TTL, while this one deletes it at its
//!   next section of the group, as it does any leftover of its own (`store::Token`); after the write, the decision
//!   stays recorded and only the answer is lost.
//! * [`Action::Hang`]: the section never returns. The caller's request hangs, the local group lock stays held:
//!   the test then kills the instance ([`crate::server::CoordinatorHandle::abort`]) and carries on with another.
//! * [`Action::Delay`]: the section sleeps, then goes on (e.g. past the mutex TTL, to make another instance win
//!   the revision compare-and-set).
//! * [`Action::Continue`]: nothing happens.
//!
//! Sections that write nothing (a refusal, a no-change heartbeat of a released mutex) are not reported: there is
//! no write boundary to fail at. Routing writes (create, add shards) are not hooked.
//!
//! With the feature off, none of this is compiled and the critical section is unchanged. Note that cargo unifies
//! features across a workspace build: `cargo test --workspace` builds the coordinator with this feature because
//! the scenario tests ask for it; with no hook installed, every point costs one uncontended lock and a lookup.

use protocol::names::{GroupName, StreamName};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::{Error, StoreError};
use crate::state_machine::Transition;
use crate::stats::Stats;

/// Where in a critical section the hook is asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    /// Decided, nothing written yet.
    BeforeWrite,
    /// Written (the compare-and-set succeeded), not answered yet.
    AfterWrite,
}

/// What the section is about to write (or just wrote), for the hook to decide on.
#[derive(Debug)]
#[non_exhaustive]
pub struct Site<'a> {
    /// The point reached.
    pub point: Point,
    /// The stream.
    pub stream: &'a StreamName,
    /// The group.
    pub group: &'a GroupName,
    /// The decision: next metadata, liveness renewals, events (`MemberJoined`, `ShardReleased`, ...).
    pub transition: &'a Transition,
}

/// What the section does at a [`Point`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Action {
    /// Go on normally.
    Continue,
    /// Return an error as if the process died here (see the module docs for what is left behind).
    Fail,
    /// Never return (the test kills the instance).
    Hang,
    /// Sleep, then go on.
    Delay(Duration),
}

/// Decides what a critical section does at each [`Point`]. Implemented for closures.
pub trait FaultHook: Send + Sync + 'static {
    /// Called at every point of every writing group section of the coordinator it is installed on.
    fn at(&self, site: &Site<'_>) -> Action;
}

impl<F> FaultHook for F
where
    F: Fn(&Site<'_>) -> Action + Send + Sync + 'static,
{
    fn at(&self, site: &Site<'_>) -> Action {
        self(site)
    }
}

struct Installed {
    /// Which coordinator (see [`identity`]).
    coordinator: usize,
    /// Which installation, for [`FaultGuard`].
    id: u64,
    hook: Arc<dyn FaultHook>,
}

/// Hooks live in a registry keyed by coordinator rather than in the coordinator itself, so the feature adds no
/// field to it and the critical section gains two lines only.
static HOOKS: Mutex<Vec<Installed>> = Mutex::new(Vec::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// What hooks are installed on: a coordinator instance, whose clones share its hooks. Implemented by
/// [`crate::Coordinator`].
pub trait Target {
    /// The instance's counters: their address identifies the instance.
    fn instance_stats(&self) -> &Stats;
}

/// An instance's identity: the address of its shared counters, stable for as long as any clone of it lives.
fn identity(stats: &Stats) -> usize {
    std::ptr::from_ref(stats) as usize
}

/// Installs `hook` on `coordinator` (and every clone of it). Hooks installed on one coordinator are asked in
/// installation order; the first answer other than [`Action::Continue`] wins.
///
/// Keep the returned guard alive for as long as the hook should act: dropping it uninstalls the hook. Uninstall
/// before the coordinator is dropped, since a later coordinator could reuse its address.
#[must_use = "dropping the guard uninstalls the hook"]
pub fn install(coordinator: &impl Target, hook: impl FaultHook) -> FaultGuard {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    HOOKS.lock().expect("fault hooks lock").push(Installed {
        coordinator: identity(coordinator.instance_stats()),
        id,
        hook: Arc::new(hook),
    });
    FaultGuard { id }
}

/// Uninstalls its hook when dropped.
#[derive(Debug)]
pub struct FaultGuard {
    id: u64,
}

impl Drop for FaultGuard {
    fn drop(&mut self) {
        if let Ok(mut hooks) = HOOKS.lock() {
            hooks.retain(|h| h.id != self.id);
        }
    }
}

/// Called by the critical section at `point`: asks the installed hooks and acts.
pub(crate) async fn reached(
    stats: &Stats,
    point: Point,
    stream: &StreamName,
    group: &GroupName,
    transition: &Transition,
) -> Result<(), Error> {
    let me = identity(stats);
    let hooks: Vec<Arc<dyn FaultHook>> = HOOKS
        .lock()
        .expect("fault hooks lock")
        .iter()
        .filter(|h| h.coordinator == me)
        .map(|h| Arc::clone(&h.hook))
        .collect();
    let site = Site {
        point,
        stream,
        group,
        transition,
    };
    // Asked outside the registry lock: a hook may install or drop guards itself.
    let action = hooks
        .iter()
        .map(|h| h.at(&site))
        .find(|a| *a != Action::Continue)
        .unwrap_or(Action::Continue);
    match action {
        Action::Continue => Ok(()),
        Action::Fail => {
            tracing::warn!(stream = %stream, group = %group, ?point, "fault injected: failing the section");
            Err(StoreError::Protocol(format!("fault injected at {point:?}")).into())
        }
        Action::Hang => {
            tracing::warn!(stream = %stream, group = %group, ?point, "fault injected: the section hangs");
            std::future::pending().await
        }
        Action::Delay(d) => {
            tracing::warn!(stream = %stream, group = %group, ?point, delay = ?d, "fault injected: delaying");
            tokio::time::sleep(d).await;
            Ok(())
        }
    }
}
