//! `GET /healthz` (the process runs) and `GET /readyz` (send traffic here).

use axum::extract::State;
use axum::Json;
use protocol::Status;
use serde::Serialize;
use std::time::Duration;

use super::error::ApiError;
use super::AppState;
use crate::error::{Error, StoreError};

/// How long `/readyz` waits for Redis to answer `PING`; a probe must answer before its own timeout.
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
/// and while Redis does not answer `PING`.
pub(super) async fn readyz(State(state): State<AppState>) -> Result<Json<Health>, ApiError> {
    let coordinator = &state.coordinator;
    if coordinator.gate().is_terminating() {
        return Err(Error::Terminating.into());
    }
    let mut conn = coordinator.store().connection();
    let cmd = redis::cmd("PING");
    let ping = cmd.query_async::<String>(&mut conn);
    match tokio::time::timeout(PING_TIMEOUT, ping).await {
        Ok(Ok(_)) => Ok(Json(Health { status: Status::Ok })),
        Ok(Err(e)) => Err(Error::Store(StoreError::Redis(e)).into()),
        Err(_) => {
            let timeout = std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("Redis did not answer PING within {} ms", PING_TIMEOUT.as_millis()),
            );
            Err(Error::Store(StoreError::Redis(timeout.into())).into())
        }
    }
}
