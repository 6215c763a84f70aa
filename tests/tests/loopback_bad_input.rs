//! Every malformed or out-of-order command gets the spec's status (with DNR where the spec
//! says) and the controller keeps serving.

use nvmf_common::spec::command::Command;
use nvmf_common::spec::fabrics::{
    connect_offsets, parse_connect_invalid_param_dw0, PropertyGetCommand, PropertySetCommand,
};
use nvmf_common::spec::registers::Property;
use nvmf_common::spec::sgl::SglDescriptor;
use nvmf_common::spec::{Completion, Status};
use nvmf_target::target::SubsystemOptions;
use nvmf_tests::*;

const NQN: &str = "nqn.2016-06.io.spdk:cnode1";

fn lab() -> LoopbackLab {
    let mut lab = LoopbackLab::default();
    lab.malloc("Malloc0", 1024, 512);
    lab.subsystem(NQN, &["Malloc0"]);
    lab
}

fn assert_status(cqe: &Completion, status: Status) {
    assert_eq!(cqe.status(), status, "unexpected completion {cqe:?}");
}

/// The controller still reads and writes after whatever went before.
fn still_serves(lab: &mut LoopbackLab, ctrl: &mut HostController) {
    let cid = ctrl.cid();
    expect_ok(&ctrl.io(
        lab,
        0,
        with_buffer(Command::write(cid, 1, 0, 1), vec![0xAB; 512]),
    ));
    let cid = ctrl.cid();
    let r = ctrl.io(lab, 0, reading(Command::read(cid, 1, 0, 1), 512));
    assert_eq!(expect_ok(&r).cid.get(), cid);
    assert!(r.host_buffer.iter().all(|&b| b == 0xAB));
    let cid = ctrl.cid();
    expect_ok(&ctrl.admin(lab, no_data(Command::keep_alive(cid))));
}

#[test]
fn bad_io_commands_get_their_status_and_the_queue_keeps_serving() {
    let mut lab = lab();
    let mut ctrl = linux_bring_up(&mut lab, NQN, 1);
    let cases: Vec<(Capsule, Status)> = vec![
        // Unknown I/O opcode.
        (
            no_data(Command::new(0x7E, 1, 1)),
            Status::INVALID_OPCODE.with_dnr(),
        ),
        // Invalid NSID: none, inactive, broadcast.
        (
            reading(Command::read(2, 0, 0, 1), 512),
            Status::INVALID_NAMESPACE.with_dnr(),
        ),
        (
            reading(Command::read(3, 9, 0, 1), 512),
            Status::INVALID_NAMESPACE.with_dnr(),
        ),
        (
            no_data(Command::flush(4, 0xFFFF_FFFF)),
            Status::INVALID_NAMESPACE.with_dnr(),
        ),
        // LBA range past the end, including one that wraps around u64.
        (
            reading(Command::read(5, 1, 1024, 1), 512),
            Status::LBA_OUT_OF_RANGE.with_dnr(),
        ),
        (
            reading(Command::read(6, 1, 1020, 8), 4096),
            Status::LBA_OUT_OF_RANGE.with_dnr(),
        ),
        (
            reading(Command::read(7, 1, u64::MAX, 2), 1024),
            Status::LBA_OUT_OF_RANGE.with_dnr(),
        ),
        (
            no_data(Command::write_zeroes(8, 1, 1000, 100, false)),
            Status::LBA_OUT_OF_RANGE.with_dnr(),
        ),
        // Transfer above MDTS (128 KiB): 512 blocks of 512 bytes is 256 KiB.
        (
            reading(Command::read(9, 1, 0, 512), 512 * 512),
            Status::INVALID_FIELD.with_dnr(),
        ),
        // An SGL shorter than NLB x block size is refused; a longer one moves just the
        // transfer (Identify SGLS bit 18, as Linux's discards need).
        (
            reading(Command::read(10, 1, 0, 2), 512),
            Status::DATA_SGL_LENGTH_INVALID.with_dnr(),
        ),
        (
            with_buffer(Command::write(11, 1, 0, 1), vec![0; 1024]),
            Status::SUCCESS,
        ),
    ];
    for (capsule, status) in cases {
        let cid = capsule.cmd.cid.get();
        let r = lab.run(&ctrl.io[0], capsule);
        assert_eq!(r.cqe.cid.get(), cid);
        assert_status(&r.cqe, status);
    }
    // A PRP data pointer is meaningless on a fabric; an unsupported SGL type too.
    let mut prp = Command::read(12, 1, 0, 1);
    prp.flags = 0;
    let r = lab.run(
        &ctrl.io[0],
        Capsule {
            cmd: prp,
            host_buffer: vec![0; 512],
        },
    );
    assert_status(&r.cqe, Status::INVALID_FIELD.with_dnr());
    let mut bit_bucket = Command::read(13, 1, 0, 1);
    bit_bucket.set_sgl(SglDescriptor::data_block(0, 512));
    let r = lab.run(
        &ctrl.io[0],
        Capsule {
            cmd: bit_bucket,
            host_buffer: vec![0; 512],
        },
    );
    assert_status(&r.cqe, Status::SGL_DESCRIPTOR_TYPE_INVALID.with_dnr());
    still_serves(&mut lab, &mut ctrl);
}

