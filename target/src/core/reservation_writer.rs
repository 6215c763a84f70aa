//! Where a namespace's reservation changes reach its PTPL file: a thread of its own (one
//! per namespace with a `ptpl_file`, started with it, ending with it), so a reactor never
//! waits for `write` + `fsync` + `rename` + a directory sync, and a file that hangs (a dead
//! NFS server, say) holds back only its own namespace. A reservation command that needs
//! the file queues its new state and a [`Ticket`], goes pending, and completes when the
//! ticket says how the write went; meanwhile its reactor serves everyone else (and a host
//! flooding Register cannot stall it).
//!
//! Order: every namespace has at most one write in flight. A change made while one is in
//! flight starts from the newest state (written or not) and waits for the next write, which
//! carries it and every change queued with it. A state is installed (seen by I/O and by
//! Reservation Report) only once written, so what a host was told succeeded survives a
//! restart; a failed write installs nothing, and fails the changes queued behind it too,
//! since they were made on top of it.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;

use super::ptpl::store_ptpl;
use super::ResvShared;

/// How one reservation change's write went, read by the reactor that waits for it.
#[derive(Debug, Default)]
pub struct Ticket(AtomicU8);

const WAITING: u8 = 0;
const WRITTEN: u8 = 1;
const FAILED: u8 = 2;

impl Ticket {
    /// None while the write is to come; then whether it reached the file.
    pub fn outcome(&self) -> Option<bool> {
        match self.0.load(Ordering::Acquire) {
            WAITING => None,
            state => Some(state == WRITTEN),
        }
    }

    fn settle(&self, written: bool) {
        self.0
            .store(if written { WRITTEN } else { FAILED }, Ordering::Release);
    }

    /// Blocks until the write is done (control-plane callers and tests, never a reactor).
    pub fn wait(&self) -> bool {
        loop {
            if let Some(written) = self.outcome() {
                return written;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}

/// Changes of one namespace not yet installed, under its writer lock.
#[derive(Debug, Default)]
pub(super) struct Queued {
    /// The tickets of the changes the next write carries.
    pub tickets: Vec<Arc<Ticket>>,
    /// A write of this namespace is queued or running on the writer thread.
    pub in_flight: bool,
}

/// Starts the writer thread of one namespace: it writes whatever namespace state it is
/// handed, and ends once `Sender` is dropped (with its namespace) and its queue is empty.
pub(super) fn start_writer() -> Sender<Arc<ResvShared>> {
    let (tx, rx) = channel::<Arc<ResvShared>>();
    std::thread::Builder::new()
        .name("nvmf-ptpl".into())
        .spawn(move || {
            for shared in rx {
                write_queued(&shared);
            }
        })
        .expect("spawn a PTPL writer thread");
    tx
}

/// Hands namespace `shared` to its writer thread (the caller set `in_flight`).
pub(super) fn schedule(writer: &Sender<Arc<ResvShared>>, shared: Arc<ResvShared>) {
    if writer.send(Arc::clone(&shared)).is_err() {
        // The thread is gone (it never ends while the sender lives): fail what waits.
        fail_queued(&shared);
    }
}

/// Writes the newest state of `shared` until no change is left queued.
fn write_queued(shared: &ResvShared) {
    loop {
        let (state, tickets) = {
            let mut w = shared.writer.lock().unwrap_or_else(|e| e.into_inner());
            if w.queued.tickets.is_empty() {
                w.queued.in_flight = false;
                return;
            }
            (Arc::clone(&w.head), std::mem::take(&mut w.queued.tickets))
        };
        let installed = shared.current.load_full();
        let path = shared
            .ptpl_file
            .as_deref()
            .expect("only PTPL namespaces queue writes");
        // Switching PTPL off is written too: the file must not restore a state later.
        let written = if state.ptpl || installed.ptpl {
            store_ptpl(path, &shared.bdev_uuid, &state)
                .map_err(|e| tracing::error!("cannot persist reservations: {e}"))
                .is_ok()
        } else {
            true
        };
        let mut w = shared.writer.lock().unwrap_or_else(|e| e.into_inner());
        if written {
            shared.install(state);
        } else {
            // The changes queued meanwhile were made on top of the failed state: they go too.
            w.head = shared.current.load_full();
            for t in w.queued.tickets.drain(..) {
                t.settle(false);
            }
        }
        for t in tickets {
            t.settle(written);
        }
    }
}

fn fail_queued(shared: &ResvShared) {
    let mut w = shared.writer.lock().unwrap_or_else(|e| e.into_inner());
    w.head = shared.current.load_full();
    w.queued.in_flight = false;
    for t in w.queued.tickets.drain(..) {
        t.settle(false);
    }
}
