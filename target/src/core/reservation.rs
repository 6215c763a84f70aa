//! Reservations of a namespace (NVMe 2.0 base, 8.19): the registrants, the reservation and its
//! holder, the state machine of Reservation Register, Acquire and Release, the access check
//! every I/O command passes, Persist Through Power Loss (SPDK's `ptpl_file`, a JSON file; read
//! and written in `reservation_ptpl.rs`) and each controller's Reservation Notification log.
//!
//! Sharing: every reactor checks I/O against the same namespace, so the state is one immutable
//! [`ResvState`] behind an [`ArcSwap`], with a change counter beside it. A reservation
//! command, which is rare, takes the namespace's writer lock, computes the next state from a
//! copy, swaps it in and moves the counter on before the command completes, so every command
//! submitted after that completion sees it. When PTPL is on, the state is handed to the
//! namespace's PTPL writer thread instead (`reservation_writer.rs`), which swaps it in once
//! the file holds it; the command waits pending meanwhile, and its reactor does not. Each
//! reactor keeps the state it last loaded ([`ResvView`]): its I/O reads the counter (a plain
//! load, no lock, no write) and loads the state again only when the counter moved. (An `ArcSwap` load per I/O
//! writes the reader's debt slot, which writers also write, and cost some 70 instructions.)
//!
//! Hosts are named by their Host Identifier (the 128-bit host ID of Connect), so every
//! controller of one host shares its registration, as the spec and SPDK/nvmet do.
//!
//! Where SPDK (`lib/nvmf/subsystem.c`) and nvmet (`drivers/nvme/target/pr.c`) differ, each
//! choice below says which one it follows.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use nvmf_common::spec::reservation::{
    AcquireAction, AcquireData, Cptpl, NotificationType, RegisterAction, RegisterData,
    ReleaseAction, ReservationAcquire, ReservationNotificationLog, ReservationRegister,
    ReservationRelease, ReservationType, NOTIFICATION_MASK_ALL,
};
use nvmf_common::spec::Status;
use zerocopy::FromZeros;

/// A host as reservations know it: the Host Identifier of its Connect.
pub type HostId = [u8; 16];

/// Registrants a namespace holds at most: SPDK's `SPDK_NVMF_MAX_NUM_REGISTRANTS`, so a PTPL
/// file written here loads in SPDK too. One more Register is answered Internal Error, as SPDK.
pub const MAX_REGISTRANTS: usize = 16;

/// Reservation Notification log pages a controller queues (the count field of the page is
/// a byte); past that a notice is counted but lost, as in SPDK.
pub const NOTICE_QUEUE_MAX: usize = 255;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registrant {
    pub hostid: HostId,
    pub rkey: u64,
}

/// Which command group an I/O command belongs to (NVMe 2.0 base, Figure 170/171).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Read, Compare (the Read command group).
    Read,
    /// Write, Write Zeroes, Dataset Management, Flush (the Write command group).
    Write,
}

/// A notice for the controllers of one host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Notice {
    pub hostid: HostId,
    pub kind: NotificationType,
}

fn is_all_registrants(t: ReservationType) -> bool {
    matches!(
        t,
        ReservationType::WRITE_EXCLUSIVE_ALL_REGISTRANTS
            | ReservationType::EXCLUSIVE_ACCESS_ALL_REGISTRANTS
    )
}

fn is_registrants_only(t: ReservationType) -> bool {
    matches!(
        t,
        ReservationType::WRITE_EXCLUSIVE_REGISTRANTS_ONLY
            | ReservationType::EXCLUSIVE_ACCESS_REGISTRANTS_ONLY
    )
}

fn valid_type(t: ReservationType) -> bool {
    (1..=6).contains(&t.0)
}

const CONFLICT: Status = Status::RESERVATION_CONFLICT.with_dnr();
const INVALID: Status = Status::INVALID_FIELD.with_dnr();

/// The reservation state of one namespace. Invariants: `rtype` and `holder` are both set or
/// both unset, and the holder is a registrant. For the All Registrants types every registrant
/// holds the reservation; `holder` then names one of them (the first registered, as SPDK),
/// which is what a PTPL file records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResvState {
    /// PRGEN: bumped by every successful Register (any action), Preempt and Clear.
    pub generation: u32,
    /// In order of registration.
    pub registrants: Vec<Registrant>,
    pub rtype: Option<ReservationType>,
    pub holder: Option<HostId>,
    /// Persist Through Power Loss is active.
    pub ptpl: bool,
}

