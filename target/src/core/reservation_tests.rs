//! The reservation state machine, the access matrix, the notice log and the PTPL file.

use super::*;
use crate::bdev::util::format_uuid;
use nvmf_common::spec::reservation::{
    AcquireAction, Cptpl, RegisterAction, ReleaseAction, ReservationType as T,
};

const A: HostId = [0xA; 16];
const B: HostId = [0xB; 16];
const C: HostId = [0xC; 16];
const ALL_TYPES: [T; 6] = [
    T::WRITE_EXCLUSIVE,
    T::EXCLUSIVE_ACCESS,
    T::WRITE_EXCLUSIVE_REGISTRANTS_ONLY,
    T::EXCLUSIVE_ACCESS_REGISTRANTS_ONLY,
    T::WRITE_EXCLUSIVE_ALL_REGISTRANTS,
    T::EXCLUSIVE_ACCESS_ALL_REGISTRANTS,
];

fn reg_cmd(action: RegisterAction, iekey: bool, cptpl: Cptpl) -> ReservationRegister {
    ReservationRegister {
        action,
        iekey,
        cptpl,
    }
}

fn reg_data(crkey: u64, nrkey: u64) -> RegisterData {
    let mut d = RegisterData::default();
    d.crkey.set(crkey);
    d.nrkey.set(nrkey);
    d
}

fn acq(action: AcquireAction, rtype: T) -> ReservationAcquire {
    ReservationAcquire {
        action,
        iekey: false,
        rtype,
    }
}

fn acq_data(crkey: u64, prkey: u64) -> AcquireData {
    let mut d = AcquireData::default();
    d.crkey.set(crkey);
    d.prkey.set(prkey);
    d
}

fn rel(action: ReleaseAction, rtype: T) -> ReservationRelease {
    ReservationRelease {
        action,
        iekey: false,
        rtype,
    }
}

fn register(s: &mut ResvState, host: &HostId, key: u64) {
    let cmd = reg_cmd(RegisterAction::REGISTER, false, Cptpl::NO_CHANGE);
    assert_eq!(s.register(host, cmd, reg_data(0, key), false), Ok(vec![]));
}

fn acquire(s: &mut ResvState, host: &HostId, key: u64, t: T) {
    let r = s.acquire(host, acq(AcquireAction::ACQUIRE, t), acq_data(key, 0));
    assert_eq!(r, Ok(vec![]));
}

fn notice(hostid: HostId, kind: NotificationType) -> Notice {
    Notice { hostid, kind }
}

const CONFLICT: Status = Status::RESERVATION_CONFLICT.with_dnr();
const INVALID: Status = Status::INVALID_FIELD.with_dnr();

