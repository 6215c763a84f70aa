//! Reliable-connected queue pairs: posting, the send engine, the responder, acknowledgements
//! and retirement, RNR and transport retries, the error state and flushes.
//!
//! Model. A QP's send queue runs strictly in order: the engine transmits every pending WQE
//! (stopping at a held RDMA WRITE or a fence behind an unfinished READ) as one packet each on
//! the link to the peer QP. The responder handles requests in sequence (`rx_psn`); after an
//! RNR NAK it drops later packets until the NAK'd one comes again (go-back-N), and the
//! requester retransmits from the NAK'd WQE after the RNR timer. Responses (ACK, READ data,
//! NAKs) come back on the reverse link. WQEs retire from the head in order.

use std::io;

use super::super::cq::{WcOpcode, WcStatus, WorkCompletion};
use super::super::error::{RdmaError, Result};
use super::super::wr::{validate_send, Payload, RecvWr, SendOp, SendWr};
use super::fabric::{
    Body, Event, FabricState, Nak, ObjId, Packet, QpSt, RecvWqe, SendWqe, WqeData, WqeOp, WqeSt,
};
use super::mem::ScatterError;
use super::mw::check_bind;
use super::{DeliveredKind, SimAsyncEvent, SimAsyncEventKind};

fn os(errno: i32) -> io::Error {
    io::Error::from_raw_os_error(errno)
}

fn send_opcode(op: WqeOp) -> WcOpcode {
    match op {
        WqeOp::Send { .. } => WcOpcode::SEND,
        WqeOp::Write { .. } => WcOpcode::RDMA_WRITE,
        WqeOp::Read { .. } => WcOpcode::RDMA_READ,
        WqeOp::Bind(_) => WcOpcode::BIND_MW,
        WqeOp::LocalInv { .. } => WcOpcode::LOCAL_INV,
    }
}

impl FabricState {
    // ---- posting ----

