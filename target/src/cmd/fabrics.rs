//! Fabrics commands (NVMe-oF 1.1, 3): Connect creates a controller (admin queue) or binds an
//! I/O queue to one; Property Get/Set stand in for the register reads and writes of PCIe.

use std::sync::Arc;

use nvmf_common::spec::fabrics::{
    connect_invalid_param_dw0, connect_offsets as off, connect_success_dw0, ConnectCommand,
    ConnectData, FabricsCommand, FabricsCommandType, PropertyGetCommand, PropertySetCommand,
    CNTLID_DYNAMIC, RECFMT_0,
};
use nvmf_common::spec::registers::{Cap, Cc, Csts, Property, Version};
use nvmf_common::spec::Status;
use zerocopy::FromBytes;

use crate::bdev::{BdevCompletion, BdevIo, IoKind};
use crate::cmd::data_phase;
use crate::core::controller::{ControllerLocal, ControllerShared};
use crate::core::queue::QueueState;
use crate::core::request::{DataDirection, Exec, Prepared, Request, Wakeup};
use crate::core::subsystem::SubsystemKind;
use crate::core::CoreCtx;

/// The NVMe version this controller implements, reported in VS and Identify VER alike.
pub const NVME_VERSION: Version = Version::new(1, 3, 0);
/// CAP.TO: worst-case time to ready, in 500 ms units.
const CAP_TIMEOUT_UNITS: u8 = 15;
/// CC.IOSQES / IOCQES the NVM command set requires: 64-byte SQEs, 16-byte CQEs (log2).
const IOSQES: u8 = 6;
const IOCQES: u8 = 4;
/// CSTS.SHST: "shutdown processing occurring" and "shutdown processing complete".
const SHST_PROCESSING: u8 = 1;
const SHST_COMPLETE: u8 = 2;

/// KATO of a discovery controller whose host asked for none (nvmet's NVMET_DISC_KATO_MS).
pub const DISCOVERY_DEFAULT_KATO_MS: u32 = 120_000;

const CONNECT_DATA_LEN: u32 = core::mem::size_of::<ConnectData>() as u32;

pub fn prepare(
    _core: &mut CoreCtx,
    q: &mut QueueState,
    req: &mut Request,
) -> Result<Prepared, Status> {
    let fctype = FabricsCommand::from_command(&req.cmd).fctype();
    match fctype {
        FabricsCommandType::CONNECT => {
            if q.is_connected() {
                return Err(Status::COMMAND_SEQUENCE_ERROR.with_dnr());
            }
            if ConnectCommand::from_command(&req.cmd).recfmt.get() != RECFMT_0 {
                return Err(Status::INCOMPATIBLE_FORMAT.with_dnr());
            }
            data_phase(
                q,
                &req.cmd,
                DataDirection::HostToController,
                CONNECT_DATA_LEN,
            )
        }
        FabricsCommandType::PROPERTY_GET | FabricsCommandType::PROPERTY_SET => {
            if !q.is_connected() {
                return Err(Status::COMMAND_SEQUENCE_ERROR.with_dnr());
            }
            if !q.is_admin() {
                return Err(Status::INVALID_QUEUE_TYPE.with_dnr());
            }
            data_phase(q, &req.cmd, DataDirection::None, 0)
        }
        _ if !q.is_connected() => Err(Status::COMMAND_SEQUENCE_ERROR.with_dnr()),
        // Authentication is not required by any subsystem here, and Disconnect is optional
        // (OFCS bit 0 clear): hosts close the transport connection instead.
        _ => Err(Status::INVALID_OPCODE.with_dnr()),
    }
}

pub fn execute(core: &mut CoreCtx, q: &mut QueueState, req: &mut Request) -> Exec {
    match FabricsCommand::from_command(&req.cmd).fctype() {
        FabricsCommandType::CONNECT => connect(core, q, req),
        FabricsCommandType::PROPERTY_GET => property_get(q, req),
        FabricsCommandType::PROPERTY_SET => property_set(core, q, req),
        _ => req.fail(Status::INVALID_OPCODE.with_dnr()),
    }
}

fn invalid_param(req: &mut Request, in_data: bool, offset: u16) -> Exec {
    req.complete_with(
        Status::CONNECT_INVALID_PARAMETERS.with_dnr(),
        connect_invalid_param_dw0(in_data, offset),
    );
    Exec::Complete
}

