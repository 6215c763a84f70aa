//! The statistics, log and application methods (stats.rs, log.rs, app.rs): SPDK's layouts,
//! counters that move after a host's I/O, filters that change the running subscriber.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nvmf_common::spec::command::Command;
use nvmf_common::spec::fabrics::{ConnectCommand, ConnectData, PropertySetCommand, CNTLID_DYNAMIC};
use nvmf_common::spec::registers::{Cc, Property};
use nvmf_common::spec::sgl::SglDescriptor;
use nvmf_common::spec::Status;
use nvmf_rpc::RpcError;
use serde_json::{json, Value};
use zerocopy::IntoBytes;

use super::app::KillSignal;
use super::*;
use crate::core::TargetInfo;
use crate::metrics::ReactorCounters;
use crate::reactor::{start_reactors, stop_reactors};
use crate::transport::loopback::{Capsule, LoopbackHostQueue, LoopbackTransport, LOOPBACK_LIMITS};

const NQN: &str = "nqn.2016-06.io.spdk:stats";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555";
const PARAMS: i32 = RpcError::INVALID_PARAMS;

fn call(c: &mut Control, method: &str, params: Value) -> Result<Value, RpcError> {
    let params = if params.is_null() { None } else { Some(params) };
    dispatch(c, method, params)
}

#[track_caller]
fn ok(c: &mut Control, method: &str, params: Value) -> Value {
    call(c, method, params.clone()).unwrap_or_else(|e| panic!("{method} {params}: {e}"))
}

#[track_caller]
fn fails(c: &mut Control, method: &str, params: Value, code: i32, needle: &str) {
    let e = call(c, method, params.clone()).expect_err(&format!("{method} {params} must fail"));
    assert_eq!(e.code, code, "{method} {params}: {e}");
    assert!(e.message.contains(needle), "{method} {params}: {e}");
}

fn keys(v: &Value) -> Vec<&str> {
    v.as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"))
        .keys()
        .map(String::as_str)
        .collect()
}

#[track_caller]
fn assert_keys(v: &Value, expected: &[&str]) {
    let mut got = keys(v);
    got.sort_unstable();
    let mut want = expected.to_vec();
    want.sort_unstable();
    assert_eq!(got, want, "{v}");
}

/// A target on two real reactors with a loopback transport, Malloc0 in NQN.
struct Lab {
    control: Control,
    transport: LoopbackTransport,
    reactors: Vec<nvmf_common::reactor::Reactor>,
}

impl Lab {
    fn new() -> Self {
        let info = Arc::new(TargetInfo::default());
        let (reactors, handles) =
            start_reactors(&[0, 1], &info, nvmf_common::reactor::IdleMode::Adaptive).unwrap();
        let mut target = Target::new(info);
        for h in handles {
            target.add_poll_group(h);
        }
        let transport = LoopbackTransport::new(LOOPBACK_LIMITS);
        target.add_transport(Arc::new(transport.clone())).unwrap();
        let mut control = Control::new(
            target,
            Box::new(|o: &TransportOptions| Err(TransportError::UnsupportedType(o.trtype.clone()))),
        );
        control.reactors = reactors
            .iter()
            .map(|r| ReactorCounters {
                core: r.core,
                stats: Arc::clone(&r.stats),
            })
            .collect();
        let mut lab = Self {
            control,
            transport,
            reactors,
        };
        let c = &mut lab.control;
        ok(
            c,
            "bdev_malloc_create",
            json!({"name": "Malloc0", "num_blocks": 64, "block_size": 512}),
        );
        ok(
            c,
            "bdev_malloc_create",
            json!({"name": "Malloc1", "num_blocks": 64, "block_size": 512}),
        );
        ok(
            c,
            "nvmf_create_subsystem",
            json!({"nqn": NQN, "allow_any_host": true}),
        );
        ok(
            c,
            "nvmf_subsystem_add_ns",
            json!({"nqn": NQN, "namespace": {"bdev_name": "Malloc0"}}),
        );
        lab
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        stop_reactors(std::mem::take(&mut self.reactors));
    }
}

fn keyed(mut cmd: Command, host_buffer: Vec<u8>) -> Capsule {
    cmd.flags |= Command::FLAG_SGL;
    cmd.dptr = SglDescriptor::keyed(0x1000, host_buffer.len() as u32, 0x1234, false);
    Capsule { cmd, host_buffer }
}

