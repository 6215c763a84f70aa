//! Persistent reservations (NVMe 2.0 base, 8.19) as hosts see them over the loopback
//! transport: two hosts (different host NQNs and Host Identifiers) and a second controller of
//! the first host share one namespace.
//!
//! Covered: Identify (ONCS, RESCAP, NMIC), every Register / Acquire / Release action, wrong
//! keys, the access matrix of all six types for the holder, a registrant and a non-registrant
//! on read, compare, write, write zeroes, DSM and flush, preempt and preempt-and-abort,
//! Report with and without EDS, the Reservation Notification log and its AEN, the mask and
//! persistence features, and PTPL across a target rebuilt from its saved config.

use std::time::{Duration, Instant};

use nvmf_common::spec::command::{Command, DsmRange};
use nvmf_common::spec::features::{
    parse_async_event_dw0, AsyncEventType, FeatureId, FeatureSelect, FEATURE_CAP_CHANGEABLE,
    FEATURE_CAP_NAMESPACE_SPECIFIC,
};
use nvmf_common::spec::identify::{Cns, IdentifyNamespace, NMIC_SHARED, ONCS_RESERVATIONS};
use nvmf_common::spec::log_page::LogPageId;
use nvmf_common::spec::reservation::{
    NotificationType, RegisteredControllerExt, ReservationNotificationLog, ReservationStatusHeader,
    ReservationType as T, AEN_RESERVATION_LOG_PAGE_AVAILABLE, RESCAP_ALL_TYPES, RESCAP_PTPL,
};
use nvmf_common::spec::{IoOpcode, Status};
use nvmf_target::bdev::{BdevRef, MallocBdev};
use nvmf_target::rpc::{self, Control};
use nvmf_target::target::{NamespaceOptions, SubsystemOptions};
use nvmf_target::transport::options::TransportOptions;
use nvmf_target::transport::TransportError;
use nvmf_tests::*;
use serde_json::Value;
use zerocopy::{FromBytes, IntoBytes};

const NQN: &str = "nqn.2016-06.io.spdk:resv";
const HOST_A: &str = HOSTNQN;
const HOST_B: &str = "nqn.2014-08.org.nvmexpress:uuid:bbbbbbbb-2222-3333-4444-555555555555";
const HOST_C: &str = "nqn.2014-08.org.nvmexpress:uuid:cccccccc-2222-3333-4444-555555555555";
const ID_A: [u8; 16] = HOSTID;
const ID_B: [u8; 16] = [0xBB; 16];
const ID_C: [u8; 16] = [0xCC; 16];
const BLOCK: usize = 512;
const BDEV_UUID: [u8; 16] = [0x5A; 16];
const CONFLICT: Status = Status::RESERVATION_CONFLICT.with_dnr();

fn lab_with(ptpl_file: Option<std::path::PathBuf>) -> LoopbackLab {
    let mut lab = LoopbackLab::default();
    let bdev: BdevRef =
        std::sync::Arc::new(MallocBdev::new("Malloc0", 64, BLOCK as u32, Some(BDEV_UUID)).unwrap());
    lab.target.bdevs.register(bdev).unwrap();
    let opts = SubsystemOptions {
        allow_any_host: true,
        serial_number: "SN-RESV".into(),
        ..Default::default()
    };
    lab.target.create_subsystem(NQN, opts).unwrap();
    let ns = NamespaceOptions {
        bdev_name: "Malloc0".into(),
        ptpl_file,
        ..Default::default()
    };
    lab.target.add_namespace(NQN, ns).unwrap();
    lab.target.add_listener(NQN, loopback_address()).unwrap();
    lab.pg.poll();
    lab
}

/// Host A (two controllers), host B, host C.
struct Hosts {
    a: HostController,
    a2: HostController,
    b: HostController,
    c: HostController,
}

fn hosts(lab: &mut LoopbackLab) -> Hosts {
    Hosts {
        a: linux_bring_up_with_hostid(lab, NQN, 1, HOST_A, ID_A),
        a2: linux_bring_up_with_hostid(lab, NQN, 1, HOST_A, ID_A),
        b: linux_bring_up_with_hostid(lab, NQN, 1, HOST_B, ID_B),
        c: linux_bring_up_with_hostid(lab, NQN, 1, HOST_C, ID_C),
    }
}

fn keys(k1: u64, k2: u64) -> Vec<u8> {
    [k1.to_le_bytes(), k2.to_le_bytes()].concat()
}

fn resv_cmd(op: IoOpcode, cid: u16, cdw10: u32) -> Command {
    let mut c = Command::new(op.0, cid, 1);
    c.cdw10.set(cdw10);
    c
}

fn register(
    lab: &mut LoopbackLab,
    h: &mut HostController,
    cdw10: u32,
    crkey: u64,
    nrkey: u64,
) -> Status {
    let cid = h.cid();
    let cmd = resv_cmd(IoOpcode::RESERVATION_REGISTER, cid, cdw10);
    h.io(lab, 0, in_capsule(cmd, keys(crkey, nrkey)))
        .cqe
        .status()
}

fn acquire(
    lab: &mut LoopbackLab,
    h: &mut HostController,
    action: u32,
    rtype: T,
    crkey: u64,
    prkey: u64,
) -> Status {
    let cid = h.cid();
    let cmd = resv_cmd(
        IoOpcode::RESERVATION_ACQUIRE,
        cid,
        action | u32::from(rtype.0) << 8,
    );
    h.io(lab, 0, in_capsule(cmd, keys(crkey, prkey)))
        .cqe
        .status()
}

fn release(
    lab: &mut LoopbackLab,
    h: &mut HostController,
    action: u32,
    rtype: T,
    crkey: u64,
) -> Status {
    let cid = h.cid();
    let cmd = resv_cmd(
        IoOpcode::RESERVATION_RELEASE,
        cid,
        action | u32::from(rtype.0) << 8,
    );
    h.io(lab, 0, in_capsule(cmd, crkey.to_le_bytes().to_vec()))
        .cqe
        .status()
}

