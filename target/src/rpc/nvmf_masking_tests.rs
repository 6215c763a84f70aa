//! RPC tests of namespace masking (`nvmf_ns_add_host`, `nvmf_ns_remove_host`, `no_auto_visible`)
//! and discovery referrals: SPDK's error codes, the get methods' layout, saved-config round
//! trips. What hosts see is tested over the loopback transport (tests/tests/loopback_ns_masking.rs).

use std::sync::Arc;

use nvmf_rpc::RpcError;
use serde_json::{json, Value};

use super::*;
use crate::core::TargetInfo;
use crate::transport::loopback::LoopbackTransport;

fn control() -> Control {
    let factory: TransportFactory = Box::new(|opts: &TransportOptions| {
        Ok(Arc::new(LoopbackTransport::new(opts.limits())) as Arc<dyn Transport>)
    });
    Control::new(Target::new(Arc::new(TargetInfo::default())), factory)
}

#[track_caller]
fn ok(c: &mut Control, method: &str, params: Value) -> Value {
    let params = (!params.is_null()).then_some(params);
    match dispatch(c, method, params.clone()) {
        Ok(v) => v,
        Err(e) => panic!("{method} {params:?}: {e}"),
    }
}

/// Everything the RPCs of this area can see.
fn snapshot(c: &mut Control) -> Value {
    json!({
        "nvmf": ok(c, "framework_get_config", json!({"name": "nvmf"})),
        "subsystems": ok(c, "nvmf_get_subsystems", Value::Null),
        "referrals": ok(c, "nvmf_discovery_get_referrals", Value::Null),
    })
}

fn saved_config(c: &mut Control) -> Value {
    json!({"subsystems": [
        {"subsystem": "bdev", "config": ok(c, "framework_get_config", json!({"name": "bdev"}))},
        {"subsystem": "nvmf", "config": ok(c, "framework_get_config", json!({"name": "nvmf"}))},
    ]})
}

const NQN: &str = "nqn.2016-06.io.spdk:masked";
const HOST_A: &str = "nqn.2014-08.org.nvmexpress:uuid:aaaaaaaa-2222-3333-4444-555555555555";
const HOST_B: &str = "nqn.2014-08.org.nvmexpress:uuid:bbbbbbbb-2222-3333-4444-555555555555";
const DISCOVERY: &str = "nqn.2014-08.org.nvmexpress.discovery";
const PARAMS: i32 = RpcError::INVALID_PARAMS;
const INTERNAL: i32 = RpcError::INTERNAL_ERROR;

/// A subsystem with a masked namespace 1 and an auto-visible namespace 2.
fn setup() -> Control {
    let mut c = control();
    ok(
        &mut c,
        "nvmf_create_transport",
        json!({"trtype": "LOOPBACK"}),
    );
    for name in ["Malloc0", "Malloc1"] {
        ok(
            &mut c,
            "bdev_malloc_create",
            json!({"name": name, "num_blocks": 64, "block_size": 512}),
        );
    }
    ok(
        &mut c,
        "nvmf_create_subsystem",
        json!({"nqn": NQN, "allow_any_host": true}),
    );
    let nsid = ok(
        &mut c,
        "nvmf_subsystem_add_ns",
        json!({"nqn": NQN, "namespace": {"bdev_name": "Malloc0", "no_auto_visible": true}}),
    );
    assert_eq!(nsid, json!(1));
    ok(
        &mut c,
        "nvmf_subsystem_add_ns",
        json!({"nqn": NQN, "namespace": {"bdev_name": "Malloc1"}}),
    );
    c
}

#[track_caller]
fn refused(c: &mut Control, method: &str, params: Value, code: i32, needle: &str) {
    let before = snapshot(c);
    let err = dispatch(c, method, Some(params.clone()))
        .expect_err(&format!("{method} {params} should fail"));
    assert_eq!(err.code, code, "{method} {params}: {err}");
    assert!(
        err.message.contains(needle),
        "{method} {params}: message {:?} should mention {needle:?}",
        err.message
    );
    assert_eq!(snapshot(c), before, "{method} {params} changed state");
}

fn namespaces(c: &mut Control) -> Value {
    ok(c, "nvmf_get_subsystems", json!({"nqn": NQN}))[0]["namespaces"].clone()
}

