//! What went wrong when a TLS connection to Redis failed, in the operator's words: the server's certificate is
//! not signed by a trusted CA, names another host, has expired, the server does not speak TLS, or wants a client
//! certificate. rustls's own wording (`invalid peer certificate: UnknownIssuer`) reaches us through redis-rs
//! and tokio-rustls as text inside an I/O error, so the cause is read from that text.

use std::fmt;

/// Why a TLS connection failed, as far as the error says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TlsFailure {
    /// The server's certificate is not signed by a trusted CA.
    UnknownCa,
    /// The server's certificate does not name the host of the URL.
    NameMismatch,
    /// The server's certificate has expired (or is not valid yet).
    Expired,
    /// The server answered in plaintext: a Redis without TLS on that port.
    NotTls,
    /// No answer to the TLS handshake within the connect timeout: most often a plaintext Redis on that port,
    /// which waits for the end of a command line that never comes.
    NoAnswer,
    /// The server requires a client certificate and none (or one it does not trust) was presented.
    ClientCertificate,
    /// The server closed the connection during the handshake (or another TLS error).
    Handshake,
}

impl TlsFailure {
    /// Reads the cause from an error of a TLS connection attempt; `None` when it is not a TLS failure.
    pub fn of(error: &(impl fmt::Display + ?Sized)) -> Option<TlsFailure> {
        let text = error.to_string();
        let has = |needle: &str| text.contains(needle);
        // An alert is the server's complaint about us: our certificate (missing, or of a CA it does not trust).
        if has("received fatal alert") {
            let ours = [
                "UnknownCA",
                "BadCertificate",
                "CertificateRequired",
                "CertificateUnknown",
                "HandshakeFailure",
            ];
            return Some(if ours.iter().any(|a| has(a)) {
                TlsFailure::ClientCertificate
            } else {
                TlsFailure::Handshake
            });
        }
        if has("UnknownIssuer") || has("BadSignature") {
            Some(TlsFailure::UnknownCa)
        } else if has("NotValidForName") || has("not valid for name") {
            Some(TlsFailure::NameMismatch)
        } else if has("Expired") || has("NotValidYet") || has("certificate expired") || has("not valid yet") {
            Some(TlsFailure::Expired)
        } else if has("InvalidContentType") || has("corrupt message") || has("InvalidMessage") {
            Some(TlsFailure::NotTls)
        } else if has("no TLS answer") {
            Some(TlsFailure::NoAnswer)
        } else if has("peer certificate") {
            Some(TlsFailure::Handshake)
        } else {
            None
        }
    }

    /// What to tell the operator.
    pub fn explanation(self) -> &'static str {
        match self {
            TlsFailure::UnknownCa => {
                "the server's certificate is not signed by a trusted CA (give its CA with --redis-tls-ca / REDIS_TLS_CA)"
            }
            TlsFailure::NameMismatch => "the server's certificate does not name the URL's host",
            TlsFailure::Expired => "the server's certificate has expired or is not valid yet",
            TlsFailure::NotTls => "the server does not speak TLS on that port (a plaintext Redis: use redis://)",
            TlsFailure::NoAnswer => {
                "no TLS answer from the server in time (a plaintext Redis on that port? then use redis://)"
            }
            TlsFailure::ClientCertificate => {
                "the server requires a client certificate it trusts (--redis-tls-cert / --redis-tls-key)"
            }
            TlsFailure::Handshake => "the TLS handshake failed",
        }
    }
}

impl fmt::Display for TlsFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.explanation())
    }
}

/// `error` of a connection to `url`, with the URL (password redacted) and, for a TLS failure, its cause in
/// words; for a `redis://` URL whose connection was closed or reset at once, the hint that the server may want
/// TLS. Other errors come back as they were.
pub fn explain(url: &str, error: redis::RedisError) -> redis::RedisError {
    let redacted = protocol::redact::redact_url(url);
    if crate::tls_setup::is_tls_url(url) {
        let failure = TlsFailure::of(&error).or_else(|| error.is_timeout().then_some(TlsFailure::NoAnswer));
        if let Some(failure) = failure {
            return redis::RedisError::from((
                redis::ErrorKind::Io,
                "TLS connection to Redis failed",
                format!("{redacted}: {failure} ({error})"),
            ));
        }
    } else if error.is_connection_dropped() || error.is_io_error() && !error.is_timeout() {
        let text = error.to_string();
        if text.contains("reset") || text.contains("closed") || text.contains("broken pipe") || text.contains("EOF") {
            return redis::RedisError::from((
                redis::ErrorKind::Io,
                "connection to Redis closed",
                format!("{redacted}: {error} (if the server accepts only TLS, use rediss://)"),
            ));
        }
    }
    error
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_are_read_from_rustls_wording() {
        let cases = [
            ("invalid peer certificate: UnknownIssuer", TlsFailure::UnknownCa),
            ("invalid peer certificate: NotValidForName", TlsFailure::NameMismatch),
            ("invalid peer certificate: Expired", TlsFailure::Expired),
            (
                "invalid peer certificate: certificate expired: verification time 2 (UNIX), but ...",
                TlsFailure::Expired,
            ),
            (
                "invalid peer certificate: certificate not valid for name \"a\"; certificate is only valid for b",
                TlsFailure::NameMismatch,
            ),
            (
                "received corrupt message of type InvalidContentType",
                TlsFailure::NotTls,
            ),
            (
                "received fatal alert: CertificateRequired",
                TlsFailure::ClientCertificate,
            ),
            ("received fatal alert: UnknownCA", TlsFailure::ClientCertificate),
        ];
        for (text, want) in cases {
            assert_eq!(TlsFailure::of(text), Some(want), "{text}");
        }
        assert_eq!(TlsFailure::of("Connection refused (os error 111)"), None);
    }
}
