//! Bring-up, identify, log pages, features and events through the loopback transport, in the
//! order and shape a Linux host uses them.

use nvmf_common::spec::command::Command;
use nvmf_common::spec::fabrics::{PropertyGetCommand, PropertySetCommand};
use nvmf_common::spec::features::{
    parse_async_event_dw0, AsyncEventType, AsyncNotice, FeatureId, FeatureSelect,
    AEC_NAMESPACE_ATTRIBUTE,
};
use nvmf_common::spec::identify::*;
use nvmf_common::spec::log_page::{
    get_u128, DiscoveryLogEntry, DiscoveryLogHeader, ErrorLogEntry, LogPageId, SmartHealthLog,
    SubsystemType, TransportType,
};
use nvmf_common::spec::nqn::DISCOVERY_NQN;
use nvmf_common::spec::registers::{Cc, Csts, Property};
use nvmf_common::spec::Status;
use nvmf_target::core::subsystem::ListenAddress;
use nvmf_target::target::NamespaceOptions;
use nvmf_tests::*;
use zerocopy::FromBytes;

const NQN: &str = "nqn.2016-06.io.spdk:cnode1";

fn lab_with_two_namespaces() -> LoopbackLab {
    let mut lab = LoopbackLab::default();
    lab.malloc("Malloc0", 2048, 512);
    lab.malloc("Malloc1", 512, 4096);
    lab.subsystem(NQN, &["Malloc0", "Malloc1"]);
    lab
}

#[test]
fn linux_bring_up_sees_what_the_kernel_host_requires() {
    let mut lab = lab_with_two_namespaces();
    let ctrl = linux_bring_up(&mut lab, NQN, 2);
    let id = &ctrl.identify;
    // drivers/nvme/host refuses a fabrics controller without these.
    assert_ne!(id.kas.get(), 0);
    assert!(id.ioccsz.get() >= 4);
    assert!(id.iorcsz.get() >= 1);
    assert_eq!(id.icdoff.get(), 0);
    assert_ne!(id.sgls.get() & SGLS_KEYED, 0);
    assert_ne!(id.sgls.get() & SGLS_OFFSET, 0, "in-capsule data advertised");
    assert_eq!(id.ioccsz.get(), (64 + 4096) / 16);
    assert_eq!(id.mdts, 5, "128 KiB over 4 KiB pages");
    assert_eq!(nul_str(&id.subnqn), NQN);
    assert_eq!(ascii_str(&id.sn).trim_end(), "SN0001");
    assert_eq!(id.cntrltype, CNTRLTYPE_IO);
    assert_eq!(id.nn.get(), 32);
    assert_ne!(id.oncs.get() & ONCS_WRITE_ZEROES, 0);
    assert_eq!(ctrl.io.len(), 2);
}

