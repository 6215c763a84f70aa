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
//! - A request larger than [`ServerOptions::max_request_bytes`] (4 MiB by default): `-32600`
//!   naming the limit, then close; the buffer never grows past the limit plus one read.
//! - A client silent for [`ServerOptions::idle_timeout`] (60 s) is closed; beyond
//!   [`ServerOptions::max_connections`] (64) a new client gets `-32002` and is closed.
//!
//! Access: the Unix socket is created 0600 (or 0660 for a group) by binding in a private
//! directory and renaming into place; another user's file, a symlink, or a socket a live
//! server answers on is never replaced. TCP serves loopback only, unless a token is set:
//! then every request must carry `"auth_token"` (compared in constant time) or it is
//! answered `-32001` and the connection closed.
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
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use jsonrpsee::types::ErrorObjectOwned;
use jsonrpsee::RpcModule;
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{watch, Semaphore};

use crate::{RpcError, ServeError};

/// What the target supplies: runs one method with its (optional) params.
pub type CallFn = Arc<dyn Fn(&str, Option<Value>) -> Result<Value, RpcError> + Send + Sync>;

/// Connection limits and access control.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Largest request (or batch) accepted on one connection, in bytes (4 MiB: the largest
    /// SPDK request, a `bdev_malloc_create` or a subsystem with many hosts, is a few KiB).
    pub max_request_bytes: usize,
    /// Clients served at once on one listener (SPDK_JSONRPC_MAX_CONNS); one more is
    /// answered an error and closed.
    pub max_connections: usize,
    /// A connection that sends nothing for this long while no request of its own is running
    /// is closed (rpc.py opens one connection per invocation and waits 60 s for an answer).
    pub idle_timeout: Duration,
    /// Mode of the Unix socket file: 0600 (only our user), 0660 with [`Self::socket_group`].
    pub socket_mode: u32,
    /// Group that owns the Unix socket file (with mode 0660, its members may connect).
    pub socket_group: Option<u32>,
    /// Shared secret every TCP request must carry as `"auth_token"`; required for a
    /// non-loopback TCP address. The Unix socket never asks for it (its mode is the control).
    pub tcp_token: Option<AuthToken>,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            max_request_bytes: 4 << 20,
            max_connections: 64,
            idle_timeout: Duration::from_secs(60),
            socket_mode: 0o600,
            socket_group: None,
            tcp_token: None,
        }
    }
}

/// A shared secret for TCP clients. Compared in constant time; never printed.
#[derive(Clone)]
pub struct AuthToken(Arc<[u8]>);

impl std::fmt::Debug for AuthToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuthToken(..)")
    }
}

impl AuthToken {
    /// Shortest token accepted: 16 bytes (128 bits if random).
    pub const MIN_LEN: usize = 16;

    pub fn new(token: &[u8]) -> Result<Self, String> {
        if token.len() < Self::MIN_LEN {
            return Err(format!(
                "the token has {} bytes; at least {} are needed",
                token.len(),
                Self::MIN_LEN
            ));
        }
        Ok(Self(token.into()))
    }

    /// Reads a token file (surrounding whitespace dropped). Like ssh with its keys, a file
    /// that group or others may read or write is refused: the token is the whole protection.
    pub fn from_file(path: &Path) -> Result<Self, ServeError> {
        let bad = |why: String| ServeError::Token {
            path: path.to_path_buf(),
            why,
        };
        let meta = std::fs::metadata(path).map_err(|e| bad(e.to_string()))?;
        if meta.mode() & 0o077 != 0 {
            return Err(bad(format!(
                "mode {:04o} lets group or others read it (chmod 600)",
                meta.mode() & 0o7777
            )));
        }
        let text = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
        Self::new(text.trim_ascii()).map_err(bad)
    }

    /// Constant-time in the token's content: every byte is compared whatever the first
    /// difference (only the length can be learned from timing).
    pub fn matches(&self, offered: &[u8]) -> bool {
        let ours: &[u8] = &self.0;
        let mut diff = (ours.len() ^ offered.len()) as u8 | u8::from(ours.len() != offered.len());
        for (i, &b) in ours.iter().enumerate() {
            diff |= b ^ offered.get(i).copied().unwrap_or(0);
        }
        std::hint::black_box(diff) == 0
    }
}

const READ_CHUNK: usize = 64 << 10;

