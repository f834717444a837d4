//! The span tower-http opens per request, with the query's secrets redacted: `/status` takes the admin token as
//! `?token=` (a browser cannot send a header), and the default span logs the whole URI at `debug`.

use axum::extract::Request;
use axum::http::Uri;
use tracing::Span;

/// What replaces a redacted query value.
const REDACTED: &str = "[redacted]";

/// tower-http's default request span (`request`, at `debug`, with method, URI and version), with
/// [`redacted_uri`] in place of the URI.
pub(super) fn request_span(req: &Request) -> Span {
    tracing::debug_span!(
        "request",
        method = %req.method(),
        uri = %redacted_uri(req.uri()),
        version = ?req.version(),
    )
}

/// The path and query of `uri`, where a value (or a pair without one) is kept only when its name is a plain word
/// that does not mention a token. An encoded name (`%74oken`) could still mean `token` to the query decoder, so its value goes too.
fn redacted_uri(uri: &Uri) -> String {
    let Some(query) = uri.query() else {
        return uri.path().to_owned();
    };
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, _)) if !harmless(name) => format!("{name}={REDACTED}"),
            None if !harmless(pair) => REDACTED.to_owned(),
            _ => pair.to_owned(),
        })
        .collect();
    format!("{}?{}", uri.path(), pairs.join("&"))
}

/// A query name whose value may be logged.
fn harmless(name: &str) -> bool {
    name.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        && !name.to_ascii_lowercase().contains("token")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redact(uri: &str) -> String {
        redacted_uri(&uri.parse().expect("uri"))
    }

    #[test]
    fn token_values_go_and_plain_values_stay() {
        assert_eq!(redact("/status?token=abc"), "/status?token=[redacted]");
        assert_eq!(redact("/status?Token=abc&x=1"), "/status?Token=[redacted]&x=1");
        assert_eq!(redact("/status?%74oken=abc"), "/status?%74oken=[redacted]");
        assert_eq!(redact("/v1/groups?rebuild=true"), "/v1/groups?rebuild=true");
        assert_eq!(redact("/status"), "/status");
        assert_eq!(redact("/status?flag"), "/status?flag");
        assert_eq!(redact("/status?token"), "/status?[redacted]");
        assert_eq!(redact("/status?a%20secret"), "/status?[redacted]");
    }
}
