//! One NVMe-oF RDMA queue (NVMe-oF 1.1, 7.3): an RC queue pair set up through RDMA CM with
//! the NVMe-oF private data, its own completion queue, registered command slots and response
//! buffers.
//!
//! Each command owns a slot `cid` (the CID on the wire) from submission until both its SEND
//! completed locally and its response arrived: the command slot memory may be read by the
//! device until the SEND completes, and the response may come before that completion is
//! polled. Data never passes through this module's memory: commands name the caller's
//! registered buffers with keyed SGLs (the target RDMA READs / WRITEs them) or, for small
//! writes, send them as a second scatter entry of the command SEND (in-capsule data).
//!
//! Responses are 16-byte CQEs, one receive per possible outstanding command. Polling copies
//! completions into a fixed array and reposts the receives before anything else runs, so a
//! command submitted from a completion handler always finds a receive for its response.
//! Nothing on this path locks or allocates.
//!
//! Per-command keys (as the Linux host's fast registration): when the device has type 2
//! memory windows, every CID owns one. A command with data in host memory binds its window
//! over exactly that buffer (a BIND_MW chained before the command SEND) and names the
//! window's fresh key with the Keyed SGL subtype Invalidate (0x0F). The target then either
//! invalidates the key itself with SEND_WITH_INVALIDATE (the receive completion reports
//! which key: it must be the command's), or answers with a plain SEND, and we post a
//! LOCAL_INV. A command completes only once its SEND completed, its response arrived and
//! its key is invalid, so the buffer goes back to the caller only when no late or stray
//! RDMA operation can reach it. The buffer pools themselves are then registered without
//! remote access.
//!
//! The queue is generic over the verbs provider `V` ([`Verbs`]); its clock and idle waits
//! are the provider's ([`Verbs::now`], [`Verbs::sleep`]), and so are its windows
//! ([`Verbs::alloc_mw`]).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use nvmf_common::rdma::{
    AccessFlags, CmEvent, CmEventKind, ConnParams, DmaBuf, QpCaps, RdmaError, RecvWr, SendWr, Sge,
    Verbs, VerbsChannel, VerbsCmId, VerbsContext, VerbsCq, VerbsMr, VerbsMw, VerbsPd, VerbsQp,
    WcStatus, WorkCompletion,
};
use nvmf_common::spec::rdma_cm::{RdmaCmAccept, RdmaCmReject, RdmaCmRejectStatus, RdmaCmRequest};
use nvmf_common::spec::{Command, Completion, SglDescriptor};
use zerocopy::{FromBytes, IntoBytes};

use crate::error::{Error, QueueFault, Result};

/// A CID is the command's slot in its low bits and the slot's generation above them, as
/// Linux's `nvme_cid` does: at most 4,096 slots a queue.
const SLOT_BITS: u32 = 12;
const SLOT_MASK: u16 = (1 << SLOT_BITS) - 1;
const GEN_MASK: u16 = u16::MAX >> SLOT_BITS;
/// The deepest queue a CID can number.
pub(crate) const MAX_QUEUE_DEPTH: u16 = 1 << SLOT_BITS;

/// The smallest admin queue we work with: an AER, a keep-alive and a command at once, and
/// one to spare.
const MIN_ADMIN_CRQSIZE: u16 = 4;

const SQE_LEN: usize = 64;
const CQE_LEN: usize = 16;
/// Work completions taken per `ibv_poll_cq`.
pub(crate) const POLL_BATCH: usize = 32;
/// Receive completions carry this bit in their work request id; command SENDs carry the CID.
const RECV_BIT: u64 = 1 << 63;
/// A LOCAL_INV of the CID's window.
const LOCAL_INV_BIT: u64 = 1 << 62;
/// A BIND_MW of the CID's window (unsignaled: only seen when it fails).
const BIND_BIT: u64 = 1 << 61;
/// Send-queue entries a command may hold at once: window bind, command SEND, LOCAL_INV.
const SENDS_PER_CMD: u32 = 3;
/// IB CM reject reason "invalid service ID": nothing listens on the port.
const IB_CM_REJ_INVALID_SERVICE_ID: i32 = 8;
/// wc_flags bit 2: rxe reports remote invalidation with the kernel's IB_WC_WITH_INVALIDATE
/// value (see `WorkCompletion::invalidated_rkey`).
const RXE_WC_WITH_INVALIDATE: u32 = 1 << 2;