impl ResvState {
    pub fn registrant(&self, host: &HostId) -> Option<&Registrant> {
        self.registrants.iter().find(|r| r.hostid == *host)
    }

    /// Whether `host` holds the reservation (for All Registrants types: is a registrant).
    pub fn is_holder(&self, host: &HostId) -> bool {
        match self.rtype {
            None => false,
            Some(t) if is_all_registrants(t) => self.registrant(host).is_some(),
            Some(_) => self.holder == Some(*host),
        }
    }

    /// The access check of every I/O command (NVMe 2.0 base, Figure 170 "Command Behavior in
    /// the Presence of a Reservation"): the holder may do anything; otherwise
    ///
    /// | type | non-registrant read / write | registrant read / write |
    /// | --- | --- | --- |
    /// | Write Exclusive | ok / conflict | ok / conflict |
    /// | Exclusive Access | conflict / conflict | conflict / conflict |
    /// | WE Registrants Only, WE All Registrants | ok / conflict | ok / ok |
    /// | EA Registrants Only, EA All Registrants | conflict / conflict | ok / ok |
    pub fn check(&self, host: &HostId, access: Access) -> Result<(), Status> {
        let Some(rtype) = self.rtype else {
            return Ok(());
        };
        if self.holder == Some(*host) {
            return Ok(());
        }
        let registrant = || self.registrant(host).is_some();
        let allowed = match rtype {
            ReservationType::WRITE_EXCLUSIVE => access == Access::Read,
            ReservationType::EXCLUSIVE_ACCESS => false,
            ReservationType::WRITE_EXCLUSIVE_REGISTRANTS_ONLY
            | ReservationType::WRITE_EXCLUSIVE_ALL_REGISTRANTS => {
                access == Access::Read || registrant()
            }
            _ => registrant(),
        };
        if allowed {
            Ok(())
        } else {
            Err(CONFLICT)
        }
    }

    fn others(&self, host: &HostId) -> Vec<HostId> {
        self.registrants
            .iter()
            .map(|r| r.hostid)
            .filter(|h| h != host)
            .collect()
    }

    fn add(&mut self, host: &HostId, rkey: u64) -> Result<(), Status> {
        if self.registrants.len() >= MAX_REGISTRANTS {
            tracing::warn!(
                max = MAX_REGISTRANTS,
                "reservation registrant list full: register refused"
            );
            return Err(Status::INTERNAL_ERROR);
        }
        self.registrants.push(Registrant {
            hostid: *host,
            rkey,
        });
        Ok(())
    }

    /// Unregisters `host`; returns the type of the reservation that went with it, if its
    /// holder left and no other registrant takes it over (All Registrants types pass it on).
    fn unregister_one(&mut self, host: &HostId) -> Option<ReservationType> {
        self.registrants.retain(|r| r.hostid != *host);
        if self.holder != Some(*host) {
            return None;
        }
        let rtype = self.rtype.expect("a holder holds a reservation");
        if is_all_registrants(rtype) {
            if let Some(next) = self.registrants.first() {
                self.holder = Some(next.hostid);
                return None;
            }
        }
        self.holder = None;
        self.rtype = None;
        Some(rtype)
    }

    /// Unregisters every registrant with key `rkey` except `keep`; returns how many went.
    fn unregister_by_key(&mut self, rkey: u64, keep: Option<&HostId>) -> usize {
        let victims: Vec<HostId> = self
            .registrants
            .iter()
            .filter(|r| r.rkey == rkey && Some(&r.hostid) != keep)
            .map(|r| r.hostid)
            .collect();
        for h in &victims {
            self.unregister_one(h);
        }
        victims.len()
    }

    fn released_notices(&self, host: &HostId) -> Vec<Notice> {
        self.others(host)
            .into_iter()
            .map(|hostid| Notice {
                hostid,
                kind: NotificationType::RESERVATION_RELEASED,
            })
            .collect()
    }

