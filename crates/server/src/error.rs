//! Domain errors and their one mapping to HTTP statuses.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use corral_api::FieldError;
use corral_store::StoreError;
use serde::{Deserialize, Serialize};

/// Everything a request can fail with. [`IntoResponse`] maps each variant to
/// exactly one status in one exhaustive `match`.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    Unauthenticated(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{message}")]
    Invalid {
        message: String,
        fields: Vec<FieldError>,
    },
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Gone(String),
    /// The request body is over the limit.
    #[error("{0}")]
    TooLarge(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Internal(String),
}

/// The JSON body of every error response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ErrorBody {
    /// Machine-readable class: `Unauthenticated`, `Forbidden`, `NotFound`,
    /// `AlreadyExists`, `Conflict`, `Invalid`, `BadRequest`, `Gone`,
    /// `TooLarge`, `Unavailable` or `Internal`.
    pub code: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<FieldError>,
}

impl ApiError {
    /// A validation failure listing every broken rule.
    pub fn invalid(what: &str, fields: Vec<FieldError>) -> Self {
        let details: Vec<String> = fields.iter().map(ToString::to_string).collect();
        ApiError::Invalid {
            message: format!("{what} is invalid: {}", details.join("; ")),
            fields,
        }
    }

    /// The machine-readable class of the error, as in [`ErrorBody::code`].
    pub fn code(&self) -> &'static str {
        self.parts().1
    }

    /// The HTTP status the error is answered with.
    pub fn status(&self) -> StatusCode {
        self.parts().0
    }

    fn parts(&self) -> (StatusCode, &'static str) {
        match self {
            ApiError::Unauthenticated(_) => (StatusCode::UNAUTHORIZED, "Unauthenticated"),
            ApiError::Forbidden(_) => (StatusCode::FORBIDDEN, "Forbidden"),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "NotFound"),
            ApiError::AlreadyExists(_) => (StatusCode::CONFLICT, "AlreadyExists"),
            ApiError::Conflict(_) => (StatusCode::CONFLICT, "Conflict"),
            ApiError::Invalid { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "Invalid"),
            ApiError::BadRequest(_) => (StatusCode::BAD_REQUEST, "BadRequest"),
            ApiError::Gone(_) => (StatusCode::GONE, "Gone"),
            ApiError::TooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "TooLarge"),
            ApiError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "Unavailable"),
            ApiError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "Internal"),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        let message = error.to_string();
        match error {
            StoreError::NotFound { .. } | StoreError::RevisionNotFound { .. } => {
                ApiError::NotFound(message)
            }
            StoreError::AlreadyExists { .. } => ApiError::AlreadyExists(message),
            StoreError::Conflict { .. } => ApiError::Conflict(message),
            StoreError::Expired { .. } => ApiError::Gone(message),
            StoreError::Unavailable(_) => ApiError::Unavailable(message),
            StoreError::Corrupt(_) | StoreError::Sqlite(_) | StoreError::Join(_) => {
                ApiError::Internal(error_chain(&error))
            }
        }
    }
}

/// The error and all its sources, joined with `: `.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.parts();
        if status.is_server_error() {
            tracing::error!(error = %self, "request failed");
        }
        let fields = match &self {
            ApiError::Invalid { fields, .. } => fields.clone(),
            _ => Vec::new(),
        };
        let body = ErrorBody {
            code: code.to_string(),
            message: self.to_string(),
            fields,
        };
        (status, Json(body)).into_response()
    }
}