const REGISTER: u32 = 0;
const UNREGISTER: u32 = 1;
const REPLACE: u32 = 2;
const IEKEY: u32 = 1 << 3;
const CPTPL_SET: u32 = 3 << 30;
const ACQUIRE: u32 = 0;
const PREEMPT: u32 = 1;
const PREEMPT_ABORT: u32 = 2;
const RELEASE: u32 = 0;
const CLEAR: u32 = 1;

struct Report {
    header: ReservationStatusHeader,
    regs: Vec<RegisteredControllerExt>,
}

fn report_raw(lab: &mut LoopbackLab, h: &mut HostController, len: usize, eds: bool) -> Response {
    let cid = h.cid();
    let mut cmd = resv_cmd(IoOpcode::RESERVATION_REPORT, cid, (len / 4 - 1) as u32);
    cmd.cdw11.set(u32::from(eds));
    h.io(lab, 0, reading(cmd, len))
}

fn report(lab: &mut LoopbackLab, h: &mut HostController) -> Report {
    let r = report_raw(lab, h, 4096, true);
    expect_ok(&r);
    let header = ReservationStatusHeader::read_from_prefix(&r.host_buffer)
        .unwrap()
        .0;
    let n = header.regctl.get() as usize;
    let regs = r.host_buffer[64..64 + n * 64]
        .chunks_exact(64)
        .map(|c| RegisteredControllerExt::read_from_bytes(c).unwrap())
        .collect();
    Report { header, regs }
}

/// Runs `op` (a read-group or write-group I/O) from `h`; its status.
fn io_status(lab: &mut LoopbackLab, h: &mut HostController, op: IoOpcode) -> Status {
    let cid = h.cid();
    let capsule = match op {
        IoOpcode::READ => reading(Command::read(cid, 1, 0, 1), BLOCK),
        IoOpcode::COMPARE => in_capsule(Command::compare(cid, 1, 0, 1), vec![0; BLOCK]),
        IoOpcode::WRITE => in_capsule(Command::write(cid, 1, 0, 1), vec![0; BLOCK]),
        IoOpcode::WRITE_ZEROES => no_data(Command::write_zeroes(cid, 1, 0, 1, false)),
        IoOpcode::FLUSH => no_data(Command::flush(cid, 1)),
        IoOpcode::DATASET_MANAGEMENT => {
            let mut range = DsmRange::default();
            range.slba.set(8);
            range.nlb.set(1);
            in_capsule(Command::dsm(cid, 1, 1, true), range.as_bytes().to_vec())
        }
        _ => unreachable!(),
    };
    let status = h.io(lab, 0, capsule).cqe.status();
    // A compare of zeroes against written data may miscompare: that is not our question.
    if status == Status::COMPARE_FAILURE.with_dnr() {
        return Status::SUCCESS;
    }
    status
}

const READS: [IoOpcode; 2] = [IoOpcode::READ, IoOpcode::COMPARE];
const WRITES: [IoOpcode; 4] = [
    IoOpcode::WRITE,
    IoOpcode::WRITE_ZEROES,
    IoOpcode::DATASET_MANAGEMENT,
    IoOpcode::FLUSH,
];

fn assert_access(
    lab: &mut LoopbackLab,
    h: &mut HostController,
    read_ok: bool,
    write_ok: bool,
    who: &str,
) {
    for (ops, ok) in [(&READS[..], read_ok), (&WRITES[..], write_ok)] {
        for &op in ops {
            let expect = if ok { Status::SUCCESS } else { CONFLICT };
            assert_eq!(io_status(lab, h, op), expect, "{who}: {op:?}");
        }
    }
}

fn get_log(lab: &mut LoopbackLab, h: &mut HostController, rae: bool) -> ReservationNotificationLog {
    let cid = h.cid();
    let mut cmd = Command::get_log_page(cid, 0, LogPageId::RESERVATION_NOTIFICATION, 64, 0);
    if rae {
        cmd.cdw10.set(cmd.cdw10.get() | 1 << 15);
    }
    let r = h.admin(lab, reading(cmd, 64));
    expect_ok(&r);
    ReservationNotificationLog::read_from_bytes(&r.host_buffer).unwrap()
}

fn submit_aer(h: &mut HostController) {
    let cid = h.cid();
    h.admin.submit(no_data(Command::async_event_request(cid)));
}

/// Polls (in real time: AENs are raised on the reactor's 10 ms tick) until an AER of `h`
/// completes or `limit` passes.
fn aen(lab: &mut LoopbackLab, h: &HostController, limit: Duration) -> Option<Response> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Some(r) = lab.try_wait(&h.admin, 100) {
            return Some(r);
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    None
}

fn set_feature(
    lab: &mut LoopbackLab,
    h: &mut HostController,
    fid: FeatureId,
    nsid: u32,
    v: u32,
) -> Status {
    let cid = h.cid();
    let mut cmd = Command::set_features(cid, fid, v, false);
    cmd.nsid.set(nsid);
    h.admin(lab, no_data(cmd)).cqe.status()
}

fn get_feature(
    lab: &mut LoopbackLab,
    h: &mut HostController,
    fid: FeatureId,
    sel: FeatureSelect,
    nsid: u32,
) -> Response {
    let cid = h.cid();
    let mut cmd = Command::get_features(cid, fid, sel);
    cmd.nsid.set(nsid);
    h.admin(lab, no_data(cmd))
}

