//! Listening: binds a Unix or TCP socket, runs the accept loop on its own thread and runtime
//! (one task per connection, refusing clients beyond the limit), and stops it all again when
//! the [`ServerHandle`] goes.

use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use jsonrpsee::RpcModule;
use serde_json::Value;
use tokio::sync::{watch, Semaphore};

use super::connection::{serve_connection, write_reply};
use super::dispatch::error_response;
use super::socket_file::{bind_private, clear_stale};
use super::{ServerOptions, TOO_MANY_CONNECTIONS};
use crate::ServeError;

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
            Conn::Unix(mut s) => write_reply(&mut s, &reply, limit).await,
            Conn::Tcp(mut s) => write_reply(&mut s, &reply, limit).await,
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