fn run(q: &LoopbackHostQueue, capsule: Capsule) -> crate::transport::loopback::Response {
    q.submit(capsule);
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Some(r) = q.poll() {
            assert_eq!(r.cqe.status(), Status::SUCCESS, "{:?}", r.cqe);
            return r;
        }
        std::thread::yield_now();
    }
    panic!("no answer from the reactor");
}

fn connect(q: &LoopbackHostQueue, qid: u16, cntlid: u16) -> u16 {
    let cmd = ConnectCommand::new(1, qid, 31, 0).to_command();
    let data = ConnectData::new([0x11; 16], cntlid, NQN, HOST);
    let r = run(q, keyed(cmd, data.as_bytes().to_vec()));
    r.cqe.dw0.get() as u16
}

/// Polls `f` until it holds (counters a reactor publishes arrive a little later).
#[track_caller]
fn eventually(c: &mut Control, method: &str, params: Value, f: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v = ok(c, method, params.clone());
        if f(&v) {
            return v;
        }
        assert!(Instant::now() < deadline, "{method} never got there: {v}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn sum(groups: &Value, field: &str) -> u64 {
    groups
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            g[field]
                .as_u64()
                .unwrap_or_else(|| panic!("{field} in {g}"))
        })
        .sum()
}

const GROUP_FIELDS: &[&str] = &[
    "name",
    "admin_qpairs",
    "io_qpairs",
    "current_admin_qpairs",
    "current_io_qpairs",
    "current_unassociated_qpairs",
    "pending_bdev_io",
    "completed_nvme_io",
    "transports",
];

const IO_STAT_FIELDS: &[&str] = &[
    "bytes_read",
    "num_read_ops",
    "bytes_written",
    "num_write_ops",
    "bytes_unmapped",
    "num_unmap_ops",
    "bytes_copied",
    "num_copy_ops",
    "read_latency_ticks",
    "max_read_latency_ticks",
    "min_read_latency_ticks",
    "write_latency_ticks",
    "max_write_latency_ticks",
    "min_write_latency_ticks",
    "unmap_latency_ticks",
    "max_unmap_latency_ticks",
    "min_unmap_latency_ticks",
    "copy_latency_ticks",
    "max_copy_latency_ticks",
    "min_copy_latency_ticks",
    "io_error",
];