    pub(crate) fn post_send(&mut self, qp: ObjId, wrs: &[SendWr<'_>]) -> Result<()> {
        self.stats.post_send_calls += 1;
        let q = self
            .qps
            .get_mut(&qp)
            .ok_or(RdmaError::InvalidArgument("the QP was destroyed"))?;
        let call = q.post_send_calls;
        q.post_send_calls += 1;
        let (num, max_inline) = (q.num, q.caps.max_inline_data);
        // An injected failure is spent on its call even if validation refuses the call.
        let fault = self.faults.take_post_send(num, call);
        if wrs
            .iter()
            .any(|wr| matches!(wr.op, SendOp::SendWithImm { .. }))
        {
            return Err(RdmaError::InvalidArgument(
                "SEND with immediate data is not simulated",
            ));
        }
        validate_send(max_inline, wrs, |b| check_bind(b).map(drop))?;
        let count = |f: fn(&SendOp) -> bool| wrs.iter().filter(|wr| f(&wr.op)).count();
        let reads = count(|op| matches!(op, SendOp::RdmaRead { .. }));
        let sends = count(|op| matches!(op, SendOp::Send | SendOp::SendWithInvalidate { .. }));
        if reads > 0 && sends > 0 {
            self.stats.read_and_send_posts += 1;
        }
        let fail_at = fault.map(|f| (f.index.min(wrs.len().saturating_sub(1)), f.errno));
        let res = self.enqueue_sends(qp, wrs, fail_at);
        self.trace(|| {
            format!(
                "post_send qp={num} n={} reads={reads} sends={sends} -> {}",
                wrs.len(),
                match &res {
                    Ok(()) => "ok".to_string(),
                    Err(e) => e.to_string(),
                }
            )
        });
        self.kick(qp);
        res
    }

    fn enqueue_sends(
        &mut self,
        qp: ObjId,
        wrs: &[SendWr<'_>],
        fail_at: Option<(usize, i32)>,
    ) -> Result<()> {
        if let Some((index, errno)) = fail_at {
            if wrs.is_empty() {
                return Err(RdmaError::PostSend {
                    source: os(errno),
                    index,
                });
            }
        }
        for (i, wr) in wrs.iter().enumerate() {
            if let Some((index, errno)) = fail_at {
                if index == i {
                    return Err(RdmaError::PostSend {
                        source: os(errno),
                        index,
                    });
                }
            }
            let q = self.qps.get_mut(&qp).expect("QP checked by the caller");
            let fail = |errno| RdmaError::PostSend {
                source: os(errno),
                index: i,
            };
            if q.state == QpSt::Init {
                return Err(fail(libc::EINVAL));
            }
            if let Payload::Sges(s) = wr.payload {
                if s.len() > q.caps.max_send_sge as usize {
                    return Err(fail(libc::EINVAL));
                }
            }
            if q.outstanding() >= u64::from(q.caps.max_send_wr) {
                return Err(fail(libc::ENOMEM));
            }
            let op = match wr.op {
                SendOp::Send => WqeOp::Send { inv: None },
                SendOp::SendWithInvalidate { rkey } => WqeOp::Send { inv: Some(rkey) },
                SendOp::RdmaWrite { remote_addr, rkey } => WqeOp::Write { remote_addr, rkey },
                SendOp::RdmaRead { remote_addr, rkey } => WqeOp::Read { remote_addr, rkey },
                SendOp::LocalInvalidate { rkey } => WqeOp::LocalInv { rkey },
                SendOp::BindMw(b) => match check_bind(&b) {
                    Ok(b) => WqeOp::Bind(b),
                    // Checked before anything was posted.
                    Err(_) => return Err(fail(libc::EINVAL)),
                },
                // Refused before anything was posted.
                SendOp::SendWithImm { .. } => return Err(fail(libc::EINVAL)),
            };
            let data = match wr.payload {
                Payload::Sges(s) => WqeData::Sges(s.to_vec()),
                Payload::Inline(d) => {
                    self.hosts[q.host].inline_send_wrs += 1;
                    WqeData::Inline(d.to_vec())
                }
            };
            let psn = q.next_psn;
            q.next_psn += 1;
            let wire_psn = q.next_wire_psn;
            if !op.is_local() {
                q.next_wire_psn += 1;
            }
            q.sq.push_back(SendWqe {
                wr_id: wr.wr_id,
                op,
                data,
                signaled: wr.signaled,
                fence: wr.fence,
                psn,
                wire_psn,
                state: WqeSt::Pending,
                rnr_left: None,
            });
            self.stats.send_wrs += 1;
        }
        Ok(())
    }

    /// A WRITE the QP's owner did not post ([`Faults::stray_write`](super::Faults::stray_write)),
    /// queued like a posted one (beyond the QP's send queue size: it is a fault).
    pub(crate) fn enqueue_stray_write(
        &mut self,
        qp: ObjId,
        remote_addr: u64,
        rkey: u32,
        data: Vec<u8>,
    ) {
        let Some(q) = self.qps.get_mut(&qp) else {
            return;
        };
        let (psn, wire_psn) = (q.next_psn, q.next_wire_psn);
        q.next_psn += 1;
        q.next_wire_psn += 1;
        q.sq.push_back(SendWqe {
            wr_id: super::STRAY_WR_ID,
            op: WqeOp::Write { remote_addr, rkey },
            data: WqeData::Inline(data),
            signaled: true,
            fence: false,
            psn,
            wire_psn,
            state: WqeSt::Pending,
            rnr_left: None,
        });
        self.kick(qp);
    }

    pub(crate) fn post_recv_qp(&mut self, qp: ObjId, wrs: &[RecvWr<'_>]) -> Result<()> {
        self.stats.post_recv_calls += 1;
        let q = self
            .qps
            .get_mut(&qp)
            .ok_or(RdmaError::InvalidArgument("the QP was destroyed"))?;
        if q.srq.is_some() {
            return Err(RdmaError::InvalidArgument(
                "the QP uses an SRQ; post receives on the SRQ",
            ));
        }
        let call = q.post_recv_calls;
        q.post_recv_calls += 1;
        let num = q.num;
        let fault = self.faults.take_post_recv(num, call);
        let fail_at = fault.map(|f| (f.index.min(wrs.len().saturating_sub(1)), f.errno));
        let mut res = Ok(());
        let q = self.qps.get_mut(&qp).expect("looked up above");
        for (i, wr) in wrs.iter().enumerate() {
            let errno = match fail_at {
                Some((index, errno)) if index == i => Some(errno),
                _ if wr.sges.len() > q.caps.max_recv_sge as usize => Some(libc::EINVAL),
                _ if q.rq.len() >= q.caps.max_recv_wr as usize => Some(libc::ENOMEM),
                _ => None,
            };
            if let Some(errno) = errno {
                res = Err(RdmaError::PostRecv {
                    source: os(errno),
                    index: i,
                });
                break;
            }
            q.rq.push_back(RecvWqe {
                wr_id: wr.wr_id,
                sges: wr.sges.to_vec(),
            });
            self.stats.recv_wrs += 1;
        }
        let in_error = q.state == QpSt::Error;
        if in_error {
            self.schedule(self.now, Event::Flush(qp));
        }
        res
    }

    pub(crate) fn post_recv_srq(&mut self, srq: ObjId, wrs: &[RecvWr<'_>]) -> Result<()> {
        self.stats.post_recv_calls += 1;
        let s = self
            .srqs
            .get_mut(&srq)
            .ok_or(RdmaError::InvalidArgument("the SRQ was destroyed"))?;
        for (i, wr) in wrs.iter().enumerate() {
            let errno = if wr.sges.len() > s.max_sge as usize {
                libc::EINVAL
            } else if s.wqes.len() >= s.max_wr as usize {
                libc::ENOMEM
            } else {
                s.wqes.push_back(RecvWqe {
                    wr_id: wr.wr_id,
                    sges: wr.sges.to_vec(),
                });
                self.stats.recv_wrs += 1;
                continue;
            };
            return Err(RdmaError::PostSrqRecv {
                source: os(errno),
                index: i,
            });
        }
        Ok(())
    }

    /// Schedules the send engine (or a flush, for a QP in Error).
    pub(crate) fn kick(&mut self, qp: ObjId) {
        let Some(q) = self.qps.get_mut(&qp) else {
            return;
        };
        match q.state {
            QpSt::Error => {
                if !q.sq.is_empty() || !q.rq.is_empty() {
                    self.schedule(self.now, Event::Flush(qp));
                }
            }
            QpSt::Init => {}
            QpSt::Rts => {
                let pending = q
                    .index_of(q.tx_psn)
                    .is_some_and(|i| q.sq[i].state == WqeSt::Pending);
                if !q.exec_pending && pending {
                    q.exec_pending = true;
                    let at = q.resume_at.max(self.now);
                    let key = self.schedule(at, Event::ExecSq(qp));
                    if at > self.now {
                        self.qps.get_mut(&qp).expect("looked up above").rnr_timer = Some(key);
                    }
                }
            }
        }
    }

    // ---- the send engine ----

    pub(crate) fn run_sq(&mut self, qp: ObjId) {
        let Some(q) = self.qps.get_mut(&qp) else {
            return;
        };
        q.exec_pending = false;
        if q.state != QpSt::Rts || q.stalled || self.hosts[q.host].crashed {
            return;
        }
        if self.now < q.resume_at {
            q.exec_pending = true;
            let at = q.resume_at;
            let key = self.schedule(at, Event::ExecSq(qp));
            self.qps.get_mut(&qp).expect("looked up above").rnr_timer = Some(key);
            return;
        }
        let Some(peer) = q.peer else {
            return;
        };
        let held = self.faults.held_writes.contains(&q.num);
        loop {
            let q = self.qps.get_mut(&qp).expect("checked above");
            let Some(idx) = q.index_of(q.tx_psn) else {
                break;
            };
            let w = &q.sq[idx];
            if w.state != WqeSt::Pending {
                if w.op.is_local() && w.state == WqeSt::Done(WcStatus::SUCCESS.0, 0) {
                    // Executed before an RNR NAK rewound the queue: local work requests run
                    // once.
                    q.tx_psn += 1;
                    continue;
                }
                // A WQE that failed locally: nothing after it is sent.
                break;
            }
            if held && matches!(w.op, WqeOp::Write { .. }) {
                let (num, psn) = (q.num, w.psn);
                self.trace(|| format!("qp={num} psn={psn} WRITE held"));
                break;
            }
            if w.fence
                && q.sq
                    .iter()
                    .take(idx)
                    .any(|e| matches!(e.op, WqeOp::Read { .. }) && e.state == WqeSt::InFlight)
            {
                break;
            }
            let (psn, wire_psn, op, pd, num) = (w.psn, w.wire_psn, w.op, q.pd, q.num);
            if op.is_local() {
                let status = match op {
                    WqeOp::Bind(b) => self.exec_bind(qp, b),
                    WqeOp::LocalInv { rkey } => self.exec_local_inv(qp, rkey),
                    _ => unreachable!("a local work request"),
                };
                let q = self.qps.get_mut(&qp).expect("checked above");
                q.tx_psn += 1;
                q.sq[idx].state = WqeSt::Done(status.0, 0);
                self.retire(qp);
                if !status.is_success() {
                    break;
                }
                continue;
            }
            let body = match op {
                WqeOp::Send { inv } => self
                    .wqe_bytes(qp, idx, pd)
                    .map(|data| Body::Send { data, inv }),
                WqeOp::Write { remote_addr, rkey } => {
                    self.wqe_bytes(qp, idx, pd).map(|data| Body::Write {
                        remote_addr,
                        rkey,
                        data,
                    })
                }
                WqeOp::Read { remote_addr, rkey } => {
                    let len = match &self.qps[&qp].sq[idx].data {
                        WqeData::Sges(s) => s.iter().map(|s| u64::from(s.length)).sum(),
                        WqeData::Inline(d) => d.len() as u64,
                    };
                    Some(Body::ReadReq {
                        remote_addr,
                        rkey,
                        len,
                    })
                }
                WqeOp::Bind(_) | WqeOp::LocalInv { .. } => unreachable!("executed above"),
            };
            let q = self.qps.get_mut(&qp).expect("checked above");
            let Some(body) = body else {
                q.sq[idx].state = WqeSt::Done(WcStatus::LOC_PROT_ERR.0, 0);
                self.trace(|| format!("qp={num} psn={psn} {} LOC_PROT_ERR", op.name()));
                self.retire(qp);
                break;
            };
            q.tx_psn += 1;
            q.sq[idx].state = WqeSt::InFlight;
            let at = self.link_time(qp, peer);
            self.stats.packets += 1;
            self.trace(|| format!("tx qp={num} psn={psn} {} arrives {at}", op.name()));
            self.schedule(
                at,
                Event::Packet(Packet {
                    src: qp,
                    dst: peer,
                    psn,
                    wire_psn,
                    body,
                }),
            );
        }
    }

    fn wqe_bytes(&self, qp: ObjId, idx: usize, pd: ObjId) -> Option<Vec<u8>> {
        match &self.qps[&qp].sq[idx].data {
            WqeData::Inline(d) => Some(d.clone()),
            WqeData::Sges(s) => self.gather(pd, s),
        }
    }

    // ---- delivery ----

    pub(crate) fn deliver(&mut self, p: Packet) {
        match p.body {
            Body::Send { .. } | Body::Write { .. } | Body::ReadReq { .. } => self.on_request(p),
            Body::Ack | Body::ReadResp { .. } | Body::Nak(_) => self.on_response(p),
        }
    }

    /// A request that reached no live, connected QP: the requester times out.
    fn lost(&mut self, requester: ObjId, psn: u64) {
        let Some(q) = self.qps.get(&requester) else {
            return;
        };
        let wait = (u64::from(q.retry_count) + 1).saturating_mul(self.cfg.transport_timeout_ns);
        let num = q.num;
        self.trace(|| format!("lost qp={num} psn={psn}, retry timeout in {wait} ns"));
        let key = self.schedule(
            self.now.saturating_add(wait),
            Event::Timeout { qp: requester, psn },
        );
        if let Some(q) = self.qps.get_mut(&requester) {
            q.lost_timers.push(key);
        }
    }

    fn respond(&mut self, from: ObjId, to: ObjId, psn: u64, body: Body) {
        let mut at = self.link_time(from, to);
        // A late response leaves the link's order: requests sent after it may pass it.
        // (Looked up only while the fault is set: every response passes here.)
        if !self.faults.late_responses.is_empty() {
            let late = self
                .qps
                .get(&from)
                .and_then(|q| self.faults.late_responses.get(&q.num));
            if let Some(&extra) = late {
                at = at.saturating_add(extra);
            }
        }
        self.stats.packets += 1;
        self.schedule(
            at,
            Event::Packet(Packet {
                src: from,
                dst: to,
                psn,
                wire_psn: 0,
                body,
            }),
        );
    }

    fn on_request(&mut self, p: Packet) {
        let Packet {
            src,
            dst,
            psn,
            wire_psn,
            body,
        } = p;
        let alive = self.qps.get(&dst).is_some_and(|d| {
            !self.hosts[d.host].crashed && d.state == QpSt::Rts && d.peer == Some(src)
        });
        if !alive {
            self.lost(src, psn);
            return;
        }
        let d = &self.qps[&dst];
        if wire_psn != d.rx_psn {
            let (num, want) = (d.num, d.rx_psn);
            self.trace(|| {
                format!("rx qp={num} psn={psn} (wire {wire_psn}) dropped (expected {want})")
            });
            return;
        }
        let (host, num, pd) = (d.host, d.num, d.pd);
        match body {
            Body::Send { data, inv } => self.recv_send(src, dst, psn, data, inv),
            Body::Write {
                remote_addr,
                rkey,
                data,
            } => {
                if self.remote_write(pd, dst, rkey, remote_addr, &data) {
                    let at = self.describe_remote(rkey, remote_addr);
                    self.trace(|| {
                        format!("rx qp={num} psn={psn} WRITE {} bytes at {at}", data.len())
                    });
                    self.record_rx(host, DeliveredKind::Write, num, remote_addr, &data);
                    self.qps.get_mut(&dst).expect("alive").rx_psn += 1;
                    self.respond(dst, src, psn, Body::Ack);
                } else {
                    self.remote_access_error(src, dst, psn, "WRITE", rkey, remote_addr);
                }
            }
            Body::ReadReq {
                remote_addr,
                rkey,
                len,
            } => match self.remote_read(pd, dst, rkey, remote_addr, len) {
                Some(data) => {
                    let at = self.describe_remote(rkey, remote_addr);
                    self.trace(|| format!("rx qp={num} psn={psn} READ {len} bytes at {at}"));
                    self.hosts[host].rx.read_bytes += len;
                    self.qps.get_mut(&dst).expect("alive").rx_psn += 1;
                    self.respond(dst, src, psn, Body::ReadResp { data });
                }
                None => self.remote_access_error(src, dst, psn, "READ", rkey, remote_addr),
            },
            Body::Ack | Body::ReadResp { .. } | Body::Nak(_) => unreachable!("a response"),
        }
    }

    /// `rkey` and the offset into its region: what the trace shows instead of addresses,
    /// which differ from run to run.
    fn describe_remote(&self, rkey: u32, addr: u64) -> String {
        match self.mrs.get(&rkey) {
            Some(mr) => format!("rkey={rkey:#x}+{}", addr.wrapping_sub(mr.iova) as i64),
            None => self
                .describe_window(rkey, addr)
                .unwrap_or_else(|| format!("unknown rkey={rkey:#x}")),
        }
    }

    fn remote_access_error(
        &mut self,
        src: ObjId,
        dst: ObjId,
        psn: u64,
        what: &str,
        rkey: u32,
        addr: u64,
    ) {
        let num = self.qps[&dst].num;
        let at = self.describe_remote(rkey, addr);
        self.trace(|| format!("rx qp={num} psn={psn} {what} at {at}: access error"));
        self.respond(dst, src, psn, Body::Nak(Nak::RemoteAccess));
        self.qp_to_error(dst, Some(SimAsyncEventKind::QpAccessErr));
    }

    fn recv_send(&mut self, src: ObjId, dst: ObjId, psn: u64, data: Vec<u8>, inv: Option<u32>) {
        let d = &self.qps[&dst];
        let (host, num, recv_cq, srq, qp_pd) = (d.host, d.num, d.recv_cq, d.srq, d.pd);
        let (wqe, pd) = match srq {
            Some(s) => match self.srqs.get_mut(&s) {
                Some(srq) => (srq.wqes.pop_front(), srq.pd),
                None => (None, qp_pd),
            },
            None => (self.qps.get_mut(&dst).expect("alive").rq.pop_front(), qp_pd),
        };
        let Some(wqe) = wqe else {
            self.stats.rnr_naks += 1;
            self.trace(|| format!("rx qp={num} psn={psn} SEND: no receive, RNR NAK"));
            self.respond(dst, src, psn, Body::Nak(Nak::Rnr));
            return;
        };
        let len = data.len() as u32;
        if let Some(rkey) = inv.filter(|&k| !self.can_invalidate(dst, k)) {
            // Not a valid window of this QP: a remote invalid request (class J).
            self.trace(|| format!("rx qp={num} psn={psn} SEND_INV rkey={rkey:#x}: invalid"));
            self.push_cqe(
                recv_cq,
                WorkCompletion::sim(
                    wqe.wr_id,
                    WcStatus::REM_INV_REQ_ERR,
                    WcOpcode::RECV,
                    len,
                    num,
                    None,
                ),
            );
            self.respond(dst, src, psn, Body::Nak(Nak::InvalidRequest));
            self.qp_to_error(dst, None);
            return;
        }
        match self.scatter(pd, &wqe.sges, &data) {
            Ok(()) => {
                self.trace(|| {
                    format!(
                        "rx qp={num} psn={psn} SEND {len} bytes -> recv wr_id={}",
                        wqe.wr_id
                    )
                });
                self.record_rx(host, DeliveredKind::Send, num, 0, &data);
                if let Some(rkey) = inv {
                    self.invalidate_window(dst, rkey);
                }
                self.qps.get_mut(&dst).expect("alive").rx_psn += 1;
                self.push_cqe(
                    recv_cq,
                    WorkCompletion::sim(
                        wqe.wr_id,
                        WcStatus::SUCCESS,
                        WcOpcode::RECV,
                        len,
                        num,
                        inv,
                    ),
                );
                self.respond(dst, src, psn, Body::Ack);
            }
            Err(e) => {
                let (status, nak) = match e {
                    ScatterError::Length => (WcStatus::LOC_LEN_ERR, Nak::InvalidRequest),
                    ScatterError::Protection => (WcStatus::LOC_PROT_ERR, Nak::RemoteOp),
                };
                self.trace(|| format!("rx qp={num} psn={psn} SEND {len} bytes: {status:?}"));
                self.push_cqe(
                    recv_cq,
                    WorkCompletion::sim(wqe.wr_id, status, WcOpcode::RECV, len, num, None),
                );
                self.respond(dst, src, psn, Body::Nak(nak));
                self.qp_to_error(dst, None);
            }
        }
    }

    fn on_response(&mut self, p: Packet) {
        let Packet { dst, psn, body, .. } = p;
        let Some(q) = self.qps.get_mut(&dst) else {
            return;
        };
        if q.state != QpSt::Rts || self.hosts[q.host].crashed {
            return;
        }
        let Some(idx) = q
            .index_of(psn)
            .filter(|&i| q.sq[i].state == WqeSt::InFlight)
        else {
            return;
        };
        let (num, pd, op) = (q.num, q.pd, q.sq[idx].op);
        let done = match body {
            Body::Ack => WqeSt::Done(WcStatus::SUCCESS.0, 0),
            Body::ReadResp { data } => {
                let WqeData::Sges(sges) = &q.sq[idx].data else {
                    unreachable!("validated: READ is never inline")
                };
                let sges = sges.clone();
                match self.scatter(pd, &sges, &data) {
                    Ok(()) => WqeSt::Done(WcStatus::SUCCESS.0, data.len() as u32),
                    Err(_) => WqeSt::Done(WcStatus::LOC_PROT_ERR.0, 0),
                }
            }
            Body::Nak(Nak::Rnr) => {
                let (limit, timer) = (q.rnr_retry & 7, self.cfg.rnr_timer_ns.max(1));
                let left = q.sq[idx].rnr_left.get_or_insert(limit);
                if limit == 7 || *left > 0 {
                    if limit != 7 {
                        *left -= 1;
                    }
                    // Go back: this WQE and every later one are sent again after the timer.
                    for w in q.sq.iter_mut().skip(idx) {
                        if w.state == WqeSt::InFlight {
                            w.state = WqeSt::Pending;
                        }
                    }
                    q.tx_psn = psn;
                    q.resume_at = self.now + timer;
                    self.trace(|| format!("qp={num} psn={psn} RNR, retry in {timer} ns"));
                    self.kick(dst);
                    return;
                }
                WqeSt::Done(WcStatus::RNR_RETRY_EXC_ERR.0, 0)
            }
            Body::Nak(Nak::RemoteAccess) => WqeSt::Done(WcStatus::REM_ACCESS_ERR.0, 0),
            Body::Nak(Nak::InvalidRequest) => WqeSt::Done(WcStatus::REM_INV_REQ_ERR.0, 0),
            Body::Nak(Nak::RemoteOp) => WqeSt::Done(WcStatus::REM_OP_ERR.0, 0),
            Body::Send { .. } | Body::Write { .. } | Body::ReadReq { .. } => {
                unreachable!("a request")
            }
        };
        let q = self.qps.get_mut(&dst).expect("checked above");
        q.sq[idx].state = done;
        if let WqeSt::Done(status, _) = done {
            if status != WcStatus::SUCCESS.0 {
                q.stalled = true;
                self.trace(|| format!("qp={num} psn={psn} {} {:?}", op.name(), WcStatus(status)));
            }
        }
        self.retire(dst);
        self.kick(dst);
    }

    pub(crate) fn on_timeout(&mut self, qp: ObjId, psn: u64) {
        let Some(q) = self.qps.get_mut(&qp) else {
            return;
        };
        if q.state != QpSt::Rts || self.hosts[q.host].crashed {
            return;
        }
        let Some(idx) = q
            .index_of(psn)
            .filter(|&i| q.sq[i].state == WqeSt::InFlight)
        else {
            return;
        };
        q.sq[idx].state = WqeSt::Done(WcStatus::RETRY_EXC_ERR.0, 0);
        q.stalled = true;
        let num = q.num;
        self.trace(|| format!("qp={num} psn={psn} RETRY_EXC_ERR"));
        self.retire(qp);
    }

    // ---- completion ----

    /// Retires finished WQEs from the head of the send queue, in order. An unsignaled
    /// success makes no completion and keeps its slot until the next signaled completion;
    /// an error always completes and moves the QP to Error.
    pub(crate) fn retire(&mut self, qp: ObjId) {
        loop {
            let Some(q) = self.qps.get_mut(&qp) else {
                return;
            };
            if q.state == QpSt::Error {
                return;
            }
            let Some(WqeSt::Done(status, len)) = q.sq.front().map(|w| w.state) else {
                return;
            };
            let w = q.sq.pop_front().expect("front exists");
            let (num, cq) = (q.num, q.send_cq);
            let wc =
                WorkCompletion::sim(w.wr_id, WcStatus(status), send_opcode(w.op), len, num, None);
            if status == WcStatus::SUCCESS.0 {
                if w.signaled {
                    q.unsignaled_held = 0;
                    self.push_cqe(cq, wc);
                } else {
                    q.unsignaled_held += 1;
                }
            } else {
                q.unsignaled_held = 0;
                self.push_cqe(cq, wc);
                self.qp_to_error(qp, None);
                return;
            }
        }
    }

    /// Moves a QP to Error (raising `async_kind` first, if any) and flushes it.
    pub(crate) fn qp_to_error(&mut self, qp: ObjId, async_kind: Option<SimAsyncEventKind>) {
        let Some(q) = self.qps.get_mut(&qp) else {
            return;
        };
        if q.state == QpSt::Error {
            return;
        }
        q.state = QpSt::Error;
        let (host, num, srq) = (q.host, q.num, q.srq);
        let timers: Vec<_> = q
            .rnr_timer
            .take()
            .into_iter()
            .chain(q.lost_timers.drain(..))
            .collect();
        for key in timers {
            self.cancel(Some(key));
        }
        self.trace(|| format!("qp={num} -> Error"));
        if let Some(kind) = async_kind {
            self.raise_async(
                host,
                SimAsyncEvent {
                    kind,
                    qp_num: Some(num),
                    cq_id: None,
                },
            );
        }
        if srq.is_some() {
            self.raise_async(
                host,
                SimAsyncEvent {
                    kind: SimAsyncEventKind::QpLastWqeReached,
                    qp_num: Some(num),
                    cq_id: None,
                },
            );
        }
        self.flush_qp(qp);
    }

    /// Completes every outstanding send WQE (signaled or not) and every own receive WQE
    /// with WR_FLUSH_ERR, in order. SRQ receives stay in the SRQ.
    pub(crate) fn flush_qp(&mut self, qp: ObjId) {
        let Some(q) = self.qps.get_mut(&qp) else {
            return;
        };
        let sq: Vec<SendWqe> = q.sq.drain(..).collect();
        let rq: Vec<RecvWqe> = q.rq.drain(..).collect();
        if !sq.is_empty() {
            q.unsignaled_held = 0;
        }
        let (num, send_cq, recv_cq) = (q.num, q.send_cq, q.recv_cq);
        if !sq.is_empty() || !rq.is_empty() {
            let (ns, nr) = (sq.len(), rq.len());
            self.trace(|| format!("qp={num} flush {ns} send, {nr} recv"));
        }
        for w in sq {
            let wc = WorkCompletion::sim(
                w.wr_id,
                WcStatus::WR_FLUSH_ERR,
                send_opcode(w.op),
                0,
                num,
                None,
            );
            self.push_cqe(send_cq, wc);
        }
        for r in rq {
            let wc = WorkCompletion::sim(
                r.wr_id,
                WcStatus::WR_FLUSH_ERR,
                WcOpcode::RECV,
                0,
                num,
                None,
            );
            self.push_cqe(recv_cq, wc);
        }
    }
}
