//! The JSON-RPC 2.0 server as SPDK's `rpc.py` expects it.
//!
//! SPDK's protocol has no framing: a client writes JSON values back to back on a stream socket
//! (one request may arrive in many reads, several requests in one read, a request may span
//! lines) and the server answers each request with one JSON value. So a connection keeps an
//! accumulating buffer; a small scanner finds where the first top-level value ends (counting
//! brackets outside strings, so a large request costs one pass, not one parse per read), and
//! serde_json parses exactly that slice. Each reply is written followed by a newline.
//!
//! Faults, per connection:
//! - Bytes that are not JSON: a `-32700` parse error (id `null`) is sent and the connection is
//!   closed, as SPDK does: a byte stream has no resynchronisation point after garbage.
//! - Valid JSON that is not a request (no `"jsonrpc": "2.0"`, no string `method`, bad `id` or
//!   `params` type): `-32600`, and the connection stays open.
//! - A request larger than [`ServerOptions::max_request_bytes`] (32 MiB by default): `-32600`
//!   naming the limit, then close; the buffer never grows past the limit plus one read.
//! - A client that hangs up mid-request or stalls only loses its own connection; every
//!   connection is its own task.
//!
//! Batches (a JSON array of requests) are answered with an array of responses, notifications
//! (requests without `id`) are executed without a response. SPDK itself refuses batches; this
//! server accepts them as JSON-RPC 2.0 defines.
//!
//! The method table is a jsonrpsee [`RpcModule`]; every method forwards to one dispatch closure
//! ([`CallFn`]) that runs on a blocking thread, so a handler may wait (for poll groups, say)
//! without stalling other connections. The envelope (ids of any JSON type, notifications,
//! batches) is handled here and each call is handed to the module with a numeric id.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use jsonrpsee::types::ErrorObjectOwned;
use jsonrpsee::RpcModule;
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

use crate::RpcError;

/// What the target supplies: runs one method with its (optional) params.
pub type CallFn = Arc<dyn Fn(&str, Option<Value>) -> Result<Value, RpcError> + Send + Sync>;

/// Connection limits.
#[derive(Debug, Clone, Copy)]
pub struct ServerOptions {
    /// Largest request (or batch) accepted on one connection, in bytes.
    pub max_request_bytes: usize,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            max_request_bytes: 32 << 20,
        }
    }
}

const READ_CHUNK: usize = 64 << 10;

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

/// A running server. Dropping it (or [`ServerHandle::shutdown`]) stops accepting, closes every
/// connection and, for a Unix socket, removes the socket file.
pub struct ServerHandle {
    stop: Option<watch::Sender<bool>>,
    thread: Option<JoinHandle<()>>,
    local_addr: Option<SocketAddr>,
    path: Option<PathBuf>,
}

impl ServerHandle {
    /// The bound TCP address (useful with port 0).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr
    }

    pub fn socket_path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    pub fn shutdown(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(true);
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        if let Some(path) = self.path.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.stop_now();
    }
}

fn runtime() -> io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("nvmf-rpc")
        .enable_all()
        .build()
}

/// Serves `module` on a Unix stream socket at `path` (SPDK's default is
/// [`crate::DEFAULT_SOCKET_PATH`]). A stale socket file (nobody accepting) is replaced; a live
/// one is `AddrInUse`.
pub fn serve_unix(
    path: impl AsRef<Path>,
    module: RpcModule<()>,
    opts: ServerOptions,
) -> io::Result<ServerHandle> {
    let path = path.as_ref().to_path_buf();
    if path.exists() {
        match std::os::unix::net::UnixStream::connect(&path) {
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("{} is in use by a running server", path.display()),
                ))
            }
            Err(_) => std::fs::remove_file(&path)?,
        }
    }
    let rt = runtime()?;
    let listener = rt.block_on(async { tokio::net::UnixListener::bind(&path) })?;
    let module = Arc::new(module);
    let (stop, mut stopped) = watch::channel(false);
    let thread = std::thread::Builder::new()
        .name("nvmf-rpc-accept".into())
        .spawn(move || {
            rt.block_on(async move {
                loop {
                    tokio::select! {
                        _ = stopped.changed() => break,
                        accepted = listener.accept() => match accepted {
                            Ok((stream, _)) => {
                                tokio::spawn(serve_connection(stream, Arc::clone(&module), opts, stopped.clone()));
                            }
                            Err(e) => tracing::warn!("rpc accept: {e}"),
                        }
                    }
                }
            });
            rt.shutdown_timeout(std::time::Duration::from_secs(1));
        })?;
    Ok(ServerHandle {
        stop: Some(stop),
        thread: Some(thread),
        local_addr: None,
        path: Some(path),
    })
}

