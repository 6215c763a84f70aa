//! Admin commands (NVMe 2.0 base, 5) for NVM and discovery controllers.

use nvmf_common::spec::command::{Abort, GetFeatures, GetLogPage, Identify, SetFeatures, NSID_ALL};
use nvmf_common::spec::features::{
    async_event_dw0, AsyncEventType, AsyncNotice, FeatureId, FeatureSelect, NumberOfQueues,
    AEC_ANA_CHANGE, AEC_DISCOVERY_LOG_CHANGE, AEC_NAMESPACE_ATTRIBUTE, FEATURE_CAP_CHANGEABLE,
    VWC_ENABLE,
};
use nvmf_common::spec::identify::*;
use nvmf_common::spec::log_page::{
    set_u128, AnaState, ErrorLogEntry, FirmwareSlotLog, LogPageId, SmartHealthLog, ANA_LSP_RGO,
};
use nvmf_common::spec::reservation::{
    AEN_RESERVATION_LOG_PAGE_AVAILABLE, RESCAP_ALL_TYPES, RESCAP_PTPL,
};
use nvmf_common::spec::{AdminOpcode, Status};
use zerocopy::{FromZeros, IntoBytes};

use crate::cmd::reservation;
use crate::cmd::{data_phase, discovery, fabrics::NVME_VERSION};
use crate::core::ana;
use crate::core::controller::{ControllerLocal, AER_LIMIT, ERROR_LOG_ENTRIES};
use crate::core::queue::QueueState;
use crate::core::request::{DataDirection, Exec, Prepared, Request};
use crate::core::subsystem::{SubsystemConfig, SubsystemId, SubsystemKind};
use crate::core::{CoreCtx, PersistWait};

const IDENTIFY_LEN: u32 = 4096;
/// IEEE OUI left zero: no registered vendor; hosts only display it.
const HOST_ID_LEN: u32 = 16;
/// Temperature Threshold feature default: 343 K over-temperature, as drives ship.
const DEFAULT_TEMPERATURE_THRESHOLD: u32 = 0x0157;

type Key = (SubsystemId, u16);

fn key_of(q: &QueueState) -> Key {
    let ctrl = q
        .ctrl
        .as_ref()
        .expect("admin commands run on connected queues");
    (ctrl.subsystem_id, ctrl.cntlid)
}

pub fn prepare(
    _core: &mut CoreCtx,
    q: &mut QueueState,
    req: &mut Request,
) -> Result<Prepared, Status> {
    let ctrl = q.ctrl.as_ref().expect("checked by the caller");
    let opcode = AdminOpcode(req.cmd.opcode);
    let discovery = ctrl.kind == SubsystemKind::Discovery;
    // Until CC.EN only Property Get/Set (fabrics) may run; a disabled controller executes no
    // admin commands.
    if !ctrl.is_ready() {
        return Err(Status::COMMAND_SEQUENCE_ERROR.with_dnr());
    }
    let no_data = |q: &QueueState, req: &Request| data_phase(q, &req.cmd, DataDirection::None, 0);
    let to_host = |q: &QueueState, req: &Request, len: u32| {
        data_phase(q, &req.cmd, DataDirection::ControllerToHost, len)
    };
    match opcode {
        AdminOpcode::IDENTIFY => {
            let id = Identify::parse(&req.cmd);
            if discovery && id.cns != Cns::CONTROLLER {
                return Err(Status::INVALID_FIELD.with_dnr());
            }
            to_host(q, req, IDENTIFY_LEN)
        }
        AdminOpcode::GET_LOG_PAGE => {
            let glp = GetLogPage::parse(&req.cmd);
            let len = glp.len_bytes();
            if len > u64::from(q.limits.max_transfer()) {
                return Err(Status::INVALID_FIELD.with_dnr());
            }
            to_host(q, req, len as u32)
        }
        AdminOpcode::GET_FEATURES => {
            let gf = GetFeatures::parse(&req.cmd);
            // Supported Capabilities (SEL 11b) answers in dword 0 only, Host Identifier too.
            if gf.fid == FeatureId::HOST_IDENTIFIER
                && gf.sel != FeatureSelect::SUPPORTED_CAPABILITIES
            {
                to_host(q, req, HOST_ID_LEN)
            } else {
                no_data(q, req)
            }
        }
        AdminOpcode::SET_FEATURES | AdminOpcode::KEEP_ALIVE | AdminOpcode::ASYNC_EVENT_REQUEST => {
            no_data(q, req)
        }
        AdminOpcode::ABORT if !discovery => no_data(q, req),
        _ => Err(Status::INVALID_OPCODE.with_dnr()),
    }
}

