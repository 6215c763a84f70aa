//! The admin queue: its commands, keep-alive and asynchronous event bookkeeping, the
//! bring-up in the Linux host's order and the shutdown. The [`Controller`](super::Controller)
//! owns one and drives it from its thread.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvmf_common::rdma::{AccessFlags, DmaBuf, Verbs, VerbsMr};
use nvmf_common::spec::fabrics::{
    connect_offsets, parse_connect_invalid_param_dw0, CNTLID_DYNAMIC,
};
use nvmf_common::spec::{
    Cap, Cc, Cns, Command, Completion, ConnectCommand, ConnectData, Csts, IdentifyController,
    LogPageId, Property, PropertyGetCommand, PropertySetCommand, Status, Version,
};
use zerocopy::{FromBytes, IntoBytes};

use crate::address::TransportId;
use crate::error::{Error, QueueFault, Result};
use crate::host::HostIdentity;
use crate::transport::{Data, RdmaQueue, POLL_BATCH};

use super::{ControllerInfo, ControllerOptions, ADMIN_DATA_LEN, ADMIN_QUEUE_DEPTH};

/// Admin command data direction.
pub(crate) enum AdminData<'a> {
    None,
    /// Controller to host, this many bytes (then read them from the admin buffer).
    In(usize),
    /// Host to controller.
    Out(&'a [u8]),
}

/// The admin queue and its bookkeeping. Its times are on the provider's clock
/// (`q.verbs()`).
pub(crate) struct Admin<V: Verbs> {
    q: RdmaQueue<V>,
    data: DmaBuf<V>,
    kato: Duration,
    last_ka: Instant,
    ka: Option<(u16, Instant)>,
    aer: Option<u16>,
    pub(super) aer_done: Vec<Completion>,
    sync: Option<(u16, Instant)>,
    sync_rsp: Option<Completion>,
    out: [(u16, Completion); POLL_BATCH],
    timeout: Duration,
    cc: Cc,
    /// Why a synchronous command left the queue unusable (it timed out, or the queue
    /// faulted): its slot and the shared data buffer may still be the target's, so the next
    /// [`pump`](Admin::pump) fails and the association is reset, as Linux resets on an
    /// admin timeout.
    broken: Option<String>,
}

impl<V: Verbs> Admin<V> {
    fn fault(&self, f: QueueFault) -> Error {
        Error::Transport {
            addr: self.q.peer(),
            qid: 0,
            detail: f.to_string(),
        }
    }

    /// Takes admin completions, sends a keep-alive when due, checks timeouts and the CM
    /// channel. An error means the association is broken.
    pub(super) fn pump(&mut self) -> Result<()> {
        if let Some(why) = &self.broken {
            return Err(Error::Transport {
                addr: self.q.peer(),
                qid: 0,
                detail: format!("the admin queue is unusable after {why}"),
            });
        }
        let n = self
            .q
            .poll(&mut self.out, POLL_BATCH)
            .map_err(|f| self.fault(f))?;
        for i in 0..n {
            let (cid, cqe) = self.out[i];
            if self.sync.is_some_and(|(c, _)| c == cid) {
                self.sync = None;
                self.sync_rsp = Some(cqe);
            } else if self.ka.is_some_and(|(c, _)| c == cid) {
                self.ka = None;
                if !cqe.status().is_success() {
                    return Err(Error::Command {
                        what: "Keep Alive".into(),
                        status: cqe.status(),
                    });
                }
            } else if self.aer == Some(cid) {
                self.aer = None;
                if cqe.status().is_success() {
                    self.aer_done.push(cqe);
                } else {
                    // Aborted (shutdown) or refused: not re-armed.
                    tracing::debug!(status = %cqe.status(), "AER completed with an error");
                }
            }
        }
        let now = self.q.verbs().now();
        if n == 0 {
            if let Some(f) = self.q.check_cm() {
                return Err(self.fault(f));
            }
        }
        if let Some((_, sent)) = self.sync {
            if now.duration_since(sent) > self.timeout {
                return Err(Error::Timeout {
                    what: "admin command".into(),
                    after: self.timeout,
                });
            }
        }
        if !self.kato.is_zero() {
            match self.ka {
                Some((_, sent)) if now.duration_since(sent) > self.kato => {
                    return Err(Error::Timeout {
                        what: "Keep Alive".into(),
                        after: self.kato,
                    })
                }
                Some(_) => {}
                None if now.duration_since(self.last_ka) >= self.kato / 2 => {
                    let mut cmd = Command::keep_alive(0);
                    if let Some(cid) = self
                        .q
                        .submit(&mut cmd, Data::None)
                        .map_err(|f| self.fault(f))?
                    {
                        self.ka = Some((cid, now));
                        self.last_ka = now;
                    }
                }
                None => {}
            }
        }
        Ok(())
    }

