//! Errors of the coordinator. Every variant maps to one wire [`Status`] (see `http::error`).

use protocol::{MemberEpoch, Status, StoreRevision};
use thiserror::Error;

/// An error from a coordinator operation.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Error {
    /// The state machine refused the input (fenced or unknown member, invalid heartbeat); nothing was changed
    /// on its account.
    #[error("{status}: {message}")]
    Rejected {
        /// The wire status.
        status: Status,
        /// Why.
        message: String,
        /// For a fenced member: the epoch Redis records.
        member_epoch: Option<MemberEpoch>,
    },
    /// The request is malformed or breaks a rule.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The group or stream metadata is missing or unreadable; the coordinator fails closed.
    #[error("metadata unavailable: {0}")]
    MetadataUnavailable(String),
    /// The group or stream was never created: Redis holds no trace of it (see `docs/failure-handling.md`).
    #[error("not found: {0}")]
    NotFound(String),
    /// An admin mutation's `If-Match` does not match the stored revision.
    #[error("revision conflict: expected {expected}, stored {found}")]
    RevisionConflict {
        /// The revision the caller expected.
        expected: StoreRevision,
        /// The stored revision.
        found: StoreRevision,
    },
    /// The group or stream to create exists already.
    #[error("already exists: {0}")]
    AlreadyExists(String),
    /// This instance is shutting down.
    #[error("coordinator is terminating")]
    Terminating,
    /// Redis failed or the group mutex stayed busy.
    #[error(transparent)]
    Store(StoreError),
    /// The HTTP listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: std::net::SocketAddr,
        /// The bind error.
        #[source]
        source: std::io::Error,
    },
    /// The HTTPS certificate, key or client CA (`Config::tls`) cannot serve.
    #[error("cannot serve HTTPS: {0}")]
    Tls(#[source] crate::server::tls::TlsError),
}

impl From<StoreError> for Error {
    /// A corrupt hash is not a store outage: only an operator fixes it, so it fails closed like missing metadata.
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Corrupt(message) => Error::MetadataUnavailable(message),
            other => Error::Store(other),
        }
    }
}

impl Error {
    /// The wire status of this error.
    pub fn status(&self) -> Status {
        match self {
            Error::Rejected { status, .. } => *status,
            Error::InvalidRequest(_) => Status::InvalidRequest,
            Error::MetadataUnavailable(_) => Status::MetadataUnavailable,
            Error::NotFound(_) => Status::NotFound,
            Error::RevisionConflict { .. } => Status::RevisionConflict,
            Error::AlreadyExists(_) => Status::AlreadyExists,
            Error::Terminating => Status::CoordinatorTerminating,
            Error::Store(_) => Status::StoreUnavailable,
            Error::Listen { .. } | Error::Tls(_) => Status::InvalidRequest,
        }
    }

    /// A copy of this error for every request of a batch that failed together: store failures keep their
    /// variant and source; a listen error (never part of a batch) keeps its kind and message.
    pub fn duplicate(&self) -> Error {
        match self {
            Error::Rejected {
                status,
                message,
                member_epoch,
            } => Error::Rejected {
                status: *status,
                message: message.clone(),
                member_epoch: *member_epoch,
            },
            Error::InvalidRequest(m) => Error::InvalidRequest(m.clone()),
            Error::MetadataUnavailable(m) => Error::MetadataUnavailable(m.clone()),
            Error::NotFound(m) => Error::NotFound(m.clone()),
            Error::RevisionConflict { expected, found } => Error::RevisionConflict {
                expected: *expected,
                found: *found,
            },
            Error::AlreadyExists(m) => Error::AlreadyExists(m.clone()),
            Error::Terminating => Error::Terminating,
            Error::Store(e) => Error::Store(e.clone()),
            Error::Listen { addr, source } => Error::Listen {
                addr: *addr,
                source: std::io::Error::new(source.kind(), source.to_string()),
            },
            Error::Tls(e) => Error::Tls(e.clone()),
        }
    }

    /// Whether the caller may retry the same request.
    pub fn is_retryable(&self) -> bool {
        self.status().is_retryable()
    }
}

/// A failure talking to Redis. `Clone` (redis-rs errors are), so a failure shared by every request of a batch
/// reaches each of them with its type and source intact.
#[derive(Debug, Clone, Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A Redis command failed (connection, timeout, script error).
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// The group's mutex could not be acquired within the critical-section deadline.
    #[error("mutex {key} stayed busy for {waited_ms} ms")]
    MutexBusy {
        /// The mutex key.
        key: String,
        /// How long we tried.
        waited_ms: u64,
    },
    /// The compare-and-set lost to another writer more times than the retry budget allows.
    #[error("revision compare-and-set kept failing on {key}")]
    CasExhausted {
        /// The metadata key.
        key: String,
    },
    /// A reply had an unexpected shape (a bug or a foreign writer).
    #[error("unexpected reply: {0}")]
    Protocol(String),
    /// A stored field does not parse, or names a version this build does not understand; nothing was written.
    #[error("{0}")]
    Corrupt(String),
    /// The Redis server lacks a command or version the coordinator needs.
    #[error("unsupported Redis: {0}")]
    Unsupported(String),
    /// A failure of one node of a Redis Cluster, in something every master must answer (start-up checks,
    /// `SCAN`, run ids).
    #[error("Redis Cluster node {node}: {source}")]
    Node {
        /// The node's address (`host:port`).
        node: String,
        /// What failed there.
        #[source]
        source: Box<StoreError>,
    },
}

impl StoreError {
    /// This error as a failure of cluster node `node`.
    pub fn on_node(self, node: impl std::fmt::Display) -> StoreError {
        StoreError::Node {
            node: node.to_string(),
            source: Box::new(self),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duplicated_store_failure_keeps_its_variant_and_source() {
        let original = Error::Store(StoreError::MutexBusy {
            key: "k".into(),
            waited_ms: 7,
        });
        let copy = original.duplicate();
        assert!(
            matches!(&copy, Error::Store(StoreError::MutexBusy { key, waited_ms: 7 }) if key == "k"),
            "{copy:?}"
        );
        let redis = Error::Store(StoreError::Redis(redis::RedisError::from((
            redis::ErrorKind::Io,
            "connection reset",
        ))));
        let copy = redis.duplicate();
        assert!(matches!(&copy, Error::Store(StoreError::Redis(_))), "{copy:?}");
        assert!(
            std::error::Error::source(&copy).is_some(),
            "the Redis error stays the source"
        );
        assert_eq!(copy.status(), redis.status());
    }
}