pub fn execute(core: &mut CoreCtx, q: &mut QueueState, req: &mut Request) -> Exec {
    let key = key_of(q);
    match AdminOpcode(req.cmd.opcode) {
        AdminOpcode::IDENTIFY => identify(core, q, req),
        AdminOpcode::GET_LOG_PAGE => get_log_page(core, q, req),
        AdminOpcode::GET_FEATURES => get_features(core, q, req),
        AdminOpcode::SET_FEATURES => set_features(core, q, req),
        AdminOpcode::KEEP_ALIVE => {
            let ctrl = q.ctrl.as_ref().expect("connected");
            if ctrl.kato_ms() == 0 {
                return req.fail(Status::KEEP_ALIVE_INVALID.with_dnr());
            }
            ctrl.keep_alive(core.now_ms());
            req.fail(Status::SUCCESS)
        }
        AdminOpcode::ASYNC_EVENT_REQUEST => {
            let Some(local) = core.controllers.get_mut(&key) else {
                return req.fail(Status::INTERNAL_ERROR.with_dnr());
            };
            if local.outstanding_aers.len() >= AER_LIMIT {
                return req.fail(Status::ASYNC_EVENT_REQUEST_LIMIT_EXCEEDED.with_dnr());
            }
            local.outstanding_aers.push_back(req.tag);
            deliver_events(core, key);
            Exec::Pending
        }
        AdminOpcode::ABORT => {
            // Commands run to completion quickly here; report "not aborted" (dword 0 bit 0),
            // which the spec allows for any Abort.
            let _ = Abort::parse(&req.cmd);
            req.complete_with(Status::SUCCESS, 1);
            Exec::Complete
        }
        _ => req.fail(Status::INVALID_OPCODE.with_dnr()),
    }
}

