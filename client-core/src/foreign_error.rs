//! The errors of the Redis and HTTP clients, wrapped in types of ours: [`RedisFailure`] and [`HttpFailure`].
//!
//! The public errors of both SDKs carry these rather than `redis::RedisError` or `reqwest::Error`, so that an
//! upgrade of either client library is not a breaking change of the SDKs. The original error stays reachable
//! as the [`source`](std::error::Error::source) of the wrapper, and a caller who pins the same client library
//! version can still downcast it:
//! ```
//! use client_core::{RedisErrorKind, RedisFailure};
//!
//! fn explain(e: &RedisFailure) -> String {
//!     match e.kind() {
//!         RedisErrorKind::Io | RedisErrorKind::Timeout => format!("Redis unreachable: {e}"),
//!         RedisErrorKind::Busy => "Redis is loading its data set; try again".to_owned(),
//!         kind => format!("{kind:?}: {e} (code {:?})", e.code()),
//!     }
//! }
//! # let _ = explain;
//! ```

use std::error::Error;
use std::fmt;
use std::sync::Arc;

/// What kind of Redis failure a [`RedisFailure`] is.
///
/// ```
/// use client_core::RedisErrorKind;
///
/// fn is_outage(kind: RedisErrorKind) -> bool {
///     matches!(kind, RedisErrorKind::Io | RedisErrorKind::Timeout | RedisErrorKind::Busy)
/// }
/// assert!(is_outage(RedisErrorKind::Timeout));
/// assert!(!is_outage(RedisErrorKind::Auth));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RedisErrorKind {
    /// An I/O error: the connection was refused, reset or dropped.
    Io,
    /// No answer within the response or connection timeout.
    Timeout,
    /// The server refused the credentials (`AUTH`, `HELLO ... AUTH`).
    Auth,
    /// The server refused the command for the ACL user (`NOPERM`).
    NoPermission,
    /// The server is busy (`LOADING` its data set, a script running).
    Busy,
    /// The server is a read-only replica (`READONLY`).
    ReadOnly,
    /// A Redis Cluster answer: `MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`, `CROSSSLOT`, `MASTERDOWN`, or no
    /// connection to the node of a slot.
    Cluster,
    /// Any other error reply of the server (`ERR ...`, `WRONGTYPE`, `OOM`, `NOSCRIPT`, `EXECABORT`, ...): see
    /// [`RedisFailure::code`].
    ResponseError,
    /// The answer could not be read as what the command returns.
    UnexpectedReply,
    /// The client's settings were refused (an invalid Redis URL, for example).
    InvalidConfig,
    /// Anything else.
    Other,
}

/// A Redis command or connection failed.
///
/// Cheap to clone (one failed pipeline fails every record in it, each with a clone): its parts are shared. [`source`](std::error::Error::source) is the Redis client's own error.
#[derive(Debug, Clone)]
pub struct RedisFailure {
    kind: RedisErrorKind,
    /// The server's error code (`WRONGTYPE`, `OOM`, ...), when the server answered with an error.
    code: Option<Arc<str>>,
    /// Whether the Redis client classifies the error as worth retrying (its retry method is not "no retry").
    retryable: bool,
    /// Whether the connection is gone (dropped, refused, reset): the command may or may not have run.
    connection_dropped: bool,
    message: Arc<str>,
    source: Arc<dyn Error + Send + Sync>,
}

impl RedisFailure {
    /// What kind of failure this is.
    ///
    /// ```
    /// # fn f(e: client_core::RedisFailure) {
    /// if e.kind() == client_core::RedisErrorKind::ReadOnly {
    ///     eprintln!("connected to a replica: {e}");
    /// }
    /// # }
    /// ```
    pub fn kind(&self) -> RedisErrorKind {
        self.kind
    }

    /// The server's error code (`WRONGTYPE`, `OOM`, `NOPERM`, `ERR`, ...), when the server answered with an
    /// error reply.
    ///
    /// ```
    /// # fn f(e: client_core::RedisFailure) {
    /// if e.code() == Some("OOM") {
    ///     eprintln!("Redis is out of memory");
    /// }
    /// # }
    /// ```
    pub fn code(&self) -> Option<&str> {
        self.code.as_deref()
    }

