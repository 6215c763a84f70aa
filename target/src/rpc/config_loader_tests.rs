//! SPDK saved configs (one per release, written in the shape each release's `nvmf_tgt` saves)
//! start the target; sections and entries are skipped, run or refused per the loader's rules.

use std::path::PathBuf;

use nvmf_rpc::RpcError;
use serde_json::{json, Value};

use super::config_loader::skipped_settings_are_not_registered;
use super::tests::{control, ok, saved_config, snapshot};
use super::*;

const NQN1: &str = "nqn.2016-06.io.spdk:cnode1";
const NQN2: &str = "nqn.2016-06.io.spdk:cnode2";
const DISCOVERY: &str = "nqn.2014-08.org.nvmexpress.discovery";
const HOST1: &str = "nqn.2014-08.org.nvmexpress:uuid:7a4f1e52-93c1-4a0e-b7de-3f60c2a1d001";
const HOST2: &str = "nqn.2014-08.org.nvmexpress:uuid:7a4f1e52-93c1-4a0e-b7de-3f60c2a1d002";

/// The backing file of the fixtures' `bdev_aio_create` (they name `/var/tmp/aio0.img`).
struct AioFile(PathBuf);

impl AioFile {
    fn new() -> Self {
        use std::sync::atomic::{AtomicU32, Ordering};
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "spdk-config-aio-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::File::create(&path)
            .and_then(|f| f.set_len(1 << 20))
            .unwrap();
        Self(path)
    }
}

impl Drop for AioFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Every `{"method", "params"}` of a config, batch items included.
fn calls_mut(config: &mut Value) -> Vec<&mut Value> {
    let mut out = Vec::new();
    for sub in config["subsystems"].as_array_mut().unwrap() {
        if let Some(entries) = sub["config"].as_array_mut() {
            for entry in entries {
                match entry {
                    Value::Array(items) => out.extend(items.iter_mut()),
                    call => out.push(call),
                }
            }
        }
    }
    out
}

/// Fixture `release`, its AIO bdev pointed at `aio`.
fn fixture(release: &str, aio: &AioFile) -> Value {
    let path = format!(
        "{}/tests/data/spdk-configs/nvmf_tgt-{release}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut config: Value = serde_json::from_str(&text).unwrap();
    for call in calls_mut(&mut config) {
        if call["method"] == "bdev_aio_create" {
            call["params"]["filename"] = json!(aio.0.to_str().unwrap());
        }
    }
    config
}

fn subsystem<'a>(subsystems: &'a Value, nqn: &str) -> &'a Value {
    subsystems
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["nqn"] == nqn)
        .unwrap_or_else(|| panic!("{nqn} missing from {subsystems}"))
}