fn identify(core: &mut CoreCtx, q: &QueueState, req: &mut Request) -> Exec {
    let id = Identify::parse(&req.cmd);
    let nsid = req.cmd.nsid.get();
    let Some(sub) = q.subsystem.and_then(|s| core.subsystem(s)).cloned() else {
        return req.fail(Status::INTERNAL_ERROR.with_dnr());
    };
    // Namespaces masked from this controller's host are inactive NSIDs to it.
    let hostnqn = &q.ctrl.as_ref().expect("connected").hostnqn;
    match id.cns {
        Cns::CONTROLLER => {
            let data = identify_controller(core, q, &sub);
            req.fill_data(data.as_bytes());
        }
        Cns::NAMESPACE => {
            if nsid == 0 || nsid == NSID_ALL || nsid > sub.max_nsid() {
                return req.fail(Status::INVALID_NAMESPACE.with_dnr());
            }
            // An inactive NSID in range returns a zeroed structure (NVMe 2.0 base, 5.17.2.1).
            let mut data = IdentifyNamespace::new_zeroed();
            if let Some(ns) = sub.visible_namespace(nsid, hostnqn) {
                let blocks = ns.num_blocks();
                data.nsze.set(blocks);
                data.ncap.set(blocks);
                data.nuse.set(blocks);
                data.nsfeat = NSFEAT_THIN_PROVISIONING;
                data.nlbaf = 0;
                data.flbas = 0;
                data.nmic = NMIC_SHARED;
                // Every reservation type and IEKEY; PTPL only with a ptpl_file (SPDK's
                // `nvmf_ns_get_rescap`).
                data.rescap = RESCAP_ALL_TYPES
                    | if ns.resv.ptpl_capable() {
                        RESCAP_PTPL
                    } else {
                        0
                    };
                data.dlfeat = DLFEAT_READS_ZEROES | DLFEAT_WRITE_ZEROES_DEALLOCATE;
                data.nsattr = u8::from(ns.bdev.read_only());
                data.nguid = ns.nguid;
                data.eui64 = ns.eui64;
                data.lbaf[0] = LbaFormat::new(ns.block_size().trailing_zeros() as u8, 0);
                if sub.ana_reporting {
                    data.anagrpid.set(sub.anagrpid(nsid));
                    // Through a path with no access nothing is in use (SPDK's NUSE rule).
                    let ctrl = q.ctrl.as_ref().expect("connected");
                    let state = sub.ns_ana_state(ctrl.listener.as_ref(), nsid);
                    if state == AnaState::INACCESSIBLE || state == AnaState::PERSISTENT_LOSS {
                        data.nuse.set(0);
                    }
                }
            }
            req.fill_data(data.as_bytes());
        }
        Cns::ACTIVE_NAMESPACE_LIST => {
            if nsid >= 0xFFFF_FFFE {
                return req.fail(Status::INVALID_NAMESPACE.with_dnr());
            }
            let mut out = [0u8; 4096];
            let visible = sub
                .namespaces
                .values()
                .filter(|ns| sub.ns_visible(ns, hostnqn));
            write_ns_list(&mut out, nsid, visible.map(|ns| ns.nsid));
            req.fill_data(&out);
        }
        Cns::NAMESPACE_ID_DESCRIPTOR_LIST => {
            let Some(ns) = sub.visible_namespace(nsid, hostnqn) else {
                return req.fail(Status::INVALID_NAMESPACE.with_dnr());
            };
            let mut out = [0u8; 4096];
            let eui = (ns.eui64 != [0; 8]).then_some(ns.eui64);
            let used = write_ns_id_descriptors(&mut out, Some(ns.nguid), Some(ns.uuid), eui);
            append_csi_descriptor(&mut out, used, 0);
            req.fill_data(&out);
        }
        _ => return req.fail(Status::INVALID_FIELD.with_dnr()),
    }
    req.fail(Status::SUCCESS)
}

fn identify_controller(
    core: &CoreCtx,
    q: &QueueState,
    sub: &SubsystemConfig,
) -> IdentifyController {
    let ctrl = q.ctrl.as_ref().expect("connected");
    let limits = &q.limits;
    let mut id = IdentifyController::new_zeroed();
    set_ascii(&mut id.sn, &sub.serial_number);
    set_ascii(&mut id.mn, &sub.model_number);
    set_ascii(&mut id.fr, &core.info.firmware_revision);
    set_nqn(&mut id.subnqn, &sub.nqn);
    id.cntlid.set(ctrl.cntlid);
    id.ver.set(NVME_VERSION.0);
    id.ctratt.set(CTRATT_HOST_ID_128);
    // The transport's `kas`: the granularity grant_kato rounds KATO to.
    id.kas.set(limits.kas);
    id.mdts = limits.mdts();
    id.aerl = (AER_LIMIT - 1) as u8;
    id.elpe = (ERROR_LOG_ENTRIES - 1) as u8;
    id.lpa = LPA_EXTENDED_DATA;
    id.sgls.set(
        SGLS_SUPPORTED
            | SGLS_KEYED
            | SGLS_OVERSIZED
            | if limits.in_capsule_data_size > 0 {
                SGLS_OFFSET
            } else {
                0
            },
    );
    id.ioccsz.set((64 + limits.in_capsule_data_size) / 16);
    id.iorcsz.set(1);
    id.icdoff.set(0);
    id.fcatt = 0;
    id.msdbd = limits.msdbd;
    id.maxcmd.set(limits.max_queue_depth);
    if sub.kind == SubsystemKind::Discovery {
        id.cntrltype = CNTRLTYPE_DISCOVERY;
        id.oaes.set(OAES_DISCOVERY_LOG_CHANGE);
        return id;
    }
    id.cntrltype = CNTRLTYPE_IO;
    id.rab = 6;
    id.cmic = CMIC_MULTI_CONTROLLER;
    id.oaes.set(OAES_NAMESPACE_ATTRIBUTE);
    id.acl = 3;
    // One read-only firmware slot (FRMW bit 0, slot count in bits 3:1).
    id.frmw = 0b0011;
    id.sqes = SQES_64;
    id.cqes = CQES_16;
    id.nn.set(sub.max_nsid());
    id.oncs
        .set(ONCS_COMPARE | ONCS_DSM | ONCS_WRITE_ZEROES | ONCS_RESERVATIONS);
    let write_cache = sub.namespaces.values().any(|ns| ns.bdev.has_write_cache());
    // Flush with NSID FFFFFFFFh is not supported (VWC bits 2:1 = 10b).
    id.vwc = 0b100 | if write_cache { VWC_PRESENT } else { 0 };
    if sub.ana_reporting {
        id.cmic |= CMIC_ANA;
        id.oaes.set(OAES_NAMESPACE_ATTRIBUTE | OAES_ANA_CHANGE);
        id.anatt = ana::ANA_TRANSITION_TIME_S;
        // Every state can be set through the RPCs. No ANAGRPID promise (bit 6): a group can
        // change while the namespace is attached (nvmf_subsystem_set_ns_ana_group), as nvmet
        // reports too.
        id.anacap = ANACAP_OPTIMIZED
            | ANACAP_NON_OPTIMIZED
            | ANACAP_INACCESSIBLE
            | ANACAP_PERSISTENT_LOSS
            | ANACAP_CHANGE;
        id.anagrpmax.set(sub.ana_group_max());
        // At most one group per namespace; Linux sizes its ANA log buffer from NANAGRPID and
        // MNAN (which must be non-zero and at most NN), so both stay at the NSID bound.
        id.nanagrpid.set(sub.max_nsid());
        id.mnan.set(sub.max_nsid());
    }
    id
}