/// Serves `module` on TCP `addr` ("IP:PORT", as `rpc.py -s IP -p PORT` connects to).
pub fn serve_tcp(
    addr: &str,
    module: RpcModule<()>,
    opts: ServerOptions,
) -> io::Result<ServerHandle> {
    let rt = runtime()?;
    let listener = rt.block_on(async { tokio::net::TcpListener::bind(addr).await })?;
    let local_addr = listener.local_addr()?;
    let module = Arc::new(module);
    let (stop, mut stopped) = watch::channel(false);
    let thread = std::thread::Builder::new()
        .name("nvmf-rpc-accept".into())
        .spawn(move || {
            rt.block_on(async move {
                loop {
                    tokio::select! {
                        _ = stopped.changed() => break,
                        accepted = listener.accept() => match accepted {
                            Ok((stream, _)) => {
                                tokio::spawn(serve_connection(stream, Arc::clone(&module), opts, stopped.clone()));
                            }
                            Err(e) => tracing::warn!("rpc accept: {e}"),
                        }
                    }
                }
            });
            rt.shutdown_timeout(std::time::Duration::from_secs(1));
        })?;
    Ok(ServerHandle {
        stop: Some(stop),
        thread: Some(thread),
        local_addr: Some(local_addr),
        path: None,
    })
}