    /// Whether trying again may succeed (a dropped connection, a timeout, a busy or redirecting server), as the
    /// Redis client classifies it.
    ///
    /// ```
    /// # fn f(e: client_core::RedisFailure) {
    /// let worth_another_try = e.is_retryable();
    /// # let _ = worth_another_try;
    /// # }
    /// ```
    pub fn is_retryable(&self) -> bool {
        self.retryable
    }

    /// Whether no answer came within the timeout.
    ///
    /// ```
    /// # fn f(e: client_core::RedisFailure) {
    /// if e.is_timeout() {
    ///     eprintln!("Redis is slow: {e}");
    /// }
    /// # }
    /// ```
    pub fn is_timeout(&self) -> bool {
        self.kind == RedisErrorKind::Timeout
    }

    /// Whether the connection was refused, reset or dropped.
    ///
    /// ```
    /// # fn f(e: client_core::RedisFailure) {
    /// if e.is_connection_dropped() {
    ///     eprintln!("lost the connection to Redis: {e}");
    /// }
    /// # }
    /// ```
    pub fn is_connection_dropped(&self) -> bool {
        self.connection_dropped
    }

    /// Wraps the Redis client's error. Not part of the API: for the SDK crates, which build their errors from
    /// it (the conversion stays out of the public API so that the client library can change).
    #[doc(hidden)]
    pub fn from_redis(e: redis::RedisError) -> Self {
        Self::from_redis_arc(Arc::new(e))
    }

    /// [`from_redis`](Self::from_redis) of a shared error. Not part of the API.
    #[doc(hidden)]
    pub fn from_redis_arc(e: Arc<redis::RedisError>) -> Self {
        use redis::{ErrorKind as K, ServerErrorKind as S};
        let kind = if e.is_timeout() {
            RedisErrorKind::Timeout
        } else if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
            RedisErrorKind::Io
        } else {
            match e.kind() {
                K::Io => RedisErrorKind::Io,
                K::AuthenticationFailed => RedisErrorKind::Auth,
                K::Parse | K::UnexpectedReturnType => RedisErrorKind::UnexpectedReply,
                K::InvalidClientConfig => RedisErrorKind::InvalidConfig,
                K::ClusterConnectionNotFound => RedisErrorKind::Cluster,
                K::Server(S::NoPerm) => RedisErrorKind::NoPermission,
                K::Server(S::BusyLoading) => RedisErrorKind::Busy,
                K::Server(S::ReadOnly) => RedisErrorKind::ReadOnly,
                K::Server(S::Moved | S::Ask | S::TryAgain | S::ClusterDown | S::CrossSlot | S::MasterDown) => {
                    RedisErrorKind::Cluster
                }
                K::Server(_) | K::Extension => match e.code() {
                    Some("BUSY") => RedisErrorKind::Busy,
                    _ => RedisErrorKind::ResponseError,
                },
                _ => RedisErrorKind::Other,
            }
        };
        RedisFailure {
            kind,
            code: e.code().map(Arc::from),
            retryable: !matches!(e.retry_method(), redis::RetryMethod::NoRetry),
            connection_dropped: e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal(),
            message: e.to_string().into(),
            source: e,
        }
    }
}

impl fmt::Display for RedisFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl Error for RedisFailure {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&*self.source)
    }
}

/// What kind of HTTP failure an [`HttpFailure`] is.
///
/// ```
/// use client_core::HttpErrorKind;
///
/// fn coordinator_down(kind: HttpErrorKind) -> bool {
///     matches!(kind, HttpErrorKind::Connect | HttpErrorKind::Timeout)
/// }
/// assert!(coordinator_down(HttpErrorKind::Connect));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HttpErrorKind {
    /// No connection could be opened (refused, DNS, TLS handshake).
    Connect,
    /// No answer within the timeout.
    Timeout,
    /// The request failed after the connection was open (reset, closed).
    Request,
    /// The answer's body could not be read.
    Body,
    /// The answer could not be decoded.
    Decode,
    /// Too many redirects, or a redirect the client refused.
    Redirect,
    /// The HTTP client could not be built from its settings.
    Builder,
    /// Anything else.
    Other,
}

