//! Method-table tests: every method with good and bad params, state unchanged after errors,
//! saved-config round trips, stats through real poll groups.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nvmf_common::spec::command::Command;
use nvmf_common::spec::fabrics::{ConnectCommand, ConnectData, CNTLID_DYNAMIC};
use nvmf_common::spec::sgl::SglDescriptor;
use nvmf_common::spec::Status;
use nvmf_rpc::RpcError;
use serde_json::{json, Value};
use zerocopy::IntoBytes;

use super::*;
use crate::core::subsystem::ListenAddress;
use crate::core::{PollGroup, TargetInfo};
use crate::transport::loopback::{Capsule, LoopbackHostQueue, LoopbackTransport, LOOPBACK_LIMITS};
use crate::transport::options::TransportKind;
use crate::transport::{Transport, TransportError, TransportLimits};

const NQN1: &str = "nqn.2016-06.io.spdk:cnode1";
const NQN2: &str = "nqn.2016-06.io.spdk:cnode2";
const HOST1: &str = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555";
const HOST2: &str = "nqn.2014-08.org.nvmexpress:uuid:66666666-2222-3333-4444-555555555555";

/// The listen address [`TestTransport`] refuses.
const REFUSED_TRADDR: &str = "192.0.2.1";

/// A transport for control-plane tests: loopback underneath, reporting the options it was
/// created with under the requested trtype.
struct TestTransport {
    inner: LoopbackTransport,
    kind: TransportKind,
    opts: TransportOptions,
}

impl Transport for TestTransport {
    fn trtype(&self) -> &'static str {
        self.kind.name()
    }
    fn limits(&self) -> TransportLimits {
        self.inner.limits()
    }
    /// Refuses 192.0.2.1 (TEST-NET-1) as an RDMA device with no such address would.
    fn listen(&self, addr: &ListenAddress) -> Result<(), TransportError> {
        if addr.traddr != REFUSED_TRADDR {
            return Ok(());
        }
        Err(TransportError::Rdma {
            what: format!("rdma_bind_addr({}:{})", addr.traddr, addr.trsvcid),
            source: nvmf_common::rdma::RdmaError::BindAddr(std::io::Error::from_raw_os_error(
                libc::EADDRNOTAVAIL,
            )),
        })
    }
    fn stop_listen(&self, _: &ListenAddress) {}
    fn options(&self) -> Value {
        self.opts.to_value()
    }
    fn create_poll_group(
        &self,
        index: u8,
        group: &crate::core::PollGroupHandle,
    ) -> Result<Box<dyn crate::transport::TransportPollGroup>, TransportError> {
        self.inner.create_poll_group(index, group)
    }
}

fn factory() -> TransportFactory {
    Box::new(|opts: &TransportOptions| {
        let kind = opts.kind().map_err(TransportError::invalid_option)?;
        if opts.num_shared_buffers == 1234 {
            return Err(TransportError::InvalidOption {
                name: "num_shared_buffers".into(),
                reason: "1234 refused by the test transport".into(),
            });
        }
        if opts.num_shared_buffers == 4321 {
            return Err(TransportError::Rdma {
                what: "cannot open an RDMA CM event channel".into(),
                source: nvmf_common::rdma::RdmaError::CreateEventChannel(
                    std::io::Error::from_raw_os_error(libc::ENODEV),
                ),
            });
        }
        Ok(Arc::new(TestTransport {
            inner: LoopbackTransport::new(opts.limits()),
            kind,
            opts: opts.clone(),
        }) as Arc<dyn Transport>)
    })
}

pub(super) fn control() -> Control {
    Control::new(Target::new(Arc::new(TargetInfo::default())), factory())
}

fn call(c: &mut Control, method: &str, params: Value) -> Result<Value, RpcError> {
    let params = if params.is_null() { None } else { Some(params) };
    dispatch(c, method, params)
}

#[track_caller]
pub(super) fn ok(c: &mut Control, method: &str, params: Value) -> Value {
    match call(c, method, params.clone()) {
        Ok(v) => v,
        Err(e) => panic!("{method} {params}: {e}"),
    }
}

/// Everything the RPCs can see.
pub(super) fn snapshot(c: &mut Control) -> Value {
    json!({
        "bdev": ok(c, "framework_get_config", json!({"name": "bdev"})),
        "nvmf": ok(c, "framework_get_config", json!({"name": "nvmf"})),
        "subsystems": ok(c, "nvmf_get_subsystems", Value::Null),
        "bdevs": ok(c, "bdev_get_bdevs", Value::Null),
        "transports": ok(c, "nvmf_get_transports", Value::Null),
    })
}

/// Calls a method that must fail with `code` (and mention `needle`), leaving state unchanged.
#[track_caller]
fn refused(c: &mut Control, method: &str, params: Value, code: i32, needle: &str) {
    let before = snapshot(c);
    let err = call(c, method, params.clone()).expect_err(&format!("{method} {params} should fail"));
    assert_eq!(err.code, code, "{method} {params}: {err}");
    assert!(
        err.message.contains(needle),
        "{method} {params}: message {:?} should mention {needle:?}",
        err.message
    );
    assert_eq!(
        snapshot(c),
        before,
        "{method} {params} changed state although it failed"
    );
}

const EINVAL: i32 = -libc::EINVAL;
const EEXIST: i32 = -libc::EEXIST;
const ENOENT: i32 = -libc::ENOENT;
const ENODEV: i32 = -libc::ENODEV;
const EBUSY: i32 = -libc::EBUSY;
const PARAMS: i32 = RpcError::INVALID_PARAMS;

/// Bdevs (two base, two stacked), a transport, two subsystems, a discovery listener.
fn populate(c: &mut Control) {
    ok(
        c,
        "bdev_malloc_create",
        json!({"name": "Malloc0", "num_blocks": 256, "block_size": 512}),
    );
    ok(
        c,
        "bdev_malloc_create",
        json!({"name": "Malloc1", "num_blocks": 128, "block_size": 4096}),
    );
    ok(
        c,
        "bdev_null_create",
        json!({"name": "Null0", "num_blocks": 1024, "block_size": 512}),
    );
    ok(c, "bdev_error_create", json!({"base_name": "Malloc1"}));
    ok(
        c,
        "bdev_delay_create",
        json!({"base_bdev_name": "Null0", "name": "Delay0", "avg_read_latency": 10, "p99_read_latency": 20,
               "avg_write_latency": 30, "p99_write_latency": 40}),
    );
    ok(
        c,
        "nvmf_create_transport",
        json!({"trtype": "LOOPBACK", "max_queue_depth": 64}),
    );
    ok(
        c,
        "nvmf_create_transport",
        json!({"trtype": "RDMA", "io_unit_size": 16384}),
    );
    ok(
        c,
        "nvmf_create_subsystem",
        json!({"nqn": NQN1, "serial_number": "SPDK001", "model_number": "Model 1", "max_namespaces": 8}),
    );
    ok(
        c,
        "nvmf_create_subsystem",
        json!({"nqn": NQN2, "allow_any_host": true, "min_cntlid": 5, "max_cntlid": 100}),
    );
    ok(
        c,
        "nvmf_subsystem_add_listener",
        json!({"nqn": NQN1, "listen_address": {"trtype": "rdma", "adrfam": "ipv4", "traddr": "10.0.0.1", "trsvcid": "4420"}}),
    );
    ok(
        c,
        "nvmf_subsystem_add_listener",
        json!({"nqn": NQN2, "listen_address": {"trtype": "loopback", "traddr": "local"}}),
    );
    ok(
        c,
        "nvmf_subsystem_add_listener",
        json!({"nqn": DISCOVERY_NQN_STR, "listen_address": {"trtype": "RDMA", "traddr": "10.0.0.1", "trsvcid": "8009"}}),
    );
    ok(
        c,
        "nvmf_subsystem_add_host",
        json!({"nqn": NQN1, "host": HOST1}),
    );
    ok(
        c,
        "nvmf_subsystem_add_host",
        json!({"nqn": NQN1, "host": HOST2}),
    );
    let nsid = ok(
        c,
        "nvmf_subsystem_add_ns",
        json!({"nqn": NQN1, "namespace": {"bdev_name": "Malloc0", "nsid": 3,
               "nguid": "000102030405060708090A0B0C0D0E0F", "eui64": "0011223344556677",
               "uuid": "12345678-1234-4234-8234-123456789abc"}}),
    );
    assert_eq!(nsid, json!(3));
    assert_eq!(
        ok(
            c,
            "nvmf_subsystem_add_ns",
            json!({"nqn": NQN1, "namespace": {"bdev_name": "EE_Malloc1"}})
        ),
        json!(1)
    );
    assert_eq!(
        ok(
            c,
            "nvmf_subsystem_add_ns",
            json!({"nqn": NQN2, "namespace": {"bdev_name": "Delay0"}})
        ),
        json!(1)
    );
}