/// JSON-RPC's "server error" range: the request named no valid `auth_token`.
pub const UNAUTHORIZED: i32 = -32001;
/// The server is at [`ServerOptions::max_connections`].
pub const TOO_MANY_CONNECTIONS: i32 = -32002;

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
/// connection and, for a Unix socket, removes the socket file (if it is still ours).
pub struct ServerHandle {
    stop: Option<watch::Sender<bool>>,
    thread: Option<JoinHandle<()>>,
    local_addr: Option<SocketAddr>,
    path: Option<(PathBuf, u64, u64)>,
}

impl ServerHandle {
    /// The bound TCP address (useful with port 0).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr
    }

    pub fn socket_path(&self) -> Option<&Path> {
        self.path.as_ref().map(|(p, _, _)| p.as_path())
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
        if let Some((path, dev, ino)) = self.path.take() {
            // Only the file we bound: another server may have replaced it since.
            if std::fs::symlink_metadata(&path).is_ok_and(|m| m.dev() == dev && m.ino() == ino) {
                let _ = std::fs::remove_file(path);
            }
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

/// A group given as a number or a name from `/etc/group` (for `--rpc-socket-group`).
pub fn group_id(group: &str) -> Result<u32, ServeError> {
    if let Ok(gid) = group.parse() {
        return Ok(gid);
    }
    let groups = std::fs::read_to_string("/etc/group")?;
    groups
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.len() >= 3 && f[0] == group)
        .and_then(|f| f[2].parse().ok())
        .ok_or_else(|| ServeError::NoSuchGroup(group.into()))
}

/// Our effective uid, without libc: `/proc/self` belongs to it.
fn effective_uid() -> io::Result<u32> {
    Ok(std::fs::metadata("/proc/self")?.uid())
}

/// What may be done with an existing entry at the socket path. Split out so the ownership
/// rule is testable with any metadata (tests run as root, which owns everything it creates).
#[derive(Debug, PartialEq, Eq)]
pub enum Existing {
    /// A socket of ours: replace it if nobody answers on it.
    OurSocket,
    NotASocket,
    NotOurs {
        owner: u32,
    },
}

pub fn judge_existing(file_type: std::fs::FileType, owner: u32, us: u32) -> Existing {
    if !file_type.is_socket() {
        Existing::NotASocket
    } else if owner != us {
        Existing::NotOurs { owner }
    } else {
        Existing::OurSocket
    }
}

/// Checks what is at `path` now: nothing, or a stale socket of ours (removed here). Never
/// follows a symlink (`symlink_metadata`), never removes what is not a socket of ours or a
/// socket somebody answers on.
fn clear_stale(path: &Path) -> Result<(), ServeError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(ServeError::Path {
                path: path.into(),
                source,
            })
        }
    };
    let us = effective_uid()?;
    match judge_existing(meta.file_type(), meta.uid(), us) {
        Existing::NotASocket => Err(ServeError::NotASocket(path.into())),
        Existing::NotOurs { owner } => Err(ServeError::NotOurs {
            path: path.into(),
            owner,
            us,
        }),
        Existing::OurSocket => match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => Err(ServeError::InUse(path.into())),
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                // Stale: nobody listening. rename() below replaces it atomically anyway;
                // removing it here keeps a failed start from leaving it behind.
                match std::fs::remove_file(path) {
                    Ok(()) => Ok(()),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                    Err(source) => Err(ServeError::Path {
                        path: path.into(),
                        source,
                    }),
                }
            }
            Err(source) => Err(ServeError::Path {
                path: path.into(),
                source,
            }),
        },
    }
}

/// Binds the socket in a fresh private directory (mode 0700) beside `path`, sets its mode
/// and group there, and renames it into place: the socket is never reachable with the
/// umask's mode, and rename() replaces a directory entry without following a symlink.
fn bind_private(
    path: &Path,
    opts: &ServerOptions,
) -> Result<(std::os::unix::net::UnixListener, u64, u64), ServeError> {
    use std::os::unix::ffi::OsStrExt;
    let at = |source: io::Error| ServeError::Path {
        path: path.into(),
        source,
    };
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    let dir = dir.unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| at(io::ErrorKind::InvalidInput.into()))?;
    if path.as_os_str().as_bytes().len() > 107 {
        return Err(ServeError::PathTooLong(path.into()));
    }
    // A name nobody else chose: mkdir never follows or reuses an existing entry (a directory
    // or symlink planted under a guessable name makes it fail, and the next name is tried).
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let mut made = None;
    for attempt in 0..16u32 {
        let candidate = dir.join(format!(
            ".{}.{}.{:x}.tmp",
            name.to_string_lossy(),
            std::process::id(),
            nanos.wrapping_add(attempt.wrapping_mul(0x9e37_79b9))
        ));
        match std::fs::DirBuilder::new().mode(0o700).create(&candidate) {
            Ok(()) => {
                made = Some(candidate);
                break;
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(at(e)),
        }
    }
    let tmp_dir = made.ok_or_else(|| at(io::ErrorKind::AlreadyExists.into()))?;
    let tmp = tmp_dir.join("s");
    if tmp.as_os_str().as_bytes().len() > 107 {
        let _ = std::fs::remove_dir(&tmp_dir);
        return Err(ServeError::PathTooLong(path.into()));
    }
    let result = (|| {
        let listener = std::os::unix::net::UnixListener::bind(&tmp)?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(opts.socket_mode))?;
        if let Some(gid) = opts.socket_group {
            std::os::unix::fs::chown(&tmp, None, Some(gid))?;
        }
        let meta = std::fs::symlink_metadata(&tmp)?;
        std::fs::rename(&tmp, path)?;
        Ok((listener, meta.dev(), meta.ino()))
    })();
    let _ = std::fs::remove_file(&tmp);
    let _ = std::fs::remove_dir(&tmp_dir);
    result.map_err(at)
}

