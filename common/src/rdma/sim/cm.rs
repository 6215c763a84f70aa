//! The connection manager: address and route resolution, listeners, REQ / REP / RTU / REJ /
//! DREQ / DREP, CM timeouts, and what dropping an id means.
//!
//! Messages between two ids whose QPs exist travel on the link between those QPs, so they
//! stay in order with the data packets (a REP always arrives before the acceptor's first
//! SEND, a DREQ after the data sent before it). Other messages take a drawn delay. A crashed
//! host sends and receives no CM message at all.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use super::super::cm::{CmEventKind, ConnEventParams, ConnParams};
use super::super::error::{RdmaError, Result};
use super::super::qp::QpCaps;
use super::fabric::{
    padded, socket, Event, FabricState, HostId, ObjId, PendingEvent, QpSt, QpState, TimerKey,
};

/// Private data sizes of the IB CM messages.
pub(crate) const REQ_PRIVATE: usize = 56;
pub(crate) const REP_PRIVATE: usize = 196;
pub(crate) const REJ_PRIVATE: usize = 148;
/// REJ reasons as RDMA CM reports them in the event status.
pub(crate) const REJ_INVALID_SERVICE_ID: i32 = 8;
pub(crate) const REJ_CONSUMER_DEFINED: i32 = 28;