    /// Reservation Register (NVM command set 7.3). Register with a key already registered
    /// by this host succeeds; NRKEY 0 is Invalid Field (SPDK). Replace by a host not registered
    /// registers it when IEKEY is set (SPDK; nvmet answers Conflict). CPTPL takes effect only
    /// when the command succeeds.
    pub fn register(
        &mut self,
        host: &HostId,
        cmd: ReservationRegister,
        data: RegisterData,
        ptpl_capable: bool,
    ) -> Result<Vec<Notice>, Status> {
        let (crkey, nrkey) = (data.crkey.get(), data.nrkey.get());
        match cmd.cptpl {
            Cptpl::NO_CHANGE | Cptpl::CLEAR => {}
            Cptpl::SET if ptpl_capable => {}
            _ => return Err(INVALID),
        }
        let mut notices = Vec::new();
        let current = self.registrant(host).copied();
        match cmd.action {
            RegisterAction::REGISTER => {
                if nrkey == 0 {
                    return Err(INVALID);
                }
                match current {
                    None => self.add(host, nrkey)?,
                    Some(r) if r.rkey == nrkey => {}
                    Some(_) => return Err(CONFLICT),
                }
            }
            RegisterAction::UNREGISTER => {
                match current {
                    Some(r) if cmd.iekey || r.rkey == crkey => {}
                    _ => return Err(CONFLICT),
                }
                // A Registrants Only reservation ends with its holder's registration; the
                // other registrants lose their access and hear of it (SPDK and nvmet alike).
                if let Some(t) = self.unregister_one(host) {
                    if is_registrants_only(t) {
                        notices = self.released_notices(host);
                    }
                }
            }
            RegisterAction::REPLACE => {
                if nrkey == 0 {
                    return Err(INVALID);
                }
                match current {
                    Some(r) if cmd.iekey || r.rkey == crkey => {
                        let r = self
                            .registrants
                            .iter_mut()
                            .find(|r| r.hostid == *host)
                            .expect("registered");
                        r.rkey = nrkey;
                    }
                    None if cmd.iekey => self.add(host, nrkey)?,
                    _ => return Err(CONFLICT),
                }
            }
            _ => return Err(INVALID),
        }
        match cmd.cptpl {
            Cptpl::CLEAR => self.ptpl = false,
            Cptpl::SET => self.ptpl = true,
            _ => {}
        }
        self.generation = self.generation.wrapping_add(1);
        Ok(notices)
    }

    /// Reservation Acquire (NVM command set 7.2). IEKEY is Invalid Field (obsolete for
    /// Acquire since NVMe 1.3; SPDK and nvmet alike). Preempt and Abort preempts exactly as
    /// Preempt does; see [`Self::preempt`].
    pub fn acquire(
        &mut self,
        host: &HostId,
        cmd: ReservationAcquire,
        data: AcquireData,
    ) -> Result<Vec<Notice>, Status> {
        if cmd.iekey || !valid_type(cmd.rtype) {
            return Err(INVALID);
        }
        match self.registrant(host) {
            Some(r) if r.rkey == data.crkey.get() => {}
            _ => return Err(CONFLICT),
        }
        match cmd.action {
            AcquireAction::ACQUIRE => match self.rtype {
                None => {
                    self.rtype = Some(cmd.rtype);
                    self.holder = Some(*host);
                    Ok(Vec::new())
                }
                // The holder acquiring the type it holds is no error (nor a change).
                Some(t) if t == cmd.rtype && self.is_holder(host) => Ok(Vec::new()),
                Some(_) => Err(CONFLICT),
            },
            AcquireAction::PREEMPT | AcquireAction::PREEMPT_AND_ABORT => {
                let notices = self.preempt(host, cmd.rtype, data.prkey.get())?;
                self.generation = self.generation.wrapping_add(1);
                Ok(notices)
            }
            _ => Err(INVALID),
        }
    }

