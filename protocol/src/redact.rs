//! Redaction of credentials in Redis (and coordinator) URLs before they reach a log, an error or a `Debug` print.
//!
//! Every crate that prints a URL goes through [`redact_url`], so one set of tests covers every form a password can
//! take: `scheme://user:pass@host`, `scheme://:pass@host`, `scheme://token@host`, the scheme-less `user:pass@host`
//! that redis-rs refuses but an operator still types, and the `?pass=` / `?password=` query parameters of
//! `unix://` and `redis+unix://` URLs.

/// What replaces a secret.
const MASK: &str = "***";

/// Query parameters that carry a password (redis-rs reads `pass` for Unix sockets; `password` is the common
/// spelling elsewhere). Compared case-insensitively.
const SECRET_PARAMS: [&str; 3] = ["pass", "password", "token"];

/// `url` with its userinfo and password query parameters replaced by `***`; the host, port, path and other
/// parameters stay, so the log still says where the connection went.
///
/// Everything before the *last* `@` of the authority is userinfo: a password may itself contain `@`, and hiding
/// too much is better than leaking its tail.
pub fn redact_url(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, url),
    };
    let (before_query, query) = match rest.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (rest, None),
    };
    let mut out = String::with_capacity(url.len());
    if let Some(scheme) = scheme {
        out.push_str(scheme);
        out.push_str("://");
    }
    match before_query.rsplit_once('@') {
        Some((_, host)) => {
            out.push_str(MASK);
            out.push('@');
            out.push_str(host);
        }
        None => out.push_str(before_query),
    }
    if let Some(query) = query {
        out.push('?');
        let params: Vec<String> = query
            .split('&')
            .map(|param| match param.split_once('=') {
                Some((key, _)) if SECRET_PARAMS.iter().any(|s| key.eq_ignore_ascii_case(s)) => {
                    format!("{key}={MASK}")
                }
                _ => param.to_owned(),
            })
            .collect();
        out.push_str(&params.join("&"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn every_form_of_credential_is_hidden() {
        let cases = [
            ("redis://user:secret@host:6379/0", "redis://***@host:6379/0"),
            ("rediss://user:secret@host:6380", "rediss://***@host:6380"),
            ("redis://:secret@host", "redis://***@host"),
            ("redis://secret@host", "redis://***@host"),
            ("redis://user:p@ss@word@host:1", "redis://***@host:1"),
            ("redis://user:pa/ss@host", "redis://***@host"),
            ("user:secret@host:6379", "***@host:6379"),
            ("user:secret@host", "***@host"),
            (":secret@host", "***@host"),
            (
                "unix:///run/redis.sock?db=1&pass=secret",
                "unix:///run/redis.sock?db=1&pass=***",
            ),
            (
                "redis+unix:///run/redis.sock?user=u&PASSWORD=secret",
                "redis+unix:///run/redis.sock?user=u&PASSWORD=***",
            ),
            ("redis://u:secret@host/0?token=secret", "redis://***@host/0?token=***"),
            ("http://admin:secret@coordinator:7400", "http://***@coordinator:7400"),
        ];
        for (url, expected) in cases {
            let redacted = redact_url(url);
            assert_eq!(redacted, expected, "{url}");
            assert!(!redacted.contains("secret"), "{url} leaked: {redacted}");
        }
    }

    #[test]
    fn urls_without_credentials_are_unchanged() {
        for url in [
            "redis://127.0.0.1:6379",
            "redis://host:6379/2",
            "host:6379",
            "unix:///run/redis.sock?db=1",
            "",
        ] {
            assert_eq!(redact_url(url), url);
        }
    }
}