const DISCOVERY_NQN_STR: &str = "nqn.2014-08.org.nvmexpress.discovery";

#[test]
fn unknown_methods_states_and_framework_methods() {
    let mut c = control();
    let e = call(&mut c, "no_such_method", Value::Null).unwrap_err();
    assert_eq!(e.code, RpcError::METHOD_NOT_FOUND);
    assert!(e.message.contains("no_such_method"));

    let v = ok(&mut c, "spdk_get_version", Value::Null);
    assert!(v["version"]
        .as_str()
        .unwrap()
        .contains(env!("CARGO_PKG_VERSION")));
    assert!(v["fields"]["major"].is_u64() && v["fields"]["suffix"].is_string());
    refused(&mut c, "spdk_get_version", json!({"x": 1}), PARAMS, "x");

    let subs = ok(&mut c, "framework_get_subsystems", Value::Null);
    assert_eq!(
        subs,
        json!([{"subsystem": "bdev", "depends_on": []}, {"subsystem": "nvmf", "depends_on": ["bdev"]}])
    );
    refused(
        &mut c,
        "framework_get_config",
        json!({"name": "iscsi"}),
        PARAMS,
        "iscsi",
    );
    refused(&mut c, "framework_get_config", Value::Null, PARAMS, "name");

    // Running: framework_start_init is a startup-only method.
    refused(
        &mut c,
        "framework_start_init",
        Value::Null,
        INVALID_STATE,
        "before framework is initialized",
    );
    assert_eq!(ok(&mut c, "framework_wait_init", Value::Null), json!(true));

    let all = ok(&mut c, "rpc_get_methods", Value::Null);
    let all: Vec<String> = serde_json::from_value(all).unwrap();
    assert_eq!(all.len(), METHODS.len());
    for name in [
        "nvmf_create_subsystem",
        "bdev_get_bdevs",
        "framework_start_init",
        "nvmf_get_stats",
    ] {
        assert!(all.iter().any(|m| m == name), "{name} missing");
    }
    let current: Vec<String> =
        serde_json::from_value(ok(&mut c, "rpc_get_methods", json!({"current": true}))).unwrap();
    assert!(!current.iter().any(|m| m == "framework_start_init"));
    refused(
        &mut c,
        "rpc_get_methods",
        json!({"current": "yes"}),
        PARAMS,
        "current",
    );
}

#[test]
fn wait_for_rpc_state_gates_runtime_methods() {
    let mut c = control();
    c.init_state = InitState::WaitingForRpc;
    let hook_ran = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&hook_ran);
    c.on_start_init = Some(Box::new(move |_t: &mut Target| {
        flag.store(true, Ordering::SeqCst);
        Ok(())
    }));
    let e = call(
        &mut c,
        "bdev_malloc_create",
        json!({"num_blocks": 8, "block_size": 512}),
    )
    .unwrap_err();
    assert_eq!(e.code, INVALID_STATE);
    assert!(e.message.contains("framework_start_init"));
    assert_eq!(
        call(&mut c, "framework_wait_init", Value::Null)
            .unwrap_err()
            .code,
        INVALID_STATE
    );
    // Settings run before init.
    ok(
        &mut c,
        "nvmf_set_max_subsystems",
        json!({"max_subsystems": 16}),
    );
    let current: Vec<String> =
        serde_json::from_value(ok(&mut c, "rpc_get_methods", json!({"current": true}))).unwrap();
    assert!(current.iter().any(|m| m == "framework_start_init"));
    assert!(!current.iter().any(|m| m == "bdev_malloc_create"));
    assert_eq!(ok(&mut c, "framework_start_init", Value::Null), json!(true));
    assert!(hook_ran.load(Ordering::SeqCst));
    assert_eq!(c.init_state, InitState::Running);
    ok(
        &mut c,
        "bdev_malloc_create",
        json!({"num_blocks": 8, "block_size": 512}),
    );
    assert_eq!(c.max_subsystems, 16);
}

#[test]
fn start_init_hook_failure_keeps_waiting() {
    let mut c = control();
    c.init_state = InitState::WaitingForRpc;
    c.on_start_init = Some(Box::new(|_t: &mut Target| Err("no RDMA device".into())));
    let e = call(&mut c, "framework_start_init", Value::Null).unwrap_err();
    assert_eq!(e.code, RpcError::INTERNAL_ERROR);
    assert!(e.message.contains("no RDMA device"));
    assert_eq!(c.init_state, InitState::WaitingForRpc);
}

#[test]
fn transports_create_get_and_refusals() {
    let mut c = control();
    refused(&mut c, "nvmf_create_transport", json!({}), PARAMS, "trtype");
    refused(
        &mut c,
        "nvmf_create_transport",
        json!({"trtype": "RDMA", "max_queue_deep": 4}),
        PARAMS,
        "max_queue_deep",
    );
    refused(
        &mut c,
        "nvmf_create_transport",
        json!({"trtype": "RDMA", "max_queue_depth": "x"}),
        PARAMS,
        "max_queue_depth",
    );
    refused(
        &mut c,
        "nvmf_create_transport",
        json!({"trtype": 5}),
        PARAMS,
        "trtype",
    );
    refused(
        &mut c,
        "nvmf_create_transport",
        json!(["RDMA"]),
        PARAMS,
        "object",
    );
    refused(
        &mut c,
        "nvmf_create_transport",
        json!({"trtype": "RDMA", "zcopy": true}),
        EINVAL,
        "zcopy",
    );
    refused(
        &mut c,
        "nvmf_create_transport",
        json!({"trtype": "RDMA", "dif_insert_or_strip": true}),
        EINVAL,
        "dif_insert_or_strip",
    );
    refused(
        &mut c,
        "nvmf_create_transport",
        json!({"trtype": "RDMA", "in_capsule_data_size": 4097}),
        EINVAL,
        "in_capsule_data_size",
    );
    refused(
        &mut c,
        "nvmf_create_transport",
        json!({"trtype": "PCIE"}),
        EINVAL,
        "PCIE",
    );
    refused(
        &mut c,
        "nvmf_create_transport",
        json!({"trtype": "RDMA", "tgt_name": "other"}),
        RpcError::INTERNAL_ERROR,
        "other",
    );
    refused(
        &mut c,
        "nvmf_create_transport",
        json!({"trtype": "RDMA", "num_shared_buffers": 1234}),
        RpcError::INTERNAL_ERROR,
        "refused by the test transport",
    );
    // A failed RDMA call points to the doctor.
    refused(
        &mut c,
        "nvmf_create_transport",
        json!({"trtype": "RDMA", "num_shared_buffers": 4321}),
        RpcError::INTERNAL_ERROR,
        "Transport type 'RDMA' create failed: cannot open an RDMA CM event channel: \
         rdma_create_event_channel failed: No such device (os error 19); run `nvmf-doctor` to \
         diagnose",
    );
    // rpc.py's defaults (no_srq, c2h_success) are accepted.
    assert_eq!(
        ok(
            &mut c,
            "nvmf_create_transport",
            json!({"trtype": "rdma", "no_srq": false, "c2h_success": true, "max_queue_depth": 64, "io_unit_size": 16384, "tgt_name": "nvmf_tgt"})
        ),
        json!(true)
    );
    refused(
        &mut c,
        "nvmf_create_transport",
        json!({"trtype": "RDMA"}),
        EEXIST,
        "already exists",
    );
    let t = c.target.transport("RDMA").unwrap();
    assert_eq!(t.limits().max_queue_depth, 64);
    assert_eq!(t.limits().trtype, 1);
    assert_eq!(t.limits().max_qpairs_per_ctrl, 128);

    let all = ok(&mut c, "nvmf_get_transports", Value::Null);
    assert_eq!(all.as_array().unwrap().len(), 1);
    assert_eq!(all[0]["trtype"], "RDMA");
    assert_eq!(all[0]["max_queue_depth"], 64);
    assert_eq!(all[0]["io_unit_size"], 16384);
    assert_eq!(all[0]["max_io_qpairs_per_ctrlr"], 127);
    assert_eq!(
        ok(&mut c, "nvmf_get_transports", json!({"trtype": "rdma"})),
        all
    );
    refused(
        &mut c,
        "nvmf_get_transports",
        json!({"trtype": "TCP"}),
        ENODEV,
        "TCP",
    );
    refused(
        &mut c,
        "nvmf_get_transports",
        json!({"tgt_name": "x"}),
        RpcError::INTERNAL_ERROR,
        "x",
    );
}

