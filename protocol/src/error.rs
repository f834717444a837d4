//! Errors of the protocol crate.

use thiserror::Error;

/// A name that cannot be used in a Redis key or on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum NameError {
    /// The name is empty.
    #[error("{kind} name must not be empty")]
    Empty {
        /// Which name (stream, group, member id).
        kind: &'static str,
    },
    /// The name is longer than [`crate::names::MAX_NAME_LEN`].
    #[error("{kind} name is {len} bytes long, the limit is {max}")]
    TooLong {
        /// Which name.
        kind: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The name holds a character outside `[A-Za-z0-9._-]`.
    #[error("{kind} name {value:?} contains {found:?}; use ASCII letters, digits, '-', '_' or '.'")]
    InvalidChar {
        /// Which name.
        kind: &'static str,
        /// The name as given.
        value: String,
        /// The first refused character.
        found: char,
    },
}

/// A stored or received document that cannot be used.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The JSON does not parse into the expected type.
    #[error("malformed JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// The document was written with a schema version this build does not understand.
    #[error("unsupported schema version {found} (this build understands {supported})")]
    UnsupportedSchema {
        /// The version found in the document.
        found: u32,
        /// The version this build reads and writes.
        supported: u32,
    },
    /// The document parses but breaks an invariant (for example a shard table of the wrong length).
    #[error("inconsistent document: {0}")]
    Inconsistent(String),
}
