//! The API's refusals, answered as `{"error": {"field": ..., "message":
//! ...}}`: engine errors, `[auth]` refusals and bad requests become HTTP
//! statuses here, in one place.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::auth::Refusal;
use crate::engine::EngineError;

/// A request the API refuses, answered as
/// `{"error": {"field": ..., "message": ...}}`.
#[derive(Debug)]
pub struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) field: Option<&'static str>,
    pub(crate) message: String,
}

impl ApiError {
    /// 503 with `message`: the server cannot take this request now.
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            field: None,
            message: message.into(),
        }
    }

    /// `status` with `field` and `message`.
    pub fn with_status(
        status: StatusCode,
        field: Option<&'static str>,
        message: impl Into<String>,
    ) -> ApiError {
        ApiError {
            status,
            field,
            message: message.into(),
        }
    }

    /// 400 naming `field`.
    pub fn invalid(field: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            field: Some(field),
            message: message.into(),
        }
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> ApiError {
        let message = e.to_string();
        let (status, field) = match e {
            EngineError::Invalid { field, problem } => {
                return ApiError {
                    status: StatusCode::BAD_REQUEST,
                    field: Some(field),
                    message: problem,
                }
            }
            EngineError::TicketNotFound | EngineError::RuleNotFound { .. } => {
                (StatusCode::NOT_FOUND, None)
            }
            EngineError::Exhausted { .. }
            | EngineError::ShareExhausted { .. }
            | EngineError::StoreFull(_) => (StatusCode::TOO_MANY_REQUESTS, None),
            EngineError::ShuttingDown | EngineError::StoreUnavailable(_) => {
                (StatusCode::SERVICE_UNAVAILABLE, None)
            }
            EngineError::DeadlineExceeded { .. } => (StatusCode::GATEWAY_TIMEOUT, None),
            EngineError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, None),
        };
        ApiError {
            status,
            field,
            message,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({
            "error": { "field": self.field, "message": self.message }
        });
        if self.status == StatusCode::UNAUTHORIZED {
            let challenge = [(header::WWW_AUTHENTICATE, "Bearer realm=\"fusebox\"")];
            return (self.status, challenge, Json(body)).into_response();
        }
        (self.status, Json(body)).into_response()
    }
}

impl ApiError {
    /// 401 or 403 for a refusal of `[auth]`.
    pub fn refused(refusal: Refusal) -> ApiError {
        match refusal {
            Refusal::Unauthenticated(message) => {
                ApiError::with_status(StatusCode::UNAUTHORIZED, Some("Authorization"), message)
            }
            Refusal::Denied(message) => {
                ApiError::with_status(StatusCode::FORBIDDEN, Some("Authorization"), message)
            }
        }
    }

    /// 403 naming the header at fault.
    pub fn forbidden(field: &'static str, message: String) -> ApiError {
        ApiError::with_status(StatusCode::FORBIDDEN, Some(field), message)
    }
}