#[test]
fn subsystems_create_get_delete_and_refusals() {
    let mut c = control();
    ok(&mut c, "nvmf_create_subsystem", json!({"nqn": NQN1}));
    let subs = ok(&mut c, "nvmf_get_subsystems", Value::Null);
    let subs = subs.as_array().unwrap();
    assert_eq!(subs.len(), 2);
    assert_eq!(subs[0]["nqn"], DISCOVERY_NQN_STR);
    assert_eq!(subs[0]["subtype"], "Discovery");
    assert_eq!(subs[0]["allow_any_host"], true);
    assert!(subs[0].get("namespaces").is_none());
    let s = &subs[1];
    assert_eq!(s["nqn"], NQN1);
    assert_eq!(s["subtype"], "NVMe");
    assert_eq!(s["serial_number"], "00000000000000000000");
    assert_eq!(s["model_number"], "SPDK bdev Controller");
    assert_eq!(s["allow_any_host"], false);
    assert_eq!(s["min_cntlid"], 1);
    assert_eq!(s["max_cntlid"], 0xFFEF);
    assert_eq!(s["listen_addresses"], json!([]));
    assert_eq!(s["hosts"], json!([]));
    assert_eq!(s["namespaces"], json!([]));
    // SPDK lists max_namespaces always (its tools read it); 0: no limit.
    assert_eq!(s["max_namespaces"], 0);

    refused(&mut c, "nvmf_create_subsystem", json!({}), PARAMS, "nqn");
    refused(
        &mut c,
        "nvmf_create_subsystem",
        json!({"nqn": 7}),
        PARAMS,
        "nqn",
    );
    refused(
        &mut c,
        "nvmf_create_subsystem",
        json!({"nqn": NQN2, "allow_any_host": "yes"}),
        PARAMS,
        "allow_any_host",
    );
    refused(
        &mut c,
        "nvmf_create_subsystem",
        json!({"nqn": NQN2, "max_namespaces": -1}),
        PARAMS,
        "max_namespaces",
    );
    refused(
        &mut c,
        "nvmf_create_subsystem",
        json!({"nqn": NQN2, "colour": "red"}),
        PARAMS,
        "colour",
    );
    refused(
        &mut c,
        "nvmf_create_subsystem",
        json!({"nqn": NQN1}),
        EEXIST,
        NQN1,
    );
    refused(
        &mut c,
        "nvmf_create_subsystem",
        json!({"nqn": "not an nqn"}),
        EINVAL,
        "not an nqn",
    );
    refused(
        &mut c,
        "nvmf_create_subsystem",
        json!({"nqn": NQN2, "serial_number": "x".repeat(21)}),
        EINVAL,
        "serial_number",
    );
    refused(
        &mut c,
        "nvmf_create_subsystem",
        json!({"nqn": NQN2, "min_cntlid": 0}),
        EINVAL,
        "cntlid",
    );
    refused(
        &mut c,
        "nvmf_create_subsystem",
        json!({"nqn": NQN2, "passthrough": true}),
        EINVAL,
        "passthrough",
    );
    refused(
        &mut c,
        "nvmf_create_subsystem",
        json!({"nqn": NQN2, "max_discard_size_kib": 64}),
        EINVAL,
        "max_discard_size_kib",
    );
    refused(
        &mut c,
        "nvmf_create_subsystem",
        json!({"nqn": NQN2, "tgt_name": "t2"}),
        RpcError::INTERNAL_ERROR,
        "t2",
    );

    assert_eq!(
        ok(&mut c, "nvmf_get_subsystems", json!({"nqn": NQN1}))[0]["nqn"],
        NQN1
    );
    refused(
        &mut c,
        "nvmf_get_subsystems",
        json!({"nqn": NQN2}),
        ENODEV,
        NQN2,
    );

    // max_subsystems counts the discovery subsystem, as SPDK's does.
    ok(
        &mut c,
        "nvmf_set_max_subsystems",
        json!({"max_subsystems": 2}),
    );
    refused(
        &mut c,
        "nvmf_create_subsystem",
        json!({"nqn": NQN2}),
        -libc::ENOSPC,
        "max_subsystems",
    );
    refused(
        &mut c,
        "nvmf_set_max_subsystems",
        json!({"max_subsystems": 1}),
        EINVAL,
        "max_subsystems",
    );
    ok(
        &mut c,
        "nvmf_set_max_subsystems",
        json!({"max_subsystems": 3}),
    );
    ok(&mut c, "nvmf_create_subsystem", json!({"nqn": NQN2}));

    refused(&mut c, "nvmf_delete_subsystem", json!({}), PARAMS, "nqn");
    refused(
        &mut c,
        "nvmf_delete_subsystem",
        json!({"nqn": "nqn.2016-06.io.spdk:none"}),
        ENOENT,
        "none",
    );
    refused(
        &mut c,
        "nvmf_delete_subsystem",
        json!({"nqn": DISCOVERY_NQN_STR}),
        EINVAL,
        "discovery",
    );
    ok(&mut c, "nvmf_delete_subsystem", json!({"nqn": NQN2}));
    assert_eq!(
        ok(&mut c, "nvmf_get_subsystems", Value::Null)
            .as_array()
            .unwrap()
            .len(),
        2
    );
}

/// rpc.py of SPDK 25.x sends `max_discard_size_kib` and `max_write_zeroes_size_kib` 0 on every
/// call and SPDK 26.01 saves them, SPDK 26.05+ saves `dmrsl`/`wzsl` 0: no limit, accepted. A limit is refused by
/// the name it was given, since none is reported to hosts or enforced.
#[test]
fn subsystem_size_limits_accept_no_limit_and_refuse_a_limit_by_name() {
    let mut c = control();
    for (i, zeros) in [
        json!({"max_discard_size_kib": 0, "max_write_zeroes_size_kib": 0}),
        json!({"dmrsl": 0, "wzsl": 0}),
    ]
    .into_iter()
    .enumerate()
    {
        let nqn = format!("nqn.2016-06.io.spdk:limits{i}");
        let mut params = zeros.clone();
        params["nqn"] = json!(nqn);
        ok(&mut c, "nvmf_create_subsystem", params);
        assert_eq!(
            ok(&mut c, "nvmf_get_subsystems", json!({"nqn": nqn}))[0]["nqn"],
            nqn.as_str()
        );
    }
    for (field, value) in [
        ("max_discard_size_kib", 64),
        ("max_write_zeroes_size_kib", 8),
        ("dmrsl", 128),
        ("wzsl", 1),
    ] {
        refused(
            &mut c,
            "nvmf_create_subsystem",
            json!({"nqn": NQN2, field: value}),
            EINVAL,
            &format!("{field}: {value}"),
        );
    }
}