#[test]
fn ns_add_host_and_remove_host_errors_follow_spdk() {
    let mut c = setup();
    let add = |nqn: &str, nsid: u32, host: &str| json!({"nqn": nqn, "nsid": nsid, "host": host});
    for method in ["nvmf_ns_add_host", "nvmf_ns_remove_host"] {
        refused(
            &mut c,
            method,
            add("nqn.2016-06.io.spdk:nope", 1, HOST_A),
            PARAMS,
            "Subsystem with NQN 'nqn.2016-06.io.spdk:nope' not found",
        );
        refused(&mut c, method, add(NQN, 7, HOST_A), PARAMS, "NSID 7");
        refused(&mut c, method, add(NQN, 0, HOST_A), PARAMS, "NSID 0");
        // No per-host control of a namespace every host sees (SPDK: -EPERM, "Invalid parameters").
        refused(
            &mut c,
            method,
            add(NQN, 2, HOST_A),
            PARAMS,
            "visible to every host",
        );
        refused(
            &mut c,
            method,
            add(NQN, 1, "not-an-nqn"),
            PARAMS,
            "not-an-nqn",
        );
        refused(
            &mut c,
            method,
            add(DISCOVERY, 1, HOST_A),
            PARAMS,
            "Invalid parameters",
        );
        refused(
            &mut c,
            method,
            json!({"nqn": NQN, "nsid": 1}),
            PARAMS,
            "host",
        );
        refused(
            &mut c,
            method,
            json!({"nqn": NQN, "nsid": 1, "host": HOST_A, "bogus": 1}),
            PARAMS,
            "bogus",
        );
        refused(
            &mut c,
            method,
            json!({"nqn": NQN, "nsid": 1, "host": HOST_A, "tgt_name": "other"}),
            INTERNAL,
            "other",
        );
    }
    // Adding twice and removing a host that does not see it succeed and change nothing.
    ok(&mut c, "nvmf_ns_add_host", add(NQN, 1, HOST_A));
    let once = snapshot(&mut c);
    ok(&mut c, "nvmf_ns_add_host", add(NQN, 1, HOST_A));
    ok(&mut c, "nvmf_ns_remove_host", add(NQN, 1, HOST_B));
    assert_eq!(snapshot(&mut c), once);
    let adds = |c: &mut Control| {
        ok(c, "framework_get_config", json!({"name": "nvmf"}))
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["method"] == "nvmf_ns_add_host")
            .count()
    };
    assert_eq!(adds(&mut c), 1);
    ok(&mut c, "nvmf_ns_remove_host", add(NQN, 1, HOST_A));
    assert_eq!(adds(&mut c), 0);
    // Removing the namespace forgets its hosts: a new namespace 1 starts masked from all.
    ok(&mut c, "nvmf_ns_add_host", add(NQN, 1, HOST_B));
    ok(
        &mut c,
        "nvmf_subsystem_remove_ns",
        json!({"nqn": NQN, "nsid": 1}),
    );
    ok(
        &mut c,
        "nvmf_subsystem_add_ns",
        json!({"nqn": NQN, "namespace": {"bdev_name": "Malloc0", "nsid": 1, "no_auto_visible": true}}),
    );
    assert_eq!(adds(&mut c), 0);
}