    /// Preempt (NVMe 2.0 base, 8.19.9 and Figure 566), as nvmet decides each case:
    /// - no reservation: registrants with key PRKEY are unregistered (none: Conflict);
    /// - All Registrants type: PRKEY 0 makes the preempting host sole registrant and holder of
    ///   a reservation of the new type; another PRKEY unregisters its registrants (none:
    ///   Conflict);
    /// - the holder preempting with its own key changes the type;
    /// - PRKEY equal to the holder's key: the preempting host becomes holder of a reservation
    ///   of the new type and every other registrant with that key is unregistered;
    /// - any other nonzero PRKEY unregisters its registrants (none: Conflict), the
    ///   reservation stays; PRKEY 0 is Invalid Field.
    ///
    /// Unregistered hosts get Registration Preempted; when the type changed, the remaining
    /// registrants get Reservation Released (nvmet; SPDK sends it even without a change).
    ///
    /// Preempt and Abort is this too: the state changes before the command completes, so every
    /// command a preempted host submits afterwards is refused; commands it had already handed
    /// to a bdev finish normally (SPDK instead holds the Preempt and Abort completion until
    /// those have drained, nvmet waits on per-controller references).
    fn preempt(
        &mut self,
        host: &HostId,
        rtype: ReservationType,
        prkey: u64,
    ) -> Result<Vec<Notice>, Status> {
        let before = self.others(host);
        let old_type = self.rtype;
        match (self.rtype, self.holder) {
            (None, _) | (Some(_), None) => {
                if self.unregister_by_key(prkey, None) == 0 {
                    return Err(CONFLICT);
                }
            }
            (Some(t), Some(_)) if is_all_registrants(t) => {
                if prkey == 0 {
                    self.rtype = Some(rtype);
                    self.holder = Some(*host);
                    self.registrants.retain(|r| r.hostid == *host);
                } else if self.unregister_by_key(prkey, None) == 0 {
                    return Err(CONFLICT);
                }
            }
            (Some(_), Some(holder)) => {
                let holder_key = self.registrant(&holder).map(|r| r.rkey);
                if holder == *host && holder_key == Some(prkey) {
                    self.rtype = Some(rtype);
                } else if holder_key == Some(prkey) {
                    // The new holder first, so removing the old one does not release it.
                    self.holder = Some(*host);
                    self.rtype = Some(rtype);
                    self.unregister_by_key(prkey, Some(host));
                } else if prkey != 0 {
                    if self.unregister_by_key(prkey, None) == 0 {
                        return Err(CONFLICT);
                    }
                } else {
                    return Err(INVALID);
                }
            }
        }
        let after = self.others(host);
        let mut notices: Vec<Notice> = before
            .into_iter()
            .filter(|h| !after.contains(h))
            .map(|hostid| Notice {
                hostid,
                kind: NotificationType::REGISTRATION_PREEMPTED,
            })
            .collect();
        if old_type.is_some() && self.rtype.is_some() && old_type != self.rtype {
            notices.extend(self.released_notices(host));
        }
        Ok(notices)
    }

    /// Reservation Release (NVM command set 7.4). Release by a registrant that does not hold
    /// the reservation, or when there is none, succeeds and changes nothing (nvmet's order:
    /// the holder test comes before the type test); the holder naming another type is
    /// Invalid Field (the spec and SPDK; nvmet answers Conflict). Releasing a Registrants Only
    /// or All Registrants reservation tells the other registrants (Reservation Released);
    /// Clear tells them Reservation Preempted.
    pub fn release(
        &mut self,
        host: &HostId,
        cmd: ReservationRelease,
        crkey: u64,
    ) -> Result<Vec<Notice>, Status> {
        if cmd.iekey {
            return Err(INVALID);
        }
        match self.registrant(host) {
            Some(r) if r.rkey == crkey => {}
            _ => return Err(CONFLICT),
        }
        match cmd.action {
            ReleaseAction::RELEASE => {
                let Some(t) = self.rtype else {
                    return Ok(Vec::new());
                };
                if !self.is_holder(host) {
                    return Ok(Vec::new());
                }
                if t != cmd.rtype {
                    return Err(INVALID);
                }
                self.rtype = None;
                self.holder = None;
                if matches!(
                    t,
                    ReservationType::WRITE_EXCLUSIVE | ReservationType::EXCLUSIVE_ACCESS
                ) {
                    return Ok(Vec::new());
                }
                Ok(self.released_notices(host))
            }
            ReleaseAction::CLEAR => {
                let others = self.others(host);
                self.registrants.clear();
                self.rtype = None;
                self.holder = None;
                self.generation = self.generation.wrapping_add(1);
                Ok(others
                    .into_iter()
                    .map(|hostid| Notice {
                        hostid,
                        kind: NotificationType::RESERVATION_PREEMPTED,
                    })
                    .collect())
            }
            _ => Err(INVALID),
        }
    }
}

/// The reservation side of a namespace, shared by every reactor (and, with a PTPL file, by
/// the writer thread that installs what it wrote).
pub struct NsReservation {
    shared: Arc<ResvShared>,
    /// This namespace's PTPL writer thread, with a `ptpl_file`: dropped with the namespace,
    /// which ends the thread once it has written what was queued.
    writer: Option<std::sync::mpsc::Sender<Arc<ResvShared>>>,
}