#[test]
fn listeners_add_get_remove_and_refusals() {
    let mut c = control();
    ok(&mut c, "nvmf_create_transport", json!({"trtype": "RDMA"}));
    ok(&mut c, "nvmf_create_subsystem", json!({"nqn": NQN1}));
    let addr = json!({"trtype": "rdma", "traddr": "10.0.0.1", "trsvcid": "4420"});
    refused(
        &mut c,
        "nvmf_subsystem_add_listener",
        json!({"nqn": NQN1}),
        PARAMS,
        "listen_address",
    );
    refused(
        &mut c,
        "nvmf_subsystem_add_listener",
        json!({"nqn": NQN1, "listen_address": {"trtype": "rdma"}}),
        PARAMS,
        "traddr",
    );
    refused(
        &mut c,
        "nvmf_subsystem_add_listener",
        json!({"nqn": NQN1, "listen_address": {"trtype": "rdma", "traddr": "1.2.3.4", "trsvcid": 4420}}),
        PARAMS,
        "listen_address.trsvcid",
    );
    refused(
        &mut c,
        "nvmf_subsystem_add_listener",
        json!({"nqn": NQN1, "listen_address": {"trtype": "rdma", "traddr": "1.2.3.4", "port": "1"}}),
        PARAMS,
        "port",
    );
    refused(
        &mut c,
        "nvmf_subsystem_add_listener",
        json!({"nqn": NQN1, "listen_address": {"trtype": "rdma", "traddr": "1.2.3.4"}}),
        EINVAL,
        "trsvcid",
    );
    refused(
        &mut c,
        "nvmf_subsystem_add_listener",
        json!({"nqn": NQN1, "listen_address": {"trtype": "rdma", "adrfam": "ipx", "traddr": "1.2.3.4", "trsvcid": "1"}}),
        EINVAL,
        "ipx",
    );
    refused(
        &mut c,
        "nvmf_subsystem_add_listener",
        json!({"nqn": NQN1, "listen_address": {"trtype": "tcp", "traddr": "1.2.3.4", "trsvcid": "1"}}),
        EINVAL,
        "TCP",
    );
    refused(
        &mut c,
        "nvmf_subsystem_add_listener",
        json!({"nqn": NQN2, "listen_address": addr}),
        ENOENT,
        NQN2,
    );
    // The transport's own refusal: its words, then where to look.
    let err = call(
        &mut c,
        "nvmf_subsystem_add_listener",
        json!({"nqn": NQN1, "listen_address": {"trtype": "rdma", "traddr": REFUSED_TRADDR, "trsvcid": "4420"}}),
    )
    .unwrap_err();
    assert_eq!(err.code, -libc::EADDRNOTAVAIL, "{err}");
    assert!(
        err.message
            .contains("rdma_bind_addr(192.0.2.1:4420): rdma_bind_addr failed: ")
            && err
                .message
                .ends_with("; run `nvmf-doctor -a 192.0.2.1` to diagnose"),
        "{}",
        err.message
    );
    refused(
        &mut c,
        "nvmf_subsystem_add_listener",
        json!({"nqn": NQN1, "listen_address": addr, "secure_channel": true}),
        EINVAL,
        "secure_channel",
    );
    refused(
        &mut c,
        "nvmf_subsystem_add_listener",
        json!({"nqn": NQN1, "listen_address": addr, "ana_state": "degraded"}),
        PARAMS,
        "ana_state",
    );

    ok(
        &mut c,
        "nvmf_subsystem_add_listener",
        json!({"nqn": NQN1, "listen_address": addr, "secure_channel": false}),
    );
    refused(
        &mut c,
        "nvmf_subsystem_add_listener",
        json!({"nqn": NQN1, "listen_address": addr}),
        EEXIST,
        "10.0.0.1",
    );
    let want = json!({"trtype": "RDMA", "adrfam": "IPv4", "traddr": "10.0.0.1", "trsvcid": "4420"});
    assert_eq!(
        ok(&mut c, "nvmf_subsystem_get_listeners", json!({"nqn": NQN1})),
        json!([{"address": want}])
    );
    assert_eq!(
        ok(&mut c, "nvmf_get_subsystems", json!({"nqn": NQN1}))[0]["listen_addresses"],
        json!([want])
    );
    refused(
        &mut c,
        "nvmf_subsystem_get_listeners",
        json!({"nqn": NQN2}),
        ENOENT,
        NQN2,
    );

    let other = json!({"trtype": "RDMA", "traddr": "10.0.0.2", "trsvcid": "4420"});
    refused(
        &mut c,
        "nvmf_subsystem_remove_listener",
        json!({"nqn": NQN1, "listen_address": other}),
        ENOENT,
        "10.0.0.2",
    );
    refused(
        &mut c,
        "nvmf_subsystem_remove_listener",
        json!({"nqn": NQN1, "listen_address": addr, "x": 1}),
        PARAMS,
        "x",
    );
    ok(
        &mut c,
        "nvmf_subsystem_remove_listener",
        json!({"nqn": NQN1, "listen_address": addr}),
    );
    assert_eq!(
        ok(&mut c, "nvmf_subsystem_get_listeners", json!({"nqn": NQN1})),
        json!([])
    );
}

#[test]
fn namespaces_add_remove_and_refusals() {
    let mut c = control();
    ok(
        &mut c,
        "bdev_malloc_create",
        json!({"name": "Malloc0", "num_blocks": 64, "block_size": 512}),
    );
    ok(
        &mut c,
        "bdev_malloc_create",
        json!({"name": "Malloc1", "num_blocks": 64, "block_size": 512}),
    );
    ok(
        &mut c,
        "nvmf_create_subsystem",
        json!({"nqn": NQN1, "max_namespaces": 4}),
    );
    ok(&mut c, "nvmf_create_subsystem", json!({"nqn": NQN2}));
    refused(
        &mut c,
        "nvmf_subsystem_add_ns",
        json!({"nqn": NQN1}),
        PARAMS,
        "namespace",
    );
    // 1536-byte blocks make a bdev, as in SPDK, but not a namespace: Identify states the
    // LBA size as a power of two, and hosts would read the wrong geometry.
    ok(
        &mut c,
        "bdev_malloc_create",
        json!({"name": "Odd", "num_blocks": 64, "block_size": 1536}),
    );
    refused(
        &mut c,
        "nvmf_subsystem_add_ns",
        json!({"nqn": NQN1, "namespace": {"bdev_name": "Odd"}}),
        EINVAL,
        "power of two",
    );
    ok(&mut c, "bdev_malloc_delete", json!({"name": "Odd"}));
    refused(
        &mut c,
        "nvmf_subsystem_add_ns",
        json!({"nqn": NQN1, "namespace": {}}),
        PARAMS,
        "bdev_name",
    );
    refused(
        &mut c,
        "nvmf_subsystem_add_ns",
        json!({"nqn": NQN1, "namespace": {"bdev_name": "Malloc0", "nsid": "1"}}),
        PARAMS,
        "namespace.nsid",
    );
    refused(
        &mut c,
        "nvmf_subsystem_add_ns",
        json!({"nqn": NQN1, "namespace": {"bdev_name": "Malloc0", "size": 1}}),
        PARAMS,
        "size",
    );
    refused(
        &mut c,
        "nvmf_subsystem_add_ns",
        json!({"nqn": NQN1, "namespace": {"bdev_name": "Nope"}}),
        ENODEV,
        "Nope",
    );
    refused(
        &mut c,
        "nvmf_subsystem_add_ns",
        json!({"nqn": format!("{NQN2}x"), "namespace": {"bdev_name": "Malloc0"}}),
        ENOENT,
        "cnode2x",
    );
    refused(
        &mut c,
        "nvmf_subsystem_add_ns",
        json!({"nqn": NQN1, "namespace": {"bdev_name": "Malloc0", "nguid": "0011"}}),
        EINVAL,
        "nguid",
    );
    refused(
        &mut c,
        "nvmf_subsystem_add_ns",
        json!({"nqn": NQN1, "namespace": {"bdev_name": "Malloc0", "eui64": "zz11223344556677"}}),
        EINVAL,
        "eui64",
    );
    refused(
        &mut c,
        "nvmf_subsystem_add_ns",
        json!({"nqn": NQN1, "namespace": {"bdev_name": "Malloc0", "uuid": "abc"}}),
        EINVAL,
        "uuid",
    );
    refused(
        &mut c,
        "nvmf_subsystem_add_ns",
        json!({"nqn": NQN1, "namespace": {"bdev_name": "Malloc0", "nsid": 5}}),
        EINVAL,
        "max_namespaces",
    );
    // A PTPL file that is not a reservation state file (a missing one would be an empty
    // state, accepted as SPDK does).
    let bad_ptpl = std::env::temp_dir().join(format!("nvmf-bad-ptpl-{}", std::process::id()));
    std::fs::write(&bad_ptpl, b"not json").unwrap();
    refused(
        &mut c,
        "nvmf_subsystem_add_ns",
        json!({"nqn": NQN1, "namespace": {"bdev_name": "Malloc0", "ptpl_file": bad_ptpl}}),
        EINVAL,
        "ptpl_file",
    );
    let _ = std::fs::remove_file(&bad_ptpl);
    refused(
        &mut c,
        "nvmf_subsystem_add_ns",
        json!({"nqn": DISCOVERY_NQN_STR, "namespace": {"bdev_name": "Malloc0"}}),
        EINVAL,
        "discovery",
    );

    assert_eq!(
        ok(
            &mut c,
            "nvmf_subsystem_add_ns",
            json!({"nqn": NQN1, "namespace": {"bdev_name": "Malloc0", "nsid": 2}})
        ),
        json!(2)
    );
    refused(
        &mut c,
        "nvmf_subsystem_add_ns",
        json!({"nqn": NQN1, "namespace": {"bdev_name": "Malloc1", "nsid": 2}}),
        EEXIST,
        "2",
    );
    // Claimed by the first namespace.
    refused(
        &mut c,
        "nvmf_subsystem_add_ns",
        json!({"nqn": NQN2, "namespace": {"bdev_name": "Malloc0"}}),
        EBUSY,
        "Malloc0",
    );
    refused(
        &mut c,
        "bdev_malloc_delete",
        json!({"name": "Malloc0"}),
        EBUSY,
        "Malloc0",
    );
    assert_eq!(
        ok(
            &mut c,
            "nvmf_subsystem_add_ns",
            json!({"nqn": NQN1, "namespace": {"bdev_name": "Malloc1", "nsid": 0}})
        ),
        json!(1)
    );

    let ns = ok(&mut c, "nvmf_get_subsystems", json!({"nqn": NQN1}))[0]["namespaces"].clone();
    assert_eq!(ns[0]["nsid"], 1);
    assert_eq!(ns[0]["bdev_name"], "Malloc1");
    assert_eq!(ns[0]["name"], "Malloc1");
    assert_eq!(ns[1]["nsid"], 2);
    // Identifiers default to the bdev's UUID, as SPDK derives them.
    let bdev_uuid = ok(&mut c, "bdev_get_bdevs", json!({"name": "Malloc0"}))[0]["uuid"].clone();
    assert_eq!(ns[1]["uuid"], bdev_uuid);
    assert_eq!(ns[1]["nguid"].as_str().unwrap().len(), 32);

    refused(
        &mut c,
        "nvmf_subsystem_remove_ns",
        json!({"nqn": NQN1}),
        PARAMS,
        "nsid",
    );
    refused(
        &mut c,
        "nvmf_subsystem_remove_ns",
        json!({"nqn": NQN1, "nsid": 9}),
        ENOENT,
        "9",
    );
    ok(
        &mut c,
        "nvmf_subsystem_remove_ns",
        json!({"nqn": NQN1, "nsid": 2}),
    );
    // Released: the bdev can back another namespace (or be deleted) again.
    assert_eq!(
        ok(
            &mut c,
            "nvmf_subsystem_add_ns",
            json!({"nqn": NQN2, "namespace": {"bdev_name": "Malloc0"}})
        ),
        json!(1)
    );
}