fn listeners(s: &Value) -> Vec<(String, String, String)> {
    let mut out: Vec<_> = s["listen_addresses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["trtype"].as_str().unwrap().to_uppercase(),
                a["traddr"].as_str().unwrap().to_string(),
                a["trsvcid"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    out.sort();
    out
}

fn namespaces(s: &Value) -> Vec<(u64, String)> {
    s["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["nsid"].as_u64().unwrap(),
                n["bdev_name"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn listener(svc: &str) -> (String, String, String) {
    ("RDMA".into(), "192.168.100.8".into(), svc.into())
}

/// What every fixture describes.
fn check_loaded(c: &mut Control, release: &str) {
    let subs = ok(c, "nvmf_get_subsystems", Value::Null);
    assert_eq!(subs.as_array().unwrap().len(), 3, "{release}: {subs}");
    let disc = subsystem(&subs, DISCOVERY);
    assert_eq!(listeners(disc), [listener("8009")], "{release}");
    let s1 = subsystem(&subs, NQN1);
    assert_eq!(s1["allow_any_host"], false, "{release}");
    assert_eq!(s1["serial_number"], "SPDK00000000000001", "{release}");
    assert_eq!(s1["model_number"], "SPDK bdev Controller", "{release}");
    assert_eq!(listeners(s1), [listener("4420")], "{release}");
    let hosts: Vec<&str> = s1["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["nqn"].as_str().unwrap())
        .collect();
    assert_eq!(hosts, [HOST1, HOST2], "{release}");
    assert_eq!(
        namespaces(s1),
        [(1, "Malloc0".to_string()), (2, "Null0".to_string())],
        "{release}"
    );
    assert_eq!(
        s1["namespaces"][0]["uuid"], "3c1f0b2a-5d6e-4f70-8a91-b2c3d4e5f601",
        "{release}"
    );
    let s2 = subsystem(&subs, NQN2);
    assert_eq!(s2["allow_any_host"], true, "{release}");
    assert_eq!(listeners(s2), [listener("4421")], "{release}");
    assert_eq!(namespaces(s2), [(1, "AIO0".to_string())], "{release}");
    let transports = ok(c, "nvmf_get_transports", Value::Null);
    assert_eq!(transports.as_array().unwrap().len(), 1, "{release}");
    assert_eq!(transports[0]["trtype"], "RDMA", "{release}");
    assert_eq!(transports[0]["max_queue_depth"], 128, "{release}");
    assert_eq!(c.max_subsystems, 1024, "{release}");
}

/// Loads fixture `release` running and waiting for RPC, checks the target, and round-trips our
/// own save_config of it.
fn load_release(release: &str) {
    for waiting in [false, true] {
        let aio = AioFile::new();
        let config = fixture(release, &aio);
        let mut c = control();
        if waiting {
            c.init_state = InitState::WaitingForRpc;
        }
        let report = load_config_with(&mut c, &config, LoadOptions::default())
            .unwrap_or_else(|e| panic!("{release} (wait-for-rpc {waiting}): {e}"));
        assert_eq!(c.init_state, InitState::Running);
        assert!(report.skipped.is_empty() && report.ignored.is_empty());
        check_loaded(&mut c, release);

        // What we save from it reloads to the same target (our own round trip).
        let saved = saved_config(&mut c);
        let mut fresh = control();
        load_config(&mut fresh, &saved).unwrap_or_else(|e| panic!("{release}: {e}"));
        assert_eq!(snapshot(&mut fresh), snapshot(&mut c), "{release}");
    }
}

#[test]
fn spdk_25_saved_configs_load() {
    for release in ["25.5", "25.9"] {
        load_release(release);
    }
}

/// SPDK 26.x saves `kas`/`min_kato` (honoured: transport::options) and the subsystem size
/// limits at 0 (`max_discard_size_kib`/`max_write_zeroes_size_kib` in 26.01, `dmrsl`/`wzsl`
/// after).
#[test]
fn spdk_26_saved_configs_load() {
    for release in ["26.1", "26.5", "26.9", "26.9-batches"] {
        load_release(release);
    }
}

/// The 26.9 fixture with and without batches is the same set of calls in the same order.
#[test]
fn batched_fixture_flattens_to_the_plain_one() {
    let aio = AioFile::new();
    let mut batched = fixture("26.9-batches", &aio);
    let mut plain = fixture("26.9", &aio);
    let batched: Vec<Value> = calls_mut(&mut batched)
        .into_iter()
        .map(|v| v.clone())
        .collect();
    let plain: Vec<Value> = calls_mut(&mut plain)
        .into_iter()
        .map(|v| v.clone())
        .collect();
    assert_eq!(batched, plain);
    let with_arrays = fixture("26.9-batches", &aio)["subsystems"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["config"].as_array().cloned().unwrap_or_default())
        .filter(Value::is_array)
        .count();
    assert_eq!(
        with_arrays, 5,
        "create, hosts, namespaces, ns hosts (empty), listeners"
    );
}

fn entry(e: &ConfigError) -> (&str, usize, Option<usize>, &str, &RpcError) {
    match e {
        ConfigError::Entry {
            subsystem,
            index,
            batch_item,
            method,
            error,
        } => (subsystem, *index, *batch_item, method, error),
        other => panic!("not an entry error: {other}"),
    }
}

/// A small config in SPDK's shape that needs none of the newer params.
fn base_config() -> Value {
    json!({"subsystems": [
        {"subsystem": "keyring", "config": [{"method": "keyring_linux_set_options", "params": {"enable": false}}]},
        {"subsystem": "vmd", "config": []},
        {"subsystem": "bdev", "config": [
            {"method": "bdev_raid_set_options", "params": {"process_window_size_kb": 1024, "process_max_bandwidth_mb_sec": 0}},
            {"method": "bdev_iscsi_set_options", "params": {"timeout_sec": 30}},
            {"method": "bdev_malloc_create", "params": {"name": "Malloc0", "num_blocks": 64, "block_size": 512}},
            {"method": "bdev_malloc_create", "params": {"name": "Malloc1", "num_blocks": 64, "block_size": 512}},
            {"method": "bdev_wait_for_examine"}
        ]},
        {"subsystem": "nbd", "config": []},
        {"subsystem": "nvmf", "config": [
            {"method": "nvmf_create_transport", "params": {"trtype": "RDMA"}},
            {"method": "nvmf_create_subsystem", "params": {"nqn": NQN1}},
            {"method": "nvmf_subsystem_add_ns", "params": {"nqn": NQN1, "namespace": {"bdev_name": "Malloc0"}}}
        ]}
    ]})
}

fn push_section(config: &mut Value, section: Value) {
    config["subsystems"].as_array_mut().unwrap().push(section);
}

fn insert_entry(config: &mut Value, subsystem: &str, at: usize, e: Value) {
    let subs = config["subsystems"].as_array_mut().unwrap();
    let s = subs
        .iter_mut()
        .find(|s| s["subsystem"] == subsystem)
        .unwrap();
    s["config"].as_array_mut().unwrap().insert(at, e);
}

#[test]
fn creators_of_things_not_served_fail_before_anything_runs() {
    let cases = [
        (
            "bdev",
            json!({"method": "bdev_nvme_attach_controller", "params": {"name": "Nvme0", "trtype": "PCIe", "traddr": "0000:5e:00.0"}}),
        ),
        (
            "bdev",
            json!({"method": "bdev_lvol_create_lvstore", "params": {"bdev_name": "Malloc0", "lvs_name": "lvs0"}}),
        ),
        (
            "keyring",
            json!({"method": "keyring_file_add_key", "params": {"name": "key0", "path": "/tmp/psk"}}),
        ),
        (
            "bdev",
            json!({"method": "bdev_raid_create", "params": {"name": "Raid0", "raid_level": "raid0", "strip_size_kb": 64, "base_bdevs": ["Malloc0"]}}),
        ),
    ];
    for (sub, bad) in cases {
        let method = bad["method"].as_str().unwrap().to_string();
        let mut config = base_config();
        insert_entry(&mut config, sub, 1, bad);
        let mut c = control();
        let e = load_config(&mut c, &config).unwrap_err();
        let (s, index, item, m, error) = entry(&e);
        assert_eq!((s, index, item, m), (sub, 1, None, method.as_str()), "{e}");
        assert_eq!(error.code, RpcError::METHOD_NOT_FOUND);
        assert!(e.to_string().contains(&method), "{e}");
        // Refused before the first entry ran.
        assert_eq!(
            ok(&mut c, "bdev_get_bdevs", Value::Null),
            json!([]),
            "{method}"
        );
    }

    // A section of a subsystem nvmf_tgt does not link: its creators fail too.
    for (sub, method) in [
        ("iscsi", "iscsi_create_target_node"),
        ("ublk", "ublk_start_disk"),
        ("vhost_blk", "vhost_create_blk_controller"),
        ("fsdev", "fsdev_aio_create"),
        ("nothing_like_it", "something_set_options"),
    ] {
        let mut config = base_config();
        push_section(
            &mut config,
            json!({"subsystem": sub, "config": [{"method": method, "params": {}}]}),
        );
        let e = load_config(&mut control(), &config).unwrap_err();
        assert_eq!(entry(&e).0, sub);
        assert_eq!(entry(&e).3, method);
        assert!(e.to_string().contains(sub), "{e}");
    }
}

#[test]
fn settings_of_absent_subsystems_are_skipped_with_a_notice() {
    assert!(skipped_settings_are_not_registered());
    let mut config = base_config();
    push_section(
        &mut config,
        json!({"subsystem": "fsdev", "config": [{"method": "fsdev_set_opts", "params": {"fsdev_io_pool_size": 65535, "fsdev_io_cache_size": 256}}]}),
    );
    push_section(
        &mut config,
        json!({"subsystem": "iscsi", "config": [{"method": "iscsi_set_options", "params": {"node_base": "iqn.2016-06.io.spdk", "max_sessions": 128}}]}),
    );
    for empty in ["scsi", "vhost_scsi", "vfio_user_target", "unheard_of"] {
        push_section(&mut config, json!({"subsystem": empty, "config": []}));
    }
    let mut c = control();
    let report = load_config_with(&mut c, &config, LoadOptions::default()).unwrap();
    assert_eq!(
        report.skipped,
        [
            ("fsdev".to_string(), "fsdev_set_opts".to_string()),
            ("iscsi".to_string(), "iscsi_set_options".to_string())
        ]
    );
    let subs = ok(&mut c, "nvmf_get_subsystems", Value::Null);
    assert_eq!(namespaces(subsystem(&subs, NQN1)), [(1, "Malloc0".into())]);
    // A setting registered here is run, not skipped, in any section, and refuses what it must.
    let mut config = base_config();
    insert_entry(
        &mut config,
        "bdev",
        0,
        json!({"method": "bdev_raid_set_options", "params": {"process_window_size": 1}}),
    );
    let e = load_config(&mut control(), &config).unwrap_err();
    assert_eq!(entry(&e).4.code, RpcError::INVALID_PARAMS, "{e}");
    assert!(e.to_string().contains("process_window_size"), "{e}");
}

#[test]
fn batches_run_in_order_as_one_unit() {
    let batch = json!([
        {"method": "nvmf_create_subsystem", "params": {"nqn": NQN2, "allow_any_host": true}},
        {"method": "nvmf_subsystem_add_ns", "params": {"nqn": NQN2, "namespace": {"bdev_name": "Malloc1", "nsid": 7}}},
        {"method": "nvmf_subsystem_add_listener", "params": {"nqn": NQN2, "listen_address": {"trtype": "RDMA", "adrfam": "IPv4", "traddr": "10.0.0.1", "trsvcid": "4420"}}}
    ]);
    for waiting in [false, true] {
        let mut config = base_config();
        insert_entry(&mut config, "nvmf", 1, batch.clone());
        insert_entry(&mut config, "nvmf", 2, json!([]));
        // A batch of settings allowed before init runs in the first pass.
        insert_entry(
            &mut config,
            "bdev",
            0,
            json!([{"method": "bdev_set_options", "params": {"bdev_auto_examine": true}},
                   {"method": "bdev_nvme_set_hotplug", "params": {"enable": false}}]),
        );
        let mut c = control();
        if waiting {
            c.init_state = InitState::WaitingForRpc;
        }
        let report = load_config_with(&mut c, &config, LoadOptions::default()).unwrap();
        // keyring 1, bdev 2 + 5, nvmf 3 + 3 calls, plus framework_start_init when waiting.
        assert_eq!(report.applied, 14 + usize::from(waiting));
        let subs = ok(&mut c, "nvmf_get_subsystems", Value::Null);
        let s2 = subsystem(&subs, NQN2);
        assert_eq!(namespaces(s2), [(7, "Malloc1".into())]);
        assert_eq!(
            listeners(s2),
            [("RDMA".into(), "10.0.0.1".into(), "4420".into())]
        );
    }

    // An item that fails is named by its place in the batch; items before it stay applied.
    let mut config = base_config();
    let mut bad = batch.clone();
    bad[1]["params"]["namespace"]["bdev_name"] = json!("NoSuchBdev");
    insert_entry(&mut config, "nvmf", 3, bad);
    let mut c = control();
    let e = load_config(&mut c, &config).unwrap_err();
    assert_eq!(
        (entry(&e).0, entry(&e).1, entry(&e).2, entry(&e).3),
        ("nvmf", 3, Some(1), "nvmf_subsystem_add_ns")
    );
    assert!(e.to_string().contains("batch item 1"), "{e}");
    let subs = ok(&mut c, "nvmf_get_subsystems", Value::Null);
    assert!(subs.as_array().unwrap().iter().any(|s| s["nqn"] == NQN2));

    // An unknown method inside a batch is refused before anything runs.
    let mut config = base_config();
    let mut bad = batch.clone();
    bad.as_array_mut()
        .unwrap()
        .push(json!({"method": "bdev_nvme_attach_controller", "params": {"name": "Nvme0"}}));
    insert_entry(&mut config, "nvmf", 3, bad);
    let mut c = control();
    let e = load_config(&mut c, &config).unwrap_err();
    assert_eq!(entry(&e).2, Some(3));
    assert_eq!(ok(&mut c, "bdev_get_bdevs", Value::Null), json!([]));

    // A batch needing both states cannot run (SPDK: incompatible state requirements).
    let mut config = base_config();
    insert_entry(
        &mut config,
        "nvmf",
        0,
        json!([{"method": "framework_start_init"}, {"method": "nvmf_get_stats"}]),
    );
    let e = load_config(&mut control(), &config).unwrap_err();
    assert!(e.to_string().contains("batch mixes"), "{e}");

    // A batch item without a method is a malformed file.
    let mut config = base_config();
    insert_entry(&mut config, "nvmf", 0, json!([{"params": {}}]));
    assert!(matches!(
        load_config(&mut control(), &config),
        Err(ConfigError::Format(m)) if m.contains("batch item 0")
    ));
}

#[test]
fn ignore_errors_logs_and_goes_on() {
    let mut config = base_config();
    insert_entry(
        &mut config,
        "bdev",
        0,
        json!({"method": "bdev_nvme_attach_controller", "params": {"name": "Nvme0"}}),
    );
    insert_entry(
        &mut config,
        "nvmf",
        1,
        json!({"method": "nvmf_set_crdt", "params": {"crdt1": 5}}),
    );
    push_section(
        &mut config,
        json!({"subsystem": "iscsi", "config": [{"method": "iscsi_create_portal_group", "params": {"tag": 1}}]}),
    );
    // Without the option the first one stops the load.
    assert!(load_config(&mut control(), &config).is_err());

    let mut c = control();
    c.init_state = InitState::WaitingForRpc;
    let report = load_config_with(
        &mut c,
        &config,
        LoadOptions {
            ignore_errors: true,
        },
    )
    .unwrap();
    let methods: Vec<&str> = report.ignored.iter().map(|e| entry(e).3).collect();
    assert_eq!(
        methods,
        [
            "bdev_nvme_attach_controller",
            "iscsi_create_portal_group",
            "nvmf_set_crdt"
        ]
    );
    assert_eq!(c.init_state, InitState::Running);
    let subs = ok(&mut c, "nvmf_get_subsystems", Value::Null);
    assert_eq!(namespaces(subsystem(&subs, NQN1)), [(1, "Malloc0".into())]);
    // A malformed file still stops it.
    assert!(matches!(
        load_config_with(
            &mut control(),
            &json!({"subsystems": {}}),
            LoadOptions {
                ignore_errors: true
            }
        ),
        Err(ConfigError::Format(_))
    ));
}

/// The new option methods refuse unknown params by name, and SPDK's saved values pass.
#[test]
fn new_option_methods_check_their_params() {
    let mut c = control();
    for (method, good, bad) in [
        (
            "bdev_raid_set_options",
            json!({"process_window_size_kb": 1024, "process_max_bandwidth_mb_sec": 0}),
            json!({"process_window_size_kb": "x"}),
        ),
        (
            "bdev_iscsi_set_options",
            json!({"timeout_sec": 30}),
            json!({"timeout": 30}),
        ),
        (
            "keyring_linux_set_options",
            json!({"enable": true}),
            json!({"enable": 1}),
        ),
    ] {
        assert_eq!(ok(&mut c, method, good), json!(true));
        assert_eq!(ok(&mut c, method, Value::Null), json!(true));
        let e = dispatch(&mut c, method, Some(bad.clone())).unwrap_err();
        assert_eq!(e.code, RpcError::INVALID_PARAMS, "{method} {bad}: {e}");
    }
}
