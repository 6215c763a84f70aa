//! The wire as rpc.py speaks it: fragments, concatenated requests, batches, garbage, hang-ups,
//! oversized requests, concurrent clients.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvmf_rpc::client::{Client, ClientError, Endpoint};
use nvmf_rpc::{
    build_module, serve_tcp, serve_unix, CallFn, RpcError, ServerHandle, ServerOptions,
};
use serde_json::{json, Value};

fn socket_path(tag: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    std::env::temp_dir().join(format!(
        "nvmf-rpc-test-{}-{tag}-{}.sock",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ))
}

fn toy() -> CallFn {
    Arc::new(|method: &str, params: Option<Value>| match method {
        "echo" => Ok(params.unwrap_or(Value::Null)),
        "fail" => Err(RpcError::errno(2, "no such thing")),
        "needs_name" => match params.as_ref().and_then(|p| p.get("name")) {
            Some(Value::String(s)) => Ok(json!(s)),
            _ => Err(RpcError::invalid_params(
                "Invalid parameters: missing field `name`",
            )),
        },
        "slow" => {
            std::thread::sleep(Duration::from_millis(300));
            Ok(json!("slow"))
        }
        other => Err(RpcError::internal(format!("unexpected {other}"))),
    })
}

const METHODS: &[&str] = &["echo", "fail", "needs_name", "slow"];

fn start(opts: ServerOptions) -> (ServerHandle, PathBuf) {
    let path = socket_path("srv");
    let handle = serve_unix(&path, build_module(METHODS, toy()), opts).unwrap();
    (handle, path)
}

fn connect(path: &PathBuf) -> UnixStream {
    let s = UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

/// Reads newline-terminated replies until `n` have arrived.
fn read_replies(s: &mut UnixStream, n: usize) -> Vec<Value> {
    let mut buf = Vec::new();
    let mut out = Vec::new();
    let mut chunk = [0u8; 4096];
    while out.len() < n {
        let k = s.read(&mut chunk).expect("reply");
        assert!(
            k > 0,
            "connection closed after {} of {n} replies",
            out.len()
        );
        buf.extend_from_slice(&chunk[..k]);
        while let Some(pos) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=pos).collect();
            out.push(serde_json::from_slice(&line).expect("each reply is one JSON line"));
        }
    }
    out
}

fn assert_closed(s: &mut UnixStream) {
    let mut b = [0u8; 64];
    match s.read(&mut b) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("connection should be closed, got {other:?}"),
    }
}

#[test]
fn fragmented_request_is_reassembled() {
    let (_h, path) = start(ServerOptions::default());
    let mut s = connect(&path);
    let req =
        b"{\"jsonrpc\": \"2.0\",\n \"method\": \"echo\",\n \"params\": {\"a\": \"}{\"}, \"id\": 7}";
    for chunk in req.chunks(3) {
        s.write_all(chunk).unwrap();
        s.flush().unwrap();
        std::thread::sleep(Duration::from_millis(2));
    }
    let r = read_replies(&mut s, 1);
    assert_eq!(
        r[0],
        json!({"jsonrpc": "2.0", "id": 7, "result": {"a": "}{"}})
    );
}

#[test]
fn two_requests_in_one_write_get_two_replies_in_order() {
    let (_h, path) = start(ServerOptions::default());
    let mut s = connect(&path);
    s.write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"echo\",\"params\":[1],\"id\":1}{\"jsonrpc\":\"2.0\",\"method\":\"fail\",\"id\":\"two\"}  ")
        .unwrap();
    let r = read_replies(&mut s, 2);
    assert_eq!(r[0]["id"], 1);
    assert_eq!(r[0]["result"], json!([1]));
    assert_eq!(r[1]["id"], "two");
    assert_eq!(
        r[1]["error"],
        json!({"code": -2, "message": "no such thing"})
    );
}

