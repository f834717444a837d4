//! `openapi.json` against the code: the same (method, path) pairs as the router, every reference resolved, the
//! schemas matching the protocol's golden fixtures, and every listed route served by a handler.

mod common;

use common::start;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::Path;

fn document() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("openapi.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

const METHODS: [&str; 8] = ["get", "put", "post", "delete", "patch", "head", "options", "trace"];

fn documented_routes(doc: &Value) -> BTreeSet<(String, String)> {
    let paths = doc["paths"].as_object().expect("paths object");
    paths
        .iter()
        .flat_map(|(path, item)| {
            let item = item.as_object().expect("path item object");
            item.keys()
                .filter(|k| METHODS.contains(&k.as_str()))
                .map(|m| (m.to_uppercase(), path.clone()))
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn document_lists_exactly_the_routes_of_the_router() {
    let doc = document();
    assert_eq!(doc["openapi"].as_str().map(|v| v.starts_with("3.1")), Some(true));
    let documented = documented_routes(&doc);
    let served: BTreeSet<(String, String)> = coord_server::http::routes()
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    assert_eq!(
        served.len(),
        coord_server::http::routes().len(),
        "no route is listed twice"
    );
    let missing: Vec<_> = served.difference(&documented).collect();
    let extra: Vec<_> = documented.difference(&served).collect();
    assert!(missing.is_empty(), "routes missing from openapi.json: {missing:?}");
    assert!(
        extra.is_empty(),
        "openapi.json documents routes the router lacks: {extra:?}"
    );
}

fn collect_refs(value: &Value, out: &mut BTreeSet<String>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("$ref", Value::String(r)) => {
                        out.insert(r.clone());
                    }
                    _ => collect_refs(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| collect_refs(v, out)),
        _ => {}
    }
}

fn resolve<'a>(doc: &'a Value, reference: &str) -> Option<&'a Value> {
    doc.pointer(reference.strip_prefix('#')?)
}

#[test]
fn every_reference_resolves_and_every_operation_is_typed() {
    let doc = document();
    let mut refs = BTreeSet::new();
    collect_refs(&doc, &mut refs);
    assert!(!refs.is_empty());
    for r in &refs {
        assert!(resolve(&doc, r).is_some(), "dangling reference {r}");
    }
    for (method, path) in documented_routes(&doc) {
        let op = &doc["paths"][&path][method.to_lowercase()];
        if let Some(body) = op.get("requestBody") {
            let schema = &body["content"]["application/json"]["schema"]["$ref"];
            assert!(
                schema.is_string(),
                "{method} {path}: request body without a schema reference"
            );
        }
        let responses = op["responses"].as_object().expect("responses");
        assert!(
            responses.keys().any(|c| c.starts_with('2')),
            "{method} {path}: no success response"
        );
        for (code, response) in responses {
            let response = match response.get("$ref").and_then(Value::as_str) {
                Some(r) => resolve(&doc, r).expect("checked above"),
                None => response,
            };
            // The one plain-text success: GET /metrics (Prometheus text format).
            if code.starts_with('2') && response["content"].get("text/plain").is_some() {
                assert_eq!(path, coord_server::http::METRICS, "{method} {path} {code}: plain text");
                assert_eq!(response["content"]["text/plain"]["schema"]["type"], "string");
                continue;
            }
            // The one HTML success: GET /status, the operators' page.
            if code.starts_with('2') && response["content"].get("text/html").is_some() {
                assert_eq!(path, coord_server::http::STATUS, "{method} {path} {code}: HTML");
                assert_eq!(response["content"]["text/html"]["schema"]["type"], "string");
                continue;
            }
            let schema = &response["content"]["application/json"]["schema"]["$ref"];
            assert!(schema.is_string(), "{method} {path} {code}: no JSON schema reference");
            if !code.starts_with('2') {
                assert_eq!(schema, "#/components/schemas/ErrorResponse", "{method} {path} {code}");
            }
        }
    }
}

/// Checks `value` against the subset of JSON Schema the document uses, returning the first mismatch.
fn check(doc: &Value, schema: &Value, value: &Value, at: &str) -> Result<(), String> {
    if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
        let target = resolve(doc, r).ok_or_else(|| format!("{at}: dangling {r}"))?;
        return check(doc, target, value, at);
    }
    if let Some(options) = schema.get("oneOf").and_then(Value::as_array) {
        return options
            .iter()
            .find(|o| check(doc, o, value, at).is_ok())
            .map(|_| ())
            .ok_or_else(|| format!("{at}: {value} matches no oneOf option"));
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array) {
        if !allowed.contains(value) {
            return Err(format!("{at}: {value} is not one of {allowed:?}"));
        }
    }
    let ty = schema.get("type").and_then(Value::as_str);
    let type_ok = match ty {
        None => true,
        Some("object") => value.is_object(),
        Some("array") => value.is_array(),
        Some("string") => value.is_string(),
        Some("integer") => value.is_i64() || value.is_u64(),
        Some("boolean") => value.is_boolean(),
        Some("null") => value.is_null(),
        Some(other) => return Err(format!("{at}: unsupported schema type {other}")),
    };
    if !type_ok {
        return Err(format!("{at}: {value} is not of type {ty:?}"));
    }
    if let (Some(props), Some(obj)) = (schema.get("properties").and_then(Value::as_object), value.as_object()) {
        for key in obj.keys() {
            if !props.contains_key(key) {
                return Err(format!("{at}: field {key} is not in the schema"));
            }
        }
        for req in schema.get("required").and_then(Value::as_array).into_iter().flatten() {
            let req = req.as_str().unwrap_or_default();
            if !obj.contains_key(req) {
                return Err(format!("{at}: required field {req} is missing"));
            }
        }
        for (key, v) in obj {
            check(doc, &props[key], v, &format!("{at}.{key}"))?;
        }
    }
    if let (Some(items), Some(arr)) = (schema.get("items"), value.as_array()) {
        for (i, v) in arr.iter().enumerate() {
            check(doc, items, v, &format!("{at}[{i}]"))?;
        }
    }
    Ok(())
}