async fn serve_connection<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    module: Arc<RpcModule<()>>,
    opts: ServerOptions,
    mut stopped: watch::Receiver<bool>,
) {
    let mut buf: Vec<u8> = Vec::new();
    let mut scan = Scanner::default();
    let mut chunk = vec![0u8; READ_CHUNK];
    loop {
        loop {
            match scan.next_value(&buf) {
                Next::NeedMore => break,
                Next::Empty => {
                    buf.clear();
                    scan = Scanner::default();
                    break;
                }
                Next::Invalid(e) => {
                    let reply = error_response(
                        Value::Null,
                        RpcError::PARSE_ERROR,
                        &format!("Parse error: {e}"),
                    );
                    let _ = write_reply(&mut stream, &reply).await;
                    return;
                }
                Next::Value(value, consumed) => {
                    buf.drain(..consumed);
                    scan = Scanner::default();
                    if let Some(reply) = handle_value(&module, value).await {
                        if write_reply(&mut stream, &reply).await.is_err() {
                            return;
                        }
                    }
                }
            }
        }
        if buf.len() > opts.max_request_bytes {
            let message = format!("request exceeds {} bytes", opts.max_request_bytes);
            let reply = error_response(Value::Null, RpcError::INVALID_REQUEST, &message);
            let _ = write_reply(&mut stream, &reply).await;
            return;
        }
        let n = tokio::select! {
            _ = stopped.changed() => return,
            n = stream.read(&mut chunk) => match n {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
        };
        buf.extend_from_slice(&chunk[..n]);
    }
}

async fn write_reply<S: AsyncWrite + Unpin>(stream: &mut S, reply: &Value) -> io::Result<()> {
    let mut bytes = serde_json::to_vec(reply).map_err(io::Error::other)?;
    bytes.push(b'\n');
    stream.write_all(&bytes).await?;
    stream.flush().await
}

fn error_response(id: Value, code: i32, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

/// Answers one top-level JSON value: a request, a batch, or something invalid. `None` when
/// nothing is to be sent (notifications only).
async fn handle_value(module: &RpcModule<()>, value: Value) -> Option<Value> {
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

pub(crate) enum Next {
    /// The buffer holds only whitespace.
    Empty,
    /// The first value is not complete yet.
    NeedMore,
    /// The first value and the bytes it took (including leading whitespace).
    Value(Value, usize),
    Invalid(String),
}

/// Finds where the first top-level JSON value in a growing buffer ends, resuming where the
/// previous call stopped, so each byte is scanned once however the request is fragmented.
#[derive(Default)]
pub(crate) struct Scanner {
    pos: usize,
    start: Option<usize>,
    depth: usize,
    in_string: bool,
    escape: bool,
}

impl Scanner {
    pub(crate) fn next_value(&mut self, buf: &[u8]) -> Next {
        if self.start.is_none() {
            while self.pos < buf.len() && buf[self.pos].is_ascii_whitespace() {
                self.pos += 1;
            }
            if self.pos == buf.len() {
                return Next::Empty;
            }
            if !matches!(buf[self.pos], b'{' | b'[') {
                // A scalar at top level: small or garbage; let serde judge it.
                return self.parse_scalar(buf);
            }
            self.start = Some(self.pos);
        }
        while self.pos < buf.len() {
            let b = buf[self.pos];
            self.pos += 1;
            if self.in_string {
                if self.escape {
                    self.escape = false;
                } else if b == b'\\' {
                    self.escape = true;
                } else if b == b'"' {
                    self.in_string = false;
                }
                continue;
            }
            match b {
                b'"' => self.in_string = true,
                b'{' | b'[' => self.depth += 1,
                b'}' | b']' => {
                    self.depth -= 1;
                    if self.depth == 0 {
                        let start = self.start.expect("set above");
                        return match serde_json::from_slice::<Value>(&buf[start..self.pos]) {
                            Ok(v) => Next::Value(v, self.pos),
                            Err(e) => Next::Invalid(e.to_string()),
                        };
                    }
                }
                _ => {}
            }
        }
        Next::NeedMore
    }

    fn parse_scalar(&mut self, buf: &[u8]) -> Next {
        let mut stream =
            serde_json::Deserializer::from_slice(&buf[self.pos..]).into_iter::<Value>();
        match stream.next() {
            None => Next::Empty,
            Some(Ok(v)) => {
                let end = self.pos + stream.byte_offset();
                // A number at the very end of the buffer may still be growing.
                if end == buf.len() && v.is_number() {
                    return Next::NeedMore;
                }
                Next::Value(v, end)
            }
            Some(Err(e)) if e.is_eof() => Next::NeedMore,
            Some(Err(e)) => Next::Invalid(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan_all(chunks: &[&str]) -> Vec<Value> {
        let mut buf = Vec::new();
        let mut scan = Scanner::default();
        let mut out = Vec::new();
        for c in chunks {
            buf.extend_from_slice(c.as_bytes());
            loop {
                match scan.next_value(&buf) {
                    Next::Value(v, n) => {
                        buf.drain(..n);
                        scan = Scanner::default();
                        out.push(v);
                    }
                    Next::Empty => {
                        buf.clear();
                        scan = Scanner::default();
                        break;
                    }
                    Next::NeedMore => break,
                    Next::Invalid(e) => panic!("invalid: {e}"),
                }
            }
        }
        out
    }

    #[test]
    fn scanner_handles_fragments_strings_and_concatenation() {
        let v = scan_all(&[
            "{\"a\": \"}{\\\"",
            "]\", \"b\"",
            ": [1, {\"c\": 2}]}",
            "  {}\n[]",
        ]);
        assert_eq!(
            v,
            vec![
                json!({"a": "}{\"]", "b": [1, {"c": 2}]}),
                json!({}),
                json!([])
            ]
        );
        let v = scan_all(&["1", "2 ", "\"x\""]);
        assert_eq!(v, vec![json!(12), json!("x")]);
    }

    #[test]
    fn scanner_rejects_garbage() {
        let mut s = Scanner::default();
        assert!(matches!(s.next_value(b"hello"), Next::Invalid(_)));
        let mut s = Scanner::default();
        assert!(matches!(s.next_value(b"{\"a\": ]"), Next::Invalid(_)));
        let mut s = Scanner::default();
        assert!(matches!(s.next_value(b"}"), Next::Invalid(_)));
    }
}