/// Serves `module` on a Unix stream socket at `path` (SPDK's default is
/// [`crate::DEFAULT_SOCKET_PATH`]) with [`ServerOptions::socket_mode`]. What is already at
/// the path: a socket of ours nobody answers on is replaced; a live one is
/// [`ServeError::InUse`]; another user's, or anything but a socket (a symlink included), is
/// refused.
pub fn serve_unix(
    path: impl AsRef<Path>,
    module: RpcModule<()>,
    opts: ServerOptions,
) -> Result<ServerHandle, ServeError> {
    let path = path.as_ref().to_path_buf();
    clear_stale(&path)?;
    let (listener, dev, ino) = bind_private(&path, &opts)?;
    listener.set_nonblocking(true)?;
    let rt = runtime()?;
    let listener = {
        let _guard = rt.enter();
        tokio::net::UnixListener::from_std(listener)?
    };
    let thread = spawn_accept(rt, opts, module, Listener::Unix(listener))?;
    Ok(ServerHandle {
        stop: Some(thread.0),
        thread: Some(thread.1),
        local_addr: None,
        path: Some((path, dev, ino)),
    })
}

/// Serves `module` on TCP `addr` ("IP:PORT", as `rpc.py -s IP -p PORT` connects to). A
/// loopback address serves anyone on this machine (as the Unix socket with mode 0666 would);
/// any other address is refused unless [`ServerOptions::tcp_token`] is set, and with a token
/// every request must carry it.
pub fn serve_tcp(
    addr: &str,
    module: RpcModule<()>,
    opts: ServerOptions,
) -> Result<ServerHandle, ServeError> {
    let rt = runtime()?;
    let listener = rt.block_on(async {
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host(addr).await?.collect();
        if let Some(open) = addrs.iter().find(|a| !a.ip().is_loopback()) {
            if opts.tcp_token.is_none() {
                return Err(ServeError::NotLoopback(*open));
            }
        }
        Ok(tokio::net::TcpListener::bind(&addrs[..]).await?)
    })?;
    let local_addr = listener.local_addr()?;
    let thread = spawn_accept(rt, opts, module, Listener::Tcp(listener))?;
    Ok(ServerHandle {
        stop: Some(thread.0),
        thread: Some(thread.1),
        local_addr: Some(local_addr),
        path: None,
    })
}

enum Listener {
    Unix(tokio::net::UnixListener),
    Tcp(tokio::net::TcpListener),
}

enum Conn {
    Unix(tokio::net::UnixStream),
    Tcp(tokio::net::TcpStream),
}

impl Listener {
    async fn accept(&self) -> io::Result<Conn> {
        match self {
            Listener::Unix(l) => l.accept().await.map(|(s, _)| Conn::Unix(s)),
            Listener::Tcp(l) => l.accept().await.map(|(s, _)| Conn::Tcp(s)),
        }
    }
}

impl Conn {
    async fn refuse(self, reply: Value) {
        let limit = Duration::from_secs(1);
        let _ = match self {
            Conn::Unix(mut s) => tokio::time::timeout(limit, write_reply(&mut s, &reply)).await,
            Conn::Tcp(mut s) => tokio::time::timeout(limit, write_reply(&mut s, &reply)).await,
        };
    }

    /// Serves the connection; only TCP asks for the token.
    async fn serve(
        self,
        module: Arc<RpcModule<()>>,
        opts: &ServerOptions,
        stopped: watch::Receiver<bool>,
    ) {
        match self {
            Conn::Unix(s) => serve_connection(s, module, opts, None, stopped).await,
            Conn::Tcp(s) => {
                let token = opts.tcp_token.as_ref();
                serve_connection(s, module, opts, token, stopped).await
            }
        }
    }
}