#[test]
fn identify_namespace_and_lists_describe_each_namespace() {
    let mut lab = lab_with_two_namespaces();
    let mut ctrl = linux_bring_up(&mut lab, NQN, 1);
    let cid = ctrl.cid();
    let r = ctrl.admin(
        &mut lab,
        reading(Command::identify(cid, Cns::NAMESPACE, 2, 0), 4096),
    );
    expect_ok(&r);
    let ns = IdentifyNamespace::read_from_bytes(&r.host_buffer[..4096]).unwrap();
    assert_eq!(ns.nsze.get(), 512);
    assert_eq!(ns.current_lbaf().block_size(), 4096);
    let uuid = lab.target.subsystem(NQN).unwrap().namespaces[&2].uuid;
    assert_eq!(ns.nguid, uuid);

    // An inactive NSID within NN gives zeroes; one past NN is invalid.
    let cid = ctrl.cid();
    let r = ctrl.admin(
        &mut lab,
        reading(Command::identify(cid, Cns::NAMESPACE, 7, 0), 4096),
    );
    expect_ok(&r);
    assert!(r.host_buffer.iter().all(|&b| b == 0));
    let cid = ctrl.cid();
    let r = ctrl.admin(
        &mut lab,
        reading(Command::identify(cid, Cns::NAMESPACE, 33, 0), 4096),
    );
    assert_eq!(r.cqe.status(), Status::INVALID_NAMESPACE.with_dnr());

    let cid = ctrl.cid();
    let r = ctrl.admin(
        &mut lab,
        reading(
            Command::identify(cid, Cns::ACTIVE_NAMESPACE_LIST, 0, 0),
            4096,
        ),
    );
    expect_ok(&r);
    let ids: Vec<u32> = r
        .host_buffer
        .chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .take(3)
        .collect();
    assert_eq!(ids, [1, 2, 0]);
    let cid = ctrl.cid();
    let r = ctrl.admin(
        &mut lab,
        reading(
            Command::identify(cid, Cns::ACTIVE_NAMESPACE_LIST, 1, 0),
            4096,
        ),
    );
    assert_eq!(&r.host_buffer[..8], &[2, 0, 0, 0, 0, 0, 0, 0]);

    let cid = ctrl.cid();
    let r = ctrl.admin(
        &mut lab,
        reading(
            Command::identify(cid, Cns::NAMESPACE_ID_DESCRIPTOR_LIST, 1, 0),
            4096,
        ),
    );
    expect_ok(&r);
    let uuid1 = lab.target.subsystem(NQN).unwrap().namespaces[&1].uuid;
    // NGUID descriptor first: type 2, length 16, then the id.
    assert_eq!(&r.host_buffer[..2], &[NsIdType::NGUID.0, 16]);
    assert_eq!(&r.host_buffer[4..20], &uuid1);
    assert_eq!(&r.host_buffer[20..22], &[NsIdType::UUID.0, 16]);
}

#[test]
fn log_pages_report_counters_errors_firmware_and_bounds() {
    let mut lab = lab_with_two_namespaces();
    let mut ctrl = linux_bring_up(&mut lab, NQN, 1);
    for lba in 0..3 {
        let cid = ctrl.cid();
        let r = ctrl.io(
            &mut lab,
            0,
            with_buffer(Command::write(cid, 1, lba, 8), vec![7; 4096]),
        );
        expect_ok(&r);
    }
    let cid = ctrl.cid();
    let r = ctrl.io(&mut lab, 0, reading(Command::read(cid, 1, 0, 8), 4096));
    expect_ok(&r);

    let cid = ctrl.cid();
    let r = ctrl.admin(
        &mut lab,
        reading(
            Command::get_log_page(cid, 0xFFFF_FFFF, LogPageId::SMART_HEALTH, 512, 0),
            512,
        ),
    );
    expect_ok(&r);
    let smart = SmartHealthLog::read_from_bytes(&r.host_buffer[..512]).unwrap();
    assert_eq!(get_u128(&smart.host_write_commands), 3);
    assert_eq!(get_u128(&smart.host_read_commands), 1);
    assert_eq!(
        get_u128(&smart.data_units_written),
        1,
        "12 KiB rounds up to one unit"
    );

    // A failing command lands in the Error Information log.
    let cid = ctrl.cid();
    let r = ctrl.io(&mut lab, 0, reading(Command::read(cid, 1, 5000, 1), 512));
    assert_eq!(r.cqe.status(), Status::LBA_OUT_OF_RANGE.with_dnr());
    let cid = ctrl.cid();
    let r = ctrl.admin(
        &mut lab,
        reading(
            Command::get_log_page(cid, 0, LogPageId::ERROR_INFORMATION, 64, 0),
            64,
        ),
    );
    expect_ok(&r);
    let entry = ErrorLogEntry::read_from_bytes(&r.host_buffer[..64]).unwrap();
    assert_eq!(entry.error_count.get(), 1);
    assert_eq!(entry.sqid.get(), 1);
    assert_eq!(entry.cid.get(), cid - 1);
    assert_eq!(
        Status::from_field(entry.status.get()),
        Status::LBA_OUT_OF_RANGE.with_dnr()
    );

    let cid = ctrl.cid();
    let r = ctrl.admin(
        &mut lab,
        reading(
            Command::get_log_page(cid, 0, LogPageId::FIRMWARE_SLOT, 512, 0),
            512,
        ),
    );
    expect_ok(&r);
    assert_eq!(r.host_buffer[0], 1, "slot 1 active");
    assert_eq!(
        ascii_str(&r.host_buffer[8..16]).trim_end(),
        env!("CARGO_PKG_VERSION")
    );

    // Past the end of a log page, and an unaligned offset.
    let cid = ctrl.cid();
    let r = ctrl.admin(
        &mut lab,
        reading(
            Command::get_log_page(cid, 0, LogPageId::SMART_HEALTH, 4, 516),
            4,
        ),
    );
    assert_eq!(r.cqe.status(), Status::INVALID_FIELD.with_dnr());
    let cid = ctrl.cid();
    let r = ctrl.admin(
        &mut lab,
        reading(
            Command::get_log_page(cid, 0, LogPageId::SMART_HEALTH, 4, 2),
            4,
        ),
    );
    assert_eq!(r.cqe.status(), Status::INVALID_FIELD.with_dnr());
    let cid = ctrl.cid();
    let r = ctrl.admin(
        &mut lab,
        reading(Command::get_log_page(cid, 0, LogPageId(0xC0), 512, 0), 512),
    );
    assert_eq!(r.cqe.status(), Status::INVALID_LOG_PAGE.with_dnr());
    // The controller still serves.
    let cid = ctrl.cid();
    expect_ok(&ctrl.admin(&mut lab, no_data(Command::keep_alive(cid))));
}

