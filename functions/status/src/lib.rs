//! `GET /orders/{id}`: an order with its state, steps and timeline.

use lambda_http::http::StatusCode;
use lambda_http::{Body, Request, RequestExt, Response};
use sas_aws::api;
use sas_engine::OrderId;
use sas_engine::ports::StateStore;
use sas_engine::services::StatusService;
use serde_json::json;

/// Handles one request routed to `GET /orders/{id}`.
pub async fn handle<S: StateStore>(status: &StatusService<S>, request: Request) -> Response<Body> {
    let raw = request.path_parameters().first("id").map(str::to_owned).unwrap_or_default();
    let Ok(order_id) = raw.parse::<OrderId>() else {
        return api::error(
            StatusCode::BAD_REQUEST,
            "invalid_order_id",
            "the order id must be a UUID",
            json!({}),
        );
    };
    let caller = match api::caller(&request) {
        Ok(caller) => caller,
        Err(e) => return api::from_error(&e),
    };
    match status.get(order_id, &caller).await {
        Ok(Some(view)) => match serde_json::to_value(&view) {
            Ok(body) => api::json(StatusCode::OK, &body),
            Err(e) => api::from_error(&sas_engine::Error::rejected("status", e)),
        },
        Ok(None) => {
            api::error(StatusCode::NOT_FOUND, "not_found", "no order with this id", json!({}))
        }
        Err(e) => api::from_error(&e),
    }
}