fn get_log_page(core: &mut CoreCtx, q: &QueueState, req: &mut Request) -> Exec {
    let glp = GetLogPage::parse(&req.cmd);
    let key = key_of(q);
    let discovery = q
        .ctrl
        .as_ref()
        .is_some_and(|c| c.kind == SubsystemKind::Discovery);
    // The offset must be dword-aligned (NVMe 2.0 base, 5.16: LPOL bits 1:0 are reserved).
    if !glp.offset.is_multiple_of(4) {
        return req.fail(Status::INVALID_FIELD.with_dnr());
    }
    let page: Vec<u8> = match glp.lid {
        LogPageId::DISCOVERY if discovery => {
            let hostnqn = q
                .ctrl
                .as_ref()
                .map(|c| c.hostnqn.clone())
                .unwrap_or_default();
            if !glp.rae {
                if let Some(local) = core.controllers.get_mut(&key) {
                    local.discovery_change_masked = false;
                }
            }
            discovery::log_page(core, &hostnqn, q.listener.as_ref())
        }
        LogPageId::ERROR_INFORMATION => {
            let Some(local) = core.controllers.get(&key) else {
                return req.fail(Status::INTERNAL_ERROR.with_dnr());
            };
            let mut page = vec![0u8; ERROR_LOG_ENTRIES * 64];
            for (slot, entry) in page.chunks_exact_mut(64).zip(local.error_log.iter()) {
                slot.copy_from_slice(entry.as_bytes());
            }
            page
        }
        LogPageId::SMART_HEALTH if !discovery => smart_log(core, q).as_bytes().to_vec(),
        LogPageId::FIRMWARE_SLOT if !discovery => {
            let mut log = FirmwareSlotLog::new_zeroed();
            log.afi = 1;
            set_ascii(&mut log.frs[0], &core.info.firmware_revision);
            log.as_bytes().to_vec()
        }
        LogPageId::ASYMMETRIC_NAMESPACE_ACCESS if !discovery => {
            let Some(sub) = q.subsystem.and_then(|s| core.subsystem(s)).cloned() else {
                return req.fail(Status::INTERNAL_ERROR.with_dnr());
            };
            if !sub.ana_reporting {
                return req.fail(Status::INVALID_LOG_PAGE.with_dnr());
            }
            let ctrl = q.ctrl.as_ref().expect("connected");
            let view = sub.ana_view(ctrl.listener.as_ref(), &ctrl.hostnqn);
            let Some(local) = core.controllers.get_mut(&key) else {
                return req.fail(Status::INTERNAL_ERROR.with_dnr());
            };
            if !glp.rae {
                local.ana_change_masked = false;
            }
            ana::log_page(&view, local.ana_change_count, glp.lsp & ANA_LSP_RGO != 0)
        }
        LogPageId::CHANGED_NAMESPACE_LIST if !discovery => {
            let Some(local) = core.controllers.get_mut(&key) else {
                return req.fail(Status::INTERNAL_ERROR.with_dnr());
            };
            let mut page = vec![0u8; 4096];
            if local.changed_ns_overflow {
                page[..4].copy_from_slice(&u32::MAX.to_le_bytes());
            } else {
                for (slot, nsid) in page
                    .chunks_exact_mut(4)
                    .zip(local.changed_namespaces.iter())
                {
                    slot.copy_from_slice(&nsid.to_le_bytes());
                }
            }
            if !glp.rae {
                local.changed_namespaces.clear();
                local.changed_ns_overflow = false;
                local.ns_change_masked = false;
            }
            page
        }
        LogPageId::RESERVATION_NOTIFICATION if !discovery => {
            // One page per read, the oldest; reading removes it (NVMe 2.0 base, 5.16.1.25).
            let ctrl = q.ctrl.as_ref().expect("connected");
            let page = ctrl
                .resv_log
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take();
            if !glp.rae {
                if let Some(local) = core.controllers.get_mut(&key) {
                    local.resv_aen_masked = false;
                }
            }
            page.as_bytes().to_vec()
        }
        _ => return req.fail(Status::INVALID_LOG_PAGE.with_dnr()),
    };
    if glp.offset > page.len() as u64 {
        return req.fail(Status::INVALID_FIELD.with_dnr());
    }
    req.fill_data(&page[glp.offset as usize..]);
    req.fail(Status::SUCCESS)
}