#[test]
fn features_are_negotiated_stored_and_reported() {
    let mut lab = lab_with_two_namespaces();
    let mut ctrl = linux_bring_up(&mut lab, NQN, 0);
    let cid = ctrl.cid();
    let r = ctrl.admin(
        &mut lab,
        no_data(Command::set_features(
            cid,
            FeatureId::NUMBER_OF_QUEUES,
            0x00FF_00FF,
            false,
        )),
    );
    // 256 asked, 127 granted (128 qpairs including the admin queue), zero-based.
    assert_eq!(expect_ok(&r).dw0.get(), 0x007E_007E);
    let cid = ctrl.cid();
    let r = ctrl.admin(
        &mut lab,
        no_data(Command::get_features(
            cid,
            FeatureId::NUMBER_OF_QUEUES,
            FeatureSelect::CURRENT,
        )),
    );
    assert_eq!(expect_ok(&r).dw0.get(), 0x007E_007E);

    let cid = ctrl.cid();
    let r = ctrl.admin(
        &mut lab,
        no_data(Command::get_features(
            cid,
            FeatureId::KEEP_ALIVE_TIMER,
            FeatureSelect::CURRENT,
        )),
    );
    assert_eq!(expect_ok(&r).dw0.get(), LINUX_KATO_MS);
    let cid = ctrl.cid();
    expect_ok(&ctrl.admin(
        &mut lab,
        no_data(Command::set_features(
            cid,
            FeatureId::KEEP_ALIVE_TIMER,
            9000,
            false,
        )),
    ));
    let cid = ctrl.cid();
    let r = ctrl.admin(
        &mut lab,
        no_data(Command::get_features(
            cid,
            FeatureId::KEEP_ALIVE_TIMER,
            FeatureSelect::CURRENT,
        )),
    );
    assert_eq!(expect_ok(&r).dw0.get(), 9000);

    let cid = ctrl.cid();
    expect_ok(&ctrl.admin(
        &mut lab,
        no_data(Command::set_features(
            cid,
            FeatureId::TEMPERATURE_THRESHOLD,
            0x150,
            false,
        )),
    ));
    let cid = ctrl.cid();
    let r = ctrl.admin(
        &mut lab,
        no_data(Command::get_features(
            cid,
            FeatureId::TEMPERATURE_THRESHOLD,
            FeatureSelect::CURRENT,
        )),
    );
    assert_eq!(expect_ok(&r).dw0.get(), 0x150);

    // RAM disks have no volatile cache: the feature does not exist; saving is refused.
    let cid = ctrl.cid();
    let r = ctrl.admin(
        &mut lab,
        no_data(Command::set_features(
            cid,
            FeatureId::VOLATILE_WRITE_CACHE,
            1,
            false,
        )),
    );
    assert_eq!(r.cqe.status(), Status::INVALID_FIELD.with_dnr());
    let cid = ctrl.cid();
    let r = ctrl.admin(
        &mut lab,
        no_data(Command::set_features(cid, FeatureId::ARBITRATION, 0, true)),
    );
    assert_eq!(r.cqe.status(), Status::FEATURE_ID_NOT_SAVEABLE.with_dnr());
    let cid = ctrl.cid();
    let r = ctrl.admin(
        &mut lab,
        no_data(Command::get_features(
            cid,
            FeatureId(0x7A),
            FeatureSelect::CURRENT,
        )),
    );
    assert_eq!(r.cqe.status(), Status::INVALID_FIELD.with_dnr());

    let cid = ctrl.cid();
    let r = ctrl.admin(
        &mut lab,
        reading(
            Command::get_features(cid, FeatureId::HOST_IDENTIFIER, FeatureSelect::CURRENT),
            16,
        ),
    );
    expect_ok(&r);
    assert_eq!(r.host_buffer, HOSTID);
}