#[test]
fn identify_reports_reservation_support() {
    let mut lab = lab_with(None);
    let mut a = linux_bring_up_with_hostid(&mut lab, NQN, 1, HOST_A, ID_A);
    assert_ne!(a.identify.oncs.get() & ONCS_RESERVATIONS, 0, "ONCS bit 5");
    let cid = a.cid();
    let r = a.admin(
        &mut lab,
        reading(Command::identify(cid, Cns::NAMESPACE, 1, 0), 4096),
    );
    expect_ok(&r);
    let ns = IdentifyNamespace::read_from_bytes(&r.host_buffer[..4096]).unwrap();
    assert_eq!(
        ns.rescap, RESCAP_ALL_TYPES,
        "all types and IEKEY, no PTPL without a file"
    );
    assert_eq!(ns.nmic & NMIC_SHARED, NMIC_SHARED);
    let dir = tempdir("identify");
    let mut lab = lab_with(Some(dir.join("ptpl.json")));
    let mut a = linux_bring_up_with_hostid(&mut lab, NQN, 1, HOST_A, ID_A);
    let cid = a.cid();
    let r = a.admin(
        &mut lab,
        reading(Command::identify(cid, Cns::NAMESPACE, 1, 0), 4096),
    );
    expect_ok(&r);
    let ns = IdentifyNamespace::read_from_bytes(&r.host_buffer[..4096]).unwrap();
    assert_eq!(ns.rescap, RESCAP_ALL_TYPES | RESCAP_PTPL);
}

#[test]
fn register_replace_unregister_and_wrong_keys() {
    let mut lab = lab_with(None);
    let mut h = hosts(&mut lab);
    assert_eq!(
        register(&mut lab, &mut h.a, REGISTER, 0, 0xA1),
        Status::SUCCESS
    );
    // The second controller of host A shares the registration: registering the same key
    // again is fine, another key conflicts.
    assert_eq!(
        register(&mut lab, &mut h.a2, REGISTER, 0, 0xA1),
        Status::SUCCESS
    );
    assert_eq!(register(&mut lab, &mut h.a2, REGISTER, 0, 0xA2), CONFLICT);
    assert_eq!(
        register(&mut lab, &mut h.b, REGISTER, 0, 0xB1),
        Status::SUCCESS
    );
    assert_eq!(
        register(&mut lab, &mut h.b, REGISTER, 0, 0),
        Status::INVALID_FIELD.with_dnr()
    );
    let rep = report(&mut lab, &mut h.c);
    assert_eq!(rep.header.regctl.get(), 2);
    assert_eq!(
        rep.header.gen.get(),
        3,
        "every successful Register bumps the generation"
    );
    assert_eq!(rep.regs[0].hostid, ID_A);
    assert_eq!(rep.regs[0].rkey.get(), 0xA1);
    assert_eq!(rep.regs[0].cntlid.get(), 0xFFFF);
    assert_eq!(rep.regs[1].hostid, ID_B);
    // Replace with a wrong current key: conflict; with the key, or ignoring it: done.
    assert_eq!(register(&mut lab, &mut h.a, REPLACE, 0x99, 0xA3), CONFLICT);
    assert_eq!(
        register(&mut lab, &mut h.a, REPLACE, 0xA1, 0xA3),
        Status::SUCCESS
    );
    assert_eq!(
        register(&mut lab, &mut h.a2, REPLACE | IEKEY, 0, 0xA4),
        Status::SUCCESS
    );
    assert_eq!(report(&mut lab, &mut h.a).regs[0].rkey.get(), 0xA4);
    // CPTPL without a ptpl_file: Invalid Field.
    assert_eq!(
        register(&mut lab, &mut h.c, REGISTER | CPTPL_SET, 0, 0xC1),
        Status::INVALID_FIELD.with_dnr()
    );
    // Unregister: wrong key conflicts, IEKEY ignores it, a non-registrant conflicts.
    assert_eq!(register(&mut lab, &mut h.b, UNREGISTER, 0x99, 0), CONFLICT);
    assert_eq!(
        register(&mut lab, &mut h.c, UNREGISTER | IEKEY, 0, 0),
        CONFLICT
    );
    assert_eq!(
        register(&mut lab, &mut h.b, UNREGISTER | IEKEY, 0, 0),
        Status::SUCCESS
    );
    assert_eq!(
        register(&mut lab, &mut h.a2, UNREGISTER, 0xA4, 0),
        Status::SUCCESS
    );
    assert_eq!(report(&mut lab, &mut h.a).header.regctl.get(), 0);
    // A host not registered: acquire and release conflict.
    assert_eq!(
        acquire(&mut lab, &mut h.a, ACQUIRE, T::WRITE_EXCLUSIVE, 0xA4, 0),
        CONFLICT
    );
    assert_eq!(
        release(&mut lab, &mut h.a, RELEASE, T::WRITE_EXCLUSIVE, 0xA4),
        CONFLICT
    );
}