fn spawn_accept(
    rt: tokio::runtime::Runtime,
    opts: ServerOptions,
    module: RpcModule<()>,
    listener: Listener,
) -> io::Result<(watch::Sender<bool>, JoinHandle<()>)> {
    let module = Arc::new(module);
    let (stop, mut stopped) = watch::channel(false);
    let slots = Arc::new(Semaphore::new(opts.max_connections));
    let thread = std::thread::Builder::new()
        .name("nvmf-rpc-accept".into())
        .spawn(move || {
            rt.block_on(async move {
                loop {
                    let accepted = tokio::select! {
                        _ = stopped.changed() => break,
                        accepted = listener.accept() => accepted,
                    };
                    let stream = match accepted {
                        Ok(s) => s,
                        Err(e) => {
                            tracing::warn!("rpc accept: {e}");
                            // EMFILE and friends: do not spin.
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            continue;
                        }
                    };
                    let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
                        let reply = error_response(
                            Value::Null,
                            TOO_MANY_CONNECTIONS,
                            &format!("too many RPC connections (limit {})", opts.max_connections),
                        );
                        tokio::spawn(stream.refuse(reply));
                        continue;
                    };
                    let (module, opts, stopped) =
                        (Arc::clone(&module), opts.clone(), stopped.clone());
                    tokio::spawn(async move {
                        stream.serve(module, &opts, stopped).await;
                        drop(permit);
                    });
                }
            });
            rt.shutdown_timeout(Duration::from_secs(1));
        })?;
    Ok((stop, thread))
}

/// Serves one already-connected stream until it closes, without a listener: the same
/// framing, limits and dispatch a Unix client gets (no token). For fuzzers and tests that
/// drive the byte stream through an in-memory pipe.
pub async fn serve_stream<S: AsyncRead + AsyncWrite + Unpin>(
    stream: S,
    module: Arc<RpcModule<()>>,
    opts: &ServerOptions,
) {
    // The sender stays alive for the whole connection: a dropped one would read as "stop".
    let (_stop, stopped) = watch::channel(false);
    serve_connection(stream, module, opts, None, stopped).await;
}

async fn serve_connection<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    module: Arc<RpcModule<()>>,
    opts: &ServerOptions,
    token: Option<&AuthToken>,
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
                    if let Some(token) = token {
                        if let Err(reply) = authorize(token, &value) {
                            // No second guess on the same connection: a client that
                            // guesses must pay a connection per try.
                            let _ = write_reply(&mut stream, &reply).await;
                            return;
                        }
                    }
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
            n = tokio::time::timeout(opts.idle_timeout, stream.read(&mut chunk)) => match n {
                Err(_) => {
                    tracing::debug!("rpc connection idle for {:?}: closed", opts.idle_timeout);
                    return;
                }
                Ok(Err(_)) => return,
                Ok(Ok(0)) => {
                    // EOF inside a value (a client that half-closed after a truncated
                    // request): say so, if it still reads.
                    if buf.iter().any(|b| !b.is_ascii_whitespace()) {
                        let reply = error_response(
                            Value::Null,
                            RpcError::PARSE_ERROR,
                            "Parse error: the stream ended inside a JSON value",
                        );
                        let _ = write_reply(&mut stream, &reply).await;
                    }
                    return;
                }
                Ok(Ok(n)) => n,
            },
        };
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Every request object (each one of a batch) must carry the token as `"auth_token"`.
#[allow(clippy::result_large_err)]
fn authorize(token: &AuthToken, value: &Value) -> Result<(), Value> {
    fn offered(v: &Value) -> Option<&[u8]> {
        v.get("auth_token")
            .and_then(Value::as_str)
            .map(str::as_bytes)
    }
    let id = |v: &Value| match v.get("id") {
        Some(id @ (Value::Number(_) | Value::String(_))) => id.clone(),
        _ => Value::Null,
    };
    let check = |v: &Value| {
        // Evaluate the comparison whether or not a token is present.
        let ok = token.matches(offered(v).unwrap_or(&[]));
        if ok && offered(v).is_some() {
            Ok(())
        } else {
            Err(error_response(
                id(v),
                UNAUTHORIZED,
                "Unauthorized: this TCP listener needs \"auth_token\" in every request",
            ))
        }
    };
    match value {
        Value::Array(items) if !items.is_empty() => items.iter().try_for_each(check),
        other => check(other),
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