#[test]
fn hosts_add_remove_allow_any() {
    let mut c = control();
    ok(&mut c, "nvmf_create_subsystem", json!({"nqn": NQN1}));
    refused(
        &mut c,
        "nvmf_subsystem_add_host",
        json!({"nqn": NQN1}),
        PARAMS,
        "host",
    );
    refused(
        &mut c,
        "nvmf_subsystem_add_host",
        json!({"nqn": NQN1, "host": "bad host"}),
        EINVAL,
        "bad host",
    );
    refused(
        &mut c,
        "nvmf_subsystem_add_host",
        json!({"nqn": NQN2, "host": HOST1}),
        ENOENT,
        NQN2,
    );
    refused(
        &mut c,
        "nvmf_subsystem_add_host",
        json!({"nqn": NQN1, "host": HOST1, "dhchap_key": "key0"}),
        EINVAL,
        "dhchap_key",
    );
    refused(
        &mut c,
        "nvmf_subsystem_add_host",
        json!({"nqn": NQN1, "host": HOST1, "psk": "/tmp/psk"}),
        EINVAL,
        "psk",
    );
    ok(
        &mut c,
        "nvmf_subsystem_add_host",
        json!({"nqn": NQN1, "host": HOST1}),
    );
    refused(
        &mut c,
        "nvmf_subsystem_add_host",
        json!({"nqn": NQN1, "host": HOST1}),
        EEXIST,
        HOST1,
    );
    assert_eq!(
        ok(&mut c, "nvmf_get_subsystems", json!({"nqn": NQN1}))[0]["hosts"],
        json!([{"nqn": HOST1}])
    );
    refused(
        &mut c,
        "nvmf_subsystem_remove_host",
        json!({"nqn": NQN1, "host": HOST2}),
        ENOENT,
        HOST2,
    );
    ok(
        &mut c,
        "nvmf_subsystem_remove_host",
        json!({"nqn": NQN1, "host": HOST1, "timeout_ms": 100}),
    );
    assert_eq!(
        ok(&mut c, "nvmf_get_subsystems", json!({"nqn": NQN1}))[0]["hosts"],
        json!([])
    );

    refused(
        &mut c,
        "nvmf_subsystem_allow_any_host",
        json!({"nqn": NQN1}),
        PARAMS,
        "allow_any_host",
    );
    refused(
        &mut c,
        "nvmf_subsystem_allow_any_host",
        json!({"nqn": NQN1, "allow_any_host": 1}),
        PARAMS,
        "allow_any_host",
    );
    refused(
        &mut c,
        "nvmf_subsystem_allow_any_host",
        json!({"nqn": NQN2, "allow_any_host": true}),
        ENOENT,
        NQN2,
    );
    ok(
        &mut c,
        "nvmf_subsystem_allow_any_host",
        json!({"nqn": NQN1, "allow_any_host": true}),
    );
    assert_eq!(
        ok(&mut c, "nvmf_get_subsystems", json!({"nqn": NQN1}))[0]["allow_any_host"],
        true
    );
}

#[test]
fn bdev_methods_through_the_table() {
    let mut c = control();
    assert_eq!(
        ok(
            &mut c,
            "bdev_malloc_create",
            json!({"num_blocks": 32, "block_size": 512})
        ),
        json!("Malloc0")
    );
    refused(
        &mut c,
        "bdev_malloc_create",
        json!({"num_blocks": 32}),
        PARAMS,
        "block_size",
    );
    refused(
        &mut c,
        "bdev_malloc_create",
        json!({"num_blocks": "32", "block_size": 512}),
        PARAMS,
        "num_blocks",
    );
    refused(
        &mut c,
        "bdev_malloc_create",
        json!({"name": "Malloc0", "num_blocks": 32, "block_size": 512}),
        EEXIST,
        "Malloc0",
    );
    refused(
        &mut c,
        "bdev_malloc_create",
        json!({"num_blocks": 32, "block_size": 512, "md_size": 8}),
        EINVAL,
        "md_size",
    );
    refused(
        &mut c,
        "bdev_malloc_create",
        json!({"num_blocks": 32, "block_size": 512, "shiny": true}),
        PARAMS,
        "shiny",
    );
    ok(
        &mut c,
        "bdev_null_create",
        json!({"name": "Null0", "num_blocks": 64, "block_size": 4096}),
    );
    refused(
        &mut c,
        "bdev_null_create",
        json!({"num_blocks": 64, "block_size": 4096}),
        PARAMS,
        "name",
    );
    assert_eq!(
        ok(&mut c, "bdev_error_create", json!({"base_name": "Malloc0"})),
        json!(true)
    );
    refused(
        &mut c,
        "bdev_error_create",
        json!({"base_name": "Nope"}),
        ENODEV,
        "Nope",
    );
    ok(
        &mut c,
        "bdev_error_inject_error",
        json!({"name": "EE_Malloc0", "io_type": "read", "error_type": "failure", "num": 2}),
    );
    refused(
        &mut c,
        "bdev_error_inject_error",
        json!({"name": "EE_Malloc0", "io_type": "tea", "error_type": "failure"}),
        PARAMS,
        "io_type",
    );
    ok(
        &mut c,
        "bdev_error_resume_pending",
        json!({"name": "EE_Malloc0"}),
    );
    ok(
        &mut c,
        "bdev_delay_create",
        json!({"base_bdev_name": "Null0", "name": "Delay0", "avg_read_latency": 1, "p99_read_latency": 2, "avg_write_latency": 3, "p99_write_latency": 4}),
    );
    ok(
        &mut c,
        "bdev_delay_update_latency",
        json!({"delay_bdev_name": "Delay0", "latency_type": "avg_read", "latency_us": 7}),
    );

    let all = ok(&mut c, "bdev_get_bdevs", Value::Null);
    let names: Vec<&str> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["Malloc0", "Null0", "EE_Malloc0", "Delay0"]);
    let m = &all[0];
    for field in [
        "aliases",
        "product_name",
        "block_size",
        "num_blocks",
        "uuid",
        "assigned_rate_limits",
        "claimed",
        "zoned",
        "supported_io_types",
        "driver_specific",
    ] {
        assert!(m.get(field).is_some(), "bdev_get_bdevs lacks {field}: {m}");
    }
    assert_eq!(m["block_size"], 512);
    assert_eq!(m["num_blocks"], 32);
    assert_eq!(m["claimed"], true, "the error bdev claims its base");
    assert_eq!(m["supported_io_types"]["read"], true);
    assert_eq!(all[2]["claimed"], false);
    refused(
        &mut c,
        "bdev_get_bdevs",
        json!({"name": "Nope"}),
        ENODEV,
        "Nope",
    );
    refused(&mut c, "bdev_get_bdevs", json!({"name": 3}), PARAMS, "name");
    assert_eq!(
        ok(
            &mut c,
            "bdev_get_bdevs",
            json!({"name": "Null0", "timeout": 10})
        )
        .as_array()
        .unwrap()
        .len(),
        1
    );

    // Stacked bdevs hold their bases.
    refused(
        &mut c,
        "bdev_null_delete",
        json!({"name": "Null0"}),
        EBUSY,
        "Null0",
    );
    refused(
        &mut c,
        "bdev_malloc_delete",
        json!({"name": "Null0"}),
        ENODEV,
        "Null0",
    );
    ok(&mut c, "bdev_delay_delete", json!({"name": "Delay0"}));
    ok(&mut c, "bdev_null_delete", json!({"name": "Null0"}));
    ok(&mut c, "bdev_error_delete", json!({"name": "EE_Malloc0"}));
    ok(&mut c, "bdev_malloc_delete", json!({"name": "Malloc0"}));
    assert_eq!(ok(&mut c, "bdev_get_bdevs", Value::Null), json!([]));
}

