//! A blocking JSON-RPC client speaking the same unframed stream as SPDK's `rpc.py`.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};

use crate::server::{Next, Scanner};
use crate::RpcError;

/// `rpc.py`'s default TCP port when `-s` names an IP address.
pub const DEFAULT_TCP_PORT: u16 = 5260;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Unix(PathBuf),
    Tcp(String),
}

impl Endpoint {
    /// Reads `-s`/`-p` as `rpc.py` does: a path (absolute, relative with a slash, or existing)
    /// is a Unix socket; anything else is a host, joined with `port` unless it already carries
    /// one (`127.0.0.1:5260`, `[::1]:5260`).
    pub fn parse(server: &str, port: Option<u16>) -> Self {
        if server.contains('/') || std::path::Path::new(server).exists() {
            return Endpoint::Unix(PathBuf::from(server));
        }
        if port.is_none() && server.parse::<std::net::SocketAddr>().is_ok() {
            return Endpoint::Tcp(server.to_string());
        }
        let port = port.unwrap_or(DEFAULT_TCP_PORT);
        if server.contains(':') && !server.starts_with('[') {
            Endpoint::Tcp(format!("[{server}]:{port}"))
        } else {
            Endpoint::Tcp(format!("{server}:{port}"))
        }
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Unix(p) => write!(f, "{}", p.display()),
            Endpoint::Tcp(a) => write!(f, "{a}"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to {endpoint}: {source}")]
    Connect { endpoint: String, source: io::Error },
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("timed out waiting for the response")]
    Timeout,
    #[error("connection closed before a complete response")]
    Closed,
    #[error("invalid response: {0}")]
    Protocol(String),
    /// The server answered with an error object; `request` is what was sent.
    #[error("{error}")]
    Rpc { request: Value, error: RpcError },
}

trait Stream: Read + Write + Send {}
impl<T: Read + Write + Send> Stream for T {}

pub struct Client {
    stream: Box<dyn Stream>,
    buf: Vec<u8>,
    next_id: u64,
    auth_token: Option<String>,
}

impl Client {
    /// Connects; `timeout` bounds each response wait (rpc.py's `-t`).
    pub fn connect(endpoint: &Endpoint, timeout: Option<Duration>) -> Result<Self, ClientError> {
        let connect_err = |source| ClientError::Connect {
            endpoint: endpoint.to_string(),
            source,
        };
        let stream: Box<dyn Stream> = match endpoint {
            Endpoint::Unix(path) => {
                let s = UnixStream::connect(path).map_err(connect_err)?;
                s.set_read_timeout(timeout)?;
                Box::new(s)
            }
            Endpoint::Tcp(addr) => {
                let s = TcpStream::connect(addr).map_err(connect_err)?;
                s.set_read_timeout(timeout)?;
                Box::new(s)
            }
        };
        Ok(Self {
            stream,
            buf: Vec::new(),
            next_id: 1,
            auth_token: None,
        })
    }

    /// Sends `token` as `"auth_token"` with every request (a TCP listener opened beyond
    /// loopback asks for it).
    pub fn set_auth_token(&mut self, token: Option<String>) {
        self.auth_token = token;
    }

    /// The request object `call` would send next (for printing on error, as rpc.py does).
    pub fn request(&self, method: &str, params: Option<&Value>) -> Value {
        let mut req = json!({"jsonrpc": "2.0", "method": method, "id": self.next_id});
        if let Some(p) = params {
            req["params"] = p.clone();
        }
        req
    }

    /// Calls `method` and returns its result, or the server's error.
    pub fn call(&mut self, method: &str, params: Option<Value>) -> Result<Value, ClientError> {
        let req = self.request(method, params.as_ref());
        let id = self.next_id;
        self.next_id += 1;
        // The token goes on the wire but not into `req`, which errors print.
        let mut wire = req.clone();
        if let Some(t) = &self.auth_token {
            wire["auth_token"] = json!(t);
        }
        let mut bytes =
            serde_json::to_vec(&wire).map_err(|e| ClientError::Protocol(e.to_string()))?;
        bytes.push(b'\n');
        self.stream.write_all(&bytes)?;
        self.stream.flush()?;
        loop {
            let resp = self.read_value()?;
            if resp.get("id") != Some(&json!(id)) {
                // Not ours (a stale answer); rpc.py skips these too.
                if resp.get("id").is_some_and(|v| !v.is_null()) {
                    continue;
                }
            }
            if let Some(err) = resp.get("error") {
                let error: RpcError = serde_json::from_value(err.clone())
                    .map_err(|e| ClientError::Protocol(format!("error object {err}: {e}")))?;
                return Err(ClientError::Rpc {
                    request: req,
                    error,
                });
            }
            return resp
                .get("result")
                .cloned()
                .ok_or_else(|| ClientError::Protocol(format!("no result in {resp}")));
        }
    }

    fn read_value(&mut self) -> Result<Value, ClientError> {
        let mut scan = Scanner::default();
        let mut chunk = [0u8; 16 << 10];
        loop {
            match scan.next_value(&self.buf) {
                Next::Value(v, n) => {
                    self.buf.drain(..n);
                    return Ok(v);
                }
                Next::Invalid(e) => return Err(ClientError::Protocol(e)),
                Next::Empty | Next::NeedMore => {}
            }
            let n = match self.stream.read(&mut chunk) {
                Ok(0) => return Err(ClientError::Closed),
                Ok(n) => n,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(ClientError::Timeout)
                }
                Err(e) => return Err(e.into()),
            };
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}
