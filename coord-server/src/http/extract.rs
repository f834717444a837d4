//! Extractors that turn a request into validated values, or into a typed [`ApiError`].
//!
//! axum's own extractors answer failures in plain text; these wrap them so every refusal is an
//! `INVALID_REQUEST` [`ErrorResponse`](protocol::messages::ErrorResponse). Bearer tokens are checked in `auth`.

use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::header;
use axum::http::request::Parts;
use axum::Json;
use protocol::names::{GroupName, MemberId, StreamName};
use protocol::{NameError, StoreRevision};
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// A JSON body (`Content-Type: application/json`), decoded strictly: the wire types deny unknown fields.
pub(super) struct JsonBody<T>(pub T);

impl<S, T> FromRequest<S> for JsonBody<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        // Content type, body limit and syntax are checked by axum's extractor, as before.
        let Json(mut value) = Json::<serde_json::Value>::from_request(req, state).await?;
        integral_floats_to_integers(&mut value);
        serde_path_to_error::deserialize(value).map(JsonBody).map_err(|e| {
            let text = e.to_string();
            ApiError::invalid(format!(
                "Failed to deserialize the JSON body into the target type: {text}{}",
                upgrade_hint(&text)
            ))
        })
    }
}

/// A client built for the protocol before incarnations sends no `incarnation`: say what to do instead of only
/// naming the field (see `docs/protocol.md`, "Incarnations").
fn upgrade_hint(serde_error: &str) -> &'static str {
    if serde_error.contains("missing field `incarnation`") {
        " (heartbeats name their member incarnation since protocol 0.2: upgrade the consumer SDK; this coordinator \
         does not serve older clients)"
    } else {
        ""
    }
}

/// Largest integer every JSON implementation holds exactly (2^53): beyond it `N.0` may not be `N`.
const MAX_EXACT_FLOAT_INTEGER: f64 = 9_007_199_254_740_992.0;

/// JSON has one number type, and JSON Schema counts `5.0` as an integer: a client whose JSON library writes
/// whole numbers that way (JavaScript, some Python paths) must not be refused. Only values that are exactly an
/// integer, within 2^53, are rewritten; any other fraction stays a float and the typed decode refuses it.
fn integral_floats_to_integers(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Number(n) if n.is_f64() => {
            if let Some(f) = n
                .as_f64()
                .filter(|f| f.fract() == 0.0 && f.abs() <= MAX_EXACT_FLOAT_INTEGER)
            {
                // Exact: |f| <= 2^53, so the cast neither rounds nor saturates.
                *n = serde_json::Number::from(f as i64);
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(integral_floats_to_integers),
        serde_json::Value::Object(fields) => fields.values_mut().for_each(integral_floats_to_integers),
        _ => {}
    }
}

/// A query string decoded into `T`.
pub(super) struct QueryParams<T>(pub T);

impl<S, T> FromRequestParts<S> for QueryParams<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Query(value) = Query::<T>::from_request_parts(parts, state).await?;
        Ok(QueryParams(value))
    }
}

/// `{stream}` of the path.
pub(super) struct StreamPath(pub StreamName);

/// `{stream}` and `{group}` of the path.
pub(super) struct GroupPath {
    pub stream: StreamName,
    pub group: GroupName,
}

/// `{stream}`, `{group}` and `{member}` of the path.
pub(super) struct MemberPath {
    pub stream: StreamName,
    pub group: GroupName,
    pub member: MemberId,
}

async fn path_params<S: Send + Sync>(parts: &mut Parts, state: &S) -> Result<Vec<(String, String)>, ApiError> {
    let Path(params) = Path::<Vec<(String, String)>>::from_request_parts(parts, state).await?;
    Ok(params)
}

/// Validates one named path segment. Names go into Redis hash tags, so a bad one must stop here.
fn segment<T>(
    params: &[(String, String)],
    key: &str,
    parse: fn(String) -> Result<T, NameError>,
) -> Result<T, ApiError> {
    let raw = params
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.clone())
        .ok_or_else(|| ApiError::invalid(format!("path parameter {{{key}}} is missing")))?;
    parse(raw).map_err(|e| ApiError::invalid(format!("path parameter {{{key}}}: {e}")))
}

impl<S: Send + Sync> FromRequestParts<S> for StreamPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let params = path_params(parts, state).await?;
        Ok(StreamPath(segment(&params, "stream", StreamName::new)?))
    }
}