#[test]
fn framework_settings_accept_defaults_and_refuse_the_rest() {
    let mut c = control();
    ok(
        &mut c,
        "bdev_set_options",
        json!({"bdev_io_pool_size": 65535, "bdev_io_cache_size": 256, "bdev_auto_examine": true, "iobuf_small_cache_size": 128, "iobuf_large_cache_size": 16}),
    );
    refused(
        &mut c,
        "bdev_set_options",
        json!({"bdev_io_pool_size": "big"}),
        PARAMS,
        "bdev_io_pool_size",
    );
    ok(&mut c, "bdev_wait_for_examine", Value::Null);
    ok(
        &mut c,
        "iobuf_set_options",
        json!({"small_pool_count": 8192, "large_pool_count": 1024, "small_bufsize": 8192, "large_bufsize": 135168}),
    );
    ok(
        &mut c,
        "accel_set_options",
        json!({"small_cache_size": 128, "large_cache_size": 16, "task_count": 2048, "sequence_count": 2048, "buf_count": 2048}),
    );
    ok(
        &mut c,
        "sock_impl_set_options",
        json!({"impl_name": "posix", "recv_buf_size": 2097152}),
    );
    refused(
        &mut c,
        "sock_impl_set_options",
        json!({"recv_buf_size": 1}),
        PARAMS,
        "impl_name",
    );
    ok(
        &mut c,
        "sock_set_default_impl",
        json!({"impl_name": "posix"}),
    );
    refused(
        &mut c,
        "sock_set_default_impl",
        json!({"impl_name": "uring"}),
        EINVAL,
        "uring",
    );
    ok(
        &mut c,
        "bdev_nvme_set_options",
        json!({"action_on_timeout": "none", "timeout_us": 0}),
    );
    ok(
        &mut c,
        "bdev_nvme_set_hotplug",
        json!({"enable": false, "period_us": 100000}),
    );
    refused(
        &mut c,
        "bdev_nvme_set_hotplug",
        json!({"enable": true}),
        EINVAL,
        "hotplug",
    );
    refused(&mut c, "vmd_enable", json!({}), -libc::EOPNOTSUPP, "VMD");
    ok(
        &mut c,
        "nvmf_set_config",
        json!({"discovery_filter": "match_any", "admin_cmd_passthru": {"identify_ctrlr": false}, "dhchap_digests": ["sha256"], "dhchap_dhgroups": ["null"]}),
    );
    // Our queue pair limits: applied, refused at 0, saved only when changed.
    let saved = |c: &Control| {
        super::nvmf::config(c)
            .iter()
            .any(|e| e["method"] == "nvmf_set_config")
    };
    assert!(!saved(&c));
    ok(
        &mut c,
        "nvmf_set_config",
        json!({"max_qpairs_per_host": 8, "max_qpairs": 100}),
    );
    let limits = &c.target.info.qpair_limits;
    assert_eq!(
        (
            limits.max_per_host.load(Ordering::Relaxed),
            limits.max_total.load(Ordering::Relaxed)
        ),
        (8, 100)
    );
    assert!(saved(&c));
    refused(
        &mut c,
        "nvmf_set_config",
        json!({"max_qpairs": 0}),
        EINVAL,
        "max_qpairs",
    );
    // The connect and transfer timeouts: bounded, applied, saved.
    refused(
        &mut c,
        "nvmf_set_config",
        json!({"transfer_timeout_ms": 5}),
        EINVAL,
        "transfer_timeout_ms",
    );
    ok(
        &mut c,
        "nvmf_set_config",
        json!({"connect_timeout_ms": 2000, "transfer_timeout_ms": 15000}),
    );
    let limits = &c.target.info.qpair_limits;
    assert_eq!(limits.connect_timeout_ms.load(Ordering::Relaxed), 2000);
    assert_eq!(limits.transfer_timeout_ms.load(Ordering::Relaxed), 15000);
    let entry = super::nvmf::config(&c)
        .into_iter()
        .find(|e| e["method"] == "nvmf_set_config")
        .expect("saved");
    assert_eq!(entry["params"]["transfer_timeout_ms"], 15000);
    assert_eq!(entry["params"]["connect_timeout_ms"], 2000);
    refused(
        &mut c,
        "nvmf_set_config",
        json!({"discovery_filter": "transport"}),
        EINVAL,
        "discovery_filter",
    );
    refused(
        &mut c,
        "nvmf_set_config",
        json!({"poll_groups_mask": "0x3"}),
        EINVAL,
        "poll_groups_mask",
    );
    refused(
        &mut c,
        "nvmf_set_config",
        json!({"admin_cmd_passthru": {"identify_ctrlr": true}}),
        EINVAL,
        "admin_cmd_passthru",
    );
    ok(
        &mut c,
        "nvmf_set_crdt",
        json!({"crdt1": 0, "crdt2": 0, "crdt3": 0}),
    );
    refused(&mut c, "nvmf_set_crdt", json!({"crdt1": 5}), EINVAL, "crdt");
    ok(&mut c, "framework_set_scheduler", json!({"name": "static"}));
    refused(
        &mut c,
        "framework_set_scheduler",
        json!({"name": "dynamic"}),
        EINVAL,
        "dynamic",
    );
}

pub(super) fn saved_config(c: &mut Control) -> Value {
    json!({"subsystems": [
        {"subsystem": "bdev", "config": ok(c, "framework_get_config", json!({"name": "bdev"}))},
        {"subsystem": "nvmf", "config": ok(c, "framework_get_config", json!({"name": "nvmf"}))},
    ]})
}

