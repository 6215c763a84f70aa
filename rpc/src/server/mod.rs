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
//! - A client silent for [`ServerOptions::idle_timeout`] (60 s), or one that takes no reply
//!   bytes for as long, is closed; beyond
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
//! The method table is a jsonrpsee [`RpcModule`](jsonrpsee::RpcModule); every method forwards
//! to one dispatch closure ([`CallFn`]) that runs on a blocking thread, so a handler may wait
//! (for poll groups, say) without stalling other connections. The envelope (ids of any JSON
//! type, notifications, batches) is handled here and each call is handed to the module with a
//! numeric id.
//!
//! Layout: `options` (limits, the TCP token), `socket_file` (creating the Unix socket file
//! safely), `listener` (the accept loop and [`ServerHandle`]), `connection` (one client's
//! read/answer loop), `framing` (where one JSON value ends in the byte stream) and `dispatch`
//! (the JSON-RPC envelope and the method table).

use std::sync::Arc;

use serde_json::Value;

use crate::RpcError;

mod connection;
mod dispatch;
mod framing;
mod listener;
mod options;
mod socket_file;

pub use connection::serve_stream;
pub use dispatch::build_module;
pub(crate) use framing::{Next, Scanner};
pub use listener::{serve_tcp, serve_unix, ServerHandle};
pub use options::{AuthToken, ServerOptions};
pub use socket_file::{group_id, judge_existing, Existing};

/// What the target supplies: runs one method with its (optional) params.
pub type CallFn = Arc<dyn Fn(&str, Option<Value>) -> Result<Value, RpcError> + Send + Sync>;

/// JSON-RPC's "server error" range: the request named no valid `auth_token`.
pub const UNAUTHORIZED: i32 = -32001;
/// The server is at [`ServerOptions::max_connections`].
pub const TOO_MANY_CONNECTIONS: i32 = -32002;
