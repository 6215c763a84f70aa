//! Controllers shared by every fio thread of the process, one per transport ID (address,
//! subsystem, host NQN; the namespace is not part of the key).
//!
//! fio sizes the files in its main thread (`setup`), then runs each job in its own thread
//! (`thread=1`). The first thread to name an address connects the controller; the others
//! (and later jobs) reuse it and connect only their own I/O qpair. The [`Controller`] itself
//! sits behind a mutex, taken only to create qpairs and read Identify data, and by a small
//! admin thread per controller that calls [`Controller::poll_admin`] every
//! [`ADMIN_POLL`] (keep-alive, AER, reconnect), so keep-alive keeps going while fio is busy
//! elsewhere (between jobs, in a verify phase, while rate-limited). The I/O path never
//! touches the mutex.
//!
//! The registry holds weak references: the controller is disconnected (orderly shutdown)
//! when the last fio thread that used it drops its [`SharedController`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use nvmf_initiator::{Controller, ControllerEvent, ControllerOptions, TransportId};

use crate::error::{EngineError, Result};

/// Period of the admin thread (well under KATO / 2).
pub const ADMIN_POLL: Duration = Duration::from_millis(10);

/// I/O queues asked for at connect: one per fio thread that uses the controller. Targets
/// grant fewer if they must; a thread beyond the grant fails to open its file.
const IO_QUEUES_REQUESTED: u16 = 64;

/// One connected controller, shared by the fio threads that use it.
pub struct SharedController {
    key: String,
    ctrl: Arc<Mutex<Option<Controller>>>,
    stop: Arc<AtomicBool>,
    admin: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for SharedController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedController")
            .field("key", &self.key)
            .finish()
    }
}

impl SharedController {
    /// The controller, for admin work (creating qpairs, Identify). Not for the I/O path.
    pub fn lock(&self) -> Result<MutexGuard<'_, Option<Controller>>> {
        let guard = self.ctrl.lock().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() {
            return Err(EngineError::new(
                libc::ENOTCONN,
                format!("controller {} is gone", self.key),
            ));
        }
        Ok(guard)
    }

    pub fn key(&self) -> &str {
        &self.key
    }
}

impl Drop for SharedController {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.admin.take() {
            h.thread().unpark();
            let _ = h.join();
        }
        let ctrl = self.ctrl.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(c) = ctrl {
            if let Err(e) = c.disconnect() {
                tracing::warn!("disconnecting {}: {e}", self.key);
            }
        }
    }
}

/// The registry key: the transport ID without the namespace.
pub fn key_of(tid: &TransportId) -> String {
    TransportId {
        ns: None,
        ..tid.clone()
    }
    .to_string()
}

fn registry() -> &'static Mutex<HashMap<String, Weak<SharedController>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<String, Weak<SharedController>>>> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The live controller for `tid`, connecting it with `opts` if no fio thread holds one.
/// The registry lock is held while connecting, so two threads never connect the same
/// address twice (connecting takes at most the connect timeout per step).
pub fn get_or_connect(
    tid: &TransportId,
    opts: &ControllerOptions,
) -> Result<Arc<SharedController>> {
    let key = key_of(tid);
    let mut map = registry().lock().unwrap_or_else(|e| e.into_inner());
    map.retain(|_, w| w.strong_count() > 0);
    if let Some(c) = map.get(&key).and_then(Weak::upgrade) {
        return Ok(c);
    }
    let opts = ControllerOptions {
        io_queues: 0,
        io_queues_requested: IO_QUEUES_REQUESTED,
        ..opts.clone()
    };
    let ctrl = Controller::connect(tid, opts)
        .map_err(|e| EngineError::from(e).context(format!("connecting to {key}")))?;
    tracing::info!(
        "connected to {} (cntlid {}, {} I/O queues granted)",
        ctrl.peer(),
        ctrl.info().cntlid,
        ctrl.granted_io_queues()
    );
    let ctrl = Arc::new(Mutex::new(Some(ctrl)));
    let stop = Arc::new(AtomicBool::new(false));
    let admin = {
        let (ctrl, stop, key) = (Arc::clone(&ctrl), Arc::clone(&stop), key.clone());
        std::thread::Builder::new()
            .name("nvmf-fio-admin".into())
            .spawn(move || admin_loop(&ctrl, &stop, &key))
            .map_err(|e| {
                EngineError::new(
                    e.raw_os_error().unwrap_or(libc::EAGAIN),
                    format!("starting the admin thread: {e}"),
                )
            })?
    };
    let shared = Arc::new(SharedController {
        key: key.clone(),
        ctrl,
        stop,
        admin: Some(admin),
    });
    map.insert(key, Arc::downgrade(&shared));
    Ok(shared)
}

/// Keeps the association alive until `stop`; reports controller events on stderr (fio's
/// own messages go there too).
fn admin_loop(ctrl: &Mutex<Option<Controller>>, stop: &AtomicBool, key: &str) {
    let mut lost = false;
    while !stop.load(Ordering::Acquire) {
        if !lost {
            let result = {
                let mut guard = ctrl.lock().unwrap_or_else(|e| e.into_inner());
                match guard.as_mut() {
                    Some(c) => {
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| c.poll_admin()))
                            .unwrap_or_else(|_| {
                                Err(nvmf_initiator::Error::Invalid(
                                    "the admin poll panicked".into(),
                                ))
                            })
                    }
                    None => return,
                }
            };
            match result {
                Ok(events) => {
                    for ev in events {
                        match ev {
                            ControllerEvent::Disconnected { reason } => {
                                say!("{key}: disconnected: {reason}; reconnecting")
                            }
                            ControllerEvent::Reconnected { cntlid } => {
                                say!("{key}: reconnected (cntlid {cntlid})")
                            }
                            other => tracing::info!("{key}: {other:?}"),
                        }
                    }
                }
                Err(e) => {
                    // I/O on its qpairs now fails (or has failed) with the reason.
                    say!("{key}: {e}");
                    lost = true;
                }
            }
        }
        std::thread::park_timeout(ADMIN_POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_ignores_the_namespace() {
        let a: TransportId = "trtype=RDMA traddr=10.0.0.1 subnqn=nqn.x ns=1"
            .parse()
            .unwrap();
        let b: TransportId = "trtype:RDMA traddr:10.0.0.1 subnqn:nqn.x ns:2"
            .parse()
            .unwrap();
        let c: TransportId = "trtype=RDMA traddr=10.0.0.1 subnqn=nqn.y ns=1"
            .parse()
            .unwrap();
        assert_eq!(key_of(&a), key_of(&b));
        assert_ne!(key_of(&a), key_of(&c));
        assert!(!key_of(&a).contains("ns:"));
    }
}