/// Every type: what the holder (A, through either controller), a registrant (B) and a
/// non-registrant (C) may read and write.
#[test]
fn access_matrix_of_all_six_types() {
    let matrix = [
        // (type, registrant read, registrant write, non-registrant read, non-registrant write)
        (T::WRITE_EXCLUSIVE, true, false, true, false),
        (T::EXCLUSIVE_ACCESS, false, false, false, false),
        (T::WRITE_EXCLUSIVE_REGISTRANTS_ONLY, true, true, true, false),
        (
            T::EXCLUSIVE_ACCESS_REGISTRANTS_ONLY,
            true,
            true,
            false,
            false,
        ),
        (T::WRITE_EXCLUSIVE_ALL_REGISTRANTS, true, true, true, false),
        (
            T::EXCLUSIVE_ACCESS_ALL_REGISTRANTS,
            true,
            true,
            false,
            false,
        ),
    ];
    let mut lab = lab_with(None);
    let mut h = hosts(&mut lab);
    assert_eq!(
        register(&mut lab, &mut h.a, REGISTER, 0, 1),
        Status::SUCCESS
    );
    assert_eq!(
        register(&mut lab, &mut h.b, REGISTER, 0, 2),
        Status::SUCCESS
    );
    for (t, reg_r, reg_w, non_r, non_w) in matrix {
        assert_eq!(
            acquire(&mut lab, &mut h.a, ACQUIRE, t, 1, 0),
            Status::SUCCESS,
            "{t:?}"
        );
        let rep = report(&mut lab, &mut h.c);
        assert_eq!(rep.header.rtype, t.0);
        let all_regs = matches!(
            t,
            T::WRITE_EXCLUSIVE_ALL_REGISTRANTS | T::EXCLUSIVE_ACCESS_ALL_REGISTRANTS
        );
        assert_eq!(rep.regs[0].rcsts, 1, "{t:?}: A holds it");
        assert_eq!(
            rep.regs[1].rcsts,
            u8::from(all_regs),
            "{t:?}: B holds it too?"
        );
        assert_access(&mut lab, &mut h.a, true, true, &format!("{t:?} holder"));
        assert_access(
            &mut lab,
            &mut h.a2,
            true,
            true,
            &format!("{t:?} holder's 2nd controller"),
        );
        if all_regs {
            // Every registrant is a holder.
            assert_access(&mut lab, &mut h.b, true, true, &format!("{t:?} registrant"));
        } else {
            assert_access(
                &mut lab,
                &mut h.b,
                reg_r,
                reg_w,
                &format!("{t:?} registrant"),
            );
        }
        assert_access(
            &mut lab,
            &mut h.c,
            non_r,
            non_w,
            &format!("{t:?} non-registrant"),
        );
        // The reservation commands themselves are not blocked: C can still register.
        assert_eq!(
            register(&mut lab, &mut h.c, REGISTER, 0, 3),
            Status::SUCCESS
        );
        assert_eq!(
            register(&mut lab, &mut h.c, UNREGISTER, 3, 0),
            Status::SUCCESS
        );
        // Another host cannot acquire over it (unless it holds it already: All Registrants).
        let expect = if all_regs { Status::SUCCESS } else { CONFLICT };
        assert_eq!(
            acquire(&mut lab, &mut h.b, ACQUIRE, t, 2, 0),
            expect,
            "{t:?}"
        );
        assert_eq!(release(&mut lab, &mut h.a2, RELEASE, t, 1), Status::SUCCESS);
        assert_eq!(report(&mut lab, &mut h.c).header.rtype, 0);
        assert_access(&mut lab, &mut h.c, true, true, "no reservation");
    }
}

#[test]
fn acquire_release_and_clear() {
    let mut lab = lab_with(None);
    let mut h = hosts(&mut lab);
    assert_eq!(
        register(&mut lab, &mut h.a, REGISTER, 0, 1),
        Status::SUCCESS
    );
    assert_eq!(
        register(&mut lab, &mut h.b, REGISTER, 0, 2),
        Status::SUCCESS
    );
    // Wrong key, IEKEY, an undefined type.
    assert_eq!(
        acquire(&mut lab, &mut h.a, ACQUIRE, T::WRITE_EXCLUSIVE, 2, 0),
        CONFLICT
    );
    assert_eq!(
        acquire(
            &mut lab,
            &mut h.a,
            ACQUIRE | IEKEY,
            T::WRITE_EXCLUSIVE,
            1,
            0
        ),
        Status::INVALID_FIELD.with_dnr()
    );
    assert_eq!(
        acquire(&mut lab, &mut h.a, ACQUIRE, T(7), 1, 0),
        Status::INVALID_FIELD.with_dnr()
    );
    // Release when nothing is held: success.
    assert_eq!(
        release(&mut lab, &mut h.a, RELEASE, T::WRITE_EXCLUSIVE, 1),
        Status::SUCCESS
    );
    assert_eq!(
        acquire(&mut lab, &mut h.a, ACQUIRE, T::WRITE_EXCLUSIVE, 1, 0),
        Status::SUCCESS
    );
    // Acquire again, same type: fine; another type: conflict.
    assert_eq!(
        acquire(&mut lab, &mut h.a2, ACQUIRE, T::WRITE_EXCLUSIVE, 1, 0),
        Status::SUCCESS
    );
    assert_eq!(
        acquire(&mut lab, &mut h.a, ACQUIRE, T::EXCLUSIVE_ACCESS, 1, 0),
        CONFLICT
    );
    // Release by a registrant that does not hold it: success, nothing changes.
    assert_eq!(
        release(&mut lab, &mut h.b, RELEASE, T::WRITE_EXCLUSIVE, 2),
        Status::SUCCESS
    );
    assert_eq!(
        report(&mut lab, &mut h.b).header.rtype,
        T::WRITE_EXCLUSIVE.0
    );
    // The holder naming another type: Invalid Field; a wrong key: conflict.
    assert_eq!(
        release(&mut lab, &mut h.a, RELEASE, T::EXCLUSIVE_ACCESS, 1),
        Status::INVALID_FIELD.with_dnr()
    );
    assert_eq!(
        release(&mut lab, &mut h.a, RELEASE, T::WRITE_EXCLUSIVE, 2),
        CONFLICT
    );
    let gen = report(&mut lab, &mut h.a).header.gen.get();
    // Clear by B: every registration and the reservation go; the generation moves.
    assert_eq!(
        release(&mut lab, &mut h.b, CLEAR, T::WRITE_EXCLUSIVE, 2),
        Status::SUCCESS
    );
    let rep = report(&mut lab, &mut h.a);
    assert_eq!((rep.header.rtype, rep.header.regctl.get()), (0, 0));
    assert_eq!(rep.header.gen.get(), gen + 1);
    assert_eq!(
        io_status(&mut lab, &mut h.c, IoOpcode::WRITE),
        Status::SUCCESS
    );
}