    /// Runs one admin command to completion (pumping keep-alive and AERs meanwhile). The
    /// completion is returned whatever its status. An error (a timeout, a queue fault)
    /// leaves the queue [`broken`](Self::broken).
    pub(crate) fn cmd(
        &mut self,
        cmd: Command,
        data: AdminData<'_>,
        what: &str,
    ) -> Result<Completion> {
        let result = self.run_cmd(cmd, data, what);
        if let Err(e) = &result {
            self.broken.get_or_insert_with(|| format!("{what}: {e}"));
        }
        result
    }

    fn run_cmd(&mut self, mut cmd: Command, data: AdminData<'_>, what: &str) -> Result<Completion> {
        let timeout = self.timeout;
        let d = match data {
            AdminData::None => Data::None,
            AdminData::In(len) => {
                assert!(
                    len <= ADMIN_DATA_LEN,
                    "admin transfer above the buffer size"
                );
                let sge = self.data.sge(0, len).expect("inside the admin buffer");
                Data::Keyed {
                    addr: sge.addr,
                    len: len as u32,
                    rkey: self.data.mr().rkey(),
                }
            }
            AdminData::Out(bytes) => {
                assert!(
                    bytes.len() <= ADMIN_DATA_LEN,
                    "admin transfer above the buffer size"
                );
                self.data.write_at(0, bytes);
                let sge = self
                    .data
                    .sge(0, bytes.len())
                    .expect("inside the admin buffer");
                Data::Keyed {
                    addr: sge.addr,
                    len: bytes.len() as u32,
                    rkey: self.data.mr().rkey(),
                }
            }
        };
        let deadline = self.q.verbs().now() + timeout;
        let cid = loop {
            match self.q.submit(&mut cmd, d).map_err(|f| self.fault(f))? {
                Some(cid) => break cid,
                // Every slot busy (keep-alive, AER and ours can't fill 32: only a stuck
                // queue gets here).
                None if self.q.verbs().now() >= deadline => {
                    return Err(Error::Timeout {
                        what: format!("{what}: a free admin slot"),
                        after: timeout,
                    })
                }
                None => {
                    self.pump()?;
                    self.q.verbs().sleep(Duration::from_micros(50));
                }
            }
        };
        self.sync = Some((cid, self.q.verbs().now()));
        self.sync_rsp = None;
        loop {
            self.pump().map_err(|e| match e {
                Error::Timeout { what: w, after } if w == "admin command" => Error::Timeout {
                    what: what.to_string(),
                    after,
                },
                e => e,
            })?;
            if let Some(rsp) = self.sync_rsp.take() {
                return Ok(rsp);
            }
            self.q.verbs().sleep(Duration::from_micros(50));
        }
    }

    /// Like [`cmd`](Self::cmd), failing on an error status.
    pub(crate) fn ok(
        &mut self,
        cmd: Command,
        data: AdminData<'_>,
        what: &str,
    ) -> Result<Completion> {
        let rsp = self.cmd(cmd, data, what)?;
        if !rsp.status().is_success() {
            return Err(Error::Command {
                what: what.to_string(),
                status: rsp.status(),
            });
        }
        Ok(rsp)
    }

    pub(super) fn read_data(&self, out: &mut [u8]) {
        self.data.read_at(0, out);
    }

    fn property_get(&mut self, p: Property, what: &str) -> Result<u64> {
        let cmd = PropertyGetCommand::new(0, p.0, p.size() == 8).to_command();
        Ok(self.ok(cmd, AdminData::None, what)?.result64())
    }

    fn property_set(&mut self, p: Property, value: u64, what: &str) -> Result<()> {
        let cmd = PropertySetCommand::new(0, p.0, value, p.size() == 8).to_command();
        self.ok(cmd, AdminData::None, what).map(|_| ())
    }

    pub(super) fn submit_aer(&mut self) {
        if self.aer.is_some() {
            return;
        }
        let mut cmd = Command::async_event_request(0);
        match self.q.submit(&mut cmd, Data::None) {
            Ok(Some(cid)) => self.aer = Some(cid),
            Ok(None) => tracing::warn!("no admin slot for an AER"),
            Err(f) => tracing::warn!("cannot submit an AER: {f}"),
        }
    }

