//! Strict JSON bodies: unknown fields are rejected, and a wrong field is
//! named in the problem (`items[0].quantity: invalid type ...`). Strings
//! holding NUL are refused too: no database downstream can store them.

use crate::error::ApiError;
use axum::extract::{FromRequest, Request};
use axum::http::header;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Like `axum::Json`, with problem+json rejections naming the field.
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let is_json =
            req.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(is_json);
        if !is_json {
            return Err(ApiError::Malformed("expected Content-Type: application/json".into()));
        }
        let bytes = axum::body::Bytes::from_request(req, state).await.map_err(|e| match e.status() {
            axum::http::StatusCode::PAYLOAD_TOO_LARGE => ApiError::TooLarge,
            _ => ApiError::Malformed(format!("cannot read body: {}", e.body_text())),
        })?;
        let de = &mut serde_json::Deserializer::from_slice(&bytes);
        match serde_path_to_error::deserialize(de) {
            Ok(v) => {
                // The body parsed, so it parses as a Value too.
                let value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                match nul_field(&value, "") {
                    Some(field) => Err(ApiError::invalid(field, "must not contain NUL characters")),
                    None => Ok(ApiJson(v)),
                }
            }
            Err(e) => {
                let path = e.path().to_string();
                let inner = e.into_inner();
                if inner.is_syntax() || inner.is_eof() {
                    Err(ApiError::Malformed(format!("invalid JSON: {inner}")))
                } else {
                    let field = if path == "." { "body".to_string() } else { path };
                    Err(ApiError::invalid(field, inner.to_string()))
                }
            }
        }
    }
}

/// The path (`items[0].name`) of the first string holding U+0000, if any.
fn nul_field(value: &Value, path: &str) -> Option<String> {
    let here = || if path.is_empty() { "body".to_string() } else { path.to_string() };
    match value {
        Value::String(s) if s.contains('\0') => Some(here()),
        Value::Array(items) => {
            items.iter().enumerate().find_map(|(i, v)| nul_field(v, &format!("{path}[{i}]")))
        }
        Value::Object(fields) => fields.iter().find_map(|(k, v)| {
            if k.contains('\0') {
                return Some(here());
            }
            nul_field(v, &if path.is_empty() { k.clone() } else { format!("{path}.{k}") })
        }),
        _ => None,
    }
}

/// `application/json` or `application/<something>+json`, parameters ignored.
fn is_json(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    essence == "application/json" || (essence.starts_with("application/") && essence.ends_with("+json"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn nul_characters_are_found_with_their_path() {
        assert_eq!(nul_field(&json!({"name": "ok", "items": [{"sku": "a"}]}), ""), None);
        assert_eq!(nul_field(&json!({"name": "a\0b"}), ""), Some("name".into()));
        assert_eq!(nul_field(&json!({"items": [{"q": 1}, {"sku": "\0"}]}), ""), Some("items[1].sku".into()));
        assert_eq!(nul_field(&json!("\0"), ""), Some("body".into()));
    }

    #[test]
    fn json_content_types() {
        assert!(is_json("application/json; charset=utf-8") && is_json("application/merge-patch+json"));
        assert!(!is_json("text/plain") && !is_json("application/jsonx"));
    }
}