impl<S: Send + Sync> FromRequestParts<S> for GroupPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let params = path_params(parts, state).await?;
        Ok(GroupPath {
            stream: segment(&params, "stream", StreamName::new)?,
            group: segment(&params, "group", GroupName::new)?,
        })
    }
}

impl<S: Send + Sync> FromRequestParts<S> for MemberPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let params = path_params(parts, state).await?;
        Ok(MemberPath {
            stream: segment(&params, "stream", StreamName::new)?,
            group: segment(&params, "group", GroupName::new)?,
            member: segment(&params, "member", MemberId::new)?,
        })
    }
}

/// The `If-Match` revision of an admin mutation; `None` when absent or `*` (no precondition).
pub(super) struct IfMatch(pub Option<StoreRevision>);

impl<S: Send + Sync> FromRequestParts<S> for IfMatch {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        let Some(value) = parts.headers.get(header::IF_MATCH) else {
            return Ok(IfMatch(None));
        };
        let text = value
            .to_str()
            .map_err(|_| ApiError::invalid("If-Match is not visible ASCII"))?;
        parse_if_match(text).map(IfMatch)
    }
}

/// Accepts the ETag we send (`"42"`) and, for hand-written requests, the bare revision (`42`). Weak tags and
/// lists are refused: a revision check is a strong comparison of exactly one value.
///
/// Exactly the document's pattern: `*`, or 1 to 19 ASCII digits (always below `u64::MAX`), optionally in double
/// quotes. No sign, no spaces inside.
fn parse_if_match(text: &str) -> Result<Option<StoreRevision>, ApiError> {
    if text == "*" {
        return Ok(None);
    }
    let inner = text.strip_prefix('"').and_then(|t| t.strip_suffix('"')).unwrap_or(text);
    let digits = !inner.is_empty() && inner.len() <= 19 && inner.bytes().all(|b| b.is_ascii_digit());
    digits
        .then(|| inner.parse::<u64>().ok())
        .flatten()
        .map(|rev| Some(StoreRevision(rev)))
        .ok_or_else(|| ApiError::invalid(format!("If-Match {text:?} is not a revision (expected \"<number>\")")))
}

/// The ETag of a revision: the decimal number in double quotes.
pub(super) fn etag(revision: StoreRevision) -> String {
    format!("\"{}\"", revision.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn if_match_accepts_quoted_bare_and_star() {
        assert_eq!(parse_if_match("\"42\"").unwrap(), Some(StoreRevision(42)));
        assert_eq!(parse_if_match("7").unwrap(), Some(StoreRevision(7)));
        assert_eq!(
            parse_if_match("9999999999999999999").unwrap(),
            Some(StoreRevision(9_999_999_999_999_999_999))
        );
        assert_eq!(parse_if_match("*").unwrap(), None);
        assert_eq!(etag(StoreRevision(42)), "\"42\"");
    }

    #[test]
    fn if_match_refuses_malformed_values() {
        for bad in [
            "",
            "\"\"",
            "W/\"4\"",
            "\"4\", \"5\"",
            "abc",
            "-1",
            "+1",
            "\"+1\"",
            " 7",
            "\"4",
            "12345678901234567890",
        ] {
            assert!(parse_if_match(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn whole_floats_become_integers_and_fractions_stay() {
        let mut v = serde_json::json!({"a": 5.0, "b": [-1.0, 2.5], "c": {"d": 9007199254740994.0}, "e": 7});
        integral_floats_to_integers(&mut v);
        assert_eq!(
            v,
            serde_json::json!({"a": 5, "b": [-1, 2.5], "c": {"d": 9007199254740994.0}, "e": 7})
        );
        assert!(v["a"].is_i64() && v["b"][1].is_f64() && v["c"]["d"].is_f64());
    }

    #[test]
    fn whole_floats_parse_exactly_near_two_to_the_53() {
        // Found by schemathesis: without serde_json's exact float parsing this text read as 2251799813685247.25
        // and a schema-valid heartbeat was refused.
        for (text, want) in [
            ("2251799813685247.0", 2_251_799_813_685_247_i64),
            ("4503599627370495.0", 4_503_599_627_370_495),
            ("9007199254740991.0", 9_007_199_254_740_991),
        ] {
            let mut v: serde_json::Value = serde_json::from_str(&format!("{{\"a\": {text}}}")).unwrap();
            integral_floats_to_integers(&mut v);
            assert_eq!(v["a"].as_i64(), Some(want), "{text}");
        }
    }
}