#[test]
fn access_matrix_for_every_type() {
    // (type, registrant read, registrant write, non-registrant read, non-registrant write)
    let matrix = [
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
    for (t, reg_r, reg_w, non_r, non_w) in matrix {
        let mut s = ResvState::default();
        register(&mut s, &A, 1);
        register(&mut s, &B, 2);
        acquire(&mut s, &A, 1, t);
        let ok = |host: &HostId, access| s.check(host, access).is_ok();
        assert!(
            ok(&A, Access::Read) && ok(&A, Access::Write),
            "{t:?}: holder"
        );
        assert_eq!(ok(&B, Access::Read), reg_r, "{t:?}: registrant read");
        assert_eq!(ok(&B, Access::Write), reg_w, "{t:?}: registrant write");
        assert_eq!(ok(&C, Access::Read), non_r, "{t:?}: non-registrant read");
        assert_eq!(ok(&C, Access::Write), non_w, "{t:?}: non-registrant write");
        assert_eq!(s.check(&C, Access::Write), Err(CONFLICT));
    }
    // Without a reservation everyone may do anything, registered or not.
    let mut s = ResvState::default();
    register(&mut s, &A, 1);
    for h in [A, B] {
        assert!(s.check(&h, Access::Write).is_ok() && s.check(&h, Access::Read).is_ok());
    }
}

#[test]
fn register_unregister_replace() {
    let mut s = ResvState::default();
    let reg = |iekey| reg_cmd(RegisterAction::REGISTER, iekey, Cptpl::NO_CHANGE);
    let unreg = |iekey| reg_cmd(RegisterAction::UNREGISTER, iekey, Cptpl::NO_CHANGE);
    let replace = |iekey| reg_cmd(RegisterAction::REPLACE, iekey, Cptpl::NO_CHANGE);
    assert_eq!(
        s.register(&A, reg(false), reg_data(0, 0), false),
        Err(INVALID)
    );
    assert_eq!(
        s.register(&A, reg(false), reg_data(0, 7), false),
        Ok(vec![])
    );
    assert_eq!(s.generation, 1);
    // The same key again: success; another key: conflict (IEKEY does not change that).
    assert_eq!(
        s.register(&A, reg(false), reg_data(0, 7), false),
        Ok(vec![])
    );
    assert_eq!(
        s.register(&A, reg(true), reg_data(0, 8), false),
        Err(CONFLICT)
    );
    // Unregister with a wrong key: conflict; a host not registered: conflict.
    assert_eq!(
        s.register(&A, unreg(false), reg_data(8, 0), false),
        Err(CONFLICT)
    );
    assert_eq!(
        s.register(&B, unreg(true), reg_data(0, 0), false),
        Err(CONFLICT)
    );
    // Replace: with the key, or ignoring it.
    assert_eq!(
        s.register(&A, replace(false), reg_data(8, 9), false),
        Err(CONFLICT)
    );
    assert_eq!(
        s.register(&A, replace(false), reg_data(7, 9), false),
        Ok(vec![])
    );
    assert_eq!(s.registrant(&A).unwrap().rkey, 9);
    assert_eq!(
        s.register(&A, replace(true), reg_data(0, 10), false),
        Ok(vec![])
    );
    assert_eq!(s.registrant(&A).unwrap().rkey, 10);
    assert_eq!(
        s.register(&A, replace(true), reg_data(0, 0), false),
        Err(INVALID)
    );
    // Replace by a host not registered: conflict, or registers it with IEKEY (SPDK).
    assert_eq!(
        s.register(&B, replace(false), reg_data(0, 5), false),
        Err(CONFLICT)
    );
    assert_eq!(
        s.register(&B, replace(true), reg_data(0, 5), false),
        Ok(vec![])
    );
    assert_eq!(s.registrant(&B).unwrap().rkey, 5);
    let gen = s.generation;
    assert_eq!(
        s.register(&A, unreg(true), reg_data(0, 0), false),
        Ok(vec![])
    );
    assert!(s.registrant(&A).is_none());
    assert_eq!(s.generation, gen + 1);
    // Unknown action.
    let bad = reg_cmd(RegisterAction(3), false, Cptpl::NO_CHANGE);
    assert_eq!(s.register(&A, bad, reg_data(0, 1), false), Err(INVALID));
}

#[test]
fn registrant_limit() {
    let mut s = ResvState::default();
    for i in 0..MAX_REGISTRANTS {
        register(&mut s, &[i as u8; 16], 1);
    }
    let cmd = reg_cmd(RegisterAction::REGISTER, false, Cptpl::NO_CHANGE);
    let r = s.register(&[0xFF; 16], cmd, reg_data(0, 1), false);
    assert_eq!(r, Err(Status::INTERNAL_ERROR));
}

#[test]
fn cptpl_needs_a_file_and_applies_only_on_success() {
    let mut s = ResvState::default();
    let set = reg_cmd(RegisterAction::REGISTER, false, Cptpl::SET);
    assert_eq!(s.register(&A, set, reg_data(0, 1), false), Err(INVALID));
    assert!(!s.ptpl && s.registrants.is_empty());
    let reserved = reg_cmd(RegisterAction::REGISTER, false, Cptpl::RESERVED);
    assert_eq!(s.register(&A, reserved, reg_data(0, 1), true), Err(INVALID));
    assert_eq!(s.register(&A, set, reg_data(0, 1), true), Ok(vec![]));
    assert!(s.ptpl);
    // A failing register leaves PTPL as it was.
    let clear = reg_cmd(RegisterAction::REGISTER, false, Cptpl::CLEAR);
    assert_eq!(s.register(&A, clear, reg_data(0, 2), true), Err(CONFLICT));
    assert!(s.ptpl);
    assert_eq!(s.register(&A, clear, reg_data(0, 1), true), Ok(vec![]));
    assert!(!s.ptpl);
}

#[test]
fn acquire_rules() {
    let mut s = ResvState::default();
    register(&mut s, &A, 1);
    register(&mut s, &B, 2);
    let gen = s.generation;
    // Not registered, wrong key, IEKEY, bad type.
    let we = acq(AcquireAction::ACQUIRE, T::WRITE_EXCLUSIVE);
    assert_eq!(s.acquire(&C, we, acq_data(1, 0)), Err(CONFLICT));
    assert_eq!(s.acquire(&A, we, acq_data(2, 0)), Err(CONFLICT));
    let iekey = ReservationAcquire { iekey: true, ..we };
    assert_eq!(s.acquire(&A, iekey, acq_data(1, 0)), Err(INVALID));
    for bad in [0, 7] {
        let t = acq(AcquireAction::ACQUIRE, T(bad));
        assert_eq!(s.acquire(&A, t, acq_data(1, 0)), Err(INVALID));
    }
    acquire(&mut s, &A, 1, T::WRITE_EXCLUSIVE);
    assert_eq!((s.rtype, s.holder), (Some(T::WRITE_EXCLUSIVE), Some(A)));
    // Again, same type: fine; another type, or another host: conflict.
    acquire(&mut s, &A, 1, T::WRITE_EXCLUSIVE);
    let ea = acq(AcquireAction::ACQUIRE, T::EXCLUSIVE_ACCESS);
    assert_eq!(s.acquire(&A, ea, acq_data(1, 0)), Err(CONFLICT));
    assert_eq!(s.acquire(&B, we, acq_data(2, 0)), Err(CONFLICT));
    assert_eq!(s.generation, gen, "acquire does not bump the generation");
    let bad = acq(AcquireAction(3), T::WRITE_EXCLUSIVE);
    assert_eq!(s.acquire(&A, bad, acq_data(1, 0)), Err(INVALID));
}

#[test]
fn all_registrants_holds_for_every_registrant() {
    for t in [
        T::WRITE_EXCLUSIVE_ALL_REGISTRANTS,
        T::EXCLUSIVE_ACCESS_ALL_REGISTRANTS,
    ] {
        let mut s = ResvState::default();
        register(&mut s, &A, 1);
        register(&mut s, &B, 2);
        acquire(&mut s, &A, 1, t);
        assert!(s.is_holder(&A) && s.is_holder(&B) && !s.is_holder(&C));
        // B acquiring the same type is no conflict: it holds it already.
        acquire(&mut s, &B, 2, t);
        // The acquirer leaving passes the reservation on; the last one leaving ends it.
        let unreg = reg_cmd(RegisterAction::UNREGISTER, false, Cptpl::NO_CHANGE);
        assert_eq!(s.register(&A, unreg, reg_data(1, 0), false), Ok(vec![]));
        assert_eq!((s.rtype, s.holder), (Some(t), Some(B)));
        assert_eq!(s.register(&B, unreg, reg_data(2, 0), false), Ok(vec![]));
        assert_eq!((s.rtype, s.holder), (None, None));
    }
}

#[test]
fn unregistering_the_holder_releases() {
    for t in ALL_TYPES.into_iter().take(4) {
        let mut s = ResvState::default();
        register(&mut s, &A, 1);
        register(&mut s, &B, 2);
        acquire(&mut s, &A, 1, t);
        let unreg = reg_cmd(RegisterAction::UNREGISTER, false, Cptpl::NO_CHANGE);
        let notices = s.register(&A, unreg, reg_data(1, 0), false).unwrap();
        assert_eq!((s.rtype, s.holder), (None, None), "{t:?}");
        // Only Registrants Only reservations tell the others.
        let expect = if is_registrants_only(t) {
            vec![notice(B, NotificationType::RESERVATION_RELEASED)]
        } else {
            vec![]
        };
        assert_eq!(notices, expect, "{t:?}");
    }
}

#[test]
fn release_and_clear() {
    for t in ALL_TYPES {
        let mut s = ResvState::default();
        register(&mut s, &A, 1);
        register(&mut s, &B, 2);
        register(&mut s, &C, 3);
        acquire(&mut s, &A, 1, t);
        let gen = s.generation;
        // Wrong key or not registered: conflict; IEKEY: invalid.
        let release = rel(ReleaseAction::RELEASE, t);
        assert_eq!(s.release(&A, release, 2), Err(CONFLICT));
        assert_eq!(s.release(&[0xD; 16], release, 1), Err(CONFLICT));
        let iekey = ReservationRelease {
            iekey: true,
            ..release
        };
        assert_eq!(s.release(&A, iekey, 1), Err(INVALID));
        if !is_all_registrants(t) {
            // Not the holder: success, nothing happens (whatever type it names).
            let other = rel(ReleaseAction::RELEASE, T::EXCLUSIVE_ACCESS_ALL_REGISTRANTS);
            assert_eq!(s.release(&B, other, 2), Ok(vec![]));
            assert_eq!(s.rtype, Some(t));
        }
        // The holder naming another type: invalid.
        let wrong = T(t.0 % 6 + 1);
        assert_eq!(
            s.release(&A, rel(ReleaseAction::RELEASE, wrong), 1),
            Err(INVALID)
        );
        // For All Registrants types any registrant releases it.
        let releaser = if is_all_registrants(t) { B } else { A };
        let key = if is_all_registrants(t) { 2 } else { 1 };
        let notices = s.release(&releaser, release, key).unwrap();
        assert_eq!((s.rtype, s.holder), (None, None));
        let others: Vec<HostId> = [A, B, C].into_iter().filter(|h| *h != releaser).collect();
        let expect: Vec<Notice> = if matches!(t, T::WRITE_EXCLUSIVE | T::EXCLUSIVE_ACCESS) {
            vec![]
        } else {
            others
                .iter()
                .map(|h| notice(*h, NotificationType::RESERVATION_RELEASED))
                .collect()
        };
        assert_eq!(notices, expect, "{t:?}");
        assert_eq!(s.generation, gen, "release does not bump the generation");
        // Releasing when nothing is held: success.
        assert_eq!(s.release(&A, release, 1), Ok(vec![]));
        assert_eq!(s.registrants.len(), 3);
        // Clear: everyone goes, the others hear Reservation Preempted.
        acquire(&mut s, &A, 1, t);
        let notices = s.release(&B, rel(ReleaseAction::CLEAR, t), 2).unwrap();
        assert_eq!(
            notices,
            vec![
                notice(A, NotificationType::RESERVATION_PREEMPTED),
                notice(C, NotificationType::RESERVATION_PREEMPTED)
            ]
        );
        assert!(s.registrants.is_empty() && s.rtype.is_none());
        assert_eq!(s.generation, gen + 1);
    }
}

#[test]
fn preempt_the_holder() {
    for action in [AcquireAction::PREEMPT, AcquireAction::PREEMPT_AND_ABORT] {
        let mut s = ResvState::default();
        register(&mut s, &A, 1);
        register(&mut s, &B, 2);
        register(&mut s, &C, 3);
        acquire(&mut s, &A, 1, T::WRITE_EXCLUSIVE);
        let gen = s.generation;
        // B preempts A (PRKEY = A's key) and takes an Exclusive Access reservation.
        let notices = s
            .acquire(&B, acq(action, T::EXCLUSIVE_ACCESS), acq_data(2, 1))
            .unwrap();
        assert_eq!((s.rtype, s.holder), (Some(T::EXCLUSIVE_ACCESS), Some(B)));
        assert!(s.registrant(&A).is_none());
        assert_eq!(
            notices,
            vec![
                notice(A, NotificationType::REGISTRATION_PREEMPTED),
                notice(C, NotificationType::RESERVATION_RELEASED)
            ]
        );
        assert_eq!(s.generation, gen + 1);
        assert_eq!(s.check(&A, Access::Read), Err(CONFLICT));
        // Preempt with a PRKEY nobody has: conflict; PRKEY 0 (not the holder's): invalid.
        let ea = acq(action, T::EXCLUSIVE_ACCESS);
        assert_eq!(s.acquire(&C, ea, acq_data(3, 99)), Err(CONFLICT));
        assert_eq!(s.acquire(&C, ea, acq_data(3, 0)), Err(INVALID));
        // Another PRKEY unregisters its registrants, the reservation stays.
        let notices = s.acquire(&B, ea, acq_data(2, 3)).unwrap();
        assert_eq!(
            notices,
            vec![notice(C, NotificationType::REGISTRATION_PREEMPTED)]
        );
        assert_eq!((s.rtype, s.holder), (Some(T::EXCLUSIVE_ACCESS), Some(B)));
        // The holder preempting itself changes the type.
        register(&mut s, &C, 3);
        let notices = s
            .acquire(&B, acq(action, T::WRITE_EXCLUSIVE), acq_data(2, 2))
            .unwrap();
        assert_eq!(s.rtype, Some(T::WRITE_EXCLUSIVE));
        assert_eq!(
            notices,
            vec![notice(C, NotificationType::RESERVATION_RELEASED)]
        );
        // A non-registrant cannot preempt.
        assert_eq!(s.acquire(&A, ea, acq_data(1, 2)), Err(CONFLICT));
    }
}

#[test]
fn preempt_without_reservation_and_all_registrants() {
    let mut s = ResvState::default();
    register(&mut s, &A, 1);
    register(&mut s, &B, 2);
    let p = acq(AcquireAction::PREEMPT, T::WRITE_EXCLUSIVE);
    assert_eq!(s.acquire(&A, p, acq_data(1, 9)), Err(CONFLICT));
    let notices = s.acquire(&A, p, acq_data(1, 2)).unwrap();
    assert_eq!(
        notices,
        vec![notice(B, NotificationType::REGISTRATION_PREEMPTED)]
    );
    assert!(
        s.rtype.is_none(),
        "preempting registrations acquires nothing"
    );

    // All Registrants: PRKEY 0 leaves the preempting host alone with a new reservation.
    let mut s = ResvState::default();
    for (h, k) in [(A, 1), (B, 2), (C, 3)] {
        register(&mut s, &h, k);
    }
    acquire(&mut s, &A, 1, T::WRITE_EXCLUSIVE_ALL_REGISTRANTS);
    let p = acq(AcquireAction::PREEMPT, T::EXCLUSIVE_ACCESS);
    let notices = s.acquire(&B, p, acq_data(2, 0)).unwrap();
    assert_eq!((s.rtype, s.holder), (Some(T::EXCLUSIVE_ACCESS), Some(B)));
    assert_eq!(s.registrants.len(), 1);
    assert_eq!(
        notices,
        vec![
            notice(A, NotificationType::REGISTRATION_PREEMPTED),
            notice(C, NotificationType::REGISTRATION_PREEMPTED),
            // No other registrant is left to hear of the type change.
        ]
    );
    // All Registrants with a PRKEY: its registrants go, the reservation stays.
    let mut s = ResvState::default();
    for (h, k) in [(A, 1), (B, 2), (C, 3)] {
        register(&mut s, &h, k);
    }
    acquire(&mut s, &A, 1, T::EXCLUSIVE_ACCESS_ALL_REGISTRANTS);
    let p = acq(AcquireAction::PREEMPT, T::EXCLUSIVE_ACCESS_ALL_REGISTRANTS);
    assert_eq!(s.acquire(&B, p, acq_data(2, 42)), Err(CONFLICT));
    let notices = s.acquire(&B, p, acq_data(2, 1)).unwrap();
    assert_eq!(
        notices,
        vec![notice(A, NotificationType::REGISTRATION_PREEMPTED)]
    );
    assert_eq!(s.rtype, Some(T::EXCLUSIVE_ACCESS_ALL_REGISTRANTS));
    assert!(s.is_holder(&B) && s.is_holder(&C));
}

#[test]
fn notice_log_queue_mask_and_count() {
    let mut log = NoticeLog::default();
    assert_eq!(log.take().log_type, 0, "empty page");
    assert!(log.post(1, NotificationType::REGISTRATION_PREEMPTED));
    assert!(log.post(2, NotificationType::RESERVATION_RELEASED));
    log.set_mask(1, NotificationType::RESERVATION_PREEMPTED.mask_bit());
    assert!(!log.post(1, NotificationType::RESERVATION_PREEMPTED));
    assert!(log.post(2, NotificationType::RESERVATION_PREEMPTED));
    let p = log.take();
    assert_eq!(
        (p.count.get(), p.log_type, p.nsid.get(), p.available),
        (1, 1, 1, 2)
    );
    let p = log.take();
    assert_eq!(
        (p.count.get(), p.log_type, p.nsid.get(), p.available),
        (2, 2, 2, 1)
    );
    let p = log.take();
    assert_eq!((p.count.get(), p.log_type, p.available), (3, 3, 0));
    assert_eq!(log.pending(), 0);
    // Overflow: the newest queued page carries the count of the lost ones.
    for _ in 0..NOTICE_QUEUE_MAX + 5 {
        log.post(3, NotificationType::RESERVATION_RELEASED);
    }
    assert_eq!(log.pending(), NOTICE_QUEUE_MAX);
    assert_eq!(log.take().available, 254);
    let last = (0..NOTICE_QUEUE_MAX - 1)
        .map(|_| log.take())
        .last()
        .unwrap();
    assert_eq!(last.count.get(), 3 + NOTICE_QUEUE_MAX as u64 + 5);
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("nvmf-resv-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

const BDEV: [u8; 16] = [0x42; 16];

/// A reactor's view taken before a change sees the change at its next check (it loads the
/// state again only then), and keeps seeing it; a view taken later starts from it.
#[test]
fn a_reactor_view_follows_every_change_of_the_namespace() {
    let resv = NsReservation::new(BDEV, None).unwrap();
    let mut early = resv.view();
    assert!(early.check(&resv, &B, Access::Write).is_ok());
    resv.update_and_wait(|s| {
        register(s, &A, 1);
        acquire(s, &A, 1, T::WRITE_EXCLUSIVE);
        Ok(vec![])
    })
    .unwrap();
    assert_eq!(early.check(&resv, &B, Access::Write), Err(CONFLICT));
    assert!(early.check(&resv, &B, Access::Read).is_ok());
    assert!(early.check(&resv, &A, Access::Write).is_ok());
    let mut late = resv.view();
    assert_eq!(late.check(&resv, &B, Access::Write), Err(CONFLICT));
    // A change that changes nothing leaves the views as they are, and still right.
    let _ = resv.update_and_wait(|_| Ok(vec![]));
    assert_eq!(early.check(&resv, &B, Access::Write), Err(CONFLICT));
    resv.update_and_wait(|s| {
        s.release(
            &A,
            ReservationRelease {
                action: ReleaseAction::RELEASE,
                iekey: false,
                rtype: T::WRITE_EXCLUSIVE,
            },
            1,
        )
    })
    .unwrap();
    assert!(early.check(&resv, &B, Access::Write).is_ok());
    assert!(late.check(&resv, &B, Access::Write).is_ok());
}

#[test]
fn ptpl_file_round_trip() {
    let dir = temp_dir("round-trip");
    let path = dir.join("ns1.json");
    let resv = NsReservation::new(BDEV, Some(path.clone())).unwrap();
    assert!(
        resv.ptpl_capable() && !path.exists(),
        "a missing file is an empty state"
    );
    // PTPL off: nothing is written.
    resv.update_and_wait(|s| {
        register(s, &A, 1);
        Ok(vec![])
    })
    .unwrap();
    assert!(!path.exists());
    resv.update_and_wait(|s| {
        s.register(
            &B,
            reg_cmd(RegisterAction::REGISTER, false, Cptpl::SET),
            reg_data(0, 2),
            true,
        )
    })
    .unwrap();
    resv.update_and_wait(|s| {
        acquire(s, &B, 2, T::EXCLUSIVE_ACCESS_REGISTRANTS_ONLY);
        Ok(vec![])
    })
    .unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(json["ptpl"], true);
    assert_eq!(json["rtype"], 4);
    assert_eq!(json["crkey"], 2);
    assert_eq!(json["bdev_uuid"], format_uuid(&BDEV));
    assert_eq!(json["holder_uuid"], format_uuid(&B));
    assert_eq!(json["registrants"][0]["host_uuid"], format_uuid(&A));
    assert_eq!(json["registrants"][1]["rkey"], 2);
    // No temporary file left behind.
    let names: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert_eq!(names.len(), 1);
    let reloaded = NsReservation::new(BDEV, Some(path.clone())).unwrap();
    let (was, now) = (resv.state(), reloaded.state());
    assert_eq!(now.registrants, was.registrants);
    assert_eq!(
        (now.rtype, now.holder, now.ptpl),
        (was.rtype, was.holder, true)
    );
    // Switching PTPL off is written too; such a file restores nothing.
    resv.update_and_wait(|s| {
        s.ptpl = false;
        Ok(vec![])
    })
    .unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(json["ptpl"], false);
    let reloaded = NsReservation::new(BDEV, Some(path.clone())).unwrap();
    assert_eq!(*reloaded.state(), ResvState::default());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn ptpl_all_registrants_reloads_with_a_holder() {
    let dir = temp_dir("all-regs");
    let path = dir.join("ns.json");
    let resv = NsReservation::new(BDEV, Some(path.clone())).unwrap();
    resv.update_and_wait(|s| {
        s.ptpl = true;
        register(s, &A, 1);
        register(s, &B, 2);
        acquire(s, &B, 2, T::WRITE_EXCLUSIVE_ALL_REGISTRANTS);
        Ok(vec![])
    })
    .unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(json["holder_uuid"], "", "no single holder is recorded");
    let now = NsReservation::new(BDEV, Some(path.clone()))
        .unwrap()
        .state();
    assert_eq!(now.rtype, Some(T::WRITE_EXCLUSIVE_ALL_REGISTRANTS));
    assert!(now.is_holder(&A) && now.is_holder(&B));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_ptpl_files_are_refused_by_name() {
    let dir = temp_dir("bad");
    let path = dir.join("ns.json");
    let uuid = format_uuid(&BDEV);
    let host = format_uuid(&A);
    let cases = [
        ("{not json".to_string(), "not a valid reservation state file"),
        (String::new(), "not a valid reservation state file"),
        (
            r#"{"ptpl": true, "bdev_uuid": "00000000-0000-0000-0000-000000000001", "registrants": []}"#.to_string(),
            "is not this namespace's bdev",
        ),
        (
            format!(r#"{{"ptpl": true, "bdev_uuid": "{uuid}", "registrants": [{{"rkey": 1, "host_uuid": "nope"}}]}}"#),
            "is not a UUID",
        ),
        (
            format!(r#"{{"ptpl": true, "rtype": 9, "crkey": 1, "bdev_uuid": "{uuid}", "holder_uuid": "{host}", "registrants": [{{"rkey": 1, "host_uuid": "{host}"}}]}}"#),
            "rtype 9",
        ),
        (
            format!(r#"{{"ptpl": true, "rtype": 1, "crkey": 5, "bdev_uuid": "{uuid}", "holder_uuid": "{host}", "registrants": [{{"rkey": 1, "host_uuid": "{host}"}}]}}"#),
            "without a registered holder",
        ),
        (
            format!(r#"{{"ptpl": true, "bdev_uuid": "{uuid}", "registrants": [{{"rkey": 1, "host_uuid": "{host}"}}, {{"rkey": 2, "host_uuid": "{host}"}}]}}"#),
            "registered twice",
        ),
        (
            format!(r#"{{"ptpl": true, "bdev_uuid": "{uuid}", "registrants": [], "extra": 1}}"#),
            "unknown field",
        ),
    ];
    for (text, why) in cases {
        std::fs::write(&path, &text).unwrap();
        let err = NsReservation::new(BDEV, Some(path.clone())).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains(why) && msg.contains("ns.json"),
            "{text}: {msg}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_failed_write_keeps_the_state() {
    let dir = temp_dir("unwritable");
    // The file's directory is gone: the write fails, the command answers Internal Error and
    // the state the host sees does not move.
    let path = dir.join("gone").join("ns.json");
    let resv = NsReservation::new(BDEV, Some(path)).unwrap();
    let r = resv.update_and_wait(|s| {
        s.ptpl = true;
        register(s, &A, 1);
        Ok(vec![])
    });
    assert_eq!(r, Err(Status::INTERNAL_ERROR));
    assert_eq!(*resv.state(), ResvState::default());
    std::fs::remove_dir_all(&dir).unwrap();
}