#[test]
fn batches_and_notifications() {
    let (_h, path) = start(ServerOptions::default());
    let mut s = connect(&path);
    let batch = json!([
        {"jsonrpc": "2.0", "method": "echo", "params": {"x": 1}, "id": 1},
        {"jsonrpc": "2.0", "method": "echo", "params": {"x": 2}},
        {"jsonrpc": "2.0", "method": "nope", "id": 3},
        5
    ]);
    s.write_all(batch.to_string().as_bytes()).unwrap();
    let r = read_replies(&mut s, 1);
    let arr = r[0].as_array().expect("a batch answers with an array");
    assert_eq!(arr.len(), 3, "the notification gets no reply: {arr:?}");
    assert_eq!(arr[0]["result"], json!({"x": 1}));
    assert_eq!(arr[1]["error"]["code"], RpcError::METHOD_NOT_FOUND);
    assert_eq!(arr[1]["id"], 3);
    assert_eq!(arr[2]["error"]["code"], RpcError::INVALID_REQUEST);
    // A notification alone: nothing comes back, the next request is answered.
    s.write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"echo\"}[]{\"jsonrpc\":\"2.0\",\"method\":\"echo\",\"id\":null}").unwrap();
    let r = read_replies(&mut s, 2);
    assert_eq!(
        r[0]["error"]["code"],
        RpcError::INVALID_REQUEST,
        "empty batch"
    );
    assert_eq!(r[1], json!({"jsonrpc": "2.0", "id": null, "result": null}));
}

