//! Where errors become `tonic::Status`: engine errors (SPEC section 5) and
//! refusals of `[auth]`, for every gRPC service, stream and batch item.

use tonic::Status;

use crate::auth::Refusal;
use crate::engine::EngineError;

/// Turns an engine error into the gRPC status of SPEC section 5.
pub fn status_of(e: EngineError) -> Status {
    let message = e.to_string();
    match e {
        EngineError::Invalid { .. } => Status::invalid_argument(message),
        EngineError::TicketNotFound | EngineError::RuleNotFound { .. } => {
            Status::not_found(message)
        }
        EngineError::Exhausted { .. }
        | EngineError::ShareExhausted { .. }
        | EngineError::StoreFull(_) => Status::resource_exhausted(message),
        EngineError::ShuttingDown | EngineError::StoreUnavailable(_) => {
            Status::unavailable(message)
        }
        EngineError::DeadlineExceeded { .. } => Status::deadline_exceeded(message),
        EngineError::Internal(_) => Status::internal(message),
    }
}

/// Turns an authentication or permission refusal into its gRPC status.
pub fn status_of_refusal(r: Refusal) -> Status {
    match r {
        Refusal::Unauthenticated(m) => Status::unauthenticated(m),
        Refusal::Denied(m) => Status::permission_denied(m),
    }
}

/// `INVALID_ARGUMENT` naming `field` and what is wrong with it.
pub fn invalid(field: &'static str, problem: impl Into<String>) -> Status {
    status_of(EngineError::Invalid {
        field,
        problem: problem.into(),
    })
}