#[test]
fn get_subsystems_and_saved_config_carry_masking() {
    let mut c = setup();
    ok(
        &mut c,
        "nvmf_ns_add_host",
        json!({"nqn": NQN, "nsid": 1, "host": HOST_B}),
    );
    ok(
        &mut c,
        "nvmf_ns_add_host",
        json!({"nqn": NQN, "nsid": 1, "host": HOST_A, "tgt_name": "nvmf_tgt"}),
    );
    let ns = namespaces(&mut c);
    assert_eq!(ns[0]["nsid"], 1);
    assert_eq!(ns[0]["no_auto_visible"], true);
    assert_eq!(ns[1]["nsid"], 2);
    assert_eq!(ns[1]["no_auto_visible"], false);

    let config = saved_config(&mut c);
    let nvmf = config["subsystems"][1]["config"].as_array().unwrap();
    let add_ns: Vec<&Value> = nvmf
        .iter()
        .filter(|e| e["method"] == "nvmf_subsystem_add_ns")
        .collect();
    assert_eq!(add_ns[0]["params"]["namespace"]["no_auto_visible"], true);
    assert_eq!(add_ns[1]["params"]["namespace"]["no_auto_visible"], false);
    // SPDK's shape: one nvmf_ns_add_host per visible host, after the namespaces.
    let last_ns = nvmf
        .iter()
        .rposition(|e| e["method"] == "nvmf_subsystem_add_ns")
        .unwrap();
    let hosts: Vec<&Value> = nvmf[last_ns + 1..]
        .iter()
        .filter(|e| e["method"] == "nvmf_ns_add_host")
        .map(|e| &e["params"])
        .collect();
    assert_eq!(
        hosts,
        [
            &json!({"nqn": NQN, "nsid": 1, "host": HOST_A}),
            &json!({"nqn": NQN, "nsid": 1, "host": HOST_B}),
        ]
    );

    let mut fresh = control();
    load_config(&mut fresh, &config).unwrap();
    assert_eq!(snapshot(&mut fresh), snapshot(&mut c));
    assert_eq!(saved_config(&mut fresh), config);
    let sub = fresh.target.subsystem(NQN).unwrap();
    assert!(sub.ns_visible_to(1, HOST_A) && sub.ns_visible_to(1, HOST_B));
    assert!(!sub.ns_visible_to(
        1,
        "nqn.2014-08.org.nvmexpress:uuid:cccccccc-0000-0000-0000-000000000000"
    ));
    assert!(sub.ns_visible_to(
        2,
        "nqn.2014-08.org.nvmexpress:uuid:cccccccc-0000-0000-0000-000000000000"
    ));
}

fn rdma(traddr: &str, trsvcid: &str) -> Value {
    json!({"trtype": "rdma", "adrfam": "ipv4", "traddr": traddr, "trsvcid": trsvcid})
}

#[test]
fn referrals_add_get_remove_and_errors() {
    let mut c = setup();
    assert_eq!(
        ok(&mut c, "nvmf_discovery_get_referrals", Value::Null),
        json!([])
    );
    ok(
        &mut c,
        "nvmf_discovery_add_referral",
        json!({"address": rdma("10.0.0.2", "8009")}),
    );
    ok(
        &mut c,
        "nvmf_discovery_add_referral",
        json!({"address": rdma("10.0.0.3", "4420"), "subnqn": NQN, "secure_channel": true,
               "tgt_name": "nvmf_tgt"}),
    );
    // SPDK's layout, newest first.
    let want = json!([
        {"address": {"trtype": "RDMA", "adrfam": "IPv4", "traddr": "10.0.0.3", "trsvcid": "4420"},
         "secure_channel": true, "subnqn": NQN},
        {"address": {"trtype": "RDMA", "adrfam": "IPv4", "traddr": "10.0.0.2", "trsvcid": "8009"},
         "secure_channel": false, "subnqn": DISCOVERY},
    ]);
    assert_eq!(
        ok(&mut c, "nvmf_discovery_get_referrals", Value::Null),
        want
    );
    assert_eq!(
        ok(
            &mut c,
            "nvmf_discovery_get_referrals",
            json!({"tgt_name": "nvmf_tgt"})
        ),
        want
    );
    // A duplicate (same address and subsystem NQN) is ignored, as SPDK does.
    ok(
        &mut c,
        "nvmf_discovery_add_referral",
        json!({"address": rdma("10.0.0.2", "8009"), "subnqn": DISCOVERY, "secure_channel": true}),
    );
    assert_eq!(
        ok(&mut c, "nvmf_discovery_get_referrals", Value::Null),
        want
    );

    refused(
        &mut c,
        "nvmf_discovery_add_referral",
        json!({"address": {"trtype": "rdma", "traddr": "10.0.0.9"}}),
        INTERNAL,
        "Service ID is required.",
    );
    refused(
        &mut c,
        "nvmf_discovery_add_referral",
        json!({"address": rdma("10.0.0.9", "1"), "subnqn": "bad nqn"}),
        INTERNAL,
        "bad nqn",
    );
    refused(
        &mut c,
        "nvmf_discovery_add_referral",
        json!({"address": {"trtype": "carrier-pigeon", "traddr": "x", "trsvcid": "1"}}),
        -libc::EINVAL,
        "carrier-pigeon",
    );
    refused(
        &mut c,
        "nvmf_discovery_add_referral",
        json!({"subnqn": NQN}),
        PARAMS,
        "address",
    );
    refused(
        &mut c,
        "nvmf_discovery_add_referral",
        json!({"address": rdma("10.0.0.9", "1"), "tgt_name": "other"}),
        INTERNAL,
        "other",
    );
    // Removing an unknown one: SPDK's -32603 "Unable to remove a referral." The subsystem
    // NQN is part of a referral's identity.
    for params in [
        json!({"address": rdma("10.0.0.4", "8009")}),
        json!({"address": rdma("10.0.0.3", "4420")}),
        json!({"address": rdma("10.0.0.2", "8009"), "subnqn": NQN}),
    ] {
        refused(
            &mut c,
            "nvmf_discovery_remove_referral",
            params,
            INTERNAL,
            "Unable to remove a referral.",
        );
    }
    refused(
        &mut c,
        "nvmf_discovery_remove_referral",
        json!({"address": rdma("10.0.0.2", "8009"), "secure_channel": true}),
        PARAMS,
        "secure_channel",
    );
    ok(
        &mut c,
        "nvmf_discovery_remove_referral",
        json!({"address": rdma("10.0.0.3", "4420"), "subnqn": NQN}),
    );
    assert_eq!(
        ok(&mut c, "nvmf_discovery_get_referrals", Value::Null),
        json!([want[1]])
    );
    ok(
        &mut c,
        "nvmf_discovery_remove_referral",
        json!({"address": rdma("10.0.0.2", "8009"), "subnqn": DISCOVERY}),
    );
    assert_eq!(
        ok(&mut c, "nvmf_discovery_get_referrals", Value::Null),
        json!([])
    );
}