#[test]
fn nvmf_get_stats_and_bdev_get_iostat_count_a_hosts_io() {
    let mut lab = Lab::new();
    let c = &mut lab.control;

    let stats = ok(c, "nvmf_get_stats", Value::Null);
    assert_keys(&stats, &["tick_rate", "poll_groups"]);
    assert_eq!(stats["tick_rate"], 1_000_000_000u64);
    let groups = &stats["poll_groups"];
    assert_eq!(groups.as_array().unwrap().len(), 2);
    for (i, g) in groups.as_array().unwrap().iter().enumerate() {
        assert_keys(g, GROUP_FIELDS);
        assert_eq!(g["name"], format!("nvmf_tgt_poll_group_00{i}"));
        assert_eq!(g["transports"], json!([{"trtype": "LOOPBACK"}]));
    }
    assert_eq!(sum(groups, "admin_qpairs"), 0);
    fails(
        c,
        "nvmf_get_stats",
        json!({"tgt_name": "other"}),
        -32603,
        "other",
    );

    let iostat = ok(c, "bdev_get_iostat", Value::Null);
    assert_keys(&iostat, &["tick_rate", "ticks", "bdevs"]);
    let names: Vec<&str> = iostat["bdevs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["Malloc0", "Malloc1"]);
    let mut with_name = IO_STAT_FIELDS.to_vec();
    with_name.push("name");
    assert_keys(&iostat["bdevs"][0], &with_name);
    assert_eq!(iostat["bdevs"][0]["num_read_ops"], 0);
    assert_eq!(iostat["bdevs"][0]["min_read_latency_ticks"], 0);

    // A host: admin queue, CC.EN, an I/O queue, a 4 KiB write and a 4 KiB read.
    let admin = lab.transport.connect();
    let cntlid = connect(&admin, 0, CNTLID_DYNAMIC);
    let cc = Cc(0).with_iosqes(6).with_iocqes(4).with_en(true);
    let mut set = PropertySetCommand::new(2, Property::CC.0, u64::from(cc.0), false).to_command();
    set.flags |= Command::FLAG_SGL;
    set.dptr = SglDescriptor::keyed(0, 0, 0, false);
    run(
        &admin,
        Capsule {
            cmd: set,
            host_buffer: Vec::new(),
        },
    );
    let io = lab.transport.connect();
    connect(&io, 1, cntlid);
    run(&io, keyed(Command::write(2, 1, 0, 8), vec![0x5A; 4096]));
    let r = run(&io, keyed(Command::read(3, 1, 0, 8), vec![0; 4096]));
    assert!(r.host_buffer.iter().all(|&b| b == 0x5A));

    let c = &mut lab.control;
    let stats = ok(c, "nvmf_get_stats", Value::Null);
    let groups = &stats["poll_groups"];
    assert_eq!(sum(groups, "admin_qpairs"), 1, "{stats}");
    assert_eq!(sum(groups, "io_qpairs"), 1, "{stats}");
    assert_eq!(sum(groups, "current_admin_qpairs"), 1, "{stats}");
    assert_eq!(sum(groups, "current_io_qpairs"), 1, "{stats}");
    assert_eq!(sum(groups, "current_unassociated_qpairs"), 0, "{stats}");
    assert_eq!(sum(groups, "completed_nvme_io"), 2, "{stats}");

    let iostat = ok(c, "bdev_get_iostat", json!({"names": ["Malloc0"]}));
    let b = &iostat["bdevs"][0];
    assert_eq!(iostat["bdevs"].as_array().unwrap().len(), 1);
    assert_eq!(b["name"], "Malloc0");
    assert_eq!(b["num_read_ops"], 1, "{b}");
    assert_eq!(b["bytes_read"], 4096, "{b}");
    assert_eq!(b["num_write_ops"], 1, "{b}");
    assert_eq!(b["bytes_written"], 4096, "{b}");
    assert_eq!(b["num_unmap_ops"], 0);
    assert_eq!(b["io_error"], json!({}));
    for kind in ["read", "write"] {
        let total = b[format!("{kind}_latency_ticks")].as_u64().unwrap();
        let max = b[format!("max_{kind}_latency_ticks")].as_u64().unwrap();
        let min = b[format!("min_{kind}_latency_ticks")].as_u64().unwrap();
        assert!(total > 0 && min > 0 && min == max && max == total, "{b}");
    }
    // The old single-name form, and an idle bdev.
    let idle = ok(c, "bdev_get_iostat", json!({"name": "Malloc1"}));
    assert_eq!(idle["bdevs"][0]["num_read_ops"], 0);

    let per = ok(
        c,
        "bdev_get_iostat",
        json!({"name": "Malloc0", "per_channel": true}),
    );
    assert_keys(&per, &["tick_rate", "ticks", "name", "channels"]);
    assert_eq!(per["name"], "Malloc0");
    let channels = per["channels"].as_array().unwrap();
    assert_eq!(channels.len(), 2, "a channel per reactor: {per}");
    let mut with_thread = IO_STAT_FIELDS.to_vec();
    with_thread.push("thread_id");
    for ch in channels {
        assert_keys(ch, &with_thread);
    }
    assert_eq!(sum(&per["channels"], "num_read_ops"), 1, "{per}");
    assert_eq!(sum(&per["channels"], "num_write_ops"), 1, "{per}");

    fails(
        c,
        "bdev_get_iostat",
        json!({"per_channel": true}),
        -libc::EINVAL,
        "per_channel",
    );
    fails(
        c,
        "bdev_get_iostat",
        json!({"names": ["Malloc0", "Nope"]}),
        -libc::ENODEV,
        "Nope",
    );
    fails(
        c,
        "bdev_get_iostat",
        json!({"reset_mode": "all"}),
        -libc::EOPNOTSUPP,
        "reset",
    );
    fails(
        c,
        "bdev_get_iostat",
        json!({"reset_mode": "x"}),
        PARAMS,
        "x",
    );
    fails(c, "bdev_get_iostat", json!({"nmae": "x"}), PARAMS, "nmae");
    ok(c, "bdev_get_iostat", json!({"reset_mode": "none"}));

    // The host leaves: current counts drop, totals stay.
    drop(io);
    let stats = eventually(c, "nvmf_get_stats", Value::Null, |s| {
        sum(&s["poll_groups"], "current_io_qpairs") == 0
    });
    assert_eq!(sum(&stats["poll_groups"], "io_qpairs"), 1);
    assert_eq!(sum(&stats["poll_groups"], "current_admin_qpairs"), 1);
    drop(admin);
}

#[test]
fn thread_get_stats_and_framework_get_reactors_in_spdk_layout() {
    let mut lab = Lab::new();
    let c = &mut lab.control;
    let threads = eventually(c, "thread_get_stats", Value::Null, |t| {
        t["threads"][0]["idle"].as_u64().unwrap_or(0) > 0
    });
    assert_keys(&threads, &["tick_rate", "threads"]);
    assert_eq!(threads["tick_rate"], 1_000_000_000u64);
    let list = threads["threads"].as_array().unwrap();
    assert_eq!(list.len(), 2);
    for (i, t) in list.iter().enumerate() {
        assert_keys(
            t,
            &[
                "name",
                "id",
                "cpumask",
                "busy",
                "idle",
                "active_pollers_count",
                "timed_pollers_count",
                "paused_pollers_count",
            ],
        );
        assert_eq!(t["name"], format!("nvmf_tgt_poll_group_00{i}"));
        assert_eq!(t["id"], i + 1);
        assert_eq!(t["cpumask"], if i == 0 { "1" } else { "2" });
    }
    let first = list[0]["busy"].as_u64().unwrap() + list[0]["idle"].as_u64().unwrap();

    let reactors = ok(c, "framework_get_reactors", Value::Null);
    assert_keys(&reactors, &["tick_rate", "pid", "reactors"]);
    assert_eq!(reactors["pid"], std::process::id());
    let list = reactors["reactors"].as_array().unwrap();
    assert_eq!(list.len(), 2);
    for (i, r) in list.iter().enumerate() {
        assert_keys(
            r,
            &[
                "lcore",
                "numa_id",
                "tid",
                "busy",
                "idle",
                "in_interrupt",
                "irq",
                "sys",
                "usr",
                "lw_threads",
            ],
        );
        assert_eq!(r["lcore"], i);
        assert_ne!(r["tid"], 0);
        assert_ne!(r["tid"], std::process::id(), "the reactor's own thread");
        assert!(r["in_interrupt"].is_boolean(), "{r}");
        let lw = &r["lw_threads"][0];
        assert_keys(lw, &["name", "id", "cpumask", "elapsed"]);
        assert_eq!(lw["name"], format!("nvmf_tgt_poll_group_00{i}"));
    }
    // Time moves: busy + idle grows.
    let later = eventually(c, "thread_get_stats", Value::Null, |t| {
        let t0 = &t["threads"][0];
        t0["busy"].as_u64().unwrap() + t0["idle"].as_u64().unwrap() > first
    });
    assert_eq!(later["threads"].as_array().unwrap().len(), 2);

    fails(
        c,
        "thread_get_stats",
        json!({"x": 1}),
        PARAMS,
        "requires no arguments",
    );
    fails(
        c,
        "framework_get_reactors",
        json!({"x": 1}),
        PARAMS,
        "requires no arguments",
    );
}

/// A writer that keeps what the subscriber wrote.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn take(&self) -> String {
        String::from_utf8(std::mem::take(&mut *self.0.lock().unwrap())).unwrap()
    }
}