#[test]
fn saved_config_round_trips_into_a_fresh_target() {
    let mut c = control();
    populate(&mut c);
    ok(
        &mut c,
        "nvmf_set_max_subsystems",
        json!({"max_subsystems": 64}),
    );
    let config = saved_config(&mut c);

    // The nvmf part is in SPDK's order.
    let nvmf = config["subsystems"][1]["config"].as_array().unwrap();
    let methods: Vec<&str> = nvmf.iter().map(|e| e["method"].as_str().unwrap()).collect();
    assert_eq!(methods[0], "nvmf_set_max_subsystems");
    assert_eq!(
        &methods[1..3],
        ["nvmf_create_transport", "nvmf_create_transport"]
    );
    assert_eq!(
        methods[3], "nvmf_subsystem_add_listener",
        "discovery listener right after the transports"
    );
    let create1 = methods
        .iter()
        .position(|m| *m == "nvmf_create_subsystem")
        .unwrap();
    assert_eq!(
        &methods[create1..create1 + 6],
        [
            "nvmf_create_subsystem",
            "nvmf_subsystem_add_listener",
            "nvmf_subsystem_add_host",
            "nvmf_subsystem_add_host",
            "nvmf_subsystem_add_ns",
            "nvmf_subsystem_add_ns"
        ]
    );
    // Base bdevs before stacked ones, then bdev_wait_for_examine.
    let bdev = config["subsystems"][0]["config"].as_array().unwrap();
    let order: Vec<String> = bdev
        .iter()
        .map(|e| e["method"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(order.last().unwrap(), "bdev_wait_for_examine");
    let pos = |m: &str| order.iter().position(|o| o == m).unwrap();
    assert!(pos("bdev_malloc_create") < pos("bdev_error_create"));
    assert!(pos("bdev_null_create") < pos("bdev_delay_create"));

    let mut fresh = control();
    load_config(&mut fresh, &config).unwrap();
    assert_eq!(snapshot(&mut fresh), snapshot(&mut c));
    assert_eq!(fresh.max_subsystems, 64);
    // And once more from the reloaded target: a fixed point.
    assert_eq!(saved_config(&mut fresh), config);
}

/// A namespace added with an all-zero uuid and nguid gets the identifiers of its bdev, as
/// in SPDK (zero is "not given"): the saved config, which leaves zeroes out, restores the
/// same identifiers, so a host does not see them change across a restart.
#[test]
fn zero_namespace_identifiers_are_not_given_and_survive_a_restart() {
    let mut c = control();
    ok(
        &mut c,
        "bdev_malloc_create",
        json!({"name": "Malloc0", "num_blocks": 64, "block_size": 512,
               "uuid": "5a5a5a5a-0000-4000-8000-00000000005a"}),
    );
    ok(&mut c, "nvmf_create_subsystem", json!({"nqn": NQN1}));
    ok(
        &mut c,
        "nvmf_subsystem_add_ns",
        json!({"nqn": NQN1, "namespace": {"bdev_name": "Malloc0",
               "uuid": "00000000-0000-0000-0000-000000000000",
               "nguid": "00000000000000000000000000000000"}}),
    );
    let ns = |c: &mut Control| {
        let subs = ok(c, "nvmf_get_subsystems", Value::Null);
        let sub = subs
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["nqn"] == NQN1)
            .unwrap()
            .clone();
        sub["namespaces"][0].clone()
    };
    let before = ns(&mut c);
    assert_eq!(before["uuid"], "5a5a5a5a-0000-4000-8000-00000000005a");
    let mut fresh = control();
    load_config(&mut fresh, &saved_config(&mut c)).unwrap();
    let after = ns(&mut fresh);
    assert_eq!(
        (&after["uuid"], &after["nguid"]),
        (&before["uuid"], &before["nguid"])
    );
}

#[test]
fn load_config_waiting_for_rpc_runs_settings_first_then_starts() {
    let mut src = control();
    populate(&mut src);
    let mut config = saved_config(&mut src);
    // What SPDK's save_config also writes before bdev and nvmf.
    config["subsystems"].as_array_mut().unwrap().insert(
        0,
        json!({"subsystem": "iobuf", "config": [{"method": "iobuf_set_options", "params": {"small_pool_count": 8192, "large_pool_count": 1024, "small_bufsize": 8192, "large_bufsize": 135168}}]}),
    );
    config["subsystems"]
        .as_array_mut()
        .unwrap()
        .insert(1, json!({"subsystem": "vmd", "config": []}));
    config["subsystems"]
        .as_array_mut()
        .unwrap()
        .insert(2, json!({"subsystem": "keyring", "config": null}));
    let mut c = control();
    c.init_state = InitState::WaitingForRpc;
    load_config(&mut c, &config).unwrap();
    assert_eq!(c.init_state, InitState::Running);
    assert_eq!(snapshot(&mut c), snapshot(&mut src));
}

#[test]
fn load_config_errors_name_the_entry() {
    let mut c = control();
    let bad = json!({"subsystems": [
        {"subsystem": "bdev", "config": [
            {"method": "bdev_malloc_create", "params": {"name": "M0", "num_blocks": 16, "block_size": 512}},
            {"method": "bdev_malloc_create", "params": {"name": "M0", "num_blocks": 16, "block_size": 512}}
        ]}
    ]});
    match load_config(&mut c, &bad).unwrap_err() {
        ConfigError::Entry {
            subsystem,
            index,
            method,
            error,
            ..
        } => {
            assert_eq!(
                (subsystem.as_str(), index, method.as_str()),
                ("bdev", 1, "bdev_malloc_create")
            );
            assert_eq!(error.code, EEXIST);
        }
        other => panic!("{other}"),
    }
    // Unknown methods are refused before anything runs.
    let mut c = control();
    let unknown = json!({"subsystems": [{"subsystem": "bdev", "config": [
        {"method": "bdev_malloc_create", "params": {"name": "M0", "num_blocks": 16, "block_size": 512}},
        {"method": "bdev_lvol_create_lvstore", "params": {"bdev_name": "M0", "lvs_name": "lvs"}}
    ]}]});
    let e = load_config(&mut c, &unknown).unwrap_err();
    assert!(
        e.to_string().contains("bdev_lvol_create_lvstore") && e.to_string().contains("entry 1"),
        "{e}"
    );
    assert_eq!(ok(&mut c, "bdev_get_bdevs", Value::Null), json!([]));
    // A setting that changes behaviour is not silently taken.
    let mut c = control();
    let mask = json!({"subsystems": [{"subsystem": "nvmf", "config": [{"method": "nvmf_set_config", "params": {"poll_groups_mask": "0xF"}}]}]});
    let e = load_config(&mut c, &mask).unwrap_err();
    assert!(e.to_string().contains("poll_groups_mask"), "{e}");
    assert!(matches!(
        load_config(&mut c, &json!({"subsys": []})),
        Err(ConfigError::Format(_))
    ));
}

// ---------------------------------------------------------------------------------------------
// Poll groups, controllers, stats

/// A poll group polled by its own thread, as a reactor would.
struct Reactor {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Reactor {
    /// Transports reach it through `Target::add_transport` / `add_poll_group` messages.
    fn start(index: usize, info: Arc<TargetInfo>, target: &mut Target) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = crossbeam::channel::bounded(1);
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut pg = PollGroup::new(index, info);
            tx.send(pg.handle()).unwrap();
            while !flag.load(Ordering::Relaxed) {
                if pg.poll() == 0 {
                    std::thread::yield_now();
                }
            }
            pg.shutdown();
        });
        target.add_poll_group(rx.recv().unwrap());
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Reactor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn connect_capsule(qid: u16, cntlid: u16, subnqn: &str) -> Capsule {
    let mut cmd: Command = ConnectCommand::new(1, qid, 31, 0).to_command();
    let data = ConnectData::new([0x11; 16], cntlid, subnqn, HOST1);
    let host_buffer = data.as_bytes().to_vec();
    cmd.flags |= Command::FLAG_SGL;
    cmd.dptr = SglDescriptor::keyed(0x1000, host_buffer.len() as u32, 0x1234, false);
    Capsule { cmd, host_buffer }
}

fn wait_response(q: &LoopbackHostQueue) -> nvmf_common::spec::Completion {
    for _ in 0..200_000 {
        if let Some(r) = q.poll() {
            return r.cqe;
        }
        std::thread::yield_now();
    }
    panic!("no response from the reactor");
}

#[test]
fn stats_controllers_and_qpairs_through_live_poll_groups() {
    let info = Arc::new(TargetInfo::default());
    let mut target = Target::new(Arc::clone(&info));
    let transport = LoopbackTransport::new(LOOPBACK_LIMITS);
    let _r0 = Reactor::start(0, Arc::clone(&info), &mut target);
    let _r1 = Reactor::start(1, Arc::clone(&info), &mut target);
    target.add_transport(Arc::new(transport.clone())).unwrap();
    let mut c = Control::new(target, factory());
    ok(
        &mut c,
        "bdev_malloc_create",
        json!({"name": "Malloc0", "num_blocks": 64, "block_size": 512}),
    );
    ok(
        &mut c,
        "nvmf_create_subsystem",
        json!({"nqn": NQN1, "allow_any_host": true}),
    );
    ok(
        &mut c,
        "nvmf_subsystem_add_ns",
        json!({"nqn": NQN1, "namespace": {"bdev_name": "Malloc0"}}),
    );
    ok(
        &mut c,
        "nvmf_subsystem_add_listener",
        json!({"nqn": NQN1, "listen_address":
            {"trtype": "LOOPBACK", "adrfam": "INTRA_HOST", "traddr": "local", "trsvcid": "7"}}),
    );

    let stats = ok(&mut c, "nvmf_get_stats", Value::Null);
    let groups = stats["poll_groups"].as_array().unwrap();
    assert_eq!(groups.len(), 2);
    assert_eq!(groups[0]["name"], "nvmf_tgt_poll_group_000");
    assert_eq!(groups[1]["name"], "nvmf_tgt_poll_group_001");
    assert_eq!(stats["tick_rate"], 1_000_000_000u64);
    let iostat = ok(&mut c, "bdev_get_iostat", json!({"name": "Malloc0"}));
    assert_eq!(iostat["bdevs"][0]["name"], "Malloc0");
    assert_eq!(iostat["bdevs"][0]["num_read_ops"], 0);
    refused(
        &mut c,
        "nvmf_get_stats",
        json!({"verbose": true}),
        PARAMS,
        "verbose",
    );

    // A host connects an admin queue and one I/O queue.
    let admin = transport.connect_via(ListenAddress {
        trtype: "LOOPBACK".into(),
        adrfam: "INTRA_HOST".into(),
        traddr: "local".into(),
        trsvcid: "7".into(),
    });
    admin.submit(connect_capsule(0, CNTLID_DYNAMIC, NQN1));
    let cqe = wait_response(&admin);
    assert_eq!(cqe.status(), Status::SUCCESS);
    let cntlid = cqe.dw0.get() as u16;
    let ctrls = ok(
        &mut c,
        "nvmf_subsystem_get_controllers",
        json!({"nqn": NQN1}),
    );
    assert_eq!(ctrls.as_array().unwrap().len(), 1);
    assert_eq!(ctrls[0]["cntlid"], cntlid);
    assert_eq!(ctrls[0]["hostnqn"], HOST1);
    assert_eq!(ctrls[0]["cntrltype"], "io");
    assert_eq!(ctrls[0]["hostid"], "11111111-1111-1111-1111-111111111111");
    let qpairs = ok(&mut c, "nvmf_subsystem_get_qpairs", json!({"nqn": NQN1}));
    assert_eq!(qpairs.as_array().unwrap().len(), 1);
    assert_eq!(qpairs[0]["qid"], 0);
    assert_eq!(qpairs[0]["state"], "enabled");
    assert_eq!(
        qpairs[0]["listen_address"],
        json!({"trtype": "LOOPBACK", "adrfam": "INTRA_HOST", "traddr": "local", "trsvcid": "7"})
    );

    let stats = ok(&mut c, "nvmf_get_stats", Value::Null);
    let total: u64 = stats["poll_groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["current_admin_qpairs"].as_u64().unwrap())
        .sum();
    assert_eq!(total, 1, "{stats}");

    refused(
        &mut c,
        "nvmf_subsystem_get_controllers",
        json!({"nqn": NQN2}),
        ENOENT,
        NQN2,
    );
    refused(
        &mut c,
        "nvmf_subsystem_get_qpairs",
        json!({}),
        PARAMS,
        "nqn",
    );

    // Removing the host disconnects its controller, as SPDK does.
    ok(
        &mut c,
        "nvmf_subsystem_add_host",
        json!({"nqn": NQN1, "host": HOST1}),
    );
    ok(
        &mut c,
        "nvmf_subsystem_remove_host",
        json!({"nqn": NQN1, "host": HOST1}),
    );
    let qpairs = ok(&mut c, "nvmf_subsystem_get_qpairs", json!({"nqn": NQN1}));
    assert!(
        qpairs
            .as_array()
            .unwrap()
            .iter()
            .all(|q| q["state"] == "error"),
        "{qpairs}"
    );
}

#[test]
fn stats_time_out_when_a_poll_group_is_stuck() {
    let info = Arc::new(TargetInfo::default());
    let mut target = Target::new(Arc::clone(&info));
    // Registered but never polled.
    let pg = PollGroup::new(0, info);
    target.add_poll_group(pg.handle());
    let mut c = Control::new(target, factory());
    c.stats_timeout = Duration::from_millis(50);
    let e = call(&mut c, "nvmf_get_stats", Value::Null).unwrap_err();
    assert_eq!(e.code, -libc::ETIMEDOUT);
    assert!(e.message.contains("[0]"), "{e}");
}

#[test]
fn method_table_is_consistent() {
    let names = method_names();
    let mut sorted = names.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), names.len(), "duplicate method names");
    let _ = LOOPBACK_LIMITS;
}