#[test]
fn namespace_added_live_raises_an_aer_and_fills_the_changed_list() {
    let mut lab = lab_with_two_namespaces();
    lab.malloc("Malloc2", 64, 512);
    let mut ctrl = linux_bring_up(&mut lab, NQN, 1);
    let cid = ctrl.cid();
    expect_ok(&ctrl.admin(
        &mut lab,
        no_data(Command::set_features(
            cid,
            FeatureId::ASYNC_EVENT_CONFIGURATION,
            AEC_NAMESPACE_ATTRIBUTE,
            false,
        )),
    ));
    let aer_cid = ctrl.cid();
    ctrl.admin
        .submit(no_data(Command::async_event_request(aer_cid)));
    assert!(
        lab.try_wait(&ctrl.admin, 100).is_none(),
        "an AER waits for an event"
    );

    let opts = NamespaceOptions {
        bdev_name: "Malloc2".into(),
        nsid: Some(5),
        ..Default::default()
    };
    assert_eq!(lab.target.add_namespace(NQN, opts).unwrap(), 5);
    let r = lab
        .try_wait(&ctrl.admin, 100)
        .expect("AER completes on namespace change");
    assert_eq!(r.cqe.cid.get(), aer_cid);
    let (ty, info, lid) = parse_async_event_dw0(expect_ok(&r).dw0.get());
    assert_eq!(
        (ty, info, lid),
        (
            AsyncEventType::NOTICE,
            AsyncNotice::NAMESPACE_ATTRIBUTE_CHANGED.0,
            LogPageId::CHANGED_NAMESPACE_LIST
        )
    );

    let cid = ctrl.cid();
    let r = ctrl.admin(
        &mut lab,
        reading(
            Command::get_log_page(cid, 0, LogPageId::CHANGED_NAMESPACE_LIST, 4096, 0),
            4096,
        ),
    );
    expect_ok(&r);
    assert_eq!(&r.host_buffer[..8], &[5, 0, 0, 0, 0, 0, 0, 0]);
    // The new namespace serves I/O at once, and reading the log cleared it.
    let cid = ctrl.cid();
    expect_ok(&ctrl.io(
        &mut lab,
        0,
        with_buffer(Command::write(cid, 5, 0, 1), vec![1; 512]),
    ));
    let cid = ctrl.cid();
    let r = ctrl.admin(
        &mut lab,
        reading(
            Command::get_log_page(cid, 0, LogPageId::CHANGED_NAMESPACE_LIST, 4096, 0),
            4096,
        ),
    );
    assert!(r.host_buffer.iter().all(|&b| b == 0));

    // Removal: the next AER reports it, and the namespace stops serving.
    let aer_cid = ctrl.cid();
    ctrl.admin
        .submit(no_data(Command::async_event_request(aer_cid)));
    lab.target.remove_namespace(NQN, 5).unwrap();
    let r = lab.try_wait(&ctrl.admin, 100).expect("AER on removal");
    expect_ok(&r);
    let cid = ctrl.cid();
    let r = ctrl.io(&mut lab, 0, reading(Command::read(cid, 5, 0, 1), 512));
    assert_eq!(r.cqe.status(), Status::INVALID_NAMESPACE.with_dnr());
    // Four AERs at most.
    for _ in 0..4 {
        let cid = ctrl.cid();
        ctrl.admin
            .submit(no_data(Command::async_event_request(cid)));
    }
    let cid = ctrl.cid();
    let r = lab.run(&ctrl.admin, no_data(Command::async_event_request(cid)));
    assert_eq!(
        r.cqe.status(),
        Status::ASYNC_EVENT_REQUEST_LIMIT_EXCEEDED.with_dnr()
    );
}