/// Where a command's data is.
pub(crate) enum Data<'a, V: Verbs> {
    None,
    /// Host memory the target reaches with RDMA READ / WRITE under `rkey`, a long-lived
    /// registration's key: the plain ADDRESS subtype, never invalidated.
    Keyed {
        addr: u64,
        len: u32,
        rkey: u32,
    },
    /// `len` bytes at `offset` of `mr`, exposed for this command alone through the CID's
    /// memory window with `access` (see the module docs). Only on queues with
    /// [`RdmaQueue::has_windows`]; `mr` must be registered on the queue's PD with MW_BIND.
    Window {
        mr: &'a Arc<V::Mr>,
        offset: usize,
        len: u32,
        access: AccessFlags,
    },
    /// Data sent inside the command capsule, right after the SQE.
    InCapsule(Sge),
}

// By hand: a derive would ask `V: Copy`, which the fields do not need.
impl<V: Verbs> Clone for Data<'_, V> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<V: Verbs> Copy for Data<'_, V> {}

#[derive(Clone, Copy, Default)]
struct Slot {
    busy: bool,
    /// Bumped at each submission and carried in the CID's top bits: a response for an
    /// earlier command in this slot (a target repeating or replaying one) is told apart from
    /// the response of the command now in it.
    gen: u16,
    send_done: bool,
    rsp: Option<Completion>,
    /// The key of the command's window while it may still be valid.
    key: Option<u32>,
}

impl Slot {
    fn finished(&self) -> bool {
        self.send_done && self.rsp.is_some() && self.key.is_none()
    }
}

/// How the keys of finished commands were invalidated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeyStats {
    /// By the target's SEND_WITH_INVALIDATE.
    pub remote_invalidations: u64,
    /// By our LOCAL_INV, because the target answered with a plain SEND.
    pub local_invalidations: u64,
}

/// Whether `pd`'s device can give each command its own key: type 2 memory windows, and
/// the invalidation verbs.
pub(crate) fn device_has_windows<V: Verbs>(pd: &Arc<V::Pd>) -> bool {
    pd.context()
        .query_device()
        .is_ok_and(|a| a.has_type2_windows())
}

/// A connected queue.
pub(crate) struct RdmaQueue<V: Verbs> {
    // Field order is drop order. Windows first: a bound type 2 window holds a reference on
    // the QP it was bound through, and rxe's QP destruction waits (for long, then warns)
    // for such references to go. Deallocating a window revokes its key, so this is safe
    // whatever state the QP is in. Then the QP (and its CQ) before the CM id and its channel.
    /// One per CID when the queue gives commands their own keys; empty otherwise.
    windows: Vec<V::Mw>,
    qp: V::Qp,
    cq: Arc<V::Cq>,
    id: V::CmId,
    ch: V::Channel,
    cmds: DmaBuf<V>,
    rsps: DmaBuf<V>,
    /// The provider: its clock and idle wait.
    verbs: V,
    slots: Vec<Slot>,
    key_stats: KeyStats,
    /// Free slots, the longest free first: a slot is reused as late as possible.
    free: VecDeque<u16>,
    wcs: [WorkCompletion; POLL_BATCH],
    qid: u16,
    depth: u16,
    peer: SocketAddr,
    disconnected: bool,
    /// A protocol fault found in a poll that had finished commands to hand back first: the
    /// next poll reports it.
    pending_fault: Option<QueueFault>,
}

