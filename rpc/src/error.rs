//! JSON-RPC 2.0 errors as SPDK reports them: the protocol's codes for protocol faults, negative
//! errno values for domain errors ("no such bdev" is `-ENODEV`, "NQN exists" is `-EEXIST`).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message} (code {code})")]
pub struct RpcError {
    pub code: i32,
    pub message: String,
}

impl RpcError {
    pub const PARSE_ERROR: i32 = -32700;
    pub const INVALID_REQUEST: i32 = -32600;
    pub const METHOD_NOT_FOUND: i32 = -32601;
    pub const INVALID_PARAMS: i32 = -32602;
    pub const INTERNAL_ERROR: i32 = -32603;

    pub fn new(code: i32, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    pub fn invalid_params(message: impl Into<String>) -> Self {
        Self::new(Self::INVALID_PARAMS, message)
    }

    /// A domain error reported as SPDK does: the negated errno and a readable message.
    pub fn errno(errno: i32, message: impl Into<String>) -> Self {
        Self::new(-errno, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(Self::INTERNAL_ERROR, message)
    }
}

/// Why a server could not start. Each case names what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{path}: {source}")]
    Path {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("{0} is in use by a running server (stop it, or pick another path with -r)")]
    InUse(std::path::PathBuf),
    #[error("{path} belongs to uid {owner}, not to us (uid {us}): refusing to replace it")]
    NotOurs {
        path: std::path::PathBuf,
        owner: u32,
        us: u32,
    },
    #[error(
        "{0} exists and is not a socket (a symlink, file or directory): refusing to replace it"
    )]
    NotASocket(std::path::PathBuf),
    #[error("{0}: a socket path longer than 107 bytes cannot be bound")]
    PathTooLong(std::path::PathBuf),
    #[error(
        "refusing to serve JSON-RPC on {0} without authentication: a non-loopback address needs a token file (--rpc-token-file)"
    )]
    NotLoopback(std::net::SocketAddr),
    #[error("no group {0} in /etc/group")]
    NoSuchGroup(String),
    #[error("token file {path}: {why}")]
    Token {
        path: std::path::PathBuf,
        why: String,
    },
}