fn os(errno: i32) -> io::Error {
    io::Error::from_raw_os_error(errno)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CmSt {
    Idle,
    Bound,
    Listening,
    AddrQuery,
    AddrResolved,
    RouteQuery,
    RouteResolved,
    /// Active side, REQ sent.
    Connecting,
    /// Passive side, connect request not answered yet.
    ReqReceived,
    /// Passive side, REP sent, waiting for the RTU.
    Accepted,
    Connected,
    /// We sent a DREQ and wait for the DREP (or the timeout).
    DreqSent,
    /// The peer sent a DREQ; our `disconnect` answers it.
    DreqRcvd,
    TimeWait,
    /// Rejected, timed out, or done with time wait.
    Closed,
}

pub(crate) struct CmIdState {
    pub channel: ObjId,
    /// The host of the channel (and of the provider that made it).
    pub host: HostId,
    /// The device the id is bound to.
    pub device: Option<HostId>,
    /// The coming of that device the id was bound in (see `Host::incarnation`).
    pub incarnation: u32,
    pub local: Option<SocketAddr>,
    pub peer: Option<SocketAddr>,
    pub st: CmSt,
    pub qp: Option<ObjId>,
    /// The QP this id had, kept after the QP is destroyed: CM messages use its link.
    pub qp_link: Option<ObjId>,
    pub peer_id: Option<ObjId>,
    pub context: u64,
    pub bound: Option<(HostId, IpAddr, u16)>,
    /// The retry counts the peer gave in its connect or accept.
    pub peer_rnr_retry: u8,
    pub peer_retry: u8,
    /// The CM timeout this id waits on (REQ, REP or DREQ unanswered).
    pub timer: Option<TimerKey>,
}

/// What a new QP is built on (all on one host's device).
pub(crate) struct QpResources {
    pub host: HostId,
    pub pd: ObjId,
    pub send_cq: ObjId,
    pub recv_cq: ObjId,
    pub srq: Option<ObjId>,
}

pub(crate) enum CmMsg {
    AddrResolved(ObjId),
    AddrError(ObjId),
    RouteResolved(ObjId),
    Req {
        from: ObjId,
        src: SocketAddr,
        dst: SocketAddr,
        data: Vec<u8>,
        conn: ConnEventParams,
    },
    Rep {
        to: ObjId,
        from: ObjId,
        data: Vec<u8>,
        conn: ConnEventParams,
    },
    Rtu {
        to: ObjId,
    },
    Rej {
        to: ObjId,
        status: i32,
        data: Vec<u8>,
    },
    Dreq {
        to: ObjId,
    },
    Drep {
        to: ObjId,
    },
    /// The REQ got no answer.
    ConnectTimeout(ObjId),
    /// The RTU never came.
    EstablishTimeout(ObjId),
    /// The DREP never came.
    DreqTimeout(ObjId),
    TimewaitDone(ObjId),
}

/// `0xff` asks for the device maximum.
fn depth(v: u8, max: u32) -> u8 {
    if v == 0xff {
        u8::try_from(max).unwrap_or(u8::MAX)
    } else {
        v
    }
}

impl FabricState {
    fn cm(&self, id: ObjId) -> Result<&CmIdState> {
        self.cm_ids
            .get(&id)
            .ok_or(RdmaError::InvalidArgument("the CM id was destroyed"))
    }

    fn cm_mut(&mut self, id: ObjId) -> &mut CmIdState {
        self.cm_ids.get_mut(&id).expect("checked CM id")
    }

    /// Arms the id's CM timeout (`cm_timeout_ns` from now), replacing any other.
    fn arm_timer(&mut self, id: ObjId, msg: CmMsg) {
        self.clear_timer(id);
        let t = self.now.saturating_add(self.cfg.cm_timeout_ns);
        let key = self.schedule(t, Event::Cm(msg));
        self.cm_mut(id).timer = Some(key);
    }

    pub(crate) fn clear_timer(&mut self, id: ObjId) {
        let key = self.cm_ids.get_mut(&id).and_then(|s| s.timer.take());
        self.cancel(key);
    }

    pub(crate) fn cm_create_id(&mut self, channel: ObjId, host: HostId) -> ObjId {
        let id = self.alloc_id();
        self.cm_ids.insert(
            id,
            CmIdState {
                channel,
                host,
                device: None,
                incarnation: 0,
                local: None,
                peer: None,
                st: CmSt::Idle,
                qp: None,
                qp_link: None,
                peer_id: None,
                context: 0,
                bound: None,
                peer_rnr_retry: 7,
                peer_retry: 7,
                timer: None,
            },
        );
        id
    }

    /// The time a CM message from `from` (whose QP link is `from_link`) to `to` arrives.
    fn cm_send_time(&mut self, from: ObjId, from_link: Option<ObjId>, to: Option<ObjId>) -> u64 {
        let to_link = to.and_then(|t| self.cm_ids.get(&t)).and_then(|t| t.qp_link);
        match (from_link, to_link) {
            (Some(a), Some(b)) => self.link_time(a, b),
            _ => self.now + self.draw_delay(from),
        }
    }

    pub(crate) fn cm_send(&mut self, from: ObjId, to: Option<ObjId>, msg: CmMsg) {
        let Some(s) = self.cm_ids.get(&from) else {
            return;
        };
        if self.hosts[s.host].crashed {
            return;
        }
        let link = s.qp_link;
        let at = self.cm_send_time(from, link, to);
        self.schedule(at, Event::Cm(msg));
    }

    // ---- addresses ----

    pub(crate) fn cm_bind(&mut self, id: ObjId, addr: SocketAddr) -> Result<()> {
        let s = self.cm(id)?;
        if s.st != CmSt::Idle || s.bound.is_some() {
            return Err(RdmaError::BindAddr(os(libc::EINVAL)));
        }
        let host = s.host;
        let ip = addr.ip();
        if !ip.is_unspecified() && self.hosts[host].ip != ip {
            return Err(RdmaError::BindAddr(os(libc::EADDRNOTAVAIL)));
        }
        // The address stays on its netdev, but no RDMA device has it.
        if !ip.is_unspecified() && self.hosts[host].removed {
            return Err(RdmaError::BindAddr(os(libc::ENODEV)));
        }
        let port = if addr.port() == 0 {
            self.alloc_port()
        } else {
            addr.port()
        };
        let clash = self.bound.contains_key(&(host, ip, port))
            || if ip.is_unspecified() {
                self.bound.keys().any(|&(h, _, p)| h == host && p == port)
            } else {
                self.bound
                    .keys()
                    .any(|&(h, a, p)| h == host && p == port && a.is_unspecified())
            };
        if clash {
            return Err(RdmaError::BindAddr(os(libc::EADDRINUSE)));
        }
        self.bound.insert((host, ip, port), id);
        let incarnation = self.hosts[host].incarnation;
        let s = self.cm_mut(id);
        s.bound = Some((host, ip, port));
        s.local = Some(socket(ip, port));
        s.device = (!ip.is_unspecified()).then_some(host);
        s.incarnation = incarnation;
        s.st = CmSt::Bound;
        Ok(())
    }

    pub(crate) fn cm_listen(&mut self, id: ObjId) -> Result<()> {
        let s = self.cm(id)?;
        if s.st != CmSt::Bound {
            return Err(RdmaError::Listen(os(libc::EINVAL)));
        }
        self.cm_mut(id).st = CmSt::Listening;
        let local = self.cm_ids[&id].local;
        self.trace(|| format!("cm id={id} listening on {local:?}"));
        Ok(())
    }

    pub(crate) fn cm_resolve_addr(
        &mut self,
        id: ObjId,
        src: Option<SocketAddr>,
        dst: SocketAddr,
    ) -> Result<()> {
        let s = self.cm(id)?;
        if !matches!(s.st, CmSt::Idle | CmSt::Bound) {
            return Err(RdmaError::ResolveAddr(os(libc::EINVAL)));
        }
        let host = s.host;
        let my_ip = self.hosts[host].ip;
        if src.is_some_and(|a| !a.ip().is_unspecified() && a.ip() != my_ip) {
            return Err(RdmaError::ResolveAddr(os(libc::EADDRNOTAVAIL)));
        }
        let local = match s.local {
            Some(l) => socket(my_ip, l.port()),
            None => {
                let port = self.alloc_port();
                socket(my_ip, port)
            }
        };
        let incarnation = self.hosts[host].incarnation;
        let s = self.cm_mut(id);
        s.local = Some(local);
        s.peer = Some(dst);
        s.device = Some(host);
        s.incarnation = incarnation;
        s.st = CmSt::AddrQuery;
        let reachable = self
            .host_of_ip(dst.ip())
            .is_some_and(|h| !self.hosts[h].crashed);
        let at = self.now + self.draw_delay(id);
        let msg = if reachable {
            CmMsg::AddrResolved(id)
        } else {
            CmMsg::AddrError(id)
        };
        self.schedule(at, Event::Cm(msg));
        Ok(())
    }

    pub(crate) fn cm_resolve_route(&mut self, id: ObjId) -> Result<()> {
        if self.cm(id)?.st != CmSt::AddrResolved {
            return Err(RdmaError::ResolveRoute(os(libc::EINVAL)));
        }
        self.cm_mut(id).st = CmSt::RouteQuery;
        let at = self.now + self.draw_delay(id);
        self.schedule(at, Event::Cm(CmMsg::RouteResolved(id)));
        Ok(())
    }

    /// The device the id is bound to; none once that device is removed (even if another
    /// came back in its place).
    pub(crate) fn cm_device(&self, id: ObjId) -> Result<HostId> {
        let s = self.cm(id)?;
        let host = s.device.ok_or(RdmaError::NoDevice)?;
        if self.hosts[host].removed || self.hosts[host].incarnation != s.incarnation {
            return Err(RdmaError::NoDevice);
        }
        Ok(host)
    }

    // ---- QP ----

    pub(crate) fn cm_create_qp(
        &mut self,
        id: ObjId,
        res: QpResources,
        caps: QpCaps,
    ) -> Result<(ObjId, u32, QpCaps)> {
        let QpResources {
            host: pd_host,
            pd,
            send_cq,
            recv_cq,
            srq,
        } = res;
        let s = self.cm(id)?;
        if s.device != Some(pd_host) {
            return Err(RdmaError::InvalidArgument(
                "the PD is not on the CM id's device context",
            ));
        }
        if s.qp.is_some() {
            return Err(RdmaError::CreateQp(os(libc::EINVAL)));
        }
        let attr = &self.hosts[pd_host].attr;
        if caps.max_inline_data > self.hosts[pd_host].max_inline_data {
            return Err(RdmaError::CreateQp(os(libc::EINVAL)));
        }
        let caps = QpCaps {
            max_send_wr: caps.max_send_wr.min(attr.max_qp_wr),
            max_recv_wr: caps.max_recv_wr.min(attr.max_qp_wr),
            max_send_sge: caps.max_send_sge.min(attr.max_sge),
            max_recv_sge: caps.max_recv_sge.min(attr.max_sge),
            max_inline_data: caps.max_inline_data,
        };
        let qp = self.alloc_id();
        let num = self.alloc_qp_num();
        self.qps.insert(
            qp,
            QpState {
                host: pd_host,
                num,
                pd,
                send_cq,
                recv_cq,
                srq,
                caps,
                state: QpSt::Init,
                peer: None,
                sq: Default::default(),
                rq: Default::default(),
                unsignaled_held: 0,
                next_psn: 0,
                next_wire_psn: 0,
                tx_psn: 0,
                rx_psn: 0,
                rnr_retry: 7,
                retry_count: 7,
                resume_at: 0,
                exec_pending: false,
                rnr_timer: None,
                lost_timers: Vec::new(),
                stalled: false,
                post_send_calls: 0,
                post_recv_calls: 0,
            },
        );
        self.qp_by_num.insert(num, qp);
        let s = self.cm_mut(id);
        s.qp = Some(qp);
        s.qp_link = Some(qp);
        self.trace(|| format!("cm id={id} create_qp qp={num}"));
        Ok((qp, num, caps))
    }

    /// The QP's handle was dropped: its WQEs vanish without completions.
    pub(crate) fn destroy_qp(&mut self, qp: ObjId, cm_id: ObjId) {
        if let Some(q) = self.qps.remove(&qp) {
            self.qp_by_num.remove(&q.num);
            self.cancel(q.rnr_timer);
            for key in q.lost_timers {
                self.cancel(Some(key));
            }
            let num = q.num;
            self.trace(|| format!("qp={num} destroyed"));
            self.free_windows_of(qp);
        }
        if let Some(s) = self.cm_ids.get_mut(&cm_id) {
            if s.qp == Some(qp) {
                s.qp = None;
            }
        }
    }

    // ---- connection setup ----

    pub(crate) fn cm_connect(&mut self, id: ObjId, p: &ConnParams<'_>) -> Result<()> {
        let s = self.cm(id)?;
        if s.st != CmSt::RouteResolved || p.private_data.len() > REQ_PRIVATE {
            return Err(RdmaError::Connect(os(libc::EINVAL)));
        }
        let (Some(qp), Some(src), Some(dst)) = (s.qp, s.local, s.peer) else {
            return Err(RdmaError::Connect(os(libc::EINVAL)));
        };
        let attr = &self.hosts[s.host].attr;
        let init = depth(p.initiator_depth, attr.max_qp_init_rd_atom);
        let resp = depth(p.responder_resources, attr.max_qp_rd_atom);
        let q = self.qps.get_mut(&qp).expect("the id's QP");
        q.rnr_retry = p.rnr_retry_count & 7;
        q.retry_count = p.retry_count & 7;
        // The passive side's view: our initiator depth is its responder resources.
        let conn = peer_view(p, init, resp, q.srq.is_some(), q.num);
        self.cm_mut(id).st = CmSt::Connecting;
        self.trace(|| format!("cm id={id} connect {src} -> {dst}"));
        let msg = CmMsg::Req {
            from: id,
            src,
            dst,
            data: p.private_data.to_vec(),
            conn,
        };
        self.cm_send(id, None, msg);
        self.arm_timer(id, CmMsg::ConnectTimeout(id));
        Ok(())
    }

    fn find_listener(&self, host: HostId, ip: IpAddr, port: u16) -> Option<ObjId> {
        [
            ip,
            IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        ]
        .iter()
        .filter_map(|a| self.bound.get(&(host, *a, port)))
        .copied()
        .find(|l| self.cm_ids.get(l).is_some_and(|s| s.st == CmSt::Listening))
    }

    fn on_req(
        &mut self,
        from: ObjId,
        src: SocketAddr,
        dst: SocketAddr,
        data: Vec<u8>,
        conn: ConnEventParams,
    ) {
        if !self
            .cm_ids
            .get(&from)
            .is_some_and(|s| s.st == CmSt::Connecting)
        {
            return;
        }
        let Some(host) = self
            .host_of_ip(dst.ip())
            .filter(|&h| !self.hosts[h].crashed && !self.hosts[h].removed)
        else {
            // Nobody answers (a removed device: the address has no RDMA device): the
            // connect times out.
            return;
        };
        let Some(listener) = self.find_listener(host, dst.ip(), dst.port()) else {
            self.trace(|| format!("cm REQ from id={from} to {dst}: nobody listens"));
            let at = self.now + self.draw_delay(from);
            self.schedule(
                at,
                Event::Cm(CmMsg::Rej {
                    to: from,
                    status: REJ_INVALID_SERVICE_ID,
                    data: Vec::new(),
                }),
            );
            return;
        };
        let l = &self.cm_ids[&listener];
        let (channel, lhost, context) = (l.channel, l.host, l.context);
        let id = self.alloc_id();
        self.cm_ids.insert(
            id,
            CmIdState {
                channel,
                host: lhost,
                device: Some(host),
                incarnation: self.hosts[host].incarnation,
                local: Some(dst),
                peer: Some(src),
                st: CmSt::ReqReceived,
                qp: None,
                qp_link: None,
                peer_id: Some(from),
                context,
                bound: None,
                peer_rnr_retry: conn.rnr_retry_count & 7,
                peer_retry: conn.retry_count & 7,
                timer: None,
            },
        );
        self.trace(|| {
            format!("cm id={id} connect request from id={from} on listener id={listener}")
        });
        if let Some(ch) = self.channels.get_mut(&channel) {
            ch.queue.push_back(PendingEvent {
                kind: CmEventKind::ConnectRequest,
                status: 0,
                id,
                listen_id: Some(listener),
                id_context: context,
                new_id: true,
                private_data: padded(&data, REQ_PRIVATE),
                conn,
            });
        }
    }

    pub(crate) fn cm_accept(&mut self, id: ObjId, p: &ConnParams<'_>) -> Result<()> {
        let s = self.cm(id)?;
        if s.st != CmSt::ReqReceived || p.private_data.len() > REP_PRIVATE {
            return Err(RdmaError::Accept(os(libc::EINVAL)));
        }
        let Some(qp) = s.qp else {
            return Err(RdmaError::Accept(os(libc::EINVAL)));
        };
        let (peer_id, peer_rnr, peer_retry) = (s.peer_id, s.peer_rnr_retry, s.peer_retry);
        let attr = &self.hosts[s.host].attr;
        let init = depth(p.initiator_depth, attr.max_qp_init_rd_atom);
        let resp = depth(p.responder_resources, attr.max_qp_rd_atom);
        let active_qp = peer_id.and_then(|a| self.cm_ids.get(&a)).and_then(|a| a.qp);
        let from_peer = self.cfg.rnr_retry_from_peer;
        let q = self.qps.get_mut(&qp).expect("the id's QP");
        (q.rnr_retry, q.retry_count) = if from_peer {
            (peer_rnr, peer_retry)
        } else {
            (p.rnr_retry_count & 7, p.retry_count & 7)
        };
        q.state = QpSt::Rts;
        q.peer = active_qp;
        let conn = peer_view(p, init, resp, q.srq.is_some(), q.num);
        self.cm_mut(id).st = CmSt::Accepted;
        self.trace(|| format!("cm id={id} accept"));
        if let Some(to) = peer_id {
            let msg = CmMsg::Rep {
                to,
                from: id,
                data: padded(p.private_data, REP_PRIVATE),
                conn,
            };
            self.cm_send(id, Some(to), msg);
        }
        self.arm_timer(id, CmMsg::EstablishTimeout(id));
        Ok(())
    }

    pub(crate) fn cm_reject(&mut self, id: ObjId, data: &[u8]) -> Result<()> {
        let s = self.cm(id)?;
        if s.st != CmSt::ReqReceived || data.len() > REJ_PRIVATE {
            return Err(RdmaError::Reject(os(libc::EINVAL)));
        }
        let peer = s.peer_id;
        self.cm_mut(id).st = CmSt::Closed;
        self.trace(|| format!("cm id={id} reject"));
        if let Some(to) = peer {
            let msg = CmMsg::Rej {
                to,
                status: REJ_CONSUMER_DEFINED,
                data: padded(data, REJ_PRIVATE),
            };
            self.cm_send(id, Some(to), msg);
        }
        Ok(())
    }

    // ---- teardown ----

    pub(crate) fn cm_disconnect(&mut self, id: ObjId) -> Result<()> {
        let s = self.cm(id)?;
        let (st, qp, peer) = (s.st, s.qp, s.peer_id);
        if matches!(
            st,
            CmSt::Idle
                | CmSt::Bound
                | CmSt::Listening
                | CmSt::AddrQuery
                | CmSt::AddrResolved
                | CmSt::RouteQuery
                | CmSt::RouteResolved
        ) {
            return Err(RdmaError::Disconnect(os(libc::EINVAL)));
        }
        self.trace(|| format!("cm id={id} disconnect in {st:?}"));
        self.clear_timer(id);
        if let Some(qp) = qp {
            self.qp_to_error(qp, None);
        }
        match st {
            CmSt::Connected | CmSt::Accepted => {
                self.cm_mut(id).st = CmSt::DreqSent;
                if let Some(to) = peer {
                    self.cm_send(id, Some(to), CmMsg::Dreq { to });
                }
                self.arm_timer(id, CmMsg::DreqTimeout(id));
            }
            CmSt::DreqRcvd => {
                self.cm_mut(id).st = CmSt::TimeWait;
                if let Some(to) = peer {
                    self.cm_send(id, Some(to), CmMsg::Drep { to });
                }
                let t = self.now.saturating_add(self.cfg.timewait_ns);
                self.schedule(t, Event::Cm(CmMsg::TimewaitDone(id)));
            }
            CmSt::ReqReceived => {
                self.cm_mut(id).st = CmSt::Closed;
                if let Some(to) = peer {
                    let msg = CmMsg::Rej {
                        to,
                        status: REJ_CONSUMER_DEFINED,
                        data: Vec::new(),
                    };
                    self.cm_send(id, Some(to), msg);
                }
            }
            // A REP that arrives later is answered with a REJ.
            CmSt::Connecting => self.cm_mut(id).st = CmSt::Closed,
            _ => {}
        }
        Ok(())
    }

    /// The last handle of an id (and its QP) is gone.
    pub(crate) fn cm_destroy(&mut self, id: ObjId) {
        let Some(s) = self.cm_ids.get(&id) else {
            return;
        };
        let (st, peer, bound) = (s.st, s.peer_id, s.bound);
        self.trace(|| format!("cm id={id} destroyed in {st:?}"));
        self.clear_timer(id);
        if let Some(to) = peer {
            let msg = match st {
                CmSt::ReqReceived => Some(CmMsg::Rej {
                    to,
                    status: REJ_CONSUMER_DEFINED,
                    data: Vec::new(),
                }),
                CmSt::Connected | CmSt::Accepted => Some(CmMsg::Dreq { to }),
                CmSt::DreqRcvd => Some(CmMsg::Drep { to }),
                _ => None,
            };
            if let Some(msg) = msg {
                self.cm_send(id, Some(to), msg);
            }
        }
        if let Some(key) = bound {
            if self.bound.get(&key) == Some(&id) {
                self.bound.remove(&key);
            }
        }
        let peer_link = peer
            .and_then(|p| self.cm_ids.get(&p))
            .and_then(|p| p.qp_link);
        if let Some(link) = self.cm_ids.remove(&id).and_then(|s| s.qp_link) {
            self.forget_links(link, peer_link);
        }
    }

    /// A channel's last handle is gone: connect requests nobody took are rejected.
    pub(crate) fn channel_destroy(&mut self, channel: ObjId) {
        let Some(c) = self.channels.remove(&channel) else {
            return;
        };
        for ev in c.queue {
            if ev.new_id {
                self.cm_destroy(ev.id);
            }
        }
    }

    // ---- message arrival ----

    fn alive(&self, id: ObjId) -> Option<&CmIdState> {
        self.cm_ids.get(&id).filter(|s| !self.hosts[s.host].crashed)
    }

    fn enter_timewait(&mut self, id: ObjId) {
        self.clear_timer(id);
        self.cm_mut(id).st = CmSt::TimeWait;
        self.push_plain_event(id, CmEventKind::Disconnected, 0);
        let t = self.now.saturating_add(self.cfg.timewait_ns);
        self.schedule(t, Event::Cm(CmMsg::TimewaitDone(id)));
    }

    pub(crate) fn on_cm(&mut self, msg: CmMsg) {
        match msg {
            CmMsg::AddrResolved(id) => {
                if self.alive(id).is_some_and(|s| s.st == CmSt::AddrQuery) {
                    self.cm_mut(id).st = CmSt::AddrResolved;
                    self.push_plain_event(id, CmEventKind::AddrResolved, 0);
                }
            }
            CmMsg::AddrError(id) => {
                if self.alive(id).is_some_and(|s| s.st == CmSt::AddrQuery) {
                    self.cm_mut(id).st = CmSt::Idle;
                    let status = -libc::EHOSTUNREACH;
                    self.push_plain_event(id, CmEventKind::AddrError, status);
                }
            }
            CmMsg::RouteResolved(id) => {
                if self.alive(id).is_some_and(|s| s.st == CmSt::RouteQuery) {
                    self.cm_mut(id).st = CmSt::RouteResolved;
                    self.push_plain_event(id, CmEventKind::RouteResolved, 0);
                }
            }
            CmMsg::Req {
                from,
                src,
                dst,
                data,
                conn,
            } => self.on_req(from, src, dst, data, conn),
            CmMsg::Rep {
                to,
                from,
                data,
                conn,
            } => self.on_rep(to, from, data, conn),
            CmMsg::Rtu { to } => {
                if self.alive(to).is_some_and(|s| s.st == CmSt::Accepted) {
                    self.clear_timer(to);
                    self.cm_mut(to).st = CmSt::Connected;
                    self.push_plain_event(to, CmEventKind::Established, 0);
                }
            }
            CmMsg::Rej { to, status, data } => {
                let Some(s) = self.alive(to) else {
                    return;
                };
                let (st, qp) = (s.st, s.qp);
                if matches!(st, CmSt::Connecting | CmSt::Accepted | CmSt::Connected) {
                    if let Some(qp) = qp.filter(|_| st != CmSt::Connecting) {
                        self.qp_to_error(qp, None);
                    }
                    self.clear_timer(to);
                    self.cm_mut(to).st = CmSt::Closed;
                    self.push_cm_event(to, CmEventKind::Rejected, status, data, Default::default());
                }
            }
            CmMsg::Dreq { to } => {
                let Some(s) = self.alive(to) else {
                    return;
                };
                let (st, qp) = (s.st, s.qp);
                match st {
                    CmSt::Connected | CmSt::Accepted => {
                        self.clear_timer(to);
                        if let Some(qp) = qp {
                            self.qp_to_error(qp, None);
                        }
                        self.cm_mut(to).st = CmSt::DreqRcvd;
                        self.push_plain_event(to, CmEventKind::Disconnected, 0);
                    }
                    // Both sides disconnected at once: each DREQ answers the other.
                    CmSt::DreqSent => self.enter_timewait(to),
                    _ => {}
                }
            }
            CmMsg::Drep { to } | CmMsg::DreqTimeout(to) => {
                if self.alive(to).is_some_and(|s| s.st == CmSt::DreqSent) {
                    self.enter_timewait(to);
                }
            }
            CmMsg::ConnectTimeout(id) => {
                if self.alive(id).is_some_and(|s| s.st == CmSt::Connecting) {
                    self.cm_mut(id).timer = None;
                    self.cm_mut(id).st = CmSt::Closed;
                    let status = -libc::ETIMEDOUT;
                    self.push_plain_event(id, CmEventKind::Unreachable, status);
                }
            }
            CmMsg::EstablishTimeout(id) => {
                if let Some(s) = self.alive(id).filter(|s| s.st == CmSt::Accepted) {
                    let qp = s.qp;
                    if let Some(qp) = qp {
                        self.qp_to_error(qp, None);
                    }
                    self.cm_mut(id).timer = None;
                    self.cm_mut(id).st = CmSt::Closed;
                    let status = -libc::ETIMEDOUT;
                    self.push_plain_event(id, CmEventKind::ConnectError, status);
                }
            }
            CmMsg::TimewaitDone(id) => {
                if self.alive(id).is_some_and(|s| s.st == CmSt::TimeWait) {
                    self.cm_mut(id).st = CmSt::Closed;
                    self.push_plain_event(id, CmEventKind::TimewaitExit, 0);
                }
            }
        }
    }

    fn on_rep(&mut self, to: ObjId, from: ObjId, data: Vec<u8>, conn: ConnEventParams) {
        let Some(s) = self.cm_ids.get(&to) else {
            // The active id is gone: its side answers the REP with a REJ.
            self.reject_rep(from);
            return;
        };
        if self.hosts[s.host].crashed {
            return;
        }
        if s.st != CmSt::Connecting {
            self.reject_rep(from);
            return;
        }
        let qp = s.qp;
        let passive_qp = self.cm_ids.get(&from).and_then(|f| f.qp);
        let from_peer = self.cfg.rnr_retry_from_peer;
        if let Some(q) = qp.and_then(|qp| self.qps.get_mut(&qp)) {
            if q.state == QpSt::Init {
                q.state = QpSt::Rts;
            }
            q.peer = passive_qp;
            if from_peer {
                q.rnr_retry = conn.rnr_retry_count & 7;
                q.retry_count = conn.retry_count & 7;
            }
        }
        self.clear_timer(to);
        let s = self.cm_mut(to);
        s.st = CmSt::Connected;
        s.peer_id = Some(from);
        s.peer_rnr_retry = conn.rnr_retry_count & 7;
        s.peer_retry = conn.retry_count & 7;
        self.push_cm_event(to, CmEventKind::Established, 0, data, conn);
        self.cm_send(to, Some(from), CmMsg::Rtu { to: from });
    }

    fn reject_rep(&mut self, passive: ObjId) {
        if !self.cm_ids.contains_key(&passive) {
            return;
        }
        let at = self.now + self.draw_delay(passive);
        self.schedule(
            at,
            Event::Cm(CmMsg::Rej {
                to: passive,
                status: REJ_CONSUMER_DEFINED,
                data: Vec::new(),
            }),
        );
    }
}

/// What the other side sees of `p` in its CM event: `init` and `resp` are this side's
/// initiator depth and responder resources, already bounded by the device, swapped into the
/// peer's point of view.
fn peer_view(p: &ConnParams<'_>, init: u8, resp: u8, srq: bool, qp_num: u32) -> ConnEventParams {
    ConnEventParams {
        responder_resources: init,
        initiator_depth: resp,
        flow_control: p.flow_control,
        retry_count: p.retry_count,
        rnr_retry_count: p.rnr_retry_count,
        srq,
        qp_num,
    }
}
