//! `GET /orders/{id}`: an order with its state, steps and timeline; with `?values=whole`, its
//! stored input and outputs read back whole.

use lambda_http::http::StatusCode;
use lambda_http::{Body, Request, RequestExt, Response};
use sas_aws::api;
use sas_engine::OrderId;
use sas_engine::ports::{Payloads, StateStore};
use sas_engine::services::{StatusService, Values};
use serde_json::json;

/// Handles one request routed to `GET /orders/{id}`.
pub async fn handle<S: StateStore, P: Payloads>(
    status: &StatusService<S, P>,
    request: Request,
) -> Response<Body> {
    let raw = request.path_parameters().first("id").map(str::to_owned).unwrap_or_default();
    let Ok(order_id) = raw.parse::<OrderId>() else {
        return api::error(
            StatusCode::BAD_REQUEST,
            "invalid_order_id",
            "the order id must be a UUID",
            json!({}),
        );
    };
    let Some(values) = Values::asked(request.query_string_parameters().first("values")) else {
        return api::error(
            StatusCode::BAD_REQUEST,
            "invalid_query",
            "values must be references or whole",
            json!({}),
        );
    };
    let caller = match api::caller(&request) {
        Ok(caller) => caller,
        Err(e) => return api::from_error(&e),
    };
    match status.get_with(order_id, &caller, values).await {
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