fn smart_log(core: &CoreCtx, q: &QueueState) -> SmartHealthLog {
    let mut log = SmartHealthLog::new_zeroed();
    log.available_spare = 100;
    log.available_spare_threshold = 10;
    let Some(sub) = q.subsystem.and_then(|s| core.subsystem(s)) else {
        return log;
    };
    let (mut reads, mut writes, mut read_bytes, mut write_bytes) = (0u128, 0u128, 0u128, 0u128);
    // Only what this host may see: a masked namespace's traffic is another host's business.
    let hostnqn = &q.ctrl.as_ref().expect("connected").hostnqn;
    for ns in sub
        .namespaces
        .values()
        .filter(|ns| sub.ns_visible(ns, hostnqn))
    {
        let s = ns.stats.snapshot();
        reads += u128::from(s.read_ops);
        writes += u128::from(s.write_ops);
        read_bytes += u128::from(s.bytes_read);
        write_bytes += u128::from(s.bytes_written);
    }
    // Data units are thousands of 512-byte units, rounded up (NVMe 2.0 base, Figure 207).
    let units = |bytes: u128| (bytes / 512).div_ceil(1000);
    set_u128(&mut log.data_units_read, units(read_bytes));
    set_u128(&mut log.data_units_written, units(write_bytes));
    set_u128(&mut log.host_read_commands, reads);
    set_u128(&mut log.host_write_commands, writes);
    if let Some(local) = core.controllers.get(&key_of(q)) {
        set_u128(
            &mut log.num_error_log_entries,
            u128::from(local.error_count),
        );
    }
    log
}