    /// Get Log Page of `len` bytes into a vector, split into buffer-sized pieces.
    pub(crate) fn get_log(
        &mut self,
        nsid: u32,
        lid: LogPageId,
        len: usize,
        max_xfer: u32,
        what: &str,
    ) -> Result<Vec<u8>> {
        // At least a dword a command, whatever the target's MDTS: a chunk of 0 would loop.
        let chunk = (ADMIN_DATA_LEN.min(max_xfer as usize) & !3).max(4);
        let mut out = vec![0u8; len];
        let mut off = 0;
        while off < len {
            let n = (len - off).min(chunk);
            // Lengths are in dwords; read whole dwords and keep what was asked for.
            let n4 = n.next_multiple_of(4).max(4);
            let cmd = Command::get_log_page(0, nsid, lid, n4 as u32, off as u64);
            self.ok(cmd, AdminData::In(n4), what)?;
            let mut tmp = vec![0u8; n4];
            self.read_data(&mut tmp);
            out[off..off + n].copy_from_slice(&tmp[..n]);
            off += n;
        }
        Ok(out)
    }

    pub(crate) fn disconnect(&mut self, wait: Duration) {
        self.q.disconnect(wait);
    }
}

/// Turns a failed Fabrics Connect into an error naming the likely cause.
pub(crate) fn connect_error(
    peer: SocketAddr,
    qid: u16,
    subnqn: &str,
    hostnqn: &str,
    rsp: &Completion,
) -> Error {
    let status = rsp.status();
    let shown = status.in_connect();
    let detail = if status.same_code(Status::CONNECT_INVALID_HOST) {
        format!("host {hostnqn} is not allowed to access the subsystem ({shown})")
    } else if status.same_code(Status::CONNECT_INVALID_PARAMETERS) {
        let (in_data, off) = parse_connect_invalid_param_dw0(rsp.dw0.get());
        let field = match (in_data, off) {
            (true, o) if o == connect_offsets::DATA_SUBNQN => {
                "subsystem NQN (no such subsystem on this port?)".to_string()
            }
            (true, o) if o == connect_offsets::DATA_HOSTNQN => "host NQN".to_string(),
            (true, o) if o == connect_offsets::DATA_CNTLID => {
                "controller ID (the controller is gone?)".to_string()
            }
            (true, o) if o == connect_offsets::DATA_HOSTID => "host ID".to_string(),
            (false, o) if o == connect_offsets::SQE_SQSIZE => "queue size".to_string(),
            (false, o) if o == connect_offsets::SQE_QID => "queue ID".to_string(),
            (in_data, o) => format!("{} byte {o}", if in_data { "data" } else { "command" }),
        };
        format!("invalid parameter: {field} ({shown})")
    } else if status.same_code(Status::CONTROLLER_BUSY) {
        format!("controller busy ({shown})")
    } else {
        shown.to_string()
    };
    Error::ConnectFailed {
        addr: peer,
        qid,
        subnqn: subnqn.to_string(),
        status,
        detail,
    }
}