#[test]
fn invalid_requests_keep_the_connection_open() {
    let (_h, path) = start(ServerOptions::default());
    let mut s = connect(&path);
    for bad in [
        json!({"method": "echo", "id": 1}),
        json!({"jsonrpc": "1.0", "method": "echo", "id": 1}),
        json!({"jsonrpc": "2.0", "method": 5, "id": 1}),
        json!({"jsonrpc": "2.0", "method": "echo", "params": 3, "id": 1}),
        json!({"jsonrpc": "2.0", "method": "echo", "id": {"a": 1}}),
        json!("just a string"),
    ] {
        s.write_all(bad.to_string().as_bytes()).unwrap();
        let r = read_replies(&mut s, 1);
        assert_eq!(r[0]["error"]["code"], RpcError::INVALID_REQUEST, "{bad}");
    }
    s.write_all(br#"{"jsonrpc":"2.0","method":"needs_name","params":{},"id":9}"#)
        .unwrap();
    let r = read_replies(&mut s, 1);
    assert_eq!(r[0]["error"]["code"], RpcError::INVALID_PARAMS);
    assert!(r[0]["error"]["message"].as_str().unwrap().contains("name"));
    s.write_all(br#"{"jsonrpc":"2.0","method":"no_such","id":10}"#)
        .unwrap();
    let r = read_replies(&mut s, 1);
    assert_eq!(r[0]["error"]["code"], RpcError::METHOD_NOT_FOUND);
    assert_eq!(r[0]["id"], 10);
}

#[test]
fn malformed_json_gets_parse_error_then_close() {
    let (_h, path) = start(ServerOptions::default());
    let mut s = connect(&path);
    s.write_all(b"{\"jsonrpc\": \"2.0\", \"method\": ]")
        .unwrap();
    let r = read_replies(&mut s, 1);
    assert_eq!(r[0]["error"]["code"], RpcError::PARSE_ERROR);
    assert_eq!(r[0]["id"], Value::Null);
    assert_closed(&mut s);
    let mut s = connect(&path);
    s.write_all(b"hello there").unwrap();
    assert_eq!(
        read_replies(&mut s, 1)[0]["error"]["code"],
        RpcError::PARSE_ERROR
    );
    assert_closed(&mut s);
}

#[test]
fn truncated_request_then_hangup_harms_no_one() {
    let (_h, path) = start(ServerOptions::default());
    let mut a = connect(&path);
    let mut b = connect(&path);
    a.write_all(b"{\"jsonrpc\": \"2.0\", \"method\": \"echo\", \"par")
        .unwrap();
    drop(a);
    b.write_all(br#"{"jsonrpc":"2.0","method":"echo","params":{"ok":true},"id":1}"#)
        .unwrap();
    assert_eq!(read_replies(&mut b, 1)[0]["result"], json!({"ok": true}));
    let mut c = connect(&path);
    c.write_all(br#"{"jsonrpc":"2.0","method":"echo","id":2}"#)
        .unwrap();
    assert_eq!(read_replies(&mut c, 1)[0]["id"], 2);
}

#[test]
fn oversized_request_is_refused_and_closed() {
    let (_h, path) = start(ServerOptions {
        max_request_bytes: 64 << 10,
        ..Default::default()
    });
    let mut s = connect(&path);
    s.write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"echo\",\"params\":{\"blob\":\"")
        .unwrap();
    let junk = vec![b'x'; 16 << 10];
    let mut sent = 0;
    // Keep writing until the server gives up (a write fails once it has closed).
    while sent < (1 << 20) {
        if s.write_all(&junk).is_err() {
            break;
        }
        sent += junk.len();
    }
    let r = read_replies(&mut s, 1);
    assert_eq!(r[0]["error"]["code"], RpcError::INVALID_REQUEST);
    assert!(r[0]["error"]["message"].as_str().unwrap().contains("65536"));
    // Others are still served.
    let mut t = connect(&path);
    t.write_all(br#"{"jsonrpc":"2.0","method":"echo","id":1}"#)
        .unwrap();
    assert_eq!(read_replies(&mut t, 1)[0]["id"], 1);
}

#[test]
fn default_cap_is_4_mib_and_large_requests_below_it_work() {
    assert_eq!(ServerOptions::default().max_request_bytes, 4 << 20);
    let (_h, path) = start(ServerOptions::default());
    let blob = "y".repeat((4 << 20) - 100);
    let mut c = Client::connect(&Endpoint::Unix(path), Some(Duration::from_secs(10))).unwrap();
    let r = c.call("echo", Some(json!({"blob": blob}))).unwrap();
    assert_eq!(r["blob"].as_str().unwrap().len(), (4 << 20) - 100);
}

#[test]
fn concurrent_clients_and_a_slow_call_do_not_block_each_other() {
    let (_h, path) = start(ServerOptions::default());
    let slow_path = path.clone();
    let slow = std::thread::spawn(move || {
        let mut c =
            Client::connect(&Endpoint::Unix(slow_path), Some(Duration::from_secs(5))).unwrap();
        c.call("slow", None).unwrap()
    });
    std::thread::sleep(Duration::from_millis(20));
    let started = Instant::now();
    let workers: Vec<_> = (0..8)
        .map(|w| {
            let path = path.clone();
            std::thread::spawn(move || {
                let mut c =
                    Client::connect(&Endpoint::Unix(path), Some(Duration::from_secs(5))).unwrap();
                for i in 0..50 {
                    let r = c.call("echo", Some(json!({"w": w, "i": i}))).unwrap();
                    assert_eq!(r, json!({"w": w, "i": i}));
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(slow.join().unwrap(), json!("slow"));
}

#[test]
fn client_reports_rpc_errors_with_the_request() {
    let (_h, path) = start(ServerOptions::default());
    let mut c = Client::connect(&Endpoint::Unix(path), None).unwrap();
    match c.call("fail", Some(json!({"k": 1}))) {
        Err(ClientError::Rpc { request, error }) => {
            assert_eq!(error.code, -2);
            assert_eq!(request["method"], "fail");
            assert_eq!(request["params"], json!({"k": 1}));
        }
        other => panic!("{other:?}"),
    }
    // The connection is still usable.
    assert_eq!(c.call("echo", Some(json!([1, 2]))).unwrap(), json!([1, 2]));
}

#[test]
fn tcp_listener_serves_the_same_protocol() {
    let h = serve_tcp(
        "127.0.0.1:0",
        build_module(METHODS, toy()),
        ServerOptions::default(),
    )
    .unwrap();
    let addr = h.local_addr().unwrap();
    let mut c = Client::connect(
        &Endpoint::Tcp(addr.to_string()),
        Some(Duration::from_secs(5)),
    )
    .unwrap();
    assert_eq!(
        c.call("echo", Some(json!({"tcp": true}))).unwrap(),
        json!({"tcp": true})
    );
    assert_eq!(
        Endpoint::parse("127.0.0.1", Some(addr.port())),
        Endpoint::Tcp(format!("127.0.0.1:{}", addr.port()))
    );
    assert_eq!(
        Endpoint::parse("/var/tmp/spdk.sock", None),
        Endpoint::Unix("/var/tmp/spdk.sock".into())
    );
    h.shutdown();
    assert!(Client::connect(&Endpoint::Tcp(addr.to_string()), None).is_err());
}

#[test]
fn socket_file_lifecycle() {
    let path = socket_path("life");
    // A stale socket (nobody listening) is replaced.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    let h = serve_unix(
        &path,
        build_module(METHODS, toy()),
        ServerOptions::default(),
    )
    .unwrap();
    // A live one is not taken over.
    let e = serve_unix(
        &path,
        build_module(METHODS, toy()),
        ServerOptions::default(),
    )
    .err()
    .unwrap();
    assert!(matches!(e, nvmf_rpc::ServeError::InUse(_)), "{e}");
    let mut s = connect(&path);
    h.shutdown();
    assert!(!path.exists(), "shutdown removes the socket file");
    assert_closed(&mut s);
}