#[test]
fn discovery_log_read_as_nvme_cli_does() {
    let mut lab = lab_with_two_namespaces();
    lab.malloc("Malloc9", 64, 512);
    lab.subsystem("nqn.2016-06.io.spdk:cnode2", &["Malloc9"]);
    // A third subsystem only another host may see.
    lab.target
        .create_subsystem("nqn.2016-06.io.spdk:private", Default::default())
        .unwrap();
    lab.target
        .add_listener("nqn.2016-06.io.spdk:private", loopback_address())
        .unwrap();

    let mut disc = linux_bring_up(&mut lab, DISCOVERY_NQN, 0);
    assert_eq!(disc.identify.cntrltype, CNTRLTYPE_DISCOVERY);
    // nvme-cli: header first, then header plus all entries.
    let cid = disc.cid();
    let r = disc.admin(
        &mut lab,
        reading(
            Command::get_log_page(cid, 0, LogPageId::DISCOVERY, 1024, 0),
            1024,
        ),
    );
    expect_ok(&r);
    let header = DiscoveryLogHeader::read_from_bytes(&r.host_buffer[..1024]).unwrap();
    let numrec = header.numrec.get();
    assert_eq!(numrec, 2);
    let len = 1024 * (numrec as u32 + 1);
    let cid = disc.cid();
    let r = disc.admin(
        &mut lab,
        reading(
            Command::get_log_page(cid, 0, LogPageId::DISCOVERY, len, 0),
            len as usize,
        ),
    );
    expect_ok(&r);
    let again = DiscoveryLogHeader::read_from_bytes(&r.host_buffer[..1024]).unwrap();
    assert_eq!(
        again.genctr.get(),
        header.genctr.get(),
        "log unchanged between reads"
    );
    let entries: Vec<_> = r.host_buffer[1024..]
        .chunks(1024)
        .map(|c| DiscoveryLogEntry::read_from_bytes(c).unwrap())
        .collect();
    let nqns: Vec<_> = entries
        .iter()
        .map(|e| nul_str(&e.subnqn).to_string())
        .collect();
    assert_eq!(nqns, [NQN, "nqn.2016-06.io.spdk:cnode2"]);
    assert!(entries
        .iter()
        .all(|e| e.subsystem_type() == SubsystemType::NVME));
    assert!(entries
        .iter()
        .all(|e| e.transport() == TransportType::INTRA_HOST));
    assert_eq!(entries[0].cntlid.get(), 0xFFFF);

    // Reading entries from an offset (nvme-cli pages through large logs).
    let cid = disc.cid();
    let r = disc.admin(
        &mut lab,
        reading(
            Command::get_log_page(cid, 0, LogPageId::DISCOVERY, 1024, 2048),
            1024,
        ),
    );
    expect_ok(&r);
    assert_eq!(
        nul_str(&r.host_buffer[256..512]),
        "nqn.2016-06.io.spdk:cnode2"
    );

    // A discovery controller offers no I/O command set.
    let cid = disc.cid();
    let r = disc.admin(
        &mut lab,
        reading(
            Command::get_log_page(cid, 0, LogPageId::SMART_HEALTH, 512, 0),
            512,
        ),
    );
    assert_eq!(r.cqe.status(), Status::INVALID_LOG_PAGE.with_dnr());
    let cid = disc.cid();
    let r = disc.admin(
        &mut lab,
        reading(Command::identify(cid, Cns::NAMESPACE, 1, 0), 4096),
    );
    assert_eq!(r.cqe.status(), Status::INVALID_FIELD.with_dnr());
}