#[test]
fn schemas_match_the_protocol_golden_fixtures() {
    let doc = document();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../protocol/testdata/messages");
    let cases = [
        ("heartbeat-request", "HeartbeatRequest"),
        ("heartbeat-response", "HeartbeatResponse"),
        ("error-response", "ErrorResponse"),
        ("routing-response", "RoutingResponse"),
        ("create-group-request", "CreateGroupRequest"),
        ("recreate-group-request", "RecreateGroupRequest"),
        ("add-shards-request", "AddShardsRequest"),
        ("routing-description", "RoutingDescription"),
        ("group-description", "GroupDescription"),
        ("group-list", "GroupList"),
        ("quota-description", "QuotaDescription"),
    ];
    for (file, schema) in cases {
        let path = fixtures.join(format!("{file}.json"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let value: Value = serde_json::from_str(&text).expect("fixture is JSON");
        let schema_ref = serde_json::json!({ "$ref": format!("#/components/schemas/{schema}") });
        if let Err(e) = check(&doc, &schema_ref, &value, file) {
            panic!("openapi.json disagrees with protocol/testdata/messages/{file}.json: {e}");
        }
    }

    // The routing query travels as query parameters: the fixture's fields are exactly the documented ones.
    let text = std::fs::read_to_string(fixtures.join("routing-query.json")).expect("routing-query fixture");
    let query: Value = serde_json::from_str(&text).expect("fixture is JSON");
    let params: BTreeSet<&str> = doc["paths"]["/v1/streams/{stream}/routing"]["get"]["parameters"]
        .as_array()
        .expect("parameters")
        .iter()
        .filter(|p| p["in"] == "query")
        .filter_map(|p| p["name"].as_str())
        .collect();
    let fields: BTreeSet<&str> = query.as_object().expect("object").keys().map(String::as_str).collect();
    assert_eq!(params, fields);

    // Every status the protocol knows is documented, and nothing else.
    let documented: BTreeSet<&str> = doc["components"]["schemas"]["Status"]["enum"]
        .as_array()
        .expect("Status enum")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let known: BTreeSet<&str> = protocol::Status::ALL.iter().map(|s| s.as_str()).collect();
    assert_eq!(documented, known);
}

#[tokio::test]
async fn every_listed_route_reaches_a_handler() {
    let (_redis, coord) = start().await;
    let http = reqwest::Client::new();
    for &(method, path) in coord_server::http::routes() {
        let concrete = path
            .replace("{stream}", "s")
            .replace("{group}", "g")
            .replace("{member}", "m");
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("HTTP method");
        let resp = http
            .request(method.clone(), format!("{}{concrete}", coord.url()))
            .send()
            .await
            .expect("request sent");
        let status = resp.status();
        let body = resp.text().await.unwrap_or_default();
        // The fallbacks answer 404/405 with INVALID_REQUEST; a handler answers anything else (here mostly 400, or
        // 404 NOT_FOUND: no such group).
        let handler_404 = serde_json::from_str::<Value>(&body).is_ok_and(|b| b["status"] == "NOT_FOUND");
        assert!(
            (status != reqwest::StatusCode::NOT_FOUND || handler_404)
                && status != reqwest::StatusCode::METHOD_NOT_ALLOWED,
            "{method} {path} is not routed: {status} {body}"
        );
        if path == coord_server::http::METRICS {
            assert!(
                body.contains("redis_stream_coord_"),
                "{method} {path}: not metrics: {body}"
            );
            continue;
        }
        if path == coord_server::http::STATUS {
            assert!(body.contains("<html>"), "{method} {path}: not the status page: {body}");
            continue;
        }
        assert!(
            serde_json::from_str::<Value>(&body).is_ok(),
            "{method} {path}: not JSON: {body}"
        );
    }
    coord.shutdown().await;
}
