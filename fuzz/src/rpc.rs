//! The control plane: the JSON-RPC byte stream (framing, envelope, limits) and the method
//! handlers behind it, over a real [`Control`] with the loopback transport.
//!
//! - [`fuzz_stream`]: the input is what a client writes on the socket (in pieces); every
//!   reply must be one JSON-RPC 2.0 response (a `result` or an `error` with an integer code)
//!   on its own line, and the connection must end when the client is done.
//! - [`fuzz_dispatch`]: the input is a stream of JSON values; each request object (or each
//!   object, as params of a method picked by the input) goes to the dispatch closure
//!   (`call_fn`). A call that fails must change nothing: the saved config (rpc.py's
//!   `save_config`: `framework_get_config` of every subsystem) and `nvmf_get_subsystems` are
//!   the same before and after it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use nvmf_rpc::{build_module, CallFn, ServerOptions};
use nvmf_target::core::TargetInfo;
use nvmf_target::rpc::{call_fn, method_names, Control, TransportFactory};
use nvmf_target::target::Target;
use nvmf_target::transport::loopback::LoopbackTransport;
use nvmf_target::transport::options::TransportOptions;
use nvmf_target::transport::Transport;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Largest input the drivers generate (above the stream target's request limit).
pub const MAX_INPUT: usize = 96 << 10;
/// The stream target's request limit: small, so the oversize path is reached.
const MAX_REQUEST: usize = 64 << 10;

/// Methods left out of the dispatch target: they open paths on this machine.
const TOUCH_FILES: &[&str] = &["bdev_aio_create", "bdev_uring_create"];

fn factory() -> TransportFactory {
    Box::new(|opts: &TransportOptions| {
        Ok(Arc::new(LoopbackTransport::new(opts.limits())) as Arc<dyn Transport>)
    })
}

/// A fresh target with no reactors behind it (statistics time out at once).
pub fn control() -> Arc<Mutex<Control>> {
    let mut control = Control::new(Target::new(Arc::new(TargetInfo::default())), factory());
    control.stats_timeout = Duration::from_millis(1);
    Arc::new(Mutex::new(control))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

thread_local! {
    static RUNTIME: tokio::runtime::Runtime = runtime();
}

/// A JSON-RPC 2.0 response, as rpc.py would accept it.
fn check_response(v: &Value) {
    match v {
        Value::Array(items) => {
            assert!(!items.is_empty(), "empty batch response");
            items.iter().for_each(check_response);
        }
        Value::Object(o) => {
            assert_eq!(o.get("jsonrpc"), Some(&json!("2.0")), "{v}");
            assert!(
                matches!(
                    o.get("id"),
                    Some(Value::Null | Value::Number(_) | Value::String(_))
                ),
                "bad id: {v}"
            );
            match (o.get("result"), o.get("error")) {
                (Some(_), None) => {}
                (None, Some(e)) => {
                    assert!(e["code"].is_i64(), "error without integer code: {v}");
                    assert!(e["message"].is_string(), "error without message: {v}");
                }
                _ => panic!("neither result nor error: {v}"),
            }
        }
        other => panic!("reply is not a response: {other}"),
    }
}

pub fn fuzz_stream(data: &[u8]) {
    stream_replies(data);
}

/// Runs one input through the server and returns the replies, each checked.
pub fn stream_replies(data: &[u8]) -> Vec<Value> {
    // The first byte sets how the rest is cut into writes (1..=256 bytes each).
    let (piece, body) = match data.split_first() {
        Some((&p, rest)) => (usize::from(p) + 1, rest),
        None => (1, data),
    };
    let module = Arc::new(build_module(&method_names(), guarded(call_fn(control()))));
    let opts = ServerOptions {
        max_request_bytes: MAX_REQUEST,
        idle_timeout: Duration::from_secs(2),
        ..Default::default()
    };
    let replies = RUNTIME.with(|rt| {
        rt.block_on(async {
            let (client, server) = tokio::io::duplex(16 << 10);
            let served = tokio::spawn(async move {
                nvmf_rpc::server::serve_stream(server, module, &opts).await;
            });
            let (mut rd, mut wr) = tokio::io::split(client);
            let writer = async move {
                for chunk in body.chunks(piece) {
                    // The server may close first (garbage, oversize): stop writing then.
                    if wr.write_all(chunk).await.is_err() {
                        break;
                    }
                }
                let _ = wr.shutdown().await;
            };
            let reader = async move {
                let mut out = Vec::new();
                let _ = rd.read_to_end(&mut out).await;
                out
            };
            let all = async { tokio::join!(writer, reader).1 };
            let out = tokio::time::timeout(Duration::from_secs(20), all)
                .await
                .expect("the server never finished the connection");
            served.await.expect("connection task panicked");
            out
        })
    });
    assert!(
        replies.is_empty() || replies.ends_with(b"\n"),
        "a reply is not newline-terminated"
    );
    let mut out = Vec::new();
    for line in replies.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let v: Value = serde_json::from_slice(line).expect("every reply line is JSON");
        check_response(&v);
        out.push(v);
    }
    out
}

/// The dispatch closure without the methods that touch files.
fn guarded(call: CallFn) -> CallFn {
    Arc::new(move |method: &str, params: Option<Value>| {
        if TOUCH_FILES.contains(&method) {
            return Err(nvmf_rpc::RpcError::invalid_params("left out by the fuzzer"));
        }
        call(method, params)
    })
}

/// What rpc.py's `save_config` would write, plus the subsystems as listed.
pub fn snapshot(call: &CallFn) -> Value {
    let mut config = Vec::new();
    let subsystems = call("framework_get_subsystems", None).expect("framework_get_subsystems");
    for s in subsystems.as_array().expect("array") {
        let name = s["subsystem"].clone();
        let c = call("framework_get_config", Some(json!({"name": name})))
            .expect("framework_get_config");
        config.push(json!({"subsystem": name, "config": c}));
    }
    let listed = call("nvmf_get_subsystems", None).expect("nvmf_get_subsystems");
    json!({"subsystems": config, "nvmf_get_subsystems": listed})
}

pub fn fuzz_dispatch(data: &[u8]) {
    check_dispatch(&guarded(call_fn(control())), data);
}

/// Sends every request of `data` to `call`; panics when a failing call changed the
/// configuration.
pub fn check_dispatch(call: &CallFn, data: &[u8]) {
    let names = method_names();
    let picker = data.first().copied().unwrap_or(0);
    // One value per line (a mutation breaks one request, not the rest), or a stream of
    // values on one line.
    let values = data
        .split(|&b| b == b'\n')
        .flat_map(|line| serde_json::Deserializer::from_slice(line).into_iter::<Value>())
        .filter_map(Result::ok);
    for (i, value) in values.take(64).enumerate() {
        let (method, params) = match &value {
            Value::Object(o) if o.get("method").is_some_and(Value::is_string) => (
                o["method"].as_str().unwrap_or_default().to_string(),
                o.get("params").cloned(),
            ),
            // Any other value: the params of a method the input picks.
            other => {
                let m = names[(usize::from(picker) + i) % names.len()];
                (m.to_string(), Some(other.clone()))
            }
        };
        let before = snapshot(call);
        if let Err(e) = call(&method, params.clone()) {
            let after = snapshot(call);
            assert_eq!(
                before, after,
                "{method} failed ({e}) but changed the configuration; params: {params:?}"
            );
        }
    }
}