#[test]
fn preempt_and_preempt_and_abort() {
    for action in [PREEMPT, PREEMPT_ABORT] {
        let mut lab = lab_with(None);
        let mut h = hosts(&mut lab);
        assert_eq!(
            register(&mut lab, &mut h.a, REGISTER, 0, 1),
            Status::SUCCESS
        );
        assert_eq!(
            register(&mut lab, &mut h.b, REGISTER, 0, 2),
            Status::SUCCESS
        );
        assert_eq!(
            acquire(&mut lab, &mut h.a, ACQUIRE, T::EXCLUSIVE_ACCESS, 1, 0),
            Status::SUCCESS
        );
        assert_eq!(io_status(&mut lab, &mut h.b, IoOpcode::READ), CONFLICT);
        // PRKEY nobody holds: conflict; PRKEY 0 against a holder: Invalid Field.
        assert_eq!(
            acquire(&mut lab, &mut h.b, action, T::WRITE_EXCLUSIVE, 2, 9),
            CONFLICT
        );
        assert_eq!(
            acquire(&mut lab, &mut h.b, action, T::WRITE_EXCLUSIVE, 2, 0),
            Status::INVALID_FIELD.with_dnr()
        );
        // A non-registrant cannot preempt.
        assert_eq!(
            acquire(&mut lab, &mut h.c, action, T::WRITE_EXCLUSIVE, 3, 1),
            CONFLICT
        );
        assert_eq!(
            acquire(&mut lab, &mut h.b, action, T::WRITE_EXCLUSIVE, 2, 1),
            Status::SUCCESS
        );
        let rep = report(&mut lab, &mut h.b);
        assert_eq!(rep.header.rtype, T::WRITE_EXCLUSIVE.0);
        assert_eq!(rep.header.regctl.get(), 1, "A was unregistered");
        assert_eq!((rep.regs[0].hostid, rep.regs[0].rcsts), (ID_B, 1));
        // A (both controllers) lost its registration: writes conflict, reads pass.
        for ctrl in [&mut h.a, &mut h.a2] {
            assert_eq!(io_status(&mut lab, ctrl, IoOpcode::WRITE), CONFLICT);
            assert_eq!(io_status(&mut lab, ctrl, IoOpcode::READ), Status::SUCCESS);
        }
        assert_eq!(
            release(&mut lab, &mut h.a, RELEASE, T::WRITE_EXCLUSIVE, 1),
            CONFLICT
        );
        assert_eq!(
            io_status(&mut lab, &mut h.b, IoOpcode::WRITE),
            Status::SUCCESS
        );
    }
}

#[test]
fn report_needs_eds_and_room_for_its_header() {
    let mut lab = lab_with(None);
    let mut h = hosts(&mut lab);
    assert_eq!(
        register(&mut lab, &mut h.a, REGISTER, 0, 1),
        Status::SUCCESS
    );
    assert_eq!(
        register(&mut lab, &mut h.b, REGISTER, 0, 2),
        Status::SUCCESS
    );
    // Host IDs here are 128-bit: the 64-bit layout cannot carry them.
    let r = report_raw(&mut lab, &mut h.a, 4096, false);
    assert_eq!(
        r.cqe.status(),
        Status::HOST_ID_INCONSISTENT_FORMAT.with_dnr()
    );
    let r = report_raw(&mut lab, &mut h.a, 32, true);
    assert_eq!(r.cqe.status(), Status::INVALID_FIELD.with_dnr());
    // Room for the header and one registrant: REGCTL still counts both.
    let r = report_raw(&mut lab, &mut h.a, 128, true);
    expect_ok(&r);
    let header = ReservationStatusHeader::read_from_prefix(&r.host_buffer)
        .unwrap()
        .0;
    assert_eq!(header.regctl.get(), 2);
    let first = RegisteredControllerExt::read_from_bytes(&r.host_buffer[64..128]).unwrap();
    assert_eq!(first.hostid, ID_A);
}

