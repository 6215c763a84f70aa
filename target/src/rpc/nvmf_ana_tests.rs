//! RPC tests of Asymmetric Namespace Access: `ana_reporting`, `anagrpid`,
//! `nvmf_subsystem_set_ns_ana_group`, `nvmf_subsystem_listener_set_ana_state`, the listener and
//! namespace dumps in SPDK's layout, errors, and the saved-config round trip. What hosts see
//! (Identify, the ANA log page, notices, I/O statuses) is tested over the loopback transport
//! (tests/tests/loopback_ana.rs).

use std::sync::Arc;

use nvmf_common::spec::log_page::AnaState;
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

fn snapshot(c: &mut Control) -> Value {
    json!({
        "nvmf": ok(c, "framework_get_config", json!({"name": "nvmf"})),
        "subsystems": ok(c, "nvmf_get_subsystems", Value::Null),
        "listeners": ok(c, "nvmf_subsystem_get_listeners", json!({"nqn": NQN})),
    })
}

fn saved_config(c: &mut Control) -> Value {
    json!({"subsystems": [
        {"subsystem": "bdev", "config": ok(c, "framework_get_config", json!({"name": "bdev"}))},
        {"subsystem": "nvmf", "config": ok(c, "framework_get_config", json!({"name": "nvmf"}))},
    ]})
}

const NQN: &str = "nqn.2016-06.io.spdk:ana";
const PLAIN: &str = "nqn.2016-06.io.spdk:plain";
const PARAMS: i32 = RpcError::INVALID_PARAMS;

fn port(svc: &str) -> Value {
    json!({"trtype": "LOOPBACK", "adrfam": "INTRA_HOST", "traddr": "local", "trsvcid": svc})
}

/// A control plane with the loopback transport and 64-block malloc bdevs `names`.
fn with_bdevs(names: &[&str]) -> Control {
    let mut c = control();
    ok(
        &mut c,
        "nvmf_create_transport",
        json!({"trtype": "LOOPBACK"}),
    );
    for name in names {
        ok(
            &mut c,
            "bdev_malloc_create",
            json!({"name": name, "num_blocks": 64, "block_size": 512}),
        );
    }
    c
}

