//! `GET /healthz` (the process runs) and `GET /readyz` (send traffic here).

use axum::extract::State;
use axum::Json;
use protocol::Status;
use serde::Serialize;
use std::time::Duration;

use super::error::ApiError;
use super::state::AppState;
use crate::error::{Error, StoreError};

/// How long `/readyz` waits for Redis to answer; a probe must answer before its own timeout.
const PING_TIMEOUT: Duration = Duration::from_secs(1);

/// Body of a successful probe.
#[derive(Debug, Serialize)]
pub(super) struct Health {
    status: Status,
}

/// Liveness: answers while the process runs, even when terminating or when Redis is down (restarting the
/// process would not fix either).
pub(super) async fn healthz() -> Json<Health> {
    Json(Health { status: Status::Ok })
}

/// Readiness: unready first thing on shutdown (so load balancers stop sending before mutations are refused),
/// while Redis does not answer, and while its `maxmemory-policy` is not `noeviction` (unless accepted by
/// configuration; see [`crate::memory_policy`]). Each probe reads the policy (`INFO memory`, which also proves
/// Redis answers), so fixing it at run time turns the instance ready at the next probe.
pub(super) async fn readyz(State(state): State<AppState>) -> Result<Json<Health>, ApiError> {
    let coordinator = &state.coordinator;
    if coordinator.gate().is_terminating() {
        return Err(Error::Terminating.into());
    }
    match tokio::time::timeout(PING_TIMEOUT, coordinator.check_eviction_policy()).await {
        Ok(Ok(true)) => Ok(Json(Health { status: Status::Ok })),
        Ok(Ok(false)) => {
            let why = coordinator.eviction_policy().require_safe().err().unwrap_or_default();
            Err(Error::Store(StoreError::Unsupported(why)).into())
        }
        Ok(Err(e)) => Err(e.into()),
        Err(_) => {
            let timeout = std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("Redis did not answer PING within {} ms", PING_TIMEOUT.as_millis()),
            );
            Err(Error::Store(StoreError::Redis(timeout.into())).into())
        }
    }
}