#[test]
fn notification_log_aen_and_mask() {
    let mut lab = lab_with(None);
    let mut h = hosts(&mut lab);
    for (ctrl, key) in [(&mut h.a, 1), (&mut h.b, 2), (&mut h.c, 3)] {
        assert_eq!(register(&mut lab, ctrl, REGISTER, 0, key), Status::SUCCESS);
    }
    submit_aer(&mut h.a);
    submit_aer(&mut h.a2);
    submit_aer(&mut h.c);
    // C masks Reservation Released on namespace 1.
    let mask = NotificationType::RESERVATION_RELEASED.mask_bit();
    assert_eq!(
        set_feature(
            &mut lab,
            &mut h.c,
            FeatureId::RESERVATION_NOTIFICATION_MASK,
            1,
            mask
        ),
        Status::SUCCESS
    );
    let r = get_feature(
        &mut lab,
        &mut h.c,
        FeatureId::RESERVATION_NOTIFICATION_MASK,
        FeatureSelect::CURRENT,
        1,
    );
    assert_eq!(expect_ok(&r).dw0.get(), mask);
    let r = get_feature(
        &mut lab,
        &mut h.c,
        FeatureId::RESERVATION_NOTIFICATION_MASK,
        FeatureSelect::SUPPORTED_CAPABILITIES,
        1,
    );
    assert_eq!(
        expect_ok(&r).dw0.get(),
        FEATURE_CAP_CHANGEABLE | FEATURE_CAP_NAMESPACE_SPECIFIC
    );
    assert_eq!(
        set_feature(
            &mut lab,
            &mut h.c,
            FeatureId::RESERVATION_NOTIFICATION_MASK,
            1,
            1
        ),
        Status::INVALID_FIELD.with_dnr(),
        "bit 0 is reserved"
    );
    assert_eq!(
        set_feature(
            &mut lab,
            &mut h.c,
            FeatureId::RESERVATION_NOTIFICATION_MASK,
            7,
            mask
        ),
        Status::INVALID_FIELD.with_dnr(),
        "no such namespace"
    );

    // B takes a Registrants Only reservation, A preempts it with B's key: B's registration
    // goes (Registration Preempted to B), the type changes (Reservation Released to C,
    // which masked it).
    assert_eq!(
        acquire(
            &mut lab,
            &mut h.b,
            ACQUIRE,
            T::WRITE_EXCLUSIVE_REGISTRANTS_ONLY,
            2,
            0
        ),
        Status::SUCCESS
    );
    submit_aer(&mut h.b);
    assert_eq!(
        acquire(&mut lab, &mut h.a, PREEMPT, T::EXCLUSIVE_ACCESS, 1, 2),
        Status::SUCCESS
    );
    let r = aen(&mut lab, &h.b, Duration::from_secs(2)).expect("B gets an AEN");
    let (ty, info, lid) = parse_async_event_dw0(expect_ok(&r).dw0.get());
    assert_eq!(
        (ty, info, lid),
        (
            AsyncEventType::IO_COMMAND_SET,
            AEN_RESERVATION_LOG_PAGE_AVAILABLE,
            LogPageId::RESERVATION_NOTIFICATION
        )
    );
    let page = get_log(&mut lab, &mut h.b, false);
    assert_eq!(page.log_type, NotificationType::REGISTRATION_PREEMPTED.0);
    assert_eq!(
        (page.nsid.get(), page.count.get(), page.available),
        (1, 1, 0)
    );
    assert_eq!(
        get_log(&mut lab, &mut h.b, false).log_type,
        0,
        "read once, then empty"
    );
    // C masked Reservation Released: no AEN, an empty log. A issued the command: nothing.
    assert!(aen(&mut lab, &h.c, Duration::from_millis(100)).is_none());
    assert_eq!(get_log(&mut lab, &mut h.c, false).log_type, 0);
    assert!(aen(&mut lab, &h.a, Duration::from_millis(50)).is_none());

    // A releases its Exclusive Access reservation: no notice (not a Registrants Only type).
    // Then C takes Write Exclusive Registrants Only, and releases it: A hears (on both
    // controllers), C does not.
    assert_eq!(
        release(&mut lab, &mut h.a, RELEASE, T::EXCLUSIVE_ACCESS, 1),
        Status::SUCCESS
    );
    assert_eq!(
        acquire(
            &mut lab,
            &mut h.c,
            ACQUIRE,
            T::WRITE_EXCLUSIVE_REGISTRANTS_ONLY,
            3,
            0
        ),
        Status::SUCCESS
    );
    assert_eq!(
        release(
            &mut lab,
            &mut h.c,
            RELEASE,
            T::WRITE_EXCLUSIVE_REGISTRANTS_ONLY,
            3
        ),
        Status::SUCCESS
    );
    for ctrl in [&h.a, &h.a2] {
        let r = aen(&mut lab, ctrl, Duration::from_secs(2)).expect("A's controllers get an AEN");
        assert_eq!(
            parse_async_event_dw0(expect_ok(&r).dw0.get()).0,
            AsyncEventType::IO_COMMAND_SET
        );
    }
    // A reads with RAE set: the page goes, the AEN stays masked; a second notice (Clear by C:
    // Reservation Preempted) raises no new AEN until the log is read without RAE.
    let page = get_log(&mut lab, &mut h.a, true);
    assert_eq!(
        (page.log_type, page.count.get()),
        (NotificationType::RESERVATION_RELEASED.0, 1)
    );
    submit_aer(&mut h.a);
    assert_eq!(
        release(&mut lab, &mut h.c, CLEAR, T::WRITE_EXCLUSIVE, 3),
        Status::SUCCESS
    );
    assert!(
        aen(&mut lab, &h.a, Duration::from_millis(100)).is_none(),
        "masked until read"
    );
    let page = get_log(&mut lab, &mut h.a, false);
    assert_eq!(
        (page.log_type, page.count.get()),
        (NotificationType::RESERVATION_PREEMPTED.0, 2)
    );
    // A2 has its own log: both notices, in order.
    let first = get_log(&mut lab, &mut h.a2, false);
    let second = get_log(&mut lab, &mut h.a2, false);
    assert_eq!(
        (
            first.log_type,
            first.available,
            second.log_type,
            second.available
        ),
        (
            NotificationType::RESERVATION_RELEASED.0,
            1,
            NotificationType::RESERVATION_PREEMPTED.0,
            0
        )
    );
}

