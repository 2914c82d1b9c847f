//! Request extractors with problem+json rejections.
//!
//! * [`ApiJson`]: strict JSON bodies. Unknown fields are rejected, and a wrong
//!   field is named in the problem (`items[0].quantity: invalid type ...`).
//!   Strings holding NUL are refused too: no database downstream can store them.
//! * [`IdempotencyKey`]: the optional `Idempotency-Key` header of a mutating
//!   request, and the key that goes downstream with it.

use crate::error::ApiError;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::header;
use axum::http::request::Parts;
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

/// The `Idempotency-Key` request header, checked against the documented
/// pattern (1 to 200 visible ASCII characters, inner spaces allowed).
///
/// Every mutating gRPC call the gateway makes carries a key: the resilience
/// stack may send a call again (after a timeout, say) when the first one did
/// take effect, and the participant then answers what the first one did. The
/// client's key makes its own retries of the REST request safe as well.
pub struct IdempotencyKey(Option<String>);

/// The header's name.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

impl IdempotencyKey {
    /// The key as the client sent it, for a call whose keys belong to that
    /// call alone (`CreateOrder`); a fresh one of the gateway's own without it.
    pub fn as_sent(self) -> String {
        self.0.unwrap_or_else(generated)
    }

    /// The key as sent; a 422 without one (an action that must not run twice).
    pub fn required(self) -> Result<String, crate::error::ApiError> {
        self.0.ok_or_else(|| {
            crate::error::ApiError::invalid(
                "Idempotency-Key",
                "this operation needs an Idempotency-Key header",
            )
        })
    }

    /// The key scoped to `operation` (`create-product:<key>`): one key
    /// reused on two endpoints means two requests, not a conflict; a fresh
    /// one of the gateway's own without it.
    pub fn scoped(self, operation: &str) -> String {
        match self.0 {
            Some(key) => format!("{operation}:{key}"),
            None => generated(),
        }
    }
}

/// Documents the header on an operation: `params(IdempotencyKey)`.
impl utoipa::IntoParams for IdempotencyKey {
    fn into_params(
        _: impl Fn() -> Option<utoipa::openapi::path::ParameterIn>,
    ) -> Vec<utoipa::openapi::path::Parameter> {
        use utoipa::openapi::path::{ParameterBuilder, ParameterIn};
        use utoipa::openapi::schema::{ObjectBuilder, Type};
        let schema = ObjectBuilder::new()
            .schema_type(Type::String)
            .min_length(Some(1))
            .max_length(Some(200))
            .pattern(Some(r"^[\x21-\x7E]([\x20-\x7E]*[\x21-\x7E])?$"));
        vec![
            ParameterBuilder::new()
                .name("Idempotency-Key")
                .parameter_in(ParameterIn::Header)
                .required(utoipa::openapi::Required::False)
                .description(Some(
                    "A repeat with the same key changes nothing and answers what the first request did \
                     (1 to 200 visible ASCII characters); the same key with another body is a 422",
                ))
                .schema(Some(schema))
                .build(),
        ]
    }
}

fn generated() -> String {
    format!("gateway:{}", uuid::Uuid::new_v4())
}

impl<S: Send + Sync> FromRequestParts<S> for IdempotencyKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        match parts.headers.get(IDEMPOTENCY_KEY) {
            None => Ok(Self(None)),
            Some(v) => match v.to_str() {
                Ok(k) if valid_idempotency_key(k) => Ok(Self(Some(k.to_string()))),
                _ => Err(ApiError::invalid("Idempotency-Key", "must be 1 to 200 visible ASCII characters")),
            },
        }
    }
}

/// 1 to 200 printable ASCII characters (spaces inside only), as the document's pattern says.
fn valid_idempotency_key(key: &str) -> bool {
    let printable = |b: &u8| (0x21..=0x7E).contains(b);
    let bytes = key.as_bytes();
    (1..=200).contains(&bytes.len())
        && bytes.first().is_some_and(printable)
        && bytes.last().is_some_and(printable)
        && bytes.iter().all(|b| *b == b' ' || printable(b))
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
    fn idempotency_keys_follow_the_documented_pattern() {
        for ok in ["k", "order-42", "a b", &"x".repeat(200)] {
            assert!(valid_idempotency_key(ok), "{ok}");
        }
        for bad in ["", " k", "k ", "a\tb", &"x".repeat(201), "caf\u{e9}"] {
            assert!(!valid_idempotency_key(bad), "{bad:?}");
        }
    }

    #[test]
    fn json_content_types() {
        assert!(is_json("application/json; charset=utf-8") && is_json("application/merge-patch+json"));
        assert!(!is_json("text/plain") && !is_json("application/jsonx"));
    }
}