pub(crate) struct ResvShared {
    /// The installed state: what I/O is checked against and Reservation Report shows.
    current: ArcSwap<ResvState>,
    /// Moved on after every store to `current` (Release), so a reactor that reads it
    /// unchanged (Acquire) knows the state it holds is still current.
    changes: AtomicU64,
    /// Serialises the (rare) reservation commands and feature changes of this namespace.
    writer: Mutex<Writer>,
    ptpl_file: Option<PathBuf>,
    bdev_uuid: [u8; 16],
}

/// Under the writer lock: the state the next change starts from, and what waits for the
/// PTPL file.
struct Writer {
    /// The newest state: `current`, or a newer one queued for the file.
    head: Arc<ResvState>,
    queued: writer::Queued,
}

impl ResvShared {
    /// Makes `state` the one I/O and reports see.
    fn install(&self, state: Arc<ResvState>) {
        self.current.store(state);
        self.changes.fetch_add(1, Ordering::Release);
    }
}

/// What a reservation change did: the notices it raised, and, when its state must reach the
/// PTPL file first, the ticket that says when it has (the command completes then).
#[derive(Debug)]
pub struct Updated {
    pub notices: Vec<Notice>,
    pub persisting: Option<Arc<Ticket>>,
}

impl std::fmt::Debug for NsReservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NsReservation")
            .field("state", &*self.shared.current.load())
            .field("ptpl_file", &self.shared.ptpl_file)
            .finish()
    }
}

/// One reactor's copy of a namespace's reservation state, checked by each of its I/O
/// commands. Refreshed only when the namespace's change counter moved, so an I/O reads one
/// shared word and writes nothing shared.
#[derive(Debug)]
pub struct ResvView {
    seen: u64,
    state: Arc<ResvState>,
}

impl ResvView {
    /// The I/O path's check, against the state `of` holds now.
    #[inline]
    pub fn check(
        &mut self,
        of: &NsReservation,
        host: &HostId,
        access: Access,
    ) -> Result<(), Status> {
        if of.shared.changes.load(Ordering::Acquire) != self.seen {
            *self = of.view();
        }
        self.state.check(host, access)
    }
}

impl NsReservation {
    /// A namespace's reservations; with a PTPL file, the state it holds (a missing file is an
    /// empty state with PTPL off, as SPDK; an unreadable or malformed one is an error).
    pub fn new(bdev_uuid: [u8; 16], ptpl_file: Option<PathBuf>) -> Result<Self, PtplError> {
        let state = Arc::new(match &ptpl_file {
            Some(path) => load_ptpl(path, &bdev_uuid)?,
            None => ResvState::default(),
        });
        let shared = ResvShared {
            current: ArcSwap::new(Arc::clone(&state)),
            changes: AtomicU64::new(0),
            writer: Mutex::new(Writer {
                head: state,
                queued: writer::Queued::default(),
            }),
            ptpl_file,
            bdev_uuid,
        };
        let writer = shared.ptpl_file.is_some().then(writer::start_writer);
        Ok(Self {
            shared: Arc::new(shared),
            writer,
        })
    }

    /// A reactor's copy of the current state, for its I/O path.
    pub fn view(&self) -> ResvView {
        // The counter first: a change landing between the two loads leaves the view with a
        // newer state than its count, and the next check loads it again.
        let seen = self.shared.changes.load(Ordering::Acquire);
        ResvView {
            seen,
            state: self.shared.current.load_full(),
        }
    }

    pub fn state(&self) -> Arc<ResvState> {
        self.shared.current.load_full()
    }

    pub fn ptpl_file(&self) -> Option<&Path> {
        self.shared.ptpl_file.as_deref()
    }

    /// PTPL can be switched on only with a file to persist to (SPDK's `ptpl_file`).
    pub fn ptpl_capable(&self) -> bool {
        self.shared.ptpl_file.is_some()
    }

