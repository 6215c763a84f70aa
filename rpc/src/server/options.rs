//! What a server is configured with: connection limits, the Unix socket's mode and group,
//! and the shared secret TCP clients must present.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::ServeError;

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
    /// is closed (rpc.py opens one connection per invocation and waits 60 s for an answer);
    /// so is one that takes no bytes of a reply for this long.
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