fn get_features(core: &mut CoreCtx, q: &QueueState, req: &mut Request) -> Exec {
    let gf = GetFeatures::parse(&req.cmd);
    let ctrl = q.ctrl.as_ref().expect("connected").clone();
    if is_reservation_feature(gf.fid) && ctrl.kind != SubsystemKind::Discovery {
        let nsid = req.cmd.nsid.get();
        return match reservation::get_feature(core, q, gf.fid, gf.sel, nsid) {
            Ok(dw0) => {
                req.complete_with(Status::SUCCESS, dw0);
                Exec::Complete
            }
            Err(status) => req.fail(status),
        };
    }
    let Some(local) = core.controllers.get(&key_of(q)) else {
        return req.fail(Status::INTERNAL_ERROR.with_dnr());
    };
    if gf.sel == FeatureSelect::SUPPORTED_CAPABILITIES {
        let caps = match gf.fid {
            FeatureId::HOST_IDENTIFIER => 0,
            FeatureId::NUMBER_OF_QUEUES
            | FeatureId::KEEP_ALIVE_TIMER
            | FeatureId::ASYNC_EVENT_CONFIGURATION
            | FeatureId::VOLATILE_WRITE_CACHE
            | FeatureId::ARBITRATION
            | FeatureId::POWER_MANAGEMENT
            | FeatureId::TEMPERATURE_THRESHOLD
            | FeatureId::ERROR_RECOVERY
            | FeatureId::INTERRUPT_COALESCING => FEATURE_CAP_CHANGEABLE,
            _ => return req.fail(Status::INVALID_FIELD.with_dnr()),
        };
        req.complete_with(Status::SUCCESS, caps);
        return Exec::Complete;
    }
    let defaults = gf.sel == FeatureSelect::DEFAULT;
    let value = match gf.fid {
        FeatureId::NUMBER_OF_QUEUES => {
            let n = u32::from(if defaults {
                q.limits.max_qpairs_per_ctrl.saturating_sub(1)
            } else {
                ctrl.max_io_qid.load(std::sync::atomic::Ordering::Relaxed)
            });
            NumberOfQueues { nsq: n, ncq: n }.to_dword()
        }
        FeatureId::KEEP_ALIVE_TIMER => {
            if defaults {
                0
            } else {
                ctrl.kato_ms()
            }
        }
        FeatureId::ASYNC_EVENT_CONFIGURATION => {
            if defaults {
                0
            } else {
                local.async_event_config
            }
        }
        FeatureId::VOLATILE_WRITE_CACHE => u32::from(defaults || ctrl.write_cache_enabled()),
        FeatureId::HOST_IDENTIFIER => {
            req.fill_data(&ctrl.hostid);
            0
        }
        FeatureId::ARBITRATION
        | FeatureId::POWER_MANAGEMENT
        | FeatureId::TEMPERATURE_THRESHOLD
        | FeatureId::ERROR_RECOVERY
        | FeatureId::INTERRUPT_COALESCING => {
            let default = default_feature(gf.fid);
            if defaults {
                default
            } else {
                local
                    .stored_features
                    .get(&gf.fid.0)
                    .copied()
                    .unwrap_or(default)
            }
        }
        _ => return req.fail(Status::INVALID_FIELD.with_dnr()),
    };
    req.complete_with(Status::SUCCESS, value);
    Exec::Complete
}

fn default_feature(fid: FeatureId) -> u32 {
    match fid {
        FeatureId::TEMPERATURE_THRESHOLD => DEFAULT_TEMPERATURE_THRESHOLD,
        _ => 0,
    }
}

