//! What every handler shares: the coordinator, and the one way a mutation runs (in a task of its own, see the
//! module docs of [`crate::http`]).

use std::future::Future;

use super::error::ApiError;
use crate::coordinator::Coordinator;
use crate::error::Error;

/// What every handler shares.
#[derive(Clone)]
pub(super) struct AppState {
    pub(super) coordinator: Coordinator,
}

impl AppState {
    pub(super) fn new(coordinator: Coordinator) -> Self {
        AppState { coordinator }
    }

    /// Runs a mutation to completion in its own task (see the module docs), after a fast refusal once shutdown
    /// began: the coordinator checks the gate again after the group's local lock, but a request queued behind a
    /// section in flight should not wait for it only to be refused.
    pub(super) async fn mutate<T, F, Fut>(&self, op: F) -> Result<T, ApiError>
    where
        F: FnOnce(Coordinator) -> Fut,
        Fut: Future<Output = Result<T, Error>> + Send + 'static,
        T: Send + 'static,
    {
        if self.coordinator.gate().is_terminating() {
            return Err(Error::Terminating.into());
        }
        match tokio::spawn(op(self.coordinator.clone())).await {
            Ok(result) => result.map_err(|e| {
                let metrics = self.coordinator.stats().metrics();
                if matches!(e, Error::RevisionConflict { .. }) {
                    metrics.admin_revision_conflict();
                }
                metrics.error(&e);
                ApiError::from(e)
            }),
            Err(e) => Err(ApiError::internal(format!("the operation failed: {e}"))),
        }
    }
}
