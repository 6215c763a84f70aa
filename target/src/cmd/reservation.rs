//! Reservation commands (NVM command set 7.2-7.5: Register 0Dh, Report 0Eh, Acquire 11h,
//! Release 15h), the reservation features (Reservation Notification Mask 82h, Reservation
//! Persistence 83h) and the Reservation Notification log page (80h).
//!
//! These are rare, so they may lock: each runs the namespace's state machine
//! ([`crate::core::reservation`]) under its writer lock on whichever reactor received it, then
//! posts the notices it produced into the logs of the affected hosts' controllers, whose own
//! admin reactors raise the Asynchronous Events on their next tick.

use std::sync::Arc;

use nvmf_common::spec::command::{SetFeatures, NSID_ALL};
use nvmf_common::spec::features::{
    FeatureId, FeatureSelect, FEATURE_CAP_CHANGEABLE, FEATURE_CAP_NAMESPACE_SPECIFIC,
};
use nvmf_common::spec::reservation::{
    AcquireData, RegisterData, RegisteredControllerExt, ReleaseData, ReservationAcquire,
    ReservationRegister, ReservationRelease, ReservationReport, ReservationStatusHeader,
    NOTIFICATION_MASK_ALL, PTPL_ENABLE, RESERVATION_STATUS_EXT_HEADER_LEN,
};
use nvmf_common::spec::{Command, IoOpcode, Status};
use zerocopy::{FromBytes, FromZeros, IntoBytes};

use crate::cmd::data_phase;
use crate::core::queue::QueueState;
use crate::core::request::{DataDirection, Exec, Prepared, Request};
use crate::core::reservation::{Notice, ResvState, Ticket};
use crate::core::subsystem::{Namespace, SubsystemId};
use crate::core::{CoreCtx, PersistWait};

/// Controller ID reported for every registrant: registrations belong to hosts, and this is
/// the dynamic controller model (NVMe 2.0 base, Figure 69; nvmet reports the same).
const CNTLID_DYNAMIC: u16 = 0xFFFF;

/// A reservation command as `prepare` decoded it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ResvCmd {
    Register(ReservationRegister),
    Acquire(ReservationAcquire),
    Release(ReservationRelease),
    Report(ReservationReport),
}

/// The reservation command `opcode` names, decoded; `None` for any other opcode.
pub(crate) fn decode(opcode: IoOpcode, cmd: &Command) -> Option<ResvCmd> {
    Some(match opcode {
        IoOpcode::RESERVATION_REGISTER => ResvCmd::Register(ReservationRegister::parse(cmd)),
        IoOpcode::RESERVATION_ACQUIRE => ResvCmd::Acquire(ReservationAcquire::parse(cmd)),
        IoOpcode::RESERVATION_RELEASE => ResvCmd::Release(ReservationRelease::parse(cmd)),
        IoOpcode::RESERVATION_REPORT => ResvCmd::Report(ReservationReport::parse(cmd)),
        _ => return None,
    })
}

/// The data phase of a reservation command: the key data in, or the report out.
pub(crate) fn prepare(q: &QueueState, req: &Request, resv: ResvCmd) -> Result<Prepared, Status> {
    let (dir, len) = match resv {
        ResvCmd::Register(_) => (
            DataDirection::HostToController,
            size_of::<RegisterData>() as u32,
        ),
        ResvCmd::Acquire(_) => (
            DataDirection::HostToController,
            size_of::<AcquireData>() as u32,
        ),
        ResvCmd::Release(_) => (
            DataDirection::HostToController,
            size_of::<ReleaseData>() as u32,
        ),
        ResvCmd::Report(report) => {
            if report.len > u64::from(q.limits.max_transfer()) {
                return Err(Status::INVALID_FIELD.with_dnr());
            }
            (DataDirection::ControllerToHost, report.len as u32)
        }
    };
    data_phase(q, &req.cmd, dir, len)
}