/// Connects the admin queue and brings the controller up exactly as the Linux host does:
/// Connect (QID 0) → Property Get CAP → Property Set CC (EN, IOSQES 6, IOCQES 4) → poll
/// CSTS.RDY → Property Get VS → Identify Controller.
pub(super) fn bring_up<V: Verbs>(
    verbs: &V,
    peer: SocketAddr,
    tid: &TransportId,
    host: &HostIdentity,
    opts: &ControllerOptions,
    pd: Option<&Arc<V::Pd>>,
) -> Result<(Admin<V>, Arc<V::Pd>, ControllerInfo)> {
    // Admin data lives in one small buffer of our own, under its registration's key.
    let (q, pd) = RdmaQueue::connect(
        verbs,
        peer,
        pd,
        0,
        ADMIN_QUEUE_DEPTH,
        false,
        opts.connect_timeout,
    )?;
    let data = DmaBuf::<V>::new(&pd, ADMIN_DATA_LEN, AccessFlags::ALL_DATA)
        .map_err(|e| Error::rdma("registering the admin data buffer", e))?;
    let mut admin = Admin {
        q,
        data,
        kato: Duration::ZERO,
        last_ka: verbs.now(),
        ka: None,
        aer: None,
        aer_done: Vec::new(),
        sync: None,
        sync_rsp: None,
        out: [(0, Completion::default()); POLL_BATCH],
        timeout: opts.connect_timeout.max(Duration::from_secs(1)),
        cc: Cc(0),
        broken: None,
    };
    let kato = if tid.is_discovery() {
        Duration::ZERO
    } else {
        opts.kato
    };
    let kato_ms = u32::try_from(kato.as_millis()).unwrap_or(u32::MAX);
    let connect = ConnectCommand::new(0, 0, ADMIN_QUEUE_DEPTH - 1, kato_ms).to_command();
    let cd = ConnectData::new(host.id, CNTLID_DYNAMIC, &tid.subnqn, &host.nqn);
    let rsp = admin.cmd(connect, AdminData::Out(cd.as_bytes()), "Connect")?;
    if !rsp.status().is_success() {
        return Err(connect_error(peer, 0, &tid.subnqn, &host.nqn, &rsp));
    }
    let cntlid = rsp.dw0.get() as u16;
    admin.timeout = opts.admin_timeout;

    let cap = Cap(admin.property_get(Property::CAP, "Property Get CAP")?);
    let cc = Cc(0).with_iosqes(6).with_iocqes(4).with_en(true);
    admin.property_set(Property::CC, u64::from(cc.0), "Property Set CC.EN")?;
    admin.cc = cc;
    // CAP.TO: worst-case time to ready, in 500 ms units.
    let ready_limit = Duration::from_millis(500 * (u64::from(cap.to()) + 1));
    let ready_deadline = verbs.now() + ready_limit;
    loop {
        let csts = Csts(admin.property_get(Property::CSTS, "Property Get CSTS")? as u32);
        if csts.cfs() {
            return Err(Error::Invalid(format!(
                "{peer}: controller fatal status (CSTS.CFS) during enable"
            )));
        }
        if csts.rdy() {
            break;
        }
        if verbs.now() >= ready_deadline {
            return Err(Error::Timeout {
                what: format!("{peer}: CSTS.RDY after enabling the controller"),
                after: ready_limit,
            });
        }
        verbs.sleep(Duration::from_millis(10));
    }
    let vs = Version(admin.property_get(Property::VS, "Property Get VS")? as u32);
    admin.ok(
        Command::identify(0, Cns::CONTROLLER, 0, 0),
        AdminData::In(4096),
        "Identify Controller",
    )?;
    let mut raw = vec![0u8; 4096];
    admin.read_data(&mut raw);
    let identify = Box::new(IdentifyController::read_from_bytes(&raw).expect("4096 bytes"));
    if identify.cntlid.get() != cntlid {
        tracing::warn!(
            connect = cntlid,
            identify = identify.cntlid.get(),
            "Identify CNTLID differs from Connect's"
        );
    }
    // Keep-alive starts once the controller is enabled and identified, as Linux starts it
    // when the controller goes live; the bring-up takes far less than KATO.
    admin.kato = kato;
    admin.last_ka = verbs.now();
    Ok((
        admin,
        pd,
        ControllerInfo {
            cntlid,
            cap,
            vs,
            identify,
        },
    ))
}

/// CC.SHN = normal shutdown, then wait (up to 5 s, Linux's default) for CSTS.SHST complete.
pub(super) fn shutdown<V: Verbs>(admin: &mut Admin<V>) -> Result<()> {
    admin.timeout = admin.timeout.min(Duration::from_secs(5));
    // A shutting-down controller fails Keep Alive with Command Sequence Error: stop sending.
    admin.kato = Duration::ZERO;
    let cc = admin.cc.with_shn(Cc::SHN_NORMAL);
    admin.property_set(Property::CC, u64::from(cc.0), "Property Set CC.SHN")?;
    let deadline = admin.q.verbs().now() + Duration::from_secs(5);
    loop {
        let csts = Csts(admin.property_get(Property::CSTS, "Property Get CSTS")? as u32);
        if csts.shst() == Csts::SHST_COMPLETE {
            return Ok(());
        }
        if admin.q.verbs().now() >= deadline {
            return Err(Error::Timeout {
                what: "shutdown (CSTS.SHST)".into(),
                after: Duration::from_secs(5),
            });
        }
        admin.q.verbs().sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvmf_common::spec::fabrics::{connect_invalid_param_dw0, connect_offsets};

    #[test]
    fn connect_errors_name_the_cause() {
        let peer: SocketAddr = "10.0.0.1:4420".parse().unwrap();
        let mut rsp = Completion::new(0, Status::CONNECT_INVALID_PARAMETERS.with_dnr());
        rsp.dw0.set(connect_invalid_param_dw0(
            true,
            connect_offsets::DATA_SUBNQN,
        ));
        let e = connect_error(peer, 0, "nqn.x", "nqn.h", &rsp);
        assert!(e.to_string().contains("no such subsystem"), "{e}");
        assert!(!e.is_retryable());
        let rsp = Completion::new(0, Status::CONNECT_INVALID_HOST.with_dnr());
        let e = connect_error(peer, 0, "nqn.x", "nqn.h", &rsp);
        assert!(e.to_string().contains("host nqn.h is not allowed"), "{e}");
    }

    #[test]
    fn linux_cc_value() {
        let cc = Cc(0).with_iosqes(6).with_iocqes(4).with_en(true);
        assert_eq!(cc.0, 0x0046_0001);
        assert_eq!(cc.with_shn(Cc::SHN_NORMAL).0, 0x0046_4001);
    }
}