fn tempdir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("nvmf-resv-it-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn persistence_feature_and_ptpl_across_a_restart() {
    let dir = tempdir("restart");
    let file = dir.join("ns1.ptpl.json");
    let mut lab = lab_with(Some(file.clone()));
    let mut h = hosts(&mut lab);
    let ptpl = |lab: &mut LoopbackLab, h: &mut HostController| {
        let r = get_feature(
            lab,
            h,
            FeatureId::RESERVATION_PERSISTENCE,
            FeatureSelect::CURRENT,
            1,
        );
        expect_ok(&r).dw0.get()
    };
    assert_eq!(ptpl(&mut lab, &mut h.a), 0);
    // CPTPL on the first Register switches PTPL on and writes the file.
    assert_eq!(
        register(&mut lab, &mut h.a, REGISTER | CPTPL_SET, 0, 0xA1),
        Status::SUCCESS
    );
    assert!(file.exists());
    assert_eq!(ptpl(&mut lab, &mut h.b), 1);
    assert_eq!(report(&mut lab, &mut h.a).header.ptpls, 1);
    assert_eq!(
        register(&mut lab, &mut h.b, REGISTER, 0, 0xB1),
        Status::SUCCESS
    );
    assert_eq!(
        acquire(
            &mut lab,
            &mut h.a,
            ACQUIRE,
            T::WRITE_EXCLUSIVE_REGISTRANTS_ONLY,
            0xA1,
            0
        ),
        Status::SUCCESS
    );
    // Set Features turns it off and on again.
    assert_eq!(
        set_feature(&mut lab, &mut h.b, FeatureId::RESERVATION_PERSISTENCE, 1, 0),
        Status::SUCCESS
    );
    assert_eq!(ptpl(&mut lab, &mut h.a), 0);
    assert_eq!(
        set_feature(&mut lab, &mut h.b, FeatureId::RESERVATION_PERSISTENCE, 1, 1),
        Status::SUCCESS
    );
    assert_eq!(ptpl(&mut lab, &mut h.a), 1);

    // Save the config, drop the whole target, rebuild one from the saved config.
    let LoopbackLab { target, .. } = lab;
    drop(h);
    let control = Control::new(
        target,
        Box::new(|o: &TransportOptions| Err(TransportError::UnsupportedType(o.trtype.clone()))),
    );
    let saved = rpc::nvmf::config(&control);
    let add_ns = saved
        .iter()
        .find(|e| e["method"] == "nvmf_subsystem_add_ns")
        .expect("the namespace is saved");
    assert_eq!(
        add_ns["params"]["namespace"]["ptpl_file"],
        file.to_str().unwrap()
    );
    drop(control);

    let mut lab = LoopbackLab::default();
    let bdev: BdevRef =
        std::sync::Arc::new(MallocBdev::new("Malloc0", 64, BLOCK as u32, Some(BDEV_UUID)).unwrap());
    lab.target.bdevs.register(bdev).unwrap();
    let LoopbackLab {
        target,
        pg,
        transport,
    } = lab;
    let mut control = Control::new(
        target,
        Box::new(|o: &TransportOptions| Err(TransportError::UnsupportedType(o.trtype.clone()))),
    );
    for e in saved
        .iter()
        .filter(|e| e["method"] != "nvmf_create_transport")
    {
        let params: Value = e["params"].clone();
        rpc::dispatch(&mut control, e["method"].as_str().unwrap(), Some(params))
            .unwrap_or_else(|err| panic!("{}: {err:?}", e["method"]));
    }
    let mut lab = LoopbackLab {
        target: control.target,
        pg,
        transport,
    };
    lab.pg.poll();
    let mut h = hosts(&mut lab);
    let rep = report(&mut lab, &mut h.c);
    assert_eq!(rep.header.ptpls, 1);
    assert_eq!(rep.header.rtype, T::WRITE_EXCLUSIVE_REGISTRANTS_ONLY.0);
    let regs: Vec<_> = rep
        .regs
        .iter()
        .map(|r| (r.hostid, r.rkey.get(), r.rcsts))
        .collect();
    assert_eq!(regs, vec![(ID_A, 0xA1, 1), (ID_B, 0xB1, 0)]);
    // And it is enforced: C (not registered) cannot write, B (registrant) can.
    assert_eq!(io_status(&mut lab, &mut h.c, IoOpcode::WRITE), CONFLICT);
    assert_eq!(
        io_status(&mut lab, &mut h.b, IoOpcode::WRITE),
        Status::SUCCESS
    );

    // A corrupt file: add_ns fails and says which file and why.
    drop(h);
    let bad = dir.join("corrupt.json");
    std::fs::write(&bad, "{\"ptpl\": tru").unwrap();
    let mut lab2 = LoopbackLab::default();
    lab2.malloc("Malloc1", 64, BLOCK as u32);
    let opts = SubsystemOptions {
        allow_any_host: true,
        ..Default::default()
    };
    lab2.target.create_subsystem(NQN, opts).unwrap();
    let ns = NamespaceOptions {
        bdev_name: "Malloc1".into(),
        ptpl_file: Some(bad.clone()),
        ..Default::default()
    };
    let err = lab2.target.add_namespace(NQN, ns).unwrap_err().to_string();
    assert!(
        err.contains("corrupt.json") && err.contains("not a valid reservation state file"),
        "{err}"
    );
    // The bdev was not left claimed: it can be added without the file.
    let ns = NamespaceOptions {
        bdev_name: "Malloc1".into(),
        ..Default::default()
    };
    lab2.target.add_namespace(NQN, ns).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Makes the PTPL writer's next write of `file` block: its temporary file becomes a FIFO
/// nobody reads, so the writer's open waits. Returns the FIFO's path.
fn block_ptpl_writes(file: &std::path::Path) -> String {
    let fifo = format!("{}.tmp.{}", file.display(), std::process::id());
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success(), "mkfifo {fifo}");
    fifo
}

/// Lets the blocked write go on and fail (syncing a FIFO fails): a reader lets the writer's
/// open return. Returns the response on `q` of the command that waited for that write.
fn fail_blocked_write(lab: &mut LoopbackLab, fifo: &str, q: &LoopbackHostQueue) -> Response {
    use std::os::unix::fs::OpenOptionsExt;
    let reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(0o4000) // O_NONBLOCK: no writer needed to open
        .open(fifo)
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let done = loop {
        if let Some(r) = lab.try_wait(q, 10) {
            break r;
        }
        assert!(Instant::now() < deadline, "the failed write never settled");
        std::thread::sleep(Duration::from_millis(5));
    };
    drop(reader);
    done
}

