//! The JSON-RPC envelope: checks each request (or batch), hands the call to the method table
//! with a numeric id, and answers with the client's own id (or not at all, for a
//! notification).

use std::sync::Arc;

use jsonrpsee::types::ErrorObjectOwned;
use jsonrpsee::RpcModule;
use serde_json::{json, Value};

use super::CallFn;
use crate::RpcError;

/// Builds the module: each name in `methods` forwards to `call`. Methods not listed answer
/// `-32601` without reaching `call`.
pub fn build_module(methods: &[&'static str], call: CallFn) -> RpcModule<()> {
    let mut module = RpcModule::new(());
    for &name in methods {
        let call = Arc::clone(&call);
        module
            .register_blocking_method(name, move |params, _, _| {
                let params = match params.as_str() {
                    None => None,
                    Some(raw) => match serde_json::from_str::<Value>(raw) {
                        Ok(Value::Null) => None,
                        Ok(v) => Some(v),
                        Err(e) => {
                            return Err(ErrorObjectOwned::owned(
                                RpcError::INVALID_PARAMS,
                                format!("params: {e}"),
                                None::<()>,
                            ))
                        }
                    },
                };
                call(name, params)
                    .map_err(|e| ErrorObjectOwned::owned(e.code, e.message, None::<()>))
            })
            .unwrap_or_else(|e| panic!("method {name} registered twice: {e}"));
    }
    module
}

pub(super) fn error_response(id: Value, code: i32, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

/// Answers one top-level JSON value: a request, a batch, or something invalid. `None` when
/// nothing is to be sent (notifications only).
pub(super) async fn handle_value(module: &RpcModule<()>, value: Value) -> Option<Value> {
    match value {
        Value::Array(items) if items.is_empty() => Some(error_response(
            Value::Null,
            RpcError::INVALID_REQUEST,
            "Invalid request: empty batch",
        )),
        Value::Array(items) => {
            let mut replies = Vec::new();
            for item in items {
                if let Some(reply) = handle_request(module, item).await {
                    replies.push(reply);
                }
            }
            (!replies.is_empty()).then_some(Value::Array(replies))
        }
        other => handle_request(module, other).await,
    }
}

async fn handle_request(module: &RpcModule<()>, value: Value) -> Option<Value> {
    let Value::Object(req) = value else {
        return Some(error_response(
            Value::Null,
            RpcError::INVALID_REQUEST,
            "Invalid request: not an object",
        ));
    };
    let id = req.get("id").cloned();
    let reply_id = match &id {
        None | Some(Value::Null) | Some(Value::Number(_)) | Some(Value::String(_)) => {
            id.clone().unwrap_or(Value::Null)
        }
        Some(_) => {
            return Some(error_response(
                Value::Null,
                RpcError::INVALID_REQUEST,
                "Invalid request: id must be a string, a number or null",
            ))
        }
    };
    let invalid = |why: &str| {
        Some(error_response(
            reply_id.clone(),
            RpcError::INVALID_REQUEST,
            why,
        ))
    };
    if req.get("jsonrpc") != Some(&Value::String("2.0".into())) {
        return invalid("Invalid request: \"jsonrpc\" must be \"2.0\"");
    }
    let Some(Value::String(method)) = req.get("method") else {
        return invalid("Invalid request: \"method\" must be a string");
    };
    let params = match req.get("params") {
        None | Some(Value::Null) => None,
        Some(p @ (Value::Object(_) | Value::Array(_))) => Some(p.clone()),
        Some(_) => return invalid("Invalid request: \"params\" must be an object or an array"),
    };
    let mut call = json!({"jsonrpc": "2.0", "id": 0, "method": method});
    if let Some(p) = params {
        call["params"] = p;
    }
    let reply = match module.raw_json_request(&call.to_string(), 1).await {
        Ok((text, _)) => match serde_json::from_str::<Value>(&text) {
            Ok(mut v) => {
                v["id"] = reply_id;
                v
            }
            Err(e) => error_response(
                reply_id,
                RpcError::INTERNAL_ERROR,
                &format!("bad response: {e}"),
            ),
        },
        Err(e) => error_response(
            reply_id,
            RpcError::INVALID_REQUEST,
            &format!("Invalid request: {e}"),
        ),
    };
    // A notification is executed but never answered.
    id.is_some().then_some(reply)
}