fn connect(core: &mut CoreCtx, q: &mut QueueState, req: &mut Request) -> Exec {
    // `prepare` checked this too, but a host may pipeline two Connects whose data both come
    // by RDMA READ: both pass `prepare` before either runs. The second one must not make a
    // controller the queue then forgets (never destroyed, its connection slot never freed).
    if q.is_connected() || q.admitted {
        return req.fail(Status::COMMAND_SEQUENCE_ERROR.with_dnr());
    }
    let cmd = *ConnectCommand::from_command(&req.cmd);
    let Ok((data, _)) = ConnectData::read_from_prefix(req.data()) else {
        return req.fail(Status::DATA_SGL_LENGTH_INVALID.with_dnr());
    };
    let qid = cmd.qid.get();
    let sqsize = cmd.sqsize.get();
    if q.expected_qid.is_some_and(|expected| expected != qid) {
        return invalid_param(req, false, off::SQE_QID);
    }
    let Some(sub) = core.subsystem_by_nqn(data.subnqn()) else {
        tracing::warn!(
            subnqn = data.subnqn(),
            hostnqn = data.hostnqn(),
            "connect to unknown subsystem"
        );
        return invalid_param(req, true, off::DATA_SUBNQN);
    };
    let config = Arc::clone(&sub.config);
    // Through another subsystem's port the subsystem does not exist, as nvmet answers (SPDK
    // answers Connect Invalid Host); a host learns nothing of subsystems on other ports.
    if !config.listener_allowed(q.listener.as_ref()) {
        tracing::warn!(subnqn = %config.nqn, hostnqn = data.hostnqn(),
            listener = ?q.listener, "connect through a listener the subsystem does not have");
        return invalid_param(req, true, off::DATA_SUBNQN);
    }
    if !config.host_allowed(data.hostnqn()) {
        tracing::warn!(subnqn = %config.nqn, hostnqn = data.hostnqn(), "connect from a host not allowed");
        return req.fail(Status::CONNECT_INVALID_HOST.with_dnr());
    }
    if qid == 0 {
        if sqsize == 0 || u32::from(sqsize) + 1 > u32::from(q.limits.max_aq_depth) {
            return invalid_param(req, false, off::SQE_SQSIZE);
        }
        if data.cntlid.get() != CNTLID_DYNAMIC {
            return invalid_param(req, true, off::DATA_CNTLID);
        }
        let max_io_qid = match config.kind {
            SubsystemKind::Nvm => q.limits.max_qpairs_per_ctrl.saturating_sub(1),
            SubsystemKind::Discovery => 0,
        };
        // The transport's min_kato and KAS granularity apply (SPDK's rule). A discovery
        // controller asked for no keep-alive (Linux's one-shot `nvme discover`) still goes
        // away if its host does: nvmet and SPDK give it 120 s.
        let kato = match (config.kind, q.limits.grant_kato(cmd.kato.get())) {
            (SubsystemKind::Discovery, 0) => DISCOVERY_DEFAULT_KATO_MS,
            (_, kato) => kato,
        };
        if !admit(core, data.hostnqn()) {
            return req.fail(Status::CONTROLLER_BUSY);
        }
        let now = core.now_ms();
        let group = core.group;
        let Some(ctrl) =
            config
                .shared
                .add_controller(config.min_cntlid, config.max_cntlid, |cntlid| {
                    Arc::new(ControllerShared::new(
                        cntlid,
                        config.id,
                        config.nqn.clone(),
                        config.kind,
                        data.hostnqn().to_string(),
                        data.hostid,
                        group,
                        q.listener.clone(),
                        max_io_qid,
                        kato,
                        now,
                    ))
                })
        else {
            // Every cntlid of the subsystem's range is taken (nvmet answers Controller Busy
            // too; SPDK Internal Device Error).
            core.info.qpair_limits.release(data.hostnqn());
            return req.fail(Status::CONTROLLER_BUSY);
        };
        core.controllers.insert(
            (config.id, ctrl.cntlid),
            ControllerLocal::new(Arc::clone(&ctrl)),
        );
        core.arm_keep_alive((config.id, ctrl.cntlid));
        tracing::info!(cntlid = ctrl.cntlid, subnqn = %config.nqn, hostnqn = data.hostnqn(),
            kato_ms = kato, peer = %q.peer, "controller created");
        q.qid = 0;
        q.depth = sqsize + 1;
        q.admitted = true;
        q.subsystem = Some(config.id);
        req.complete_with(Status::SUCCESS, connect_success_dw0(ctrl.cntlid, 0));
        q.ctrl = Some(ctrl);
        core.stats.queue_connected(true);
        return Exec::Complete;
    }

    if config.kind == SubsystemKind::Discovery {
        return invalid_param(req, false, off::SQE_QID);
    }
    let Some(ctrl) = config.shared.controller(data.cntlid.get()) else {
        return invalid_param(req, true, off::DATA_CNTLID);
    };
    if ctrl.hostnqn != data.hostnqn() {
        return invalid_param(req, true, off::DATA_HOSTNQN);
    }
    if ctrl.hostid != data.hostid {
        return req.fail(Status::HOST_ID_INCONSISTENT_FORMAT.with_dnr());
    }
    if ctrl.is_failed() || !ctrl.cc().en() {
        return req.fail(Status::COMMAND_SEQUENCE_ERROR.with_dnr());
    }
    // With ANA reporting a controller's states are those of the listener its admin queue came
    // through: an I/O queue through another listener would see another path's state. SPDK
    // refuses it the same way (Connect Invalid Parameters at the QID).
    if config.ana_reporting && q.listener.is_some() && q.listener != ctrl.listener {
        tracing::warn!(cntlid = ctrl.cntlid, subnqn = %config.nqn, io_listener = ?q.listener,
            admin_listener = ?ctrl.listener, "I/O connect through another listener than the admin connect");
        return invalid_param(req, false, off::SQE_QID);
    }
    if qid > ctrl.max_io_qid.load(std::sync::atomic::Ordering::Relaxed) {
        // Beyond max_io_qpairs_per_ctrlr (or what Set Features Number of Queues granted):
        // Invalid Queue Identifier, as SPDK and nvmet answer, pointing at the SQE's QID.
        req.complete_with(
            Status::INVALID_QUEUE_IDENTIFIER.with_dnr(),
            connect_invalid_param_dw0(false, off::SQE_QID),
        );
        return Exec::Complete;
    }
    if sqsize == 0 || u32::from(sqsize) + 1 > u32::from(q.limits.max_queue_depth) {
        return invalid_param(req, false, off::SQE_SQSIZE);
    }
    if !admit(core, data.hostnqn()) {
        return req.fail(Status::CONTROLLER_BUSY);
    }
    if !ctrl.claim_qid(qid) {
        core.info.qpair_limits.release(data.hostnqn());
        return invalid_param(req, false, off::SQE_QID);
    }
    q.qid = qid;
    q.depth = sqsize + 1;
    q.admitted = true;
    q.subsystem = Some(config.id);
    q.resets_at_connect = ctrl.resets();
    req.complete_with(Status::SUCCESS, connect_success_dw0(ctrl.cntlid, 0));
    q.ctrl = Some(ctrl);
    core.stats.queue_connected(false);
    Exec::Complete
}

