//! What every handler shares: the coordinator, and the one way a mutation runs (in a task of its own, see the
//! module docs of [`crate::http`]).

use std::future::Future;
use std::sync::Arc;

use super::error::ApiError;
use crate::coordinator::Coordinator;
use crate::error::Error;
use crate::quota::principals::{Principal, Principals};

/// What every handler shares.
#[derive(Clone)]
pub(super) struct AppState {
    pub(super) coordinator: Coordinator,
    /// Every token's name, quotas and request bucket (this replica's).
    pub(super) principals: Arc<Principals>,
}

impl AppState {
    pub(super) fn new(coordinator: Coordinator) -> Self {
        let principals = Principals::new(coordinator.config())
            .expect("Coordinator::connect validated the configuration, principals included");
        AppState {
            coordinator,
            principals: Arc::new(principals),
        }
    }

    /// The token of credential position `who` (see `crate::auth::authorize_as`); `None` on an open route.
    pub(super) fn principal(&self, who: Option<usize>) -> Option<&Principal> {
        who.and_then(|i| self.principals.get(i))
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
