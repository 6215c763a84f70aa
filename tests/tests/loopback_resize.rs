//! A bdev resized under connected hosts (`bdev_null_resize`, `bdev_aio_rescan`): the hosts of
//! its namespaces get a Namespace Attribute Changed notice and read the new size from Identify
//! Namespace, the new blocks serve I/O at once, hosts of other namespaces hear nothing, and a
//! bdev in use grows but never shrinks under its hosts.

use nvmf_common::spec::command::Command;
use nvmf_common::spec::identify::{Cns, IdentifyNamespace};
use nvmf_common::spec::Status;
use nvmf_target::bdev::null::{rpc_bdev_null_resize, NullResizeParams};
use nvmf_tests::*;
use zerocopy::FromBytes;

const NQN: &str = "nqn.2016-06.io.spdk:resize";
const OTHER: &str = "nqn.2016-06.io.spdk:other";
const BLOCK: usize = 512;
/// 1 MiB of 512-byte blocks.
const MIB_BLOCKS: u64 = 2048;

fn nsze(lab: &mut LoopbackLab, ctrl: &mut HostController) -> u64 {
    let cid = ctrl.cid();
    let r = ctrl.admin(
        lab,
        reading(Command::identify(cid, Cns::NAMESPACE, 1, 0), 4096),
    );
    expect_ok(&r);
    let (id, _) = IdentifyNamespace::read_from_prefix(&r.host_buffer).unwrap();
    assert_eq!(id.ncap.get(), id.nsze.get());
    id.nsze.get()
}

fn read_at(lab: &mut LoopbackLab, ctrl: &mut HostController, slba: u64) -> Status {
    let cid = ctrl.cid();
    let r = ctrl.io(
        lab,
        0,
        with_buffer(Command::read(cid, 1, slba, 8), vec![0x5A; 8 * BLOCK]),
    );
    r.cqe.status()
}

fn resize(lab: &mut LoopbackLab, mib: u64) -> Result<(), nvmf_rpc::RpcError> {
    let params = NullResizeParams {
        name: "Null0".into(),
        new_size: mib,
    };
    rpc_bdev_null_resize(&mut lab.target.bdevs, params).map(|_| ())
}

#[test]
fn a_grown_bdev_is_announced_to_its_hosts_only_and_serves_its_new_blocks() {
    let mut lab = LoopbackLab::default();
    lab.null("Null0", MIB_BLOCKS, BLOCK as u32);
    lab.null("Null1", MIB_BLOCKS, BLOCK as u32);
    lab.subsystem(NQN, &["Null0"]);
    lab.subsystem(OTHER, &["Null1"]);
    lab.pg.poll();
    let mut a = linux_bring_up(&mut lab, NQN, 1);
    let mut b = linux_bring_up(&mut lab, OTHER, 1);
    for ctrl in [&mut a, &mut b] {
        enable_namespace_notices(&mut lab, ctrl);
    }
    let aer_a = submit_aer(&mut a);
    submit_aer(&mut b);
    assert_eq!(nsze(&mut lab, &mut a), MIB_BLOCKS);
    assert_eq!(
        read_at(&mut lab, &mut a, MIB_BLOCKS),
        Status::LBA_OUT_OF_RANGE.with_dnr()
    );

    resize(&mut lab, 2).unwrap();
    assert_eq!(lab.target.announce_resized_namespaces(), 1);
    lab.pg.poll();
    expect_namespace_notice(&mut lab, &mut a, aer_a, &[1]);
    assert_eq!(nsze(&mut lab, &mut a), 2 * MIB_BLOCKS);
    assert_eq!(read_at(&mut lab, &mut a, MIB_BLOCKS), Status::SUCCESS);
    assert!(
        lab.try_wait(&b.admin, 50).is_none(),
        "the other subsystem's host was told of a namespace it does not have"
    );
    // Told once: nothing moved since.
    assert_eq!(lab.target.announce_resized_namespaces(), 0);

    // In use, it does not shrink: the hosts keep the size they were told.
    let e = resize(&mut lab, 1).unwrap_err();
    assert_eq!(e.code, -libc::EBUSY, "{e:?}");
    assert_eq!(lab.target.announce_resized_namespaces(), 0);
    assert_eq!(nsze(&mut lab, &mut a), 2 * MIB_BLOCKS);
    assert_eq!(
        read_at(&mut lab, &mut a, 2 * MIB_BLOCKS - 8),
        Status::SUCCESS
    );
}