/// Counts one more queue pair of `hostnqn` against the target's limits (`max_qpairs_per_host`,
/// `max_qpairs`). Refused, the Connect fails with Controller Busy and no DNR: the host may
/// retry once some of its (or others') queues are gone. Only the Connect data's buffer has
/// been taken by then.
fn admit(core: &CoreCtx, hostnqn: &str) -> bool {
    match core.info.qpair_limits.admit(hostnqn) {
        Ok(()) => true,
        Err(limit) => {
            tracing::warn!(hostnqn, ?limit, "connect refused: queue pair limit reached");
            false
        }
    }
}

/// CAP as this controller reports it for queues of `q`'s transport.
pub fn capabilities(q: &QueueState) -> Cap {
    Cap(0)
        .with_mqes(q.limits.max_queue_depth - 1)
        .with_cqr(true)
        .with_to(CAP_TIMEOUT_UNITS)
        .with_css(Cap::CSS_NVM)
        .with_mpsmin(0)
        .with_mpsmax(0)
}

fn property_get(q: &QueueState, req: &mut Request) -> Exec {
    let cmd = *PropertyGetCommand::from_command(&req.cmd);
    let ctrl = q
        .ctrl
        .as_ref()
        .expect("prepare checked the queue is connected");
    let prop = Property(cmd.offset.get());
    let Some(size) = cmd.size() else {
        return req.fail(Status::INVALID_FIELD.with_dnr());
    };
    if size != prop.size() {
        return req.fail(Status::INVALID_FIELD.with_dnr());
    }
    let value: u64 = match prop {
        Property::CAP => capabilities(q).0,
        Property::VS => u64::from(NVME_VERSION.0),
        Property::CC => u64::from(ctrl.cc().0),
        Property::CSTS => u64::from(ctrl.csts().0),
        _ => return req.fail(Status::INVALID_FIELD.with_dnr()),
    };
    req.rsp.set_result64(value);
    req.complete(Status::SUCCESS);
    Exec::Complete
}