#[test]
fn log_methods_change_the_running_filter() {
    use tracing_subscriber::layer::SubscriberExt;

    let mut c = Control::new(
        Target::new(Arc::new(TargetInfo::default())),
        Box::new(|o: &TransportOptions| Err(TransportError::UnsupportedType(o.trtype.clone()))),
    );
    let (layer, apply) = log::reload_filter("info").unwrap();
    c.log.set_apply(apply);
    let out = Captured::default();
    let writer = out.clone();
    let subscriber = tracing_subscriber::registry().with(layer).with(
        tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_writer(move || writer.clone()),
    );
    let emit = || {
        tracing::debug!(target: "nvmf_target::transport::rdma::poll_group", "rdma-debug");
        tracing::debug!(target: "nvmf_target::bdev::malloc", "bdev-debug");
        tracing::info!(target: "nvmf_target::core", "core-info");
        tracing::warn!(target: "nvmf_target::core", "core-warn");
    };
    tracing::subscriber::with_default(subscriber, || {
        emit();
        let text = out.take();
        assert!(
            text.contains("core-info") && !text.contains("rdma-debug"),
            "{text}"
        );

        assert_eq!(ok(&mut c, "log_get_level", Value::Null), "NOTICE");
        assert_eq!(ok(&mut c, "log_get_print_level", Value::Null), "NOTICE");
        let flags = ok(&mut c, "log_get_flags", Value::Null);
        for name in ["nvmf", "nvmf_rdma", "rdma", "bdev"] {
            assert_eq!(flags[name], false, "{flags}");
        }

        assert_eq!(
            ok(&mut c, "log_set_flag", json!({"flag": "nvmf_rdma"})),
            true
        );
        emit();
        let text = out.take();
        assert!(text.contains("rdma-debug"), "{text}");
        assert!(!text.contains("bdev-debug"), "{text}");
        assert_eq!(ok(&mut c, "log_get_flags", Value::Null)["nvmf_rdma"], true);

        ok(&mut c, "log_clear_flag", json!({"flag": "nvmf_rdma"}));
        emit();
        assert!(!out.take().contains("rdma-debug"));

        // Globs and "all", as SPDK's fnmatch.
        ok(&mut c, "log_set_flag", json!({"flag": "BDEV_*"}));
        let flags = ok(&mut c, "log_get_flags", Value::Null);
        assert_eq!(flags["bdev_malloc"], true);
        assert_eq!(flags["bdev"], false);
        emit();
        assert!(out.take().contains("bdev-debug"));
        ok(&mut c, "log_clear_flag", json!({"flag": "all"}));
        let flags = ok(&mut c, "log_get_flags", Value::Null);
        assert!(flags.as_object().unwrap().values().all(|v| v == false));

        fails(
            &mut c,
            "log_set_flag",
            json!({"flag": "nosuch"}),
            PARAMS,
            "invalid log flag",
        );
        fails(&mut c, "log_clear_flag", json!({}), PARAMS, "flag");

        ok(&mut c, "log_set_level", json!({"level": "ERROR"}));
        ok(&mut c, "log_set_print_level", json!({"level": "ERROR"}));
        assert_eq!(ok(&mut c, "log_get_level", Value::Null), "ERROR");
        emit();
        let text = out.take();
        assert!(!text.contains("core-warn"), "{text}");
        ok(&mut c, "log_set_print_level", json!({"level": "warning"}));
        assert_eq!(ok(&mut c, "log_get_print_level", Value::Null), "WARNING");
        emit();
        let text = out.take();
        assert!(
            text.contains("core-warn") && !text.contains("core-info"),
            "{text}"
        );
        ok(&mut c, "log_set_level", json!({"level": "DEBUG"}));
        emit();
        assert!(out.take().contains("bdev-debug"));

        fails(
            &mut c,
            "log_set_level",
            json!({"level": "LOUD"}),
            PARAMS,
            "LOUD",
        );
        fails(
            &mut c,
            "log_get_level",
            json!({"level": "x"}),
            PARAMS,
            "requires no parameters",
        );
    });
}