/// A preempt whose PTPL write fails tells the preempted host nothing: its notice goes out
/// only once the change is written. The same preempt, written, is told.
#[test]
fn a_notice_goes_out_only_for_a_change_that_was_written() {
    let dir = tempdir("notice");
    let file = dir.join("ns1.ptpl.json");
    let mut lab = lab_with(Some(file.clone()));
    let mut h = hosts(&mut lab);
    assert_eq!(
        register(&mut lab, &mut h.a, REGISTER | CPTPL_SET, 0, 1),
        Status::SUCCESS
    );
    assert_eq!(
        register(&mut lab, &mut h.b, REGISTER, 0, 2),
        Status::SUCCESS
    );
    let ro = T::WRITE_EXCLUSIVE_REGISTRANTS_ONLY;
    assert_eq!(
        acquire(&mut lab, &mut h.b, ACQUIRE, ro, 2, 0),
        Status::SUCCESS
    );
    submit_aer(&mut h.b);

    let fifo = block_ptpl_writes(&file);
    let cid = h.a.cid();
    let preempt = resv_cmd(
        IoOpcode::RESERVATION_ACQUIRE,
        cid,
        PREEMPT | u32::from(T::EXCLUSIVE_ACCESS.0) << 8,
    );
    h.a.io[0].submit(in_capsule(preempt, keys(1, 2)));
    assert!(aen(&mut lab, &h.b, Duration::from_millis(200)).is_none());
    let done = fail_blocked_write(&mut lab, &fifo, &h.a.io[0]);
    assert_eq!(done.cqe.status(), Status::INTERNAL_ERROR);
    assert!(
        aen(&mut lab, &h.b, Duration::from_millis(200)).is_none(),
        "B heard of a preempt that did not happen"
    );
    assert_eq!(
        report(&mut lab, &mut h.a).regs.len(),
        2,
        "B is still registered"
    );

    assert_eq!(
        acquire(&mut lab, &mut h.a, PREEMPT, T::EXCLUSIVE_ACCESS, 1, 2),
        Status::SUCCESS
    );
    assert!(aen(&mut lab, &h.b, Duration::from_secs(2)).is_some());
    assert_eq!(report(&mut lab, &mut h.a).regs.len(), 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A PTPL write that cannot finish (its temporary file is a FIFO nobody reads, so the
/// writer's open blocks) holds only the reservation command that made it: the reactor goes
/// on serving I/O, reports and the other hosts, and the change is not seen before it is
/// written. When the write fails, that command answers Internal Error, the state stays the
/// one last written, and the next change is written as usual.
#[test]
fn a_stalled_ptpl_write_holds_only_its_own_command() {
    let dir = tempdir("stalled");
    let file = dir.join("ns1.ptpl.json");
    let mut lab = lab_with(Some(file.clone()));
    let mut h = hosts(&mut lab);
    assert_eq!(
        register(&mut lab, &mut h.a, REGISTER | CPTPL_SET, 0, 0xA1),
        Status::SUCCESS
    );
    let fifo = block_ptpl_writes(&file);

    let cid = h.b.cid();
    let cmd = resv_cmd(IoOpcode::RESERVATION_REGISTER, cid, REGISTER);
    h.b.io[0].submit(in_capsule(cmd, keys(0, 0xB1)));
    assert!(
        lab.try_wait(&h.b.io[0], 200).is_none(),
        "the Register completed although its write cannot have"
    );
    // Meanwhile the same reactor serves everyone else, with the state last written.
    for _ in 0..3 {
        assert_eq!(
            io_status(&mut lab, &mut h.c, IoOpcode::READ),
            Status::SUCCESS
        );
        assert_eq!(
            io_status(&mut lab, &mut h.a, IoOpcode::WRITE),
            Status::SUCCESS
        );
    }
    assert_eq!(
        report(&mut lab, &mut h.c).regs.len(),
        1,
        "only A is written"
    );

    let done = fail_blocked_write(&mut lab, &fifo, &h.b.io[0]);
    assert_eq!(done.cqe.status(), Status::INTERNAL_ERROR);
    assert_eq!(report(&mut lab, &mut h.c).regs.len(), 1);
    let saved: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(saved["registrants"].as_array().unwrap().len(), 1);

    assert_eq!(
        register(&mut lab, &mut h.b, REGISTER, 0, 0xB1),
        Status::SUCCESS
    );
    assert_eq!(report(&mut lab, &mut h.c).regs.len(), 2);
    let saved: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(saved["registrants"].as_array().unwrap().len(), 2);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Two namespaces cannot persist to one PTPL file: each would overwrite the other's
/// reservations, and at the next start the file would load for one bdev only.
#[test]
fn a_ptpl_file_belongs_to_one_namespace() {
    let dir = tempdir("shared-file");
    let file = dir.join("ns.ptpl.json");
    let mut lab = lab_with(Some(file.clone()));
    lab.malloc("Malloc1", 64, BLOCK as u32);
    let ns = |ptpl_file| NamespaceOptions {
        bdev_name: "Malloc1".into(),
        ptpl_file,
        ..Default::default()
    };
    let err = lab
        .target
        .add_namespace(NQN, ns(Some(file.clone())))
        .unwrap_err();
    assert!(err.to_string().contains("another namespace's"), "{err}");
    // The bdev was not kept claimed by the refusal; with its own file it is added.
    lab.target
        .add_namespace(NQN, ns(Some(dir.join("ns2.ptpl.json"))))
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Each namespace's PTPL file has its own writer: one whose file hangs holds back only its
/// own namespace's reservation commands, not another tenant's.
#[test]
fn a_hung_ptpl_file_holds_back_only_its_namespace() {
    let dir = tempdir("two-files");
    let (first, second) = (dir.join("ns1.json"), dir.join("ns2.json"));
    let mut lab = lab_with(Some(first.clone()));
    lab.malloc("Malloc1", 64, BLOCK as u32);
    let ns = NamespaceOptions {
        bdev_name: "Malloc1".into(),
        ptpl_file: Some(second.clone()),
        ..Default::default()
    };
    assert_eq!(lab.target.add_namespace(NQN, ns).unwrap(), 2);
    lab.pg.poll();
    let mut h = hosts(&mut lab);
    let register_on = |h: &mut HostController, nsid: u32, cdw10: u32, key: u64| {
        let cid = h.cid();
        let mut cmd = resv_cmd(IoOpcode::RESERVATION_REGISTER, cid, cdw10);
        cmd.nsid.set(nsid);
        in_capsule(cmd, keys(0, key))
    };
    for nsid in [1, 2] {
        let c = register_on(&mut h.a, nsid, REGISTER | CPTPL_SET, 0xA1);
        expect_ok(&h.a.io(&mut lab, 0, c));
    }
    let fifo = block_ptpl_writes(&first);
    let c = register_on(&mut h.b, 1, REGISTER, 0xB1);
    h.b.io[0].submit(c);
    let c = register_on(&mut h.c, 2, REGISTER, 0xC1);
    expect_ok(&h.c.io(&mut lab, 0, c));
    assert!(lab.try_wait(&h.b.io[0], 100).is_none());
    let done = fail_blocked_write(&mut lab, &fifo, &h.b.io[0]);
    assert_eq!(done.cqe.status(), Status::INTERNAL_ERROR);
    let saved: Value = serde_json::from_str(&std::fs::read_to_string(&second).unwrap()).unwrap();
    assert_eq!(saved["registrants"].as_array().unwrap().len(), 2);
    std::fs::remove_dir_all(&dir).unwrap();
}