fn cm_wait<V: Verbs>(
    ch: &V::Channel,
    kind: CmEventKind,
    timeout: Duration,
    peer: SocketAddr,
    qid: u16,
    step: &str,
) -> Result<CmEvent<V::CmId>> {
    match ch.wait_event(kind, timeout) {
        Ok(ev) => Ok(ev),
        Err(RdmaError::CmEventTimeout { .. }) => Err(Error::Timeout {
            what: format!("{step} for {peer} (queue {qid})"),
            after: timeout,
        }),
        Err(RdmaError::UnexpectedCmEvent {
            got,
            status,
            private_data,
            ..
        }) => Err(cm_failure(peer, qid, step, got, status, &private_data)),
        Err(e) => Err(Error::rdma(format!("{step} for {peer}"), e)),
    }
}

/// Turns an unexpected CM event during connection set-up into the error a user can act on.
pub(crate) fn cm_failure(
    peer: SocketAddr,
    qid: u16,
    step: &str,
    got: CmEventKind,
    status: i32,
    private_data: &[u8],
) -> Error {
    let errno = std::io::Error::from_raw_os_error(status.saturating_abs());
    match got {
        CmEventKind::AddrError | CmEventKind::RouteError => Error::Unreachable {
            addr: peer,
            detail: format!("{step} failed: {errno}"),
        },
        CmEventKind::Unreachable => Error::Unreachable {
            addr: peer,
            detail: format!("the peer did not answer the connection request ({errno})"),
        },
        CmEventKind::Rejected => match parse_reject(private_data) {
            Some(sts) => Error::Rejected {
                addr: peer,
                qid,
                reason: match sts.name() {
                    Some(n) => format!("{n} ({:#x})", sts.0),
                    None => format!("status {:#x}", sts.0),
                },
            },
            None if status == IB_CM_REJ_INVALID_SERVICE_ID => Error::Refused {
                addr: peer,
                reason: status,
            },
            None => Error::Rejected {
                addr: peer,
                qid,
                reason: format!("CM reject reason {status}, no NVMe-oF reject data"),
            },
        },
        other => Error::Transport {
            addr: peer,
            qid,
            detail: format!("{step}: unexpected RDMA CM event {other:?} (status {status})"),
        },
    }
}

/// An NVMe-oF RDMA_CM_REJECT record, if the private data holds one (IB/RoCE pad it).
pub(crate) fn parse_reject(private_data: &[u8]) -> Option<RdmaCmRejectStatus> {
    let (rej, _) = RdmaCmReject::read_from_prefix(private_data).ok()?;
    let sts = rej.status();
    (rej.recfmt.get() == 0 && (1..=0xFF).contains(&sts.0)).then_some(sts)
}

/// The failed work completion that says why: the first one that is not a flush (flushes
/// only follow the QP into the error state), else the first flush.
fn first_failure(wcs: &[WorkCompletion]) -> Option<&WorkCompletion> {
    let mut failed = wcs.iter().filter(|wc| !wc.is_success());
    let first = failed.clone().next()?;
    Some(
        failed
            .find(|wc| wc.status() != WcStatus::WR_FLUSH_ERR)
            .unwrap_or(first),
    )
}

/// The private data of our connect request: HRQSIZE is the receives we post (one per
/// command), HSQSIZE the zero-based SQ size the Fabrics Connect will ask for.
pub(crate) fn connect_private_data(qid: u16, depth: u16) -> RdmaCmRequest {
    RdmaCmRequest::new(qid, depth, depth - 1)
}