fn set_features(core: &mut CoreCtx, q: &QueueState, req: &mut Request) -> Exec {
    let sf = SetFeatures::parse(&req.cmd);
    let ctrl = q.ctrl.as_ref().expect("connected").clone();
    if sf.save {
        return req.fail(Status::FEATURE_ID_NOT_SAVEABLE.with_dnr());
    }
    if is_reservation_feature(sf.fid) && ctrl.kind != SubsystemKind::Discovery {
        return match reservation::set_feature(core, q, sf, req.cmd.nsid.get()) {
            Ok(tickets) if tickets.is_empty() => req.fail(Status::SUCCESS),
            Ok(tickets) => {
                core.await_persisted(PersistWait {
                    tag: req.tag,
                    tickets,
                    notices: Vec::new(),
                    notices_about: None,
                });
                Exec::Pending
            }
            Err(status) => req.fail(status),
        };
    }
    let discovery = ctrl.kind == SubsystemKind::Discovery;
    let key = key_of(q);
    let ana = core.subsystem(key.0).is_some_and(|s| s.ana_reporting);
    let Some(local) = core.controllers.get_mut(&key) else {
        return req.fail(Status::INTERNAL_ERROR.with_dnr());
    };
    let dw0 = match sf.fid {
        FeatureId::NUMBER_OF_QUEUES if !discovery => {
            if sf.cdw11 & 0xFFFF == 0xFFFF || sf.cdw11 >> 16 == 0xFFFF {
                return req.fail(Status::INVALID_FIELD.with_dnr());
            }
            // Once I/O queues exist their count cannot change (NVMe 2.0 base, 5.27.1.5).
            if ctrl.connected_qids().len() > 1 {
                return req.fail(Status::COMMAND_SEQUENCE_ERROR.with_dnr());
            }
            let asked = NumberOfQueues::from_dword(sf.cdw11);
            let max = u32::from(q.limits.max_qpairs_per_ctrl.saturating_sub(1));
            let granted = asked.nsq.min(asked.ncq).min(max).max(1);
            ctrl.max_io_qid
                .store(granted as u16, std::sync::atomic::Ordering::Relaxed);
            NumberOfQueues {
                nsq: granted,
                ncq: granted,
            }
            .to_dword()
        }
        FeatureId::KEEP_ALIVE_TIMER => {
            // Same rule as at Connect; 0 turns keep-alive off, as a 0 KATO at Connect does.
            ctrl.set_kato_ms(q.limits.grant_kato(sf.cdw11));
            ctrl.keep_alive(core.now_ms());
            core.arm_keep_alive((ctrl.subsystem_id, ctrl.cntlid));
            0
        }
        FeatureId::ASYNC_EVENT_CONFIGURATION => {
            let allowed = if discovery {
                AEC_DISCOVERY_LOG_CHANGE
            } else if ana {
                AEC_NAMESPACE_ATTRIBUTE | AEC_ANA_CHANGE
            } else {
                AEC_NAMESPACE_ATTRIBUTE
            };
            if sf.cdw11 & !allowed & !0xFF != 0 {
                return req.fail(Status::INVALID_FIELD.with_dnr());
            }
            local.async_event_config = sf.cdw11;
            0
        }
        FeatureId::VOLATILE_WRITE_CACHE if !discovery => {
            let sub = core.subsystem(key.0);
            let present =
                sub.is_some_and(|s| s.namespaces.values().any(|n| n.bdev.has_write_cache()));
            // Without a volatile cache the feature does not exist (NVMe 2.0 base, 5.27.1.4).
            if !present {
                return req.fail(Status::INVALID_FIELD.with_dnr());
            }
            ctrl.set_write_cache_enabled(sf.cdw11 & VWC_ENABLE != 0);
            0
        }
        FeatureId::ARBITRATION
        | FeatureId::TEMPERATURE_THRESHOLD
        | FeatureId::ERROR_RECOVERY
        | FeatureId::INTERRUPT_COALESCING
            if !discovery =>
        {
            local.stored_features.insert(sf.fid.0, sf.cdw11);
            0
        }
        FeatureId::POWER_MANAGEMENT if !discovery => {
            // Power state 0 is the only one (NPSS = 0).
            if sf.cdw11 & 0x1F != 0 {
                return req.fail(Status::INVALID_FIELD.with_dnr());
            }
            local.stored_features.insert(sf.fid.0, sf.cdw11);
            0
        }
        FeatureId::HOST_IDENTIFIER => return req.fail(Status::COMMAND_SEQUENCE_ERROR.with_dnr()),
        _ => return req.fail(Status::INVALID_FIELD.with_dnr()),
    };
    req.complete_with(Status::SUCCESS, dw0);
    Exec::Complete
}

/// Completes outstanding AERs with pending events, oldest first.
fn deliver_events(core: &mut CoreCtx, key: Key) {
    let mut ready = Vec::new();
    if let Some(local) = core.controllers.get_mut(&key) {
        while !local.outstanding_aers.is_empty() && !local.pending_events.is_empty() {
            let tag = local.outstanding_aers.pop_front().expect("non-empty");
            let dw0 = local.pending_events.pop_front().expect("non-empty");
            ready.push((tag, dw0));
        }
    }
    for (tag, dw0) in ready {
        core.wake(
            tag,
            crate::core::request::Wakeup::Finished {
                status: Status::SUCCESS,
                dw0,
            },
        );
    }
}