pub(crate) fn execute(
    core: &mut CoreCtx,
    q: &QueueState,
    req: &mut Request,
    resv: ResvCmd,
) -> Exec {
    let ctrl = q.ctrl.as_ref().expect("I/O queues are connected");
    let sid = q.subsystem.expect("connected queues have a subsystem");
    let Some(ns) = core
        .visible_namespace(sid, req.nsid, &ctrl.hostnqn)
        .cloned()
    else {
        return req.fail(Status::INVALID_NAMESPACE.with_dnr());
    };
    let host = ctrl.hostid;
    let result = match resv {
        ResvCmd::Register(cmd) => {
            let Ok((data, _)) = RegisterData::read_from_prefix(req.data()) else {
                return req.fail(Status::INVALID_FIELD.with_dnr());
            };
            let capable = ns.resv.ptpl_capable();
            ns.resv.update(|s| s.register(&host, cmd, data, capable))
        }
        ResvCmd::Acquire(cmd) => {
            let Ok((data, _)) = AcquireData::read_from_prefix(req.data()) else {
                return req.fail(Status::INVALID_FIELD.with_dnr());
            };
            ns.resv.update(|s| s.acquire(&host, cmd, data))
        }
        ResvCmd::Release(cmd) => {
            let Ok((data, _)) = ReleaseData::read_from_prefix(req.data()) else {
                return req.fail(Status::INVALID_FIELD.with_dnr());
            };
            ns.resv.update(|s| s.release(&host, cmd, data.crkey.get()))
        }
        ResvCmd::Report(rep) => return report(&ns.resv.state(), rep, req),
    };
    match result {
        Ok(updated) => match updated.persisting {
            Some(ticket) => {
                core.await_persisted(PersistWait {
                    tag: req.tag,
                    tickets: vec![ticket],
                    notices: updated.notices,
                    notices_about: Some((sid, ns)),
                });
                Exec::Pending
            }
            None => {
                deliver(core, sid, &ns, &updated.notices);
                req.fail(Status::SUCCESS)
            }
        },
        Err(status) => req.fail(status),
    }
}

/// Reservation Report. Hosts here are named by 128-bit Host IDs (NVMe over Fabrics requires
/// them), so only the extended data structure can carry them: without EDS the answer is Host
/// Identifier Inconsistent Format, as SPDK and nvmet answer. A transfer too short for the
/// header is Invalid Field (nvmet); registrants that do not fit are counted in REGCTL but
/// left out.
fn report(state: &ResvState, rep: ReservationReport, req: &mut Request) -> Exec {
    if !rep.eds {
        return req.fail(Status::HOST_ID_INCONSISTENT_FORMAT.with_dnr());
    }
    if rep.len < RESERVATION_STATUS_EXT_HEADER_LEN as u64 {
        return req.fail(Status::INVALID_FIELD.with_dnr());
    }
    let mut out = vec![0u8; RESERVATION_STATUS_EXT_HEADER_LEN];
    let mut header = ReservationStatusHeader::new_zeroed();
    header.gen.set(state.generation);
    header.rtype = state.rtype.map_or(0, |t| t.0);
    header.regctl.set(state.registrants.len() as u16);
    header.ptpls = u8::from(state.ptpl);
    out[..size_of::<ReservationStatusHeader>()].copy_from_slice(header.as_bytes());
    for r in &state.registrants {
        let mut entry = RegisteredControllerExt::new_zeroed();
        entry.cntlid.set(CNTLID_DYNAMIC);
        entry.rcsts = u8::from(state.is_holder(&r.hostid));
        entry.rkey.set(r.rkey);
        entry.hostid = r.hostid;
        out.extend_from_slice(entry.as_bytes());
    }
    req.fill_data(&out);
    req.fail(Status::SUCCESS)
}

/// Posts each notice to every live controller of its host that sees the namespace.
pub(crate) fn deliver(core: &CoreCtx, sid: SubsystemId, ns: &Namespace, notices: &[Notice]) {
    if notices.is_empty() {
        return;
    }
    let Some(sub) = core.subsystem(sid) else {
        return;
    };
    for ctrl in sub.shared.controllers() {
        if !sub.ns_visible(ns, &ctrl.hostnqn) {
            continue;
        }
        for n in notices.iter().filter(|n| n.hostid == ctrl.hostid) {
            ctrl.post_reservation_notice(ns.nsid, n.kind);
        }
    }
}