impl<V: Verbs> RdmaQueue<V> {
    /// Resolves `peer`, creates the QP on `pd` (or on a new PD of the device the route goes
    /// through, returned), connects with the NVMe-oF private data and waits for the accept.
    /// The queue has `depth` entries (at least 2); with `windows`, one memory window per
    /// entry (see the module docs).
    pub(crate) fn connect(
        verbs: &V,
        peer: SocketAddr,
        pd: Option<&Arc<V::Pd>>,
        qid: u16,
        depth: u16,
        windows: bool,
        timeout: Duration,
    ) -> Result<(Self, Arc<V::Pd>)> {
        if !(2..=MAX_QUEUE_DEPTH).contains(&depth) {
            return Err(Error::Invalid(format!(
                "queue depth {depth} is outside 2..={MAX_QUEUE_DEPTH}"
            )));
        }
        let ch = verbs
            .event_channel()
            .map_err(|e| Error::rdma("rdma_create_event_channel", e))?;
        let id = ch
            .create_id()
            .map_err(|e| Error::rdma("rdma_create_id", e))?;
        id.resolve_addr(None, peer, timeout)
            .map_err(|e| Error::Unreachable {
                addr: peer,
                detail: e.to_string(),
            })?;
        cm_wait::<V>(
            &ch,
            CmEventKind::AddrResolved,
            timeout + Duration::from_secs(1),
            peer,
            qid,
            "address resolution",
        )?;
        id.resolve_route(timeout).map_err(|e| Error::Unreachable {
            addr: peer,
            detail: e.to_string(),
        })?;
        cm_wait::<V>(
            &ch,
            CmEventKind::RouteResolved,
            timeout + Duration::from_secs(1),
            peer,
            qid,
            "route resolution",
        )?;
        let ctx = id.context().map_err(|e| Error::Unreachable {
            addr: peer,
            detail: format!("no RDMA device on the route: {e}"),
        })?;
        let pd = match pd {
            Some(pd) if pd.context().same_device(&ctx) => pd.clone(),
            Some(_) => {
                return Err(Error::Invalid(format!(
                    "{peer}: the route now goes through another RDMA device ({}) than the \
                     controller's buffers are registered on",
                    ctx.device_name()
                )))
            }
            None => V::alloc_pd(&ctx).map_err(|e| Error::rdma("ibv_alloc_pd", e))?,
        };
        let n = u32::from(depth);
        let cq = V::create_cq(&ctx, (SENDS_PER_CMD + 1) * n + 8)
            .map_err(|e| Error::rdma("ibv_create_cq", e))?;
        let qp = id
            .create_qp(
                &pd,
                &cq,
                &cq,
                None,
                QpCaps {
                    max_send_wr: SENDS_PER_CMD * n + 1,
                    max_recv_wr: n,
                    max_send_sge: 2,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
            )
            .map_err(|e| Error::rdma("rdma_create_qp", e))?;
        let cmds = DmaBuf::<V>::new(&pd, depth as usize * SQE_LEN, AccessFlags::LOCAL_WRITE)
            .map_err(|e| Error::rdma("registering command slots", e))?;
        let rsps = DmaBuf::<V>::new(&pd, depth as usize * CQE_LEN, AccessFlags::LOCAL_WRITE)
            .map_err(|e| Error::rdma("registering response buffers", e))?;
        let windows = if windows {
            (0..depth)
                .map(|_| V::alloc_mw(&pd))
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| Error::rdma("allocating memory windows", e))?
        } else {
            Vec::new()
        };
        let mut q = Self {
            qp,
            cq,
            id,
            ch,
            cmds,
            rsps,
            verbs: verbs.clone(),
            slots: vec![Slot::default(); usize::from(depth)],
            windows,
            key_stats: KeyStats::default(),
            free: (0..depth).collect(),
            wcs: [WorkCompletion::default(); POLL_BATCH],
            qid,
            depth,
            peer,
            disconnected: false,
            pending_fault: None,
        };
        let all: Vec<u16> = (0..depth).collect();
        q.post_recvs(&all)
            .map_err(|e| Error::rdma("posting receives", e))?;

        let req = connect_private_data(qid, depth);
        q.id.connect(&ConnParams {
            private_data: req.as_bytes(),
            // We never RDMA READ from the target; it reads our write buffers.
            initiator_depth: 0,
            ..ConnParams::default()
        })
        .map_err(|e| Error::rdma(format!("rdma_connect to {peer}"), e))?;
        let ev = cm_wait::<V>(
            &q.ch,
            CmEventKind::Established,
            timeout,
            peer,
            qid,
            "connection",
        )?;
        let crqsize = RdmaCmAccept::read_from_prefix(&ev.private_data)
            .map(|(a, _)| a.crqsize.get())
            .unwrap_or(0);
        // A receive queue this small leaves no room to work: on the admin queue the AER
        // alone would fill it, and every later command (keep-alive among them) would wait
        // for a slot for ever.
        let least = if qid == 0 { MIN_ADMIN_CRQSIZE } else { 2 };
        if crqsize != 0 && crqsize < least {
            return Err(Error::Transport {
                addr: peer,
                qid,
                detail: format!(
                    "the target's receive queue holds {crqsize} commands, fewer than {least}"
                ),
            });
        }
        if crqsize != 0 && crqsize < depth {
            // Submit no more than the target can take.
            q.depth = crqsize;
            q.free.retain(|&c| c < crqsize);
        }
        tracing::debug!(%peer, qid, depth = q.depth, crqsize, "RDMA queue connected");
        Ok((q, pd))
    }