/// A split's parts through the method table: each exported as a namespace of its own, the
/// delete refused while one is, and one saved entry bringing them back with their namespaces'
/// identities.
#[test]
fn split_parts_export_separately_and_survive_a_restart() {
    let mut c = control();
    ok(
        &mut c,
        "bdev_malloc_create",
        json!({"name": "Malloc0", "num_blocks": 4096, "block_size": 512}),
    );
    assert_eq!(
        ok(
            &mut c,
            "bdev_split_create",
            json!({"base_bdev": "Malloc0", "split_count": 2, "split_size_mb": 1})
        ),
        json!(["Malloc0p0", "Malloc0p1"])
    );
    refused(
        &mut c,
        "bdev_split_create",
        json!({"base_bdev": "Malloc0", "split_count": 2}),
        EEXIST,
        "Malloc0",
    );
    let parts = ok(&mut c, "bdev_get_bdevs", json!({"name": "Malloc0p1"}));
    assert_eq!(parts[0]["num_blocks"], 2048);
    assert_eq!(
        parts[0]["driver_specific"]["split"],
        json!({"base_bdev": "Malloc0", "offset_blocks": 2048})
    );
    ok(&mut c, "nvmf_create_subsystem", json!({"nqn": NQN1}));
    ok(&mut c, "nvmf_create_subsystem", json!({"nqn": NQN2}));
    for (nqn, part) in [(NQN1, "Malloc0p0"), (NQN2, "Malloc0p1")] {
        ok(
            &mut c,
            "nvmf_subsystem_add_ns",
            json!({"nqn": nqn, "namespace": {"bdev_name": part}}),
        );
    }
    refused(
        &mut c,
        "bdev_split_delete",
        json!({"base_bdev": "Malloc0"}),
        EBUSY,
        "Malloc0p0",
    );
    refused(
        &mut c,
        "bdev_malloc_delete",
        json!({"name": "Malloc0"}),
        EBUSY,
        "Malloc0",
    );

    let config = saved_config(&mut c);
    let bdev = config["subsystems"][0]["config"].as_array().unwrap();
    let splits: Vec<&Value> = bdev
        .iter()
        .filter(|e| e["method"] == "bdev_split_create")
        .collect();
    assert_eq!(splits.len(), 1, "{bdev:?}");
    let mut fresh = control();
    load_config(&mut fresh, &config).unwrap();
    assert_eq!(snapshot(&mut fresh), snapshot(&mut c));
    assert_eq!(saved_config(&mut fresh), config);

    ok(
        &mut c,
        "nvmf_subsystem_remove_ns",
        json!({"nqn": NQN1, "nsid": 1}),
    );
    ok(
        &mut c,
        "nvmf_subsystem_remove_ns",
        json!({"nqn": NQN2, "nsid": 1}),
    );
    ok(&mut c, "bdev_split_delete", json!({"base_bdev": "Malloc0"}));
    refused(
        &mut c,
        "bdev_split_delete",
        json!({"base_bdev": "Malloc0"}),
        ENOENT,
        "Malloc0",
    );
    ok(&mut c, "bdev_malloc_delete", json!({"name": "Malloc0"}));
}

/// `bdev_null_resize` through the method table tells the namespace's hosts (the size they
/// were told moves with it); a refused shrink tells nobody anything.
#[test]
fn a_resize_through_the_table_is_announced() {
    let mut c = control();
    ok(
        &mut c,
        "bdev_null_create",
        json!({"name": "Null0", "num_blocks": 2048, "block_size": 512}),
    );
    ok(&mut c, "nvmf_create_subsystem", json!({"nqn": NQN1}));
    ok(
        &mut c,
        "nvmf_subsystem_add_ns",
        json!({"nqn": NQN1, "namespace": {"bdev_name": "Null0"}}),
    );
    let announced = |c: &Control| {
        c.target.subsystem(NQN1).unwrap().namespaces[&1]
            .announced_blocks
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    assert_eq!(announced(&c), 2048);
    ok(
        &mut c,
        "bdev_null_resize",
        json!({"name": "Null0", "new_size": 2}),
    );
    assert_eq!(announced(&c), 4096);
    refused(
        &mut c,
        "bdev_null_resize",
        json!({"name": "Null0", "new_size": 1}),
        EBUSY,
        "Null0",
    );
    assert_eq!(announced(&c), 4096);
    refused(
        &mut c,
        "bdev_aio_rescan",
        json!({"name": "Null0"}),
        ENODEV,
        "Null0",
    );
}
