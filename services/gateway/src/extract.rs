//! Strict JSON bodies: unknown fields are rejected, and a wrong field is
//! named in the problem (`items[0].quantity: invalid type ...`).

use crate::error::ApiError;
use axum::extract::{FromRequest, Request};
use axum::http::header;
use serde::de::DeserializeOwned;

/// Like `axum::Json`, with problem+json rejections naming the field.
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let is_json = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(is_json);
        if !is_json {
            return Err(ApiError::Malformed("expected Content-Type: application/json".into()));
        }
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(|e| match e.status() {
                axum::http::StatusCode::PAYLOAD_TOO_LARGE => ApiError::TooLarge,
                _ => ApiError::Malformed(format!("cannot read body: {}", e.body_text())),
            })?;
        let de = &mut serde_json::Deserializer::from_slice(&bytes);
        match serde_path_to_error::deserialize(de) {
            Ok(v) => Ok(ApiJson(v)),
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

/// `application/json` or `application/<something>+json`, parameters ignored.
fn is_json(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    essence == "application/json" || (essence.starts_with("application/") && essence.ends_with("+json"))
}