fn property_set(core: &mut CoreCtx, q: &QueueState, req: &mut Request) -> Exec {
    let cmd = *PropertySetCommand::from_command(&req.cmd);
    let ctrl = q
        .ctrl
        .as_ref()
        .expect("prepare checked the queue is connected");
    let prop = Property(cmd.offset.get());
    if prop != Property::CC || cmd.size() != Some(4) {
        // CAP, VS and CSTS are read-only; NSSR and the PCIe queue registers do not exist here.
        return req.fail(Status::INVALID_FIELD.with_dnr());
    }
    let was_enabled = ctrl.cc().en();
    let shutting_down = write_cc(ctrl, Cc(cmd.value.get() as u32));
    if was_enabled && !ctrl.cc().en() {
        reset_controller(core, ctrl);
    }
    if shutting_down {
        return flush_for_shutdown(core, q, req);
    }
    req.complete(Status::SUCCESS);
    Exec::Complete
}

/// CC.EN 1 to 0, a Controller Reset (NVMe 2.0 base, 3.7.2): the I/O queues are deleted,
/// which over fabrics means disconnected (as SPDK does; they go at the next tick), and the
/// commands the controller holds, its AERs, are aborted. The admin queue stays: the host
/// enables the controller again and connects new I/O queues.
fn reset_controller(core: &mut CoreCtx, ctrl: &ControllerShared) {
    ctrl.reset();
    let key = (ctrl.subsystem_id, ctrl.cntlid);
    let aers = core
        .controllers
        .get_mut(&key)
        .map(|local| std::mem::take(&mut local.outstanding_aers))
        .unwrap_or_default();
    for tag in aers {
        core.wake(tag, Wakeup::Aborted(Status::ABORTED_SQ_DELETION));
    }
}

/// A shutdown notification (CC.SHN): the host will cut power or go away once CSTS.SHST says
/// complete, so every namespace of the subsystem is flushed first; the Property Set completes,
/// and SHST turns complete, when the last flush has.
fn flush_for_shutdown(core: &mut CoreCtx, q: &QueueState, req: &mut Request) -> Exec {
    let sid = q.subsystem.expect("connected queues have a subsystem");
    let nsids: Vec<u32> = core
        .subsystem(sid)
        .map(|config| {
            config
                .namespaces
                .iter()
                .filter(|(_, ns)| ns.bdev.supports(IoKind::Flush))
                .map(|(&nsid, _)| nsid)
                .collect()
        })
        .unwrap_or_default();
    let mut outstanding = 0;
    for nsid in nsids {
        let flush = BdevIo {
            tag: req.tag.0,
            kind: IoKind::Flush,
            offset_blocks: 0,
            num_blocks: 0,
            buf: None,
            fua: false,
        };
        let submitted = core
            .namespace_slot(sid, nsid)
            .is_some_and(|slot| core.submit_io(slot, flush).is_ok());
        if submitted {
            outstanding += 1;
        }
    }
    req.progress.outstanding = outstanding;
    if outstanding == 0 {
        return shutdown_complete(q, req);
    }
    Exec::Pending
}

/// A flush of the shutdown sequence finished.
pub fn on_shutdown_flush(q: &QueueState, req: &mut Request, done: BdevCompletion) -> Exec {
    if let Err(errno) = done.result {
        // Nothing more can be done for that data: the host learns of it only through the log.
        tracing::error!(errno, "flush at controller shutdown failed");
    }
    req.progress.outstanding = req.progress.outstanding.saturating_sub(1);
    if req.progress.outstanding > 0 {
        return Exec::Pending;
    }
    shutdown_complete(q, req)
}

fn shutdown_complete(q: &QueueState, req: &mut Request) -> Exec {
    if let Some(ctrl) = &q.ctrl {
        ctrl.set_csts(ctrl.csts().with_shst(SHST_COMPLETE));
    }
    req.complete(Status::SUCCESS);
    Exec::Complete
}

/// Applies a CC write: enabling makes the controller ready (or fatal if the queue entry sizes
/// are wrong), disabling resets it. A shutdown notification sets SHST to "processing"; returns
/// true when it did, and the caller completes the shutdown once the namespaces are flushed.
fn write_cc(ctrl: &ControllerShared, new: Cc) -> bool {
    let old = ctrl.cc();
    let mut csts = ctrl.csts();
    if new.en() && !old.en() {
        let sizes_ok = new.iosqes() == IOSQES && new.iocqes() == IOCQES;
        let sizes_ok = sizes_ok || ctrl.kind == SubsystemKind::Discovery;
        if new.mps() != 0 || !sizes_ok {
            csts = csts.with_cfs(true);
        } else {
            csts = csts.with_rdy(true);
        }
    } else if !new.en() && old.en() {
        csts = Csts(0);
    }
    let shutting_down = new.shn() != 0 && old.shn() == 0;
    if shutting_down {
        csts = csts.with_shst(SHST_PROCESSING);
    } else if new.shn() == 0 && old.shn() != 0 {
        csts = csts.with_shst(0);
    }
    ctrl.set_cc(new);
    ctrl.set_csts(csts);
    shutting_down
}