/// An ANA-reporting subsystem limited to 4 namespaces: namespace 1 in group 1 (the default),
/// namespace 2 in group 3; listener A (port 1) optimized, B (port 2) created non-optimized.
/// And a subsystem without ANA reporting.
fn setup() -> Control {
    let mut c = with_bdevs(&["Malloc0", "Malloc1", "Malloc2"]);
    ok(
        &mut c,
        "nvmf_create_subsystem",
        json!({"nqn": NQN, "allow_any_host": true, "ana_reporting": true, "max_namespaces": 4}),
    );
    ok(
        &mut c,
        "nvmf_subsystem_add_ns",
        json!({"nqn": NQN, "namespace": {"bdev_name": "Malloc0"}}),
    );
    ok(
        &mut c,
        "nvmf_subsystem_add_ns",
        json!({"nqn": NQN, "namespace": {"bdev_name": "Malloc1", "anagrpid": 3}}),
    );
    ok(
        &mut c,
        "nvmf_subsystem_add_listener",
        json!({"nqn": NQN, "listen_address": port("1")}),
    );
    ok(
        &mut c,
        "nvmf_subsystem_add_listener",
        json!({"nqn": NQN, "listen_address": port("2"), "ana_state": "non_optimized"}),
    );
    ok(&mut c, "nvmf_create_subsystem", json!({"nqn": PLAIN}));
    ok(
        &mut c,
        "nvmf_subsystem_add_ns",
        json!({"nqn": PLAIN, "namespace": {"bdev_name": "Malloc2"}}),
    );
    ok(
        &mut c,
        "nvmf_subsystem_add_listener",
        json!({"nqn": PLAIN, "listen_address": port("1")}),
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

fn states(c: &mut Control, svc: &str) -> Vec<(u64, String)> {
    let listeners = ok(c, "nvmf_subsystem_get_listeners", json!({"nqn": NQN}));
    let l = listeners
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["address"]["trsvcid"] == svc)
        .unwrap_or_else(|| panic!("no listener {svc} in {listeners}"));
    l["ana_states"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["ana_group"].as_u64().unwrap(),
                s["ana_state"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn expect_states(c: &mut Control, svc: &str, want: [&str; 4]) {
    let want: Vec<(u64, String)> = (1..=4).zip(want.map(String::from)).collect();
    assert_eq!(states(c, svc), want, "listener {svc}");
}

#[test]
fn listeners_show_every_groups_state_in_spdks_layout() {
    let mut c = setup();
    let listeners = ok(&mut c, "nvmf_subsystem_get_listeners", json!({"nqn": NQN}));
    assert_eq!(
        listeners[0],
        json!({
            "address": {"trtype": "LOOPBACK", "adrfam": "INTRA_HOST", "traddr": "local", "trsvcid": "1"},
            "ana_states": [
                {"ana_group": 1, "ana_state": "optimized"},
                {"ana_group": 2, "ana_state": "optimized"},
                {"ana_group": 3, "ana_state": "optimized"},
                {"ana_group": 4, "ana_state": "optimized"},
            ],
        })
    );
    expect_states(&mut c, "2", ["non_optimized"; 4]);
    // Without ANA reporting: the address alone, as SPDK.
    assert_eq!(
        ok(
            &mut c,
            "nvmf_subsystem_get_listeners",
            json!({"nqn": PLAIN})
        ),
        json!([{"address": port("1")}])
    );
}

#[test]
fn namespaces_show_their_group_only_with_ana_reporting() {
    let mut c = setup();
    let subs = ok(&mut c, "nvmf_get_subsystems", Value::Null);
    let find = |nqn: &str| {
        subs.as_array()
            .unwrap()
            .iter()
            .find(|s| s["nqn"] == nqn)
            .unwrap()
            .clone()
    };
    let ana = find(NQN);
    let groups: Vec<_> = ana["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["nsid"].clone(), n["anagrpid"].clone()))
        .collect();
    assert_eq!(groups, [(json!(1), json!(1)), (json!(2), json!(3))]);
    let plain = find(PLAIN);
    assert!(plain["namespaces"][0].get("anagrpid").is_none(), "{plain}");
}

#[test]
fn set_ana_state_per_group_and_for_all_groups() {
    let mut c = setup();
    let set = |svc: &str, state: &str, grp: Option<u32>| {
        let mut p = json!({"nqn": NQN, "listen_address": port(svc), "ana_state": state});
        if let Some(g) = grp {
            p["anagrpid"] = json!(g);
        }
        p
    };
    let m = "nvmf_subsystem_listener_set_ana_state";
    assert_eq!(
        ok(&mut c, m, set("1", "inaccessible", Some(3))),
        json!(true)
    );
    expect_states(
        &mut c,
        "1",
        ["optimized", "optimized", "inaccessible", "optimized"],
    );
    expect_states(&mut c, "2", ["non_optimized"; 4]);
    ok(&mut c, m, set("1", "persistent_loss", Some(1)));
    ok(&mut c, m, set("1", "change", Some(4)));
    expect_states(
        &mut c,
        "1",
        ["persistent_loss", "optimized", "inaccessible", "change"],
    );
    // No anagrpid (or 0, rpc.py's "not given"): every group.
    ok(&mut c, m, set("1", "non_optimized", None));
    expect_states(&mut c, "1", ["non_optimized"; 4]);
    ok(&mut c, m, set("1", "optimized", Some(0)));
    expect_states(&mut c, "1", ["optimized"; 4]);
    // The same state again is no error.
    ok(&mut c, m, set("1", "optimized", Some(2)));
    let sub = c.target.subsystem(NQN).unwrap();
    let b = crate::core::subsystem::ListenAddress {
        trtype: "LOOPBACK".into(),
        adrfam: "INTRA_HOST".into(),
        traddr: "local".into(),
        trsvcid: "2".into(),
    };
    assert_eq!(sub.ns_ana_state(Some(&b), 2), AnaState::NON_OPTIMIZED);
}

#[test]
fn set_ana_state_errors() {
    let mut c = setup();
    let m = "nvmf_subsystem_listener_set_ana_state";
    refused(
        &mut c,
        m,
        json!({"nqn": "nqn.2016-06.io.spdk:nope", "listen_address": port("1"), "ana_state": "optimized"}),
        PARAMS,
        "Subsystem with NQN 'nqn.2016-06.io.spdk:nope' not found",
    );
    refused(
        &mut c,
        m,
        json!({"nqn": PLAIN, "listen_address": port("1"), "ana_state": "inaccessible"}),
        PARAMS,
        "ANA reporting is disabled",
    );
    refused(
        &mut c,
        m,
        json!({"nqn": NQN, "listen_address": port("9"), "ana_state": "inaccessible"}),
        PARAMS,
        "not found",
    );
    refused(
        &mut c,
        m,
        json!({"nqn": NQN, "listen_address": port("1"), "ana_state": "Optimized"}),
        PARAMS,
        "ana_state",
    );
    refused(
        &mut c,
        m,
        json!({"nqn": NQN, "listen_address": port("1"), "ana_state": "inaccessible", "anagrpid": 5}),
        PARAMS,
        "anagrpid 5",
    );
    refused(
        &mut c,
        m,
        json!({"nqn": NQN, "listen_address": port("1")}),
        PARAMS,
        "ana_state",
    );
    refused(
        &mut c,
        "nvmf_subsystem_add_listener",
        json!({"nqn": NQN, "listen_address": port("3"), "ana_state": "broken"}),
        PARAMS,
        "ana_state",
    );
}

#[test]
fn set_ns_ana_group_moves_a_namespace_and_checks_its_arguments() {
    let mut c = setup();
    let m = "nvmf_subsystem_set_ns_ana_group";
    assert_eq!(
        ok(&mut c, m, json!({"nqn": NQN, "nsid": 1, "anagrpid": 4})),
        json!(true)
    );
    assert_eq!(c.target.subsystem(NQN).unwrap().anagrpid(1), 4);
    refused(
        &mut c,
        m,
        json!({"nqn": "nqn.2016-06.io.spdk:nope", "nsid": 1, "anagrpid": 2}),
        PARAMS,
        "not found",
    );
    refused(
        &mut c,
        m,
        json!({"nqn": NQN, "nsid": 3, "anagrpid": 2}),
        PARAMS,
        "NSID 3",
    );
    refused(
        &mut c,
        m,
        json!({"nqn": NQN, "nsid": 1, "anagrpid": 0}),
        PARAMS,
        "anagrpid 0",
    );
    refused(
        &mut c,
        m,
        json!({"nqn": NQN, "nsid": 1, "anagrpid": 5}),
        PARAMS,
        "anagrpid 5",
    );
    refused(
        &mut c,
        m,
        json!({"nqn": NQN, "nsid": 1}),
        PARAMS,
        "anagrpid",
    );
    // add_ns: a group above the subsystem's NSID bound is refused, as SPDK.
    let err = dispatch(
        &mut c,
        "nvmf_subsystem_add_ns",
        Some(json!({"nqn": NQN, "namespace": {"bdev_name": "Malloc2", "anagrpid": 5}})),
    )
    .unwrap_err();
    assert!(err.message.contains("anagrpid 5"), "{err}");
}

#[test]
fn saved_config_round_trips_groups_and_listener_states() {
    let mut c = setup();
    let m = "nvmf_subsystem_listener_set_ana_state";
    ok(
        &mut c,
        m,
        json!({"nqn": NQN, "listen_address": port("1"), "ana_state": "inaccessible", "anagrpid": 3}),
    );
    ok(
        &mut c,
        m,
        json!({"nqn": NQN, "listen_address": port("2"), "ana_state": "change", "anagrpid": 1}),
    );
    ok(
        &mut c,
        "nvmf_subsystem_set_ns_ana_group",
        json!({"nqn": NQN, "nsid": 1, "anagrpid": 2}),
    );
    let config = saved_config(&mut c);
    let nvmf = config["subsystems"][1]["config"]
        .as_array()
        .unwrap()
        .clone();
    let of = |method: &str, nqn: &str| -> Vec<Value> {
        nvmf.iter()
            .filter(|e| e["method"] == method && e["params"]["nqn"] == nqn)
            .map(|e| e["params"].clone())
            .collect()
    };
    // SPDK's entries: ana_reporting on creation, anagrpid on every namespace of it.
    assert_eq!(
        of("nvmf_create_subsystem", NQN)[0]["ana_reporting"],
        json!(true)
    );
    assert_eq!(
        of("nvmf_create_subsystem", PLAIN)[0]["ana_reporting"],
        json!(false)
    );
    let groups: Vec<_> = of("nvmf_subsystem_add_ns", NQN)
        .iter()
        .map(|p| p["namespace"]["anagrpid"].clone())
        .collect();
    assert_eq!(groups, [json!(2), json!(3)]);
    assert!(of("nvmf_subsystem_add_ns", PLAIN)[0]["namespace"]
        .get("anagrpid")
        .is_none());
    // A listener's common state on its add_listener entry, exceptions after the namespaces.
    let listeners = of("nvmf_subsystem_add_listener", NQN);
    assert!(listeners[0].get("ana_state").is_none(), "{}", listeners[0]);
    assert_eq!(listeners[1]["ana_state"], json!("non_optimized"));
    let last_ns = nvmf
        .iter()
        .rposition(|e| e["method"] == "nvmf_subsystem_add_ns" && e["params"]["nqn"] == NQN)
        .unwrap();
    let first_state = nvmf
        .iter()
        .position(|e| e["method"] == m)
        .expect("set_ana_state entries");
    assert!(first_state > last_ns);
    assert_eq!(
        of(m, NQN),
        [
            json!({"nqn": NQN, "listen_address": port("1"), "ana_state": "inaccessible", "anagrpid": 3}),
            json!({"nqn": NQN, "listen_address": port("2"), "ana_state": "change", "anagrpid": 1}),
        ]
    );

    let mut fresh = control();
    load_config(&mut fresh, &config).unwrap();
    assert_eq!(snapshot(&mut fresh), snapshot(&mut c));
    assert_eq!(saved_config(&mut fresh), config);
    expect_states(
        &mut fresh,
        "1",
        ["optimized", "optimized", "inaccessible", "optimized"],
    );
    expect_states(
        &mut fresh,
        "2",
        ["change", "non_optimized", "non_optimized", "non_optimized"],
    );
}

/// An ANA subsystem that may hold billions of namespaces (ANAGRPMAX follows the highest
/// NSID): `nvmf_subsystem_get_listeners` lists the first 1,024 groups, then only the groups
/// in use, instead of building an entry for each of four billion possible groups.
#[test]
fn listeners_of_a_subsystem_with_billions_of_groups_list_what_is_used() {
    let mut c = with_bdevs(&["Malloc0"]);
    let big = "nqn.2016-06.io.spdk:big";
    ok(
        &mut c,
        "nvmf_create_subsystem",
        json!({"nqn": big, "ana_reporting": true, "max_namespaces": 4_294_967_294u32}),
    );
    ok(
        &mut c,
        "nvmf_subsystem_add_ns",
        json!({"nqn": big, "namespace": {"bdev_name": "Malloc0", "nsid": 4_000_000_000u32}}),
    );
    ok(
        &mut c,
        "nvmf_subsystem_add_listener",
        json!({"nqn": big, "listen_address": port("1")}),
    );
    ok(
        &mut c,
        "nvmf_subsystem_listener_set_ana_state",
        json!({"nqn": big, "listen_address": port("1"), "ana_state": "inaccessible", "anagrpid": 3_000_000_000u32}),
    );
    let listeners = ok(&mut c, "nvmf_subsystem_get_listeners", json!({"nqn": big}));
    let states = listeners[0]["ana_states"].as_array().unwrap();
    assert_eq!(states.len(), 1024 + 2);
    assert_eq!(states[1023]["ana_group"], 1024);
    assert_eq!(
        states[1024],
        json!({"ana_group": 3_000_000_000u32, "ana_state": "inaccessible"})
    );
    assert_eq!(
        states[1025],
        json!({"ana_group": 4_000_000_000u32, "ana_state": "optimized"})
    );
}

/// An ANA subsystem without a namespace limit, whose group ids are bounded by its highest
/// NSID: namespace 1 in the group of namespace 40 saves and loads (the higher NSID is added
/// first), and a listener's state for group 50 goes with the namespace that made group 50
/// possible, instead of being saved where it cannot load.
#[test]
fn saved_ana_groups_of_high_nsids_load_again() {
    let mut c = with_bdevs(&["Malloc0", "Malloc1", "Malloc2"]);
    let open = "nqn.2016-06.io.spdk:open";
    ok(
        &mut c,
        "nvmf_create_subsystem",
        json!({"nqn": open, "ana_reporting": true}),
    );
    ok(
        &mut c,
        "nvmf_subsystem_add_listener",
        json!({"nqn": open, "listen_address": port("1")}),
    );
    for (bdev, nsid) in [("Malloc0", 40), ("Malloc1", 1), ("Malloc2", 50)] {
        ok(
            &mut c,
            "nvmf_subsystem_add_ns",
            json!({"nqn": open, "namespace": {"bdev_name": bdev, "nsid": nsid}}),
        );
    }
    ok(
        &mut c,
        "nvmf_subsystem_set_ns_ana_group",
        json!({"nqn": open, "nsid": 1, "anagrpid": 40}),
    );
    ok(
        &mut c,
        "nvmf_subsystem_listener_set_ana_state",
        json!({"nqn": open, "listen_address": port("1"), "ana_state": "inaccessible", "anagrpid": 50}),
    );
    ok(
        &mut c,
        "nvmf_subsystem_remove_ns",
        json!({"nqn": open, "nsid": 50}),
    );
    let config = saved_config(&mut c);
    let mut fresh = control();
    load_config(&mut fresh, &config).unwrap();
    assert_eq!(saved_config(&mut fresh), config);
    let listeners = ok(
        &mut fresh,
        "nvmf_subsystem_get_listeners",
        json!({"nqn": open}),
    );
    let states = listeners[0]["ana_states"].as_array().unwrap();
    assert_eq!(states.len(), 40, "groups 1..=40: {states:?}");
    assert!(states.iter().all(|s| s["ana_state"] == "optimized"));
}