    /// Runs a change on a copy of the newest state. Without PTPL (on now or just switched
    /// off) and with nothing queued for the file, it is installed at once. Otherwise it is
    /// queued for the writer thread, which installs it once written: the caller completes
    /// its command when the returned ticket settles (Internal Error if the write failed,
    /// and then the state stays as it was, so nothing the host was told is lost at restart).
    pub fn update(
        &self,
        change: impl FnOnce(&mut ResvState) -> Result<Vec<Notice>, Status>,
    ) -> Result<Updated, Status> {
        let shared = &self.shared;
        let mut w = shared.writer.lock().unwrap_or_else(|e| e.into_inner());
        let mut next = (*w.head).clone();
        let notices = change(&mut next)?;
        let file_involved = shared.ptpl_file.is_some() && (next.ptpl || w.head.ptpl);
        if !w.queued.in_flight && (!file_involved || next == *w.head) {
            if next != *w.head {
                let next = Arc::new(next);
                w.head = Arc::clone(&next);
                shared.install(next);
            }
            return Ok(Updated {
                notices,
                persisting: None,
            });
        }
        // Behind a queued write (even a change that changes nothing answers from a state
        // that is not yet written), or a change the file must hold first.
        if next != *w.head {
            w.head = Arc::new(next);
        }
        let ticket = Arc::new(Ticket::default());
        w.queued.tickets.push(Arc::clone(&ticket));
        if !std::mem::replace(&mut w.queued.in_flight, true) {
            drop(w);
            let thread = self
                .writer
                .as_ref()
                .expect("only PTPL namespaces queue writes");
            writer::schedule(thread, Arc::clone(shared));
        }
        Ok(Updated {
            notices,
            persisting: Some(ticket),
        })
    }

    /// [`update`](Self::update), waiting for the file (tests and the control plane only:
    /// never on a reactor).
    pub fn update_and_wait(
        &self,
        change: impl FnOnce(&mut ResvState) -> Result<Vec<Notice>, Status>,
    ) -> Result<Vec<Notice>, Status> {
        let updated = self.update(change)?;
        match updated.persisting {
            Some(ticket) if !ticket.wait() => Err(Status::INTERNAL_ERROR),
            _ => Ok(updated.notices),
        }
    }
}

/// One controller's Reservation Notification log (LID 80h) and its Reservation Notification
/// Mask (FID 82h) per namespace. The spec makes the mask a per-controller feature; SPDK and
/// nvmet keep one mask per namespace for all controllers.
#[derive(Debug, Default)]
pub struct NoticeLog {
    /// Log Page Count of the last notice created (0: none yet).
    count: u64,
    queue: VecDeque<ReservationNotificationLog>,
    masks: HashMap<u32, u32>,
}

impl NoticeLog {
    pub fn mask(&self, nsid: u32) -> u32 {
        self.masks.get(&nsid).copied().unwrap_or(0)
    }

    pub fn set_mask(&mut self, nsid: u32, mask: u32) {
        self.masks.insert(nsid, mask & NOTIFICATION_MASK_ALL);
    }

    /// Queues a notice unless the host masked its type for the namespace; returns whether it
    /// was queued (or counted as lost because the queue is full).
    pub fn post(&mut self, nsid: u32, kind: NotificationType) -> bool {
        if self.mask(nsid) & kind.mask_bit() != 0 {
            return false;
        }
        // The count wraps from FFFF_FFFF_FFFF_FFFFh to 1: 0 means an empty page.
        self.count = self.count.checked_add(1).unwrap_or(1);
        if self.queue.len() >= NOTICE_QUEUE_MAX {
            // Lost: the newest queued page carries the count, so the host sees the gap.
            if let Some(last) = self.queue.back_mut() {
                last.count.set(self.count);
            }
            return true;
        }
        let mut page = ReservationNotificationLog::new_zeroed();
        page.count.set(self.count);
        page.log_type = kind.0;
        page.nsid.set(nsid);
        self.queue.push_back(page);
        true
    }

    /// The oldest notice as the log page, removed from the queue, with the number still
    /// queued; a zeroed page (type Empty) when there is none.
    pub fn take(&mut self) -> ReservationNotificationLog {
        let Some(mut page) = self.queue.pop_front() else {
            return ReservationNotificationLog::new_zeroed();
        };
        page.available = self.queue.len().min(255) as u8;
        page
    }

    pub fn pending(&self) -> usize {
        self.queue.len()
    }
}

#[path = "reservation_ptpl.rs"]
mod ptpl;
#[path = "reservation_writer.rs"]
mod writer;
use ptpl::load_ptpl;
pub use ptpl::PtplError;
pub use writer::Ticket;

#[cfg(test)]
#[path = "reservation_tests.rs"]
mod tests;