#[test]
fn shutdown_and_reset_follow_cc() {
    let mut lab = lab_with_two_namespaces();
    let ctrl = linux_bring_up(&mut lab, NQN, 1);
    let cc = Cc(0)
        .with_iosqes(6)
        .with_iocqes(4)
        .with_en(true)
        .with_shn(1);
    expect_ok(&lab.run(
        &ctrl.admin,
        no_data(PropertySetCommand::new(90, Property::CC.0, u64::from(cc.0), false).to_command()),
    ));
    let r = lab.run(
        &ctrl.admin,
        no_data(PropertyGetCommand::new(91, Property::CSTS.0, false).to_command()),
    );
    assert_eq!(Csts(expect_ok(&r).dw0.get()).shst(), 2, "shutdown complete");
    // Disabling is a Controller Reset: not ready, and the I/O queues are deleted.
    expect_ok(&lab.run(
        &ctrl.admin,
        no_data(PropertySetCommand::new(92, Property::CC.0, 0, false).to_command()),
    ));
    let r = lab.run(
        &ctrl.admin,
        no_data(PropertyGetCommand::new(93, Property::CSTS.0, false).to_command()),
    );
    assert!(!Csts(expect_ok(&r).dw0.get()).rdy());
    for _ in 0..1000 {
        if ctrl.io[0].is_disconnected() {
            break;
        }
        lab.pg.poll();
    }
    assert!(
        ctrl.io[0].is_disconnected(),
        "the I/O queue outlived the reset"
    );
    assert!(!ctrl.admin.is_disconnected());
}

#[test]
fn removing_a_listener_fails_only_the_controllers_that_came_through_it() {
    let mut lab = lab_with_two_namespaces();
    let other = ListenAddress {
        trsvcid: "1".into(),
        ..loopback_address()
    };
    lab.target.add_listener(NQN, other.clone()).unwrap();
    lab.pg.poll();
    let mut stays = linux_bring_up_via(&mut lab, NQN, 1, &loopback_address());
    let goes = linux_bring_up_via(&mut lab, NQN, 1, &other);
    // A transport that does not name the listener: its controllers go too, to be safe.
    let unknown = linux_bring_up(&mut lab, NQN, 0);

    lab.target.remove_listener(NQN, &other).unwrap();
    for _ in 0..1000 {
        if goes.admin.is_disconnected()
            && goes.io[0].is_disconnected()
            && unknown.admin.is_disconnected()
        {
            break;
        }
        lab.pg.poll();
    }
    assert!(
        goes.admin.is_disconnected(),
        "admin queue of the removed listener"
    );
    assert!(
        goes.io[0].is_disconnected(),
        "I/O queue of the removed listener"
    );
    assert!(unknown.admin.is_disconnected(), "listener unknown");
    assert!(!stays.admin.is_disconnected());
    assert!(!stays.io[0].is_disconnected());

    // The host on the remaining listener is served on both queues.
    let cid = stays.cid();
    let r = stays.admin(
        &mut lab,
        reading(Command::identify(cid, Cns::CONTROLLER, 0, 0), 4096),
    );
    expect_ok(&r);
    let cid = stays.cid();
    let r = stays.io(&mut lab, 0, no_data(Command::flush(cid, 1)));
    expect_ok(&r);
}