#[test]
fn bad_admin_commands_and_properties() {
    let mut lab = lab();
    let mut ctrl = linux_bring_up(&mut lab, NQN, 1);
    // Unknown admin opcode, and ones that do not exist over fabrics.
    for opcode in [0x7Du8, 0x01, 0x05, 0x80] {
        let cid = ctrl.cid();
        let r = ctrl.admin(&mut lab, no_data(Command::new(opcode, cid, 0)));
        assert_status(&r.cqe, Status::INVALID_OPCODE.with_dnr());
    }
    // Property Set of read-only registers, and of one that does not exist.
    for (offset, size8) in [
        (Property::CAP.0, true),
        (Property::VS.0, false),
        (Property::CSTS.0, false),
        (0x40, false),
    ] {
        let r = lab.run(
            &ctrl.admin,
            no_data(PropertySetCommand::new(7, offset, 0xFF, size8).to_command()),
        );
        assert_status(&r.cqe, Status::INVALID_FIELD.with_dnr());
    }
    // Property Get with the wrong size, and on an I/O queue.
    let r = lab.run(
        &ctrl.admin,
        no_data(PropertyGetCommand::new(8, Property::CAP.0, false).to_command()),
    );
    assert_status(&r.cqe, Status::INVALID_FIELD.with_dnr());
    let r = lab.run(
        &ctrl.io[0],
        no_data(PropertyGetCommand::new(9, Property::CSTS.0, false).to_command()),
    );
    assert_status(&r.cqe, Status::INVALID_QUEUE_TYPE.with_dnr());
    // Abort is answered ("not aborted"), Identify with an unknown CNS is an invalid field.
    let cid = ctrl.cid();
    let r = ctrl.admin(&mut lab, no_data(Command::abort(cid, 1, 5)));
    assert_eq!(expect_ok(&r).dw0.get() & 1, 1);
    let cid = ctrl.cid();
    let r = ctrl.admin(
        &mut lab,
        reading(
            Command::identify(cid, nvmf_common::spec::identify::Cns(0x55), 0, 0),
            4096,
        ),
    );
    assert_status(&r.cqe, Status::INVALID_FIELD.with_dnr());
    // A second Connect on a connected queue.
    let r = lab.run(
        &ctrl.admin,
        connect_capsule(10, 0, 31, 0, 0xFFFF, NQN, HOSTNQN),
    );
    assert_status(&r.cqe, Status::COMMAND_SEQUENCE_ERROR.with_dnr());
    still_serves(&mut lab, &mut ctrl);
}

fn connect_fails(lab: &mut LoopbackLab, capsule: Capsule) -> Completion {
    let q = lab.open_queue();
    lab.run(&q, capsule).cqe
}

fn assert_invalid_param(cqe: &Completion, in_data: bool, offset: u16) {
    assert_status(cqe, Status::CONNECT_INVALID_PARAMETERS.with_dnr());
    assert_eq!(
        parse_connect_invalid_param_dw0(cqe.dw0.get()),
        (in_data, offset)
    );
}