/// An HTTP request (or the HTTP client) failed.
///
/// [`source`](std::error::Error::source) is the HTTP client's own error.
#[derive(Debug, Clone)]
pub struct HttpFailure {
    kind: HttpErrorKind,
    /// The HTTP status code, when the failure came with an answer.
    status: Option<u16>,
    message: Arc<str>,
    source: Arc<dyn Error + Send + Sync>,
}

impl HttpFailure {
    /// What kind of failure this is.
    ///
    /// ```
    /// # fn f(e: client_core::HttpFailure) {
    /// if e.kind() == client_core::HttpErrorKind::Connect {
    ///     eprintln!("the coordinator is down: {e}");
    /// }
    /// # }
    /// ```
    pub fn kind(&self) -> HttpErrorKind {
        self.kind
    }

    /// Whether no answer came within the timeout.
    ///
    /// ```
    /// # fn f(e: client_core::HttpFailure) {
    /// let slow = e.is_timeout();
    /// # let _ = slow;
    /// # }
    /// ```
    pub fn is_timeout(&self) -> bool {
        self.kind == HttpErrorKind::Timeout
    }

    /// Whether no connection could be opened.
    ///
    /// ```
    /// # fn f(e: client_core::HttpFailure) {
    /// let down = e.is_connect();
    /// # let _ = down;
    /// # }
    /// ```
    pub fn is_connect(&self) -> bool {
        self.kind == HttpErrorKind::Connect
    }

    /// The HTTP status code, when the failure came with an answer.
    ///
    /// ```
    /// # fn f(e: client_core::HttpFailure) {
    /// if let Some(code) = e.status() {
    ///     eprintln!("HTTP {code}");
    /// }
    /// # }
    /// ```
    pub fn status(&self) -> Option<u16> {
        self.status
    }

    pub(crate) fn from_reqwest(e: reqwest::Error) -> Self {
        let kind = if e.is_timeout() {
            HttpErrorKind::Timeout
        } else if e.is_connect() {
            HttpErrorKind::Connect
        } else if e.is_builder() {
            HttpErrorKind::Builder
        } else if e.is_redirect() {
            HttpErrorKind::Redirect
        } else if e.is_body() {
            HttpErrorKind::Body
        } else if e.is_decode() {
            HttpErrorKind::Decode
        } else if e.is_request() {
            HttpErrorKind::Request
        } else {
            HttpErrorKind::Other
        };
        HttpFailure {
            kind,
            status: e.status().map(|s| s.as_u16()),
            message: e.to_string().into(),
            source: Arc::new(e),
        }
    }
}

impl fmt::Display for HttpFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl Error for HttpFailure {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&*self.source)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_reply_keeps_its_code_and_source() {
        let e = redis::RedisError::from((redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly), "replica"));
        let f = RedisFailure::from_redis(e);
        assert_eq!(f.kind(), RedisErrorKind::ReadOnly);
        let source = f.source().expect("a source").downcast_ref::<redis::RedisError>();
        assert!(source.is_some(), "the Redis error is reachable by downcast");
    }

    #[test]
    fn io_error_is_retryable_and_dropped() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        let f = RedisFailure::from_redis(redis::RedisError::from(io));
        assert_eq!(f.kind(), RedisErrorKind::Io);
        assert!(f.is_connection_dropped());
        assert!(f.is_retryable());
    }

    #[test]
    fn refused_client_config_is_final() {
        let e = redis::RedisError::from((redis::ErrorKind::InvalidClientConfig, "bad url"));
        let f = RedisFailure::from_redis(e);
        assert_eq!(f.kind(), RedisErrorKind::InvalidConfig);
        assert!(!f.is_retryable());
        assert!(f.to_string().contains("bad url"), "{f}");
    }
}