#[test]
fn referrals_round_trip_through_saved_config() {
    let mut c = setup();
    for (addr, extra) in [
        (rdma("10.0.0.2", "8009"), json!({})),
        (
            rdma("10.0.0.3", "4420"),
            json!({"subnqn": NQN, "secure_channel": true}),
        ),
        (
            json!({"trtype": "tcp", "adrfam": "ipv6", "traddr": "fe80::1", "trsvcid": "8009"}),
            json!({}),
        ),
    ] {
        let mut params = extra;
        params["address"] = addr;
        ok(&mut c, "nvmf_discovery_add_referral", params);
    }
    let config = saved_config(&mut c);
    let nvmf = config["subsystems"][1]["config"].as_array().unwrap();
    let entries: Vec<&Value> = nvmf
        .iter()
        .filter(|e| e["method"] == "nvmf_discovery_add_referral")
        .map(|e| &e["params"])
        .collect();
    assert_eq!(entries.len(), 3);
    assert_eq!(
        entries[1],
        &json!({"address": {"trtype": "RDMA", "adrfam": "IPv4", "traddr": "10.0.0.3", "trsvcid": "4420"},
                "secure_channel": true, "subnqn": NQN})
    );
    let mut fresh = control();
    load_config(&mut fresh, &config).unwrap();
    assert_eq!(
        ok(&mut fresh, "nvmf_discovery_get_referrals", Value::Null),
        ok(&mut c, "nvmf_discovery_get_referrals", Value::Null),
        "same referrals in the same order"
    );
    assert_eq!(saved_config(&mut fresh), config);
}

/// SPDK's `dump_nvmf_subsystem_listener`: an `address` object and nothing else without ANA
/// reporting (with it, `ana_states` too: rpc/nvmf_ana_tests.rs).
#[test]
fn get_listeners_has_spdks_layout() {
    let mut c = setup();
    ok(
        &mut c,
        "nvmf_subsystem_add_listener",
        json!({"nqn": NQN, "listen_address": {"trtype": "loopback", "traddr": "local", "trsvcid": "7"}}),
    );
    assert_eq!(
        ok(&mut c, "nvmf_subsystem_get_listeners", json!({"nqn": NQN})),
        json!([{"address": {"trtype": "LOOPBACK", "adrfam": "INTRA_HOST", "traddr": "local", "trsvcid": "7"}}])
    );
}
