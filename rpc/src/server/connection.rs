//! One client connection: reads into an accumulating buffer, answers each complete JSON value
//! as it arrives, and closes on garbage, an oversized request, idleness, a wrong token or
//! shutdown.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use jsonrpsee::RpcModule;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

use super::dispatch::{error_response, handle_value};
use super::framing::{Next, Scanner};
use super::{AuthToken, ServerOptions, UNAUTHORIZED};
use crate::RpcError;

const READ_CHUNK: usize = 64 << 10;

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

pub(super) async fn serve_connection<S: AsyncRead + AsyncWrite + Unpin>(
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
                    let _ = write_reply(&mut stream, &reply, opts.idle_timeout).await;
                    return;
                }
                Next::Value(value, consumed) => {
                    buf.drain(..consumed);
                    scan = Scanner::default();
                    if let Some(token) = token {
                        if let Err(reply) = authorize(token, &value) {
                            // No second guess on the same connection: a client that
                            // guesses must pay a connection per try.
                            let _ = write_reply(&mut stream, &reply, opts.idle_timeout).await;
                            return;
                        }
                    }
                    if let Some(reply) = handle_value(&module, value).await {
                        if write_reply(&mut stream, &reply, opts.idle_timeout)
                            .await
                            .is_err()
                        {
                            return;
                        }
                    }
                }
            }
        }
        if buf.len() > opts.max_request_bytes {
            let message = format!("request exceeds {} bytes", opts.max_request_bytes);
            let reply = error_response(Value::Null, RpcError::INVALID_REQUEST, &message);
            let _ = write_reply(&mut stream, &reply, opts.idle_timeout).await;
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
                        let _ = write_reply(&mut stream, &reply, opts.idle_timeout).await;
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

/// Writes one reply, or gives up after `limit`: a client that sends requests but takes no
/// replies must not hold its connection slot (and a task) for ever once the socket's buffers
/// fill.
pub(super) async fn write_reply<S: AsyncWrite + Unpin>(
    stream: &mut S,
    reply: &Value,
    limit: Duration,
) -> io::Result<()> {
    let mut bytes = serde_json::to_vec(reply).map_err(io::Error::other)?;
    bytes.push(b'\n');
    let write = async {
        stream.write_all(&bytes).await?;
        stream.flush().await
    };
    match tokio::time::timeout(limit, write).await {
        Ok(written) => written,
        Err(_) => {
            tracing::debug!("rpc client took no reply for {limit:?}: closed");
            Err(io::ErrorKind::TimedOut.into())
        }
    }
}