/// Queues a Namespace Attribute Changed notice if the host enabled it and has read the last
/// one's log page.
pub(crate) fn raise_namespace_notice(core: &mut CoreCtx, key: Key) {
    let Some(local) = core.controllers.get_mut(&key) else {
        return;
    };
    if local.async_event_config & AEC_NAMESPACE_ATTRIBUTE == 0 || local.ns_change_masked {
        return;
    }
    local.ns_change_masked = true;
    local.pending_events.push_back(async_event_dw0(
        AsyncEventType::NOTICE,
        AsyncNotice::NAMESPACE_ATTRIBUTE_CHANGED.0,
        LogPageId::CHANGED_NAMESPACE_LIST,
    ));
    deliver_events(core, key);
}

/// Queues an Asymmetric Namespace Access Change notice if the host enabled it (AEC bit 11)
/// and has read the ANA log since the last one.
pub(crate) fn raise_ana_notice(core: &mut CoreCtx, key: Key) {
    let Some(local) = core.controllers.get_mut(&key) else {
        return;
    };
    if local.async_event_config & AEC_ANA_CHANGE == 0 || local.ana_change_masked {
        return;
    }
    local.ana_change_masked = true;
    local.pending_events.push_back(async_event_dw0(
        AsyncEventType::NOTICE,
        AsyncNotice::ANA_CHANGE.0,
        LogPageId::ASYMMETRIC_NAMESPACE_ACCESS,
    ));
    deliver_events(core, key);
}

fn is_reservation_feature(fid: FeatureId) -> bool {
    fid == FeatureId::RESERVATION_NOTIFICATION_MASK || fid == FeatureId::RESERVATION_PERSISTENCE
}

/// Queues a Reservation Log Page Available event (I/O command set specific, NVMe 2.0 base
/// Figure 150) for a controller whose Reservation Notification log got a notice, unless one is
/// outstanding and the log not read since. No Asynchronous Event Configuration bit governs
/// it: the Reservation Notification Mask feature does (SPDK and nvmet alike).
pub(crate) fn raise_reservation_notice(core: &mut CoreCtx, key: Key) {
    let Some(local) = core.controllers.get_mut(&key) else {
        return;
    };
    if local.resv_aen_masked {
        return;
    }
    local.resv_aen_masked = true;
    local.pending_events.push_back(async_event_dw0(
        AsyncEventType::IO_COMMAND_SET,
        AEN_RESERVATION_LOG_PAGE_AVAILABLE,
        LogPageId::RESERVATION_NOTIFICATION,
    ));
    deliver_events(core, key);
}

/// Queues a Discovery Log Page Change notice for a discovery controller that asked for them.
pub(crate) fn raise_discovery_notice(core: &mut CoreCtx, key: Key) {
    let Some(local) = core.controllers.get_mut(&key) else {
        return;
    };
    if local.async_event_config & AEC_DISCOVERY_LOG_CHANGE == 0 || local.discovery_change_masked {
        return;
    }
    local.discovery_change_masked = true;
    local.pending_events.push_back(async_event_dw0(
        AsyncEventType::NOTICE,
        AsyncNotice::DISCOVERY_LOG_CHANGE.0,
        LogPageId::DISCOVERY,
    ));
    deliver_events(core, key);
}

/// Adds a failed command to the controller's Error Information log.
pub(crate) fn record_error(local: &mut ControllerLocal, qid: u16, req: &Request, status: Status) {
    let mut entry = ErrorLogEntry::new_zeroed();
    entry.sqid.set(qid);
    entry.cid.set(req.cmd.cid.get());
    entry.status.set(status.to_field(false));
    entry.param_error_location.set(0xFFFF);
    entry.nsid.set(req.cmd.nsid.get());
    entry.opcode = req.cmd.opcode;
    local.record_error(entry);
}
