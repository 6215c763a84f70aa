//! The target's RDMA device is removed under it (`rdma link delete`, a driver unbound) and
//! comes back. The kernel finishes a removal only once its users hold nothing on the device
//! (with soft-RoCE, `rdma link delete` blocks until then): the target must close the
//! connections on it, give up its CQs, SRQs, registrations, PDs and contexts, and listen
//! again when a device has the address once more.

use std::time::Duration;

use nvmf_target::core::subsystem::ListenAddress;
use nvmf_tests::sim::*;

const BLOCK: usize = 512;

/// Runs the lab until the target holds nothing on the removed device; panics with what it
/// still holds after 10 s of virtual time.
fn until_device_released(lab: &mut SimLab) {
    for _ in 0..200 {
        if lab.fabric.device_objects(target_ip()).total() == 0 {
            return;
        }
        lab.run_for(Duration::from_millis(50), Duration::from_millis(5));
    }
    panic!(
        "the target still holds the removed device: {:?}",
        lab.fabric.device_objects(target_ip())
    );
}

/// The RDMA devices each reactor holds resources on, as `nvmf_get_stats` lists them.
fn devices_per_reactor(lab: &SimLab) -> Vec<usize> {
    lab.pgs
        .iter()
        .map(|pg| {
            pg.transport_stats()[0]["devices"]
                .as_array()
                .map_or(0, Vec::len)
        })
        .collect()
}

/// Two reactors serve the host's queues. Both let go, from the CM events alone (the look at
/// the device list is off); the listener comes back with the device and a host reconnects
/// to the same data.
#[test]
fn a_removed_device_is_let_go_and_its_listener_comes_back() {
    let mut lab = SimLab::with(3, small_options(), 2);
    lab.transport.set_device_list_checks(false);
    let host = lab.fabric.add_host(host_ip(1));
    let (_admin, cntlid) = admin_queue(&mut lab, &host);
    let mut io = io_queue(&mut lab, &host, cntlid, 32, 64 * 1024);
    let data = pattern(5, 8 * BLOCK);
    io.data.write_at(0, &data);
    let c = io.run(&mut lab, write_cmd(1, 40, 8), keyed(0, 4096));
    assert!(c.status().is_success(), "{c:?}");
    // One more write in flight when the device goes.
    io.data.write_at(8192, &pattern(6, 8 * BLOCK));
    io.submit(write_cmd(2, 80, 8), keyed(8192, 4096));
    let held = lab.fabric.device_objects(target_ip());
    assert!(
        held.pds > 0 && held.cqs >= 2 && held.contexts > 0,
        "{held:?}"
    );

    lab.fabric.remove_device(target_ip());
    until_device_released(&mut lab);
    lab.assert_drained();
    assert_eq!(devices_per_reactor(&lab), [0, 0]);

    lab.fabric.restore_device(target_ip());
    // The listener tries again every 2 s.
    lab.run_for(Duration::from_secs(3), Duration::from_millis(10));
    let (_admin, cntlid) = admin_queue(&mut lab, &host);
    let mut io = io_queue(&mut lab, &host, cntlid, 32, 64 * 1024);
    let c = io.run(&mut lab, read_cmd(3, 40, 8), keyed(32 * 1024, 4096));
    assert!(c.status().is_success(), "{c:?}");
    assert_eq!(data_bytes(&io, 32 * 1024, 4096), data);
    assert!(lab.fabric.device_objects(target_ip()).total() > 0);
}

/// An RPC that removes the listener while its device is away stops the retries: the
/// address stays closed when the device comes back.
#[test]
fn a_listener_removed_while_its_device_is_away_stays_closed() {
    let mut lab = SimLab::new(4);
    let host = lab.fabric.add_host(host_ip(1));
    lab.fabric.remove_device(target_ip());
    until_device_released(&mut lab);
    lab.target
        .remove_listener(SUBNQN, &listen_address())
        .expect("the listener is still configured");
    lab.fabric.restore_device(target_ip());
    lab.run_for(Duration::from_secs(5), Duration::from_millis(10));
    assert!(
        HostQueue::connect(&mut lab, &host, 0, 32).is_err(),
        "a removed listener came back with its device"
    );
    assert_eq!(lab.fabric.device_objects(target_ip()).total(), 0);
}

/// A device no CM event reports gone: its listener was removed by RPC, so no id is bound to
/// it, while the reactors still hold what the listener had them build. The acceptor's look
/// at the device list finds it missing and lets it go all the same.
#[test]
fn a_device_no_cm_event_reports_is_let_go_too() {
    let mut lab = SimLab::with(5, small_options(), 2);
    // Listening again once the reactors run has them build the device's resources (the
    // lab's first listener came before they had the transport).
    lab.target
        .remove_listener(SUBNQN, &listen_address())
        .expect("the listener is configured");
    lab.target
        .add_listener(SUBNQN, listen_address())
        .expect("listening again");
    lab.turns(4);
    lab.target
        .remove_listener(SUBNQN, &listen_address())
        .expect("the listener is configured");
    lab.turns(4);
    let held = lab.fabric.device_objects(target_ip());
    assert!(held.pds >= 2 && held.cm_ids == 0, "{held:?}");
    lab.fabric.remove_device(target_ip());
    until_device_released(&mut lab);
}

/// Through a wildcard listener (no id of it is bound to the device, so it gets no event):
/// the reactor whose connection gets the removal tells the acceptor, which tells the other
/// reactor, holding the device with no connection left. From the CM events alone (the look
/// at the device list is off).
#[test]
fn a_reactor_that_sees_the_removal_tells_the_others() {
    let mut lab = SimLab::with(6, small_options(), 2);
    lab.transport.set_device_list_checks(false);
    lab.target
        .remove_listener(SUBNQN, &listen_address())
        .expect("the listener is configured");
    let wildcard = ListenAddress {
        traddr: "0.0.0.0".into(),
        ..listen_address()
    };
    lab.target
        .add_listener(SUBNQN, wildcard)
        .expect("wildcard listener");
    lab.turns(4);
    let host = lab.fabric.add_host(host_ip(1));
    let (_admin, cntlid) = admin_queue(&mut lab, &host);
    let io = io_queue(&mut lab, &host, cntlid, 32, 64 * 1024);
    let per_reactor = |lab: &mut SimLab| [lab.resources(0).qpairs, lab.resources(1).qpairs];
    assert_eq!(per_reactor(&mut lab), [1, 1], "one queue on each reactor");
    drop(io);
    for _ in 0..100 {
        if per_reactor(&mut lab).contains(&0) {
            break;
        }
        lab.run_for(Duration::from_millis(50), Duration::from_millis(5));
    }
    assert!(per_reactor(&mut lab).contains(&0), "the I/O queue is gone");
    assert_eq!(devices_per_reactor(&lab), [1, 1]);
    lab.fabric.remove_device(target_ip());
    until_device_released(&mut lab);
}