    pub(crate) fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// The verbs provider: its clock ([`Verbs::now`]) and idle wait ([`Verbs::sleep`]).
    pub(crate) fn verbs(&self) -> &V {
        &self.verbs
    }

    pub(crate) fn has_free_slot(&self) -> bool {
        !self.free.is_empty()
    }

    pub(crate) fn outstanding(&self) -> usize {
        usize::from(self.depth) - self.free.len()
    }

    /// Whether commands get their own keys ([`Data::Window`]).
    pub(crate) fn has_windows(&self) -> bool {
        !self.windows.is_empty()
    }

    pub(crate) fn key_stats(&self) -> KeyStats {
        self.key_stats
    }

    fn post_recvs(&self, slots: &[u16]) -> std::result::Result<(), RdmaError> {
        let mut sges = [Sge::default(); POLL_BATCH];
        for chunk in slots.chunks(POLL_BATCH) {
            for (sge, &s) in sges.iter_mut().zip(chunk) {
                *sge = self
                    .rsps
                    .sge(usize::from(s) * CQE_LEN, CQE_LEN)
                    .expect("response slot inside its buffer");
            }
            let wrs: [RecvWr<'_>; POLL_BATCH] = std::array::from_fn(|i| {
                let s = chunk.get(i).copied().unwrap_or(0);
                RecvWr::new(RECV_BIT | u64::from(s), &sges[i..i + 1])
            });
            self.qp.post_recv(&wrs[..chunk.len()])?;
        }
        Ok(())
    }

    /// Sends `cmd` with `data`; sets its CID and SGL. Returns its slot (what
    /// [`Self::poll`] names it by), `Ok(None)` when every slot is taken.
    pub(crate) fn submit(
        &mut self,
        cmd: &mut Command,
        data: Data<'_, V>,
    ) -> std::result::Result<Option<u16>, QueueFault> {
        if self.disconnected {
            return Err(QueueFault::Verb("queue is disconnected".into()));
        }
        let Some(cid) = self.free.pop_front() else {
            return Ok(None);
        };
        let gen = self.slots[usize::from(cid)].gen.wrapping_add(1) & GEN_MASK;
        cmd.cid.set(gen << SLOT_BITS | cid);
        let mut key = None;
        // The window bind to chain before the SEND, for `Data::Window`.
        let mut bind = None;
        let data_sge = match data {
            Data::None => {
                cmd.set_sgl(SglDescriptor::null());
                None
            }
            Data::Keyed { addr, len, rkey } => {
                cmd.set_sgl(SglDescriptor::keyed(addr, len, rkey, false));
                None
            }
            Data::Window {
                mr,
                offset,
                len,
                access,
            } => {
                let Some(mw) = self.windows.get(usize::from(cid)) else {
                    self.free.push_back(cid);
                    return Err(QueueFault::Verb("this queue has no memory windows".into()));
                };
                let rkey = mw.next_rkey();
                key = Some(rkey);
                cmd.set_sgl(SglDescriptor::keyed(
                    mr.remote_addr(offset),
                    len,
                    rkey,
                    true,
                ));
                // The bind is processed before the SEND that names its key, on this QP.
                bind = Some(
                    SendWr::bind_mw(
                        BIND_BIT | u64::from(cid),
                        mw,
                        mr,
                        offset,
                        len as usize,
                        access,
                    )
                    .signaled(false),
                );
                None
            }
            Data::InCapsule(sge) => {
                cmd.set_sgl(SglDescriptor::in_capsule(0, sge.length));
                Some(sge)
            }
        };
        let off = usize::from(cid) * SQE_LEN;
        self.cmds.write_at(off, cmd.as_bytes());
        let sges = [
            self.cmds
                .sge(off, SQE_LEN)
                .expect("command slot inside its buffer"),
            data_sge.unwrap_or_default(),
        ];
        let n = 1 + usize::from(data_sge.is_some());
        let send = SendWr::send(u64::from(cid), &sges[..n]);
        let posted = match bind {
            Some(bind) => self.qp.post_send(&[bind, send]),
            None => self.qp.post_send(&[send]),
        };
        if let Err(e) = posted {
            self.free.push_back(cid);
            return Err(QueueFault::Verb(e.to_string()));
        }
        self.slots[usize::from(cid)] = Slot {
            busy: true,
            gen,
            send_done: false,
            rsp: None,
            key,
        };
        Ok(Some(cid))
    }

    /// Takes what the CQ has (at most `limit` work completions, and at most [`POLL_BATCH`];
    /// each finished command needs at least its response's receive, so at most `limit`
    /// commands) and writes the commands that finished into `out` as (CID, completion);
    /// returns how many. The CIDs are free again when this returns. An error means the
    /// queue is broken.
    pub(crate) fn poll(
        &mut self,
        out: &mut [(u16, Completion); POLL_BATCH],
        limit: usize,
    ) -> std::result::Result<usize, QueueFault> {
        if let Some(fault) = self.pending_fault.take() {
            return Err(fault);
        }
        let mut done = 0;
        match self.poll_batch(out, limit, &mut done) {
            Ok(()) => Ok(done),
            // Commands of this batch that finished before the fault did finish: they are
            // handed back (a write that landed must not be failed and resent), the fault
            // at the next poll.
            Err(fault) if done > 0 => {
                // As the teardown would: the QP leaves the target no access to our memory,
                // and the target hears of it.
                if !self.disconnected {
                    self.disconnected = true;
                    let _ = self.id.disconnect();
                }
                self.pending_fault = Some(fault);
                Ok(done)
            }
            Err(fault) => Err(fault),
        }
    }

    fn poll_batch(
        &mut self,
        out: &mut [(u16, Completion); POLL_BATCH],
        limit: usize,
        done: &mut usize,
    ) -> std::result::Result<(), QueueFault> {
        let limit = limit.clamp(1, POLL_BATCH);
        let n = self
            .cq
            .poll(&mut self.wcs[..limit])
            .map_err(|e| QueueFault::Verb(e.to_string()))?;
        if n == 0 {
            return Ok(());
        }
        // Pass 1: copy the responses out and give their receive buffers back at once.
        let mut cqes = [Completion::default(); POLL_BATCH];
        let mut invalidated = [None; POLL_BATCH];
        let mut recv_slots = [0u16; POLL_BATCH];
        let mut nrecv = 0;
        if let Some(wc) = first_failure(&self.wcs[..n]) {
            self.disconnected = true;
            let id = wc.wr_id();
            return Err(QueueFault::Wc {
                status: wc.status(),
                what: if id & RECV_BIT != 0 {
                    "receive"
                } else if id & LOCAL_INV_BIT != 0 {
                    "local invalidate"
                } else if id & BIND_BIT != 0 {
                    "window bind"
                } else {
                    "command send"
                },
                vendor: wc.vendor_err(),
            });
        }
        for i in 0..n {
            let wc = self.wcs[i];
            if wc.wr_id() & RECV_BIT == 0 {
                continue;
            }
            if wc.byte_len() as usize != CQE_LEN {
                return Err(QueueFault::Protocol(format!(
                    "response capsule of {} bytes (expected {CQE_LEN})",
                    wc.byte_len()
                )));
            }
            let slot = wc.wr_id() as u16;
            let mut raw = [0u8; CQE_LEN];
            self.rsps.read_at(usize::from(slot) * CQE_LEN, &mut raw);
            cqes[nrecv] = Completion::read_from_bytes(&raw).expect("16 bytes make one CQE");
            invalidated[nrecv] = wc
                .invalidated_rkey()
                .or_else(|| (wc.wc_flags() & RXE_WC_WITH_INVALIDATE != 0).then(|| wc.ex_data()));
            recv_slots[nrecv] = slot;
            nrecv += 1;
        }
        if nrecv > 0 {
            self.post_recvs(&recv_slots[..nrecv])
                .map_err(|e| QueueFault::Verb(e.to_string()))?;
        }
        // Pass 2: pair sends, responses and invalidations.
        let mut r = 0;
        for i in 0..n {
            let wr_id = self.wcs[i].wr_id();
            // Our own work requests name the slot; a response names the CID we sent.
            let (cid, gen) = if wr_id & RECV_BIT != 0 {
                let wire = cqes[r].cid.get();
                (wire & SLOT_MASK, Some(wire >> SLOT_BITS))
            } else {
                (wr_id as u16, None)
            };
            let outstanding = |s: &&mut Slot| s.busy && gen.is_none_or(|g| g == s.gen);
            let Some(slot) = self.slots.get_mut(usize::from(cid)).filter(outstanding) else {
                let named = gen.map_or(cid, |g| g << SLOT_BITS | cid);
                return Err(QueueFault::Protocol(format!(
                    "completion for CID {named:#06x}, which is not outstanding"
                )));
            };
            if wr_id & RECV_BIT != 0 {
                let (cqe, inv) = (cqes[r], invalidated[r]);
                r += 1;
                if slot.rsp.is_some() {
                    return Err(QueueFault::Protocol(format!(
                        "second response for CID {cid}"
                    )));
                }
                slot.rsp = Some(cqe);
                match (inv, slot.key) {
                    (Some(rkey), Some(key)) if rkey == key => {
                        slot.key = None;
                        self.key_stats.remote_invalidations += 1;
                    }
                    (Some(rkey), _) => {
                        // A key of another command, or of a whole registration: that
                        // command's buffer (or a pool) just lost its protection or its use.
                        return Err(QueueFault::Protocol(format!(
                            "the target invalidated rkey {rkey:#x} in the response to CID \
                             {cid}, which did not ask for that"
                        )));
                    }
                    (None, Some(key)) => {
                        self.qp
                            .post_send(&[SendWr::local_invalidate(
                                LOCAL_INV_BIT | u64::from(cid),
                                key,
                            )])
                            .map_err(|e| QueueFault::Verb(e.to_string()))?;
                        self.key_stats.local_invalidations += 1;
                    }
                    (None, None) => {}
                }
            } else if wr_id & LOCAL_INV_BIT != 0 {
                slot.key = None;
            } else {
                slot.send_done = true;
            }
            if slot.finished() {
                let cqe = slot
                    .rsp
                    .take()
                    .expect("a finished command has its response");
                *slot = Slot {
                    gen: slot.gen,
                    ..Slot::default()
                };
                self.free.push_back(cid);
                out[*done] = (cid, cqe);
                *done += 1;
            }
        }
        Ok(())
    }

    /// A pending CM event that ends the connection (the target disconnected, the device
    /// went away), without blocking.
    pub(crate) fn check_cm(&self) -> Option<QueueFault> {
        match self.ch.get_event() {
            Ok(Some(ev)) => match ev.kind {
                CmEventKind::Disconnected
                | CmEventKind::DeviceRemoval
                | CmEventKind::AddrChange
                | CmEventKind::TimewaitExit => Some(QueueFault::CmEvent(format!("{:?}", ev.kind))),
                _ => None,
            },
            Ok(None) => None,
            Err(e) => Some(QueueFault::Verb(e.to_string())),
        }
    }

    /// `rdma_disconnect`: the QP goes to the error state at once (the target can no longer
    /// touch our memory through it) and the target is told. With `wait`, waits that long for
    /// the target's answer.
    pub(crate) fn disconnect(&mut self, wait: Duration) {
        if !self.disconnected {
            self.disconnected = true;
            if self.id.disconnect().is_ok() && !wait.is_zero() {
                let deadline = self.verbs.now() + wait;
                while let Some(left) = deadline.checked_duration_since(self.verbs.now()) {
                    match self.ch.next_event(left) {
                        Ok(Some(ev)) if ev.kind == CmEventKind::Disconnected => break,
                        Ok(Some(_)) => continue,
                        _ => break,
                    }
                }
            }
        }
    }

    /// Sends one command and polls this queue alone until it completes: for the Fabrics
    /// Connect of an I/O queue, before it carries any I/O.
    pub(crate) fn run_sync(
        &mut self,
        cmd: &mut Command,
        data: Data<'_, V>,
        timeout: Duration,
        what: &str,
    ) -> Result<Completion> {
        let fault = |q: &Self, f: QueueFault| Error::Transport {
            addr: q.peer,
            qid: q.qid,
            detail: f.to_string(),
        };
        let cid = self
            .submit(cmd, data)
            .map_err(|f| fault(self, f))?
            .ok_or_else(|| Error::Invalid(format!("{what}: no free command slot")))?;
        let deadline = self.verbs.now() + timeout;
        let mut out = [(0u16, Completion::default()); POLL_BATCH];
        loop {
            let n = self
                .poll(&mut out, POLL_BATCH)
                .map_err(|f| fault(self, f))?;
            if let Some((_, cqe)) = out[..n].iter().find(|(c, _)| *c == cid) {
                return Ok(*cqe);
            }
            if n == 0 {
                if let Some(f) = self.check_cm() {
                    return Err(fault(self, f));
                }
                if self.verbs.now() >= deadline {
                    return Err(Error::Timeout {
                        what: format!("{what} on queue {} of {}", self.qid, self.peer),
                        after: timeout,
                    });
                }
                self.verbs.sleep(Duration::from_micros(50));
            }
        }
    }
}

