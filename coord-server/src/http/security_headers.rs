//! Response headers that keep browsers from misreading the coordinator's answers: `nosniff` on every response,
//! and for the `/status` page a strict Content-Security-Policy (no script, no framing, the one inline style
//! allowed by a per-response nonce), `no-store` (the page shows live ownership and may be fetched with the admin
//! token in the URL) and `no-referrer` (that URL must not leak through a Referer).

use axum::http::{header, HeaderValue};
use axum::response::Response;

/// Adds `X-Content-Type-Options: nosniff` to every response (a browser must never render a JSON error as HTML).
pub(super) async fn nosniff(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    response
}

/// A fresh CSP nonce: 128 random bits, hex (a valid `base64-value` of the CSP grammar).
pub(super) fn nonce() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// Adds the status page's headers to `response`, whose inline `<style>` carries `nonce`.
pub(super) fn status_page(response: &mut Response, nonce: &str) {
    let csp = format!(
        "default-src 'none'; style-src 'nonce-{nonce}'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    );
    let headers = response.headers_mut();
    if let Ok(csp) = HeaderValue::from_str(&csp) {
        headers.insert(header::CONTENT_SECURITY_POLICY, csp);
    }
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
}