#[test]
fn spdk_kill_instance_takes_spdks_signal_names_and_numbers() {
    let mut c = Control::new(
        Target::new(Arc::new(TargetInfo::default())),
        Box::new(|o: &TransportOptions| Err(TransportError::UnsupportedType(o.trtype.clone()))),
    );
    fails(
        &mut c,
        "spdk_kill_instance",
        json!({"sig_name": "SIGTERM"}),
        -libc::EOPNOTSUPP,
        "cannot be stopped",
    );
    let got = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&got);
    c.on_kill = Some(Box::new(move |s| seen.lock().unwrap().push(s)));
    for (arg, want) in [
        (json!("SIGTERM"), KillSignal::Term),
        (json!("SIGINT"), KillSignal::Int),
        (json!("SIGQUIT"), KillSignal::Quit),
        (json!("SIGHUP"), KillSignal::Hup),
        (json!("SIGKILL"), KillSignal::Kill),
        (json!("SIGUSR1"), KillSignal::Usr1),
        (json!("term"), KillSignal::Term),
        (json!(15), KillSignal::Term),
        (json!("2"), KillSignal::Int),
    ] {
        assert_eq!(
            ok(&mut c, "spdk_kill_instance", json!({"sig_name": arg})),
            true
        );
        assert_eq!(got.lock().unwrap().pop(), Some(want), "{arg}");
    }
    assert_eq!(KillSignal::Term.number(), libc::SIGTERM);
    for bad in [json!("SIGSEGV"), json!(11), json!(true)] {
        fails(
            &mut c,
            "spdk_kill_instance",
            json!({"sig_name": bad}),
            PARAMS,
            "sig_name",
        );
    }
    fails(
        &mut c,
        "spdk_kill_instance",
        Value::Null,
        PARAMS,
        "sig_name",
    );
    assert!(got.lock().unwrap().is_empty());
}