/// The namespaces a namespace-specific feature command names: one visible namespace, or
/// with NSID FFFFFFFFh every namespace the host sees (Set Features only).
fn feature_namespaces(
    core: &CoreCtx,
    q: &QueueState,
    nsid: u32,
    all_allowed: bool,
) -> Result<Vec<Arc<Namespace>>, Status> {
    let ctrl = q.ctrl.as_ref().expect("connected");
    let sid = q.subsystem.expect("connected queues have a subsystem");
    let sub = core
        .subsystem(sid)
        .ok_or(Status::INTERNAL_ERROR.with_dnr())?;
    if nsid == NSID_ALL && all_allowed {
        return Ok(sub
            .namespaces
            .values()
            .filter(|ns| sub.ns_visible(ns, &ctrl.hostnqn))
            .cloned()
            .collect());
    }
    // An NSID the host does not see is Invalid Field, as SPDK answers.
    sub.visible_namespace(nsid, &ctrl.hostnqn)
        .cloned()
        .map(|ns| vec![ns])
        .ok_or(Status::INVALID_FIELD.with_dnr())
}

/// Get Features for FID 82h / 83h: `Ok(dword 0)`.
pub(crate) fn get_feature(
    core: &CoreCtx,
    q: &QueueState,
    fid: FeatureId,
    sel: FeatureSelect,
    nsid: u32,
) -> Result<u32, Status> {
    if sel == FeatureSelect::SUPPORTED_CAPABILITIES {
        return Ok(FEATURE_CAP_CHANGEABLE | FEATURE_CAP_NAMESPACE_SPECIFIC);
    }
    let ns = feature_namespaces(core, q, nsid, false)?.remove(0);
    let defaults = sel == FeatureSelect::DEFAULT;
    Ok(match fid {
        FeatureId::RESERVATION_NOTIFICATION_MASK if defaults => 0,
        FeatureId::RESERVATION_NOTIFICATION_MASK => {
            let ctrl = q.ctrl.as_ref().expect("connected");
            ctrl.resv_log
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .mask(ns.nsid)
        }
        _ if defaults => 0,
        _ => u32::from(ns.resv.state().ptpl),
    })
}

/// Set Features for FID 82h / 83h. The mask takes the REGPRE, RESREL and RESPRE bits; any
/// other bit is Invalid Field (nvmet). PTPL can be switched on only for a namespace with a
/// `ptpl_file` (Invalid Field otherwise, as SPDK); the file is written before the command
/// completes: the tickets returned say when.
pub(crate) fn set_feature(
    core: &CoreCtx,
    q: &QueueState,
    sf: SetFeatures,
    nsid: u32,
) -> Result<Vec<Arc<Ticket>>, Status> {
    let namespaces = feature_namespaces(core, q, nsid, true)?;
    match sf.fid {
        FeatureId::RESERVATION_NOTIFICATION_MASK => {
            if sf.cdw11 & !NOTIFICATION_MASK_ALL != 0 {
                return Err(Status::INVALID_FIELD.with_dnr());
            }
            let ctrl = q.ctrl.as_ref().expect("connected");
            let mut log = ctrl.resv_log.lock().unwrap_or_else(|e| e.into_inner());
            for ns in &namespaces {
                log.set_mask(ns.nsid, sf.cdw11);
            }
            Ok(Vec::new())
        }
        _ => {
            let on = sf.cdw11 & PTPL_ENABLE != 0;
            let capable: Vec<_> = namespaces
                .iter()
                .filter(|ns| ns.resv.ptpl_capable())
                .collect();
            if nsid != NSID_ALL && capable.is_empty() && on {
                return Err(Status::INVALID_FIELD.with_dnr());
            }
            let mut tickets = Vec::new();
            for ns in capable {
                let updated = ns.resv.update(|s| {
                    s.ptpl = on;
                    Ok(Vec::new())
                })?;
                tickets.extend(updated.persisting);
            }
            Ok(tickets)
        }
    }
}