#[test]
fn bad_connects_name_the_offending_field() {
    let mut lab = lab();
    lab.target
        .create_subsystem("nqn.2016-06.io.spdk:closed", SubsystemOptions::default())
        .unwrap();
    lab.pg.poll();
    let mut ctrl = linux_bring_up(&mut lab, NQN, 1);
    use connect_offsets as off;

    let cqe = connect_fails(
        &mut lab,
        connect_capsule(1, 0, 31, 0, 0xFFFF, "nqn.2016-06.io.spdk:nope", HOSTNQN),
    );
    assert_invalid_param(&cqe, true, off::DATA_SUBNQN);
    let cqe = connect_fails(
        &mut lab,
        connect_capsule(1, 0, 31, 0, 0xFFFF, "nqn.2016-06.io.spdk:closed", HOSTNQN),
    );
    assert_status(&cqe, Status::CONNECT_INVALID_HOST.with_dnr());
    // Admin queue: sqsize 0, deeper than the admin queue limit, a static cntlid.
    let cqe = connect_fails(&mut lab, connect_capsule(1, 0, 0, 0, 0xFFFF, NQN, HOSTNQN));
    assert_invalid_param(&cqe, false, off::SQE_SQSIZE);
    let cqe = connect_fails(
        &mut lab,
        connect_capsule(1, 0, 128, 0, 0xFFFF, NQN, HOSTNQN),
    );
    assert_invalid_param(&cqe, false, off::SQE_SQSIZE);
    let cqe = connect_fails(&mut lab, connect_capsule(1, 0, 31, 0, 3, NQN, HOSTNQN));
    assert_invalid_param(&cqe, true, off::DATA_CNTLID);
    // I/O queues: unknown cntlid, qid beyond what Set Features granted (Invalid Queue
    // Identifier, as SPDK and nvmet), sqsize 0 or above MQES, a duplicate qid, another
    // host's controller.
    let cntlid = ctrl.cntlid;
    let cqe = connect_fails(
        &mut lab,
        connect_capsule(1, 2, 31, 0, cntlid + 100, NQN, HOSTNQN),
    );
    assert_invalid_param(&cqe, true, off::DATA_CNTLID);
    let cqe = connect_fails(&mut lab, connect_capsule(1, 2, 31, 0, cntlid, NQN, HOSTNQN));
    assert_status(&cqe, Status::INVALID_QUEUE_IDENTIFIER.with_dnr());
    assert_eq!(
        parse_connect_invalid_param_dw0(cqe.dw0.get()),
        (false, off::SQE_QID)
    );
    let cqe = connect_fails(&mut lab, connect_capsule(1, 1, 0, 0, cntlid, NQN, HOSTNQN));
    assert_invalid_param(&cqe, false, off::SQE_SQSIZE);
    let cqe = connect_fails(
        &mut lab,
        connect_capsule(1, 1, 128, 0, cntlid, NQN, HOSTNQN),
    );
    assert_invalid_param(&cqe, false, off::SQE_SQSIZE);
    let cqe = connect_fails(&mut lab, connect_capsule(1, 1, 31, 0, cntlid, NQN, HOSTNQN));
    assert_invalid_param(&cqe, false, off::SQE_QID);
    let other = "nqn.2014-08.org.nvmexpress:uuid:99999999-2222-3333-4444-555555555555";
    let cqe = connect_fails(&mut lab, connect_capsule(1, 1, 31, 0, cntlid, NQN, other));
    assert_invalid_param(&cqe, true, off::DATA_HOSTNQN);
    // Connect data shorter than 1024 bytes.
    let mut short = connect_capsule(1, 0, 31, 0, 0xFFFF, NQN, HOSTNQN);
    short.host_buffer.truncate(512);
    short.cmd.dptr = SglDescriptor::keyed(0, 512, 1, false);
    let cqe = connect_fails(&mut lab, short);
    assert_status(&cqe, Status::DATA_SGL_LENGTH_INVALID.with_dnr());
    still_serves(&mut lab, &mut ctrl);
}

#[test]
fn nothing_runs_before_connect_or_before_enable() {
    let mut lab = lab();
    let q = lab.open_queue();
    for capsule in [
        reading(Command::read(1, 1, 0, 1), 512),
        reading(
            Command::identify(2, nvmf_common::spec::identify::Cns::CONTROLLER, 0, 0),
            4096,
        ),
        no_data(PropertyGetCommand::new(3, Property::CAP.0, true).to_command()),
    ] {
        let r = lab.run(&q, capsule);
        assert_status(&r.cqe, Status::COMMAND_SEQUENCE_ERROR.with_dnr());
    }
    // Connected but CC.EN = 0: admin commands and I/O queue connects are out of sequence.
    let r = lab.run(&q, connect_capsule(4, 0, 31, 0, 0xFFFF, NQN, HOSTNQN));
    let cntlid = expect_ok(&r).dw0.get() as u16;
    let r = lab.run(
        &q,
        reading(
            Command::identify(5, nvmf_common::spec::identify::Cns::CONTROLLER, 0, 0),
            4096,
        ),
    );
    assert_status(&r.cqe, Status::COMMAND_SEQUENCE_ERROR.with_dnr());
    let io = lab.open_queue();
    let r = lab.run(&io, connect_capsule(6, 1, 31, 0, cntlid, NQN, HOSTNQN));
    assert_status(&r.cqe, Status::COMMAND_SEQUENCE_ERROR.with_dnr());
    // The same queue still brings the controller up afterwards.
    let r = lab.run(
        &q,
        no_data(PropertySetCommand::new(7, Property::CC.0, 0x0046_0001, false).to_command()),
    );
    expect_ok(&r);
    let r = lab.run(
        &q,
        reading(
            Command::identify(8, nvmf_common::spec::identify::Cns::CONTROLLER, 0, 0),
            4096,
        ),
    );
    expect_ok(&r);
}