impl<V: Verbs> Drop for RdmaQueue<V> {
    fn drop(&mut self) {
        self.disconnect(Duration::ZERO);
    }
}

#[cfg(test)]
#[path = "transport_tests.rs"]
mod scripted_target_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_data_is_one_based_rq_zero_based_sq() {
        let r = connect_private_data(3, 128);
        let b = r.as_bytes();
        assert_eq!(b.len(), 32);
        assert_eq!(&b[0..2], &0u16.to_le_bytes(), "recfmt 0");
        assert_eq!(&b[2..4], &3u16.to_le_bytes(), "qid");
        assert_eq!(&b[4..6], &128u16.to_le_bytes(), "hrqsize = depth");
        assert_eq!(&b[6..8], &127u16.to_le_bytes(), "hsqsize = depth - 1");
        assert!(b[8..].iter().all(|&x| x == 0));
    }

    #[test]
    fn reject_data_parses_with_padding() {
        let mut pd = RdmaCmReject::new(RdmaCmRejectStatus::INVALID_HSQSIZE)
            .as_bytes()
            .to_vec();
        pd.resize(148, 0);
        assert_eq!(parse_reject(&pd), Some(RdmaCmRejectStatus::INVALID_HSQSIZE));
        assert_eq!(
            parse_reject(&[0u8; 148]),
            None,
            "all zero is no reject record"
        );
        assert_eq!(parse_reject(&[]), None);
        let peer: SocketAddr = "10.0.0.1:4420".parse().unwrap();
        let e = cm_failure(peer, 0, "connection", CmEventKind::Rejected, 28, &pd);
        assert!(e.to_string().contains("INVALID_HSQSIZE"), "{e}");
        let e = cm_failure(peer, 0, "connection", CmEventKind::Rejected, 8, &[0; 148]);
        assert!(matches!(e, Error::Refused { .. }), "{e}");
        let e = cm_failure(
            peer,
            0,
            "address resolution",
            CmEventKind::AddrError,
            -110,
            &[],
        );
        assert!(matches!(e, Error::Unreachable { .. }), "{e}");
    }
}
