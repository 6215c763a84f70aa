//! A bdev whose channel fails to open on a reactor (an AIO context or a ring refused there):
//! the hosts on that reactor get an answer for every I/O, and `nvmf_subsystem_add_ns` fails
//! and takes the namespace back out instead of leaving it broken on one reactor.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvmf_common::spec::command::Command;
use nvmf_common::spec::Status;
use nvmf_target::bdev::BdevRef;
use nvmf_target::core::TargetInfo;
use nvmf_target::reactor::{start_reactors, stop_reactors};
use nvmf_target::rpc::{self, Control};
use nvmf_target::target::{NamespaceOptions, Target};
use nvmf_target::transport::options::TransportOptions;
use nvmf_target::transport::TransportError;
use nvmf_tests::watched_bdev::WatchedMalloc;
use nvmf_tests::*;
use serde_json::{json, Value};

const NQN: &str = "nqn.2016-06.io.spdk:chan";

/// A RAM disk of which only `opens` channels open.
fn rationed(name: &str, opens: usize) -> Arc<WatchedMalloc> {
    Arc::new(WatchedMalloc::new(name, 64, 512, opens))
}

#[test]
fn io_on_a_reactor_without_a_channel_fails_as_not_ready() {
    let mut lab = LoopbackLab::default();
    let bdev: BdevRef = rationed("Rationed0", 0);
    lab.target.bdevs.register(bdev).unwrap();
    lab.malloc("Malloc0", 64, 512);
    lab.subsystem(NQN, &["Rationed0", "Malloc0"]);
    let mut ctrl = linux_bring_up(&mut lab, NQN, 1);
    let capsules: [fn(u16) -> Capsule; 3] = [
        |cid| with_buffer(Command::write(cid, 1, 0, 1), vec![0xAB; 512]),
        |cid| reading(Command::read(cid, 1, 0, 1), 512),
        |cid| no_data(Command::flush(cid, 1)),
    ];
    for capsule in capsules {
        let cid = ctrl.cid();
        let r = ctrl.io(&mut lab, 0, capsule(cid));
        assert_eq!(r.cqe.status(), Status::NAMESPACE_NOT_READY, "{:?}", r.cqe);
    }
    let cid = ctrl.cid();
    let mut read = reading(Command::read(cid, 1, 0, 1), 512);
    read.host_buffer.fill(0xEE);
    let r = ctrl.io(&mut lab, 0, read);
    assert_eq!(r.cqe.status(), Status::NAMESPACE_NOT_READY);
    assert!(
        r.host_buffer.iter().all(|&b| b == 0xEE),
        "a failed read sends no data"
    );
    // The namespace beside it is untouched.
    let cid = ctrl.cid();
    expect_ok(&ctrl.io(
        &mut lab,
        0,
        with_buffer(Command::write(cid, 2, 0, 1), vec![0xCD; 512]),
    ));
}

/// A target on two live reactors, driven through the RPC dispatcher.
fn control_on_two_reactors() -> (Control, Vec<nvmf_common::reactor::Reactor>) {
    let info = Arc::new(TargetInfo::default());
    let (reactors, handles) =
        start_reactors(&[0, 1], &info, nvmf_common::reactor::IdleMode::Adaptive).unwrap();
    let mut target = Target::new(info);
    for h in handles {
        target.add_poll_group(h);
    }
    let control = Control::new(
        target,
        Box::new(|o: &TransportOptions| Err(TransportError::UnsupportedType(o.trtype.clone()))),
    );
    (control, reactors)
}

fn call(c: &mut Control, method: &str, params: Value) -> Result<Value, nvmf_rpc::RpcError> {
    rpc::dispatch(c, method, Some(params))
}

/// Registers `disk` and creates the subsystem (no namespace yet).
fn with_subsystem(c: &mut Control, disk: BdevRef) {
    c.target.bdevs.register(disk).unwrap();
    let params = json!({"nqn": NQN, "allow_any_host": true});
    call(c, "nvmf_create_subsystem", params).unwrap();
}

fn namespaces(c: &mut Control) -> Vec<Value> {
    let subs = call(c, "nvmf_get_subsystems", json!({"nqn": NQN})).unwrap();
    subs[0]["namespaces"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[test]
fn add_ns_fails_and_takes_the_namespace_back_when_a_reactor_cannot_open_it() {
    let (mut c, reactors) = control_on_two_reactors();
    // One reactor gets its channel, the other is refused.
    let disk = rationed("Rationed0", 1);
    with_subsystem(&mut c, disk.clone());
    let add = json!({"nqn": NQN, "namespace": {"bdev_name": "Rationed0", "nsid": 1}});
    let e = call(&mut c, "nvmf_subsystem_add_ns", add.clone()).unwrap_err();
    assert_eq!(e.code, -libc::EAGAIN, "{e}");
    assert!(e.message.contains("cannot open its bdev channel"), "{e}");
    assert!(
        namespaces(&mut c).is_empty(),
        "the namespace was taken back"
    );

    // The claim ends once both reactors dropped the namespace; then, with channels to be
    // had again, the same call succeeds.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let bdevs = call(&mut c, "bdev_get_bdevs", json!({"name": "Rationed0"})).unwrap();
        if bdevs[0]["claimed"] == false {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the bdev stayed claimed: {bdevs}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    disk.watch.opens_left.store(2, Ordering::SeqCst);
    assert_eq!(call(&mut c, "nvmf_subsystem_add_ns", add).unwrap(), 1);
    assert_eq!(namespaces(&mut c).len(), 1);
    assert_eq!(disk.watch.opens_left.load(Ordering::SeqCst), 0);
    drop(c);
    stop_reactors(reactors);
}

#[test]
fn add_ns_through_the_target_alone_keeps_the_namespace_on_both_reactors_answering() {
    // Without the RPC's check (the API the test labs use), the namespace stays: the reactor
    // without a channel answers its hosts Namespace Not Ready (the first test), and says why.
    let (mut c, reactors) = control_on_two_reactors();
    with_subsystem(&mut c, rationed("Rationed0", 1));
    let opts = NamespaceOptions {
        bdev_name: "Rationed0".into(),
        ..Default::default()
    };
    let nsid = c.target.add_namespace(NQN, opts).unwrap();
    let id = c.target.subsystem(NQN).unwrap().id;
    let errors =
        rpc::stats::ask_groups(&c, move |pg| pg.core.namespace_open_error(id, nsid)).unwrap();
    let failed: Vec<_> = errors.iter().flatten().collect();
    assert_eq!(failed.len(), 1, "{errors:?}");
    assert_eq!(failed[0].0, libc::EAGAIN);
    drop(c);
    stop_reactors(reactors);
}
