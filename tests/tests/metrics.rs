//! The Prometheus endpoint against a live reactor: a host's reads and writes show up as
//! namespace counters and latency histograms, its controller as a connected host, and the
//! HTTP side answers only scrapes.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nvmf_common::spec::command::Command;
use nvmf_common::spec::fabrics::{PropertySetCommand, CNTLID_DYNAMIC};
use nvmf_common::spec::registers::{Cc, Property};
use nvmf_common::spec::Status;
use nvmf_target::core::TargetInfo;
use nvmf_target::metrics::{self, ReactorCounters};
use nvmf_target::reactor::{start_reactors, stop_reactors};
use nvmf_target::rpc::Control;
use nvmf_target::target::{NamespaceOptions, SubsystemOptions, Target};
use nvmf_target::transport::options::TransportOptions;
use nvmf_target::transport::TransportError;
use nvmf_tests::*;

const NQN: &str = "nqn.2016-06.io.spdk:metrics";

fn wait(q: &LoopbackHostQueue) -> Response {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Some(r) = q.poll() {
            return r;
        }
        std::thread::yield_now();
    }
    panic!("the reactor did not answer");
}

fn run(q: &LoopbackHostQueue, capsule: Capsule) -> Response {
    q.submit(capsule);
    let r = wait(q);
    assert_eq!(r.cqe.status(), Status::SUCCESS, "{:?}", r.cqe);
    r
}

/// One live reactor and a target using it.
fn one_reactor_target() -> (Vec<nvmf_common::reactor::Reactor>, Target) {
    let info = Arc::new(TargetInfo::default());
    let (reactors, handles) =
        start_reactors(&[0], &info, nvmf_common::reactor::IdleMode::Adaptive).unwrap();
    let mut target = Target::new(info);
    for h in handles {
        target.add_poll_group(h);
    }
    (reactors, target)
}

/// The endpoint on a loopback port for `target` and its `reactors`.
fn serve(target: Target, reactors: &[nvmf_common::reactor::Reactor]) -> SocketAddr {
    let counters: Vec<ReactorCounters> = reactors
        .iter()
        .map(|r| ReactorCounters {
            core: r.core,
            stats: Arc::clone(&r.stats),
        })
        .collect();
    let control = Arc::new(Mutex::new(Control::new(
        target,
        Box::new(|o: &TransportOptions| Err(TransportError::UnsupportedType(o.trtype.clone()))),
    )));
    let listen = metrics::parse_listen("127.0.0.1:0").unwrap();
    metrics::serve(listen, control, counters).unwrap()
}

fn scrape(addr: SocketAddr, request: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// The value of the one sample line that starts with `series`.
fn value(body: &str, series: &str) -> f64 {
    let line = body
        .lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .unwrap_or_else(|| panic!("no sample {series} in\n{body}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

#[test]
fn a_hosts_io_shows_up_in_the_metrics() {
    let (reactors, mut target) = one_reactor_target();
    let transport = LoopbackTransport::new(LOOPBACK_LIMITS);
    target.add_transport(Arc::new(transport.clone())).unwrap();
    let bdev: nvmf_target::bdev::BdevRef =
        Arc::new(nvmf_target::bdev::MallocBdev::new("Malloc0", 64, 512, None).unwrap());
    target.bdevs.register(bdev).unwrap();
    let opts = SubsystemOptions {
        allow_any_host: true,
        serial_number: "SN-METRICS".into(),
        ..Default::default()
    };
    target.create_subsystem(NQN, opts).unwrap();
    let ns = NamespaceOptions {
        bdev_name: "Malloc0".into(),
        ..Default::default()
    };
    target.add_namespace(NQN, ns).unwrap();
    target.add_listener(NQN, loopback_address()).unwrap();
    let addr = serve(target, &reactors);
    assert_eq!(
        metrics::parse_listen("9464").unwrap(),
        "127.0.0.1:9464".parse().unwrap(),
        "a bare port binds loopback only"
    );

    // A host: admin queue, CC.EN, one I/O queue, a write and a read.
    let admin = transport.connect();
    let r = run(
        &admin,
        connect_capsule(1, 0, 31, 0, CNTLID_DYNAMIC, NQN, HOSTNQN),
    );
    let cntlid = r.cqe.dw0.get() as u16;
    let cc = Cc(0).with_iosqes(6).with_iocqes(4).with_en(true);
    run(
        &admin,
        no_data(PropertySetCommand::new(2, Property::CC.0, u64::from(cc.0), false).to_command()),
    );
    let io = transport.connect();
    run(&io, connect_capsule(1, 1, 31, 0, cntlid, NQN, HOSTNQN));
    run(
        &io,
        with_buffer(Command::write(2, 1, 0, 8), vec![0x5A; 4096]),
    );
    let r = run(&io, reading(Command::read(3, 1, 0, 8), 4096));
    assert!(r.host_buffer.iter().all(|&b| b == 0x5A));

    let resp = scrape(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    let (head, body) = resp.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    assert!(head.contains("text/plain; version=0.0.4"));
    let ns = format!("{{nqn=\"{NQN}\",nsid=\"1\",bdev=\"Malloc0\"}}");
    assert_eq!(
        value(body, &format!("nvmf_namespace_read_ops_total{ns}")),
        1.0
    );
    assert_eq!(
        value(body, &format!("nvmf_namespace_write_ops_total{ns}")),
        1.0
    );
    assert_eq!(
        value(body, &format!("nvmf_namespace_read_bytes_total{ns}")),
        4096.0
    );
    assert_eq!(
        value(body, &format!("nvmf_namespace_errors_total{ns}")),
        0.0
    );
    let sub = format!("{{nqn=\"{NQN}\"}}");
    assert_eq!(
        value(body, &format!("nvmf_subsystem_controllers{sub}")),
        1.0
    );
    assert_eq!(
        value(body, &format!("nvmf_subsystem_connected_hosts{sub}")),
        1.0
    );
    assert_eq!(value(body, &format!("nvmf_subsystem_namespaces{sub}")), 1.0);
    assert_eq!(
        value(
            body,
            "nvmf_poll_group_qpairs{poll_group=\"nvmf_tgt_poll_group_000\"}"
        ),
        2.0
    );
    assert_eq!(value(body, "nvmf_poll_groups_answering"), 1.0);
    for op in ["read", "write"] {
        let h = format!(
            "nvmf_namespace_io_latency_seconds_count{{nqn=\"{NQN}\",nsid=\"1\",op=\"{op}\"}}"
        );
        assert_eq!(value(body, &h), 1.0, "{op} latency counted once");
        let inf = format!(
            "nvmf_namespace_io_latency_seconds_bucket{{nqn=\"{NQN}\",nsid=\"1\",op=\"{op}\",le=\"+Inf\"}}"
        );
        assert_eq!(value(body, &inf), 1.0);
    }
    assert!(body.contains("# TYPE nvmf_namespace_io_latency_seconds histogram"));
    assert!(body.contains("nvmf_reactor_busy_turns_total{core=\"0\"}"));

    // Only scrapes are answered; the endpoint lives on after bad requests.
    assert!(scrape(addr, "GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
    assert!(scrape(addr, "POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
    let huge = format!("GET /metrics HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(10_000));
    assert!(scrape(addr, &huge).starts_with("HTTP/1.1 400"));
    assert!(scrape(addr, "GET /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 200"));

    drop(admin);
    drop(io);
    stop_reactors(reactors);
}

/// A scrape with a bound on how long the answer may take (a hung endpoint fails the test
/// instead of hanging it).
fn scrape_within(addr: SocketAddr, request: &str, limit: Duration) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(limit)).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out)
        .unwrap_or_else(|e| panic!("no answer to {request:?} within {limit:?}: {e}"));
    out
}

/// Scrapes until one is answered (slots free up as closed clients are noticed); panics
/// after 5 s.
fn scraped_again(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let resp = scrape_within(
            addr,
            "GET /metrics HTTP/1.1\r\n\r\n",
            Duration::from_secs(4),
        );
        if resp.starts_with("HTTP/1.1 200") {
            return;
        }
        assert!(resp.starts_with("HTTP/1.1 503"), "{resp}");
        assert!(Instant::now() < deadline, "scrapes refused for 5 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Clients that trickle their request or say nothing hold a connection for at most the
/// request timeout, and never the scrapes: a scrape is answered beside a trickling client,
/// and, with every connection slot held by silent ones, refused at once (503) rather than
/// queued behind them; once they time out (408), scrapes are answered again.
#[test]
fn slow_or_silent_clients_do_not_hold_up_the_scrapes() {
    let (reactors, target) = one_reactor_target();
    let addr = serve(target, &reactors);
    let get = "GET /metrics HTTP/1.1\r\n\r\n";

    // A byte every 200 ms, never the end of the head.
    let mut trickler = TcpStream::connect(addr).unwrap();
    trickler.write_all(b"GET /metrics HTTP/1.1\r\nX: ").unwrap();
    let trickling = std::thread::spawn(move || {
        for _ in 0..15 {
            if trickler.write_all(b"a").is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        trickler
    });
    std::thread::sleep(Duration::from_millis(100));
    let resp = scrape_within(addr, get, Duration::from_secs(4));
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    let mut trickler = trickling.join().unwrap();
    trickler
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut answer = String::new();
    let _ = trickler.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    // Closed, so the endpoint stops draining it and frees its slot.
    drop(trickler);
    scraped_again(addr);

    // Every slot held by clients that say nothing: added one by one until a scrape is
    // refused (a slot can still be draining the scrape just answered, so the count of
    // silent clients it takes is not fixed).
    let mut silent = Vec::new();
    let refused = loop {
        assert!(
            silent.len() < 8,
            "scrapes answered beside {} silent clients",
            silent.len()
        );
        silent.push(TcpStream::connect(addr).unwrap());
        std::thread::sleep(Duration::from_millis(200));
        let resp = scrape_within(addr, get, Duration::from_secs(4));
        if resp.starts_with("HTTP/1.1 503") {
            break resp;
        }
        assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    };
    assert!(refused.starts_with("HTTP/1.1 503"));
    let mut timed_out = 0;
    for mut s in silent {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        if answer.starts_with("HTTP/1.1 408") {
            timed_out += 1;
        } else {
            assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
        }
    }
    assert!(timed_out >= 3, "{timed_out} silent clients held a slot");
    scraped_again(addr);

    // Clients that send their request, then keep trickling bytes after the answer: what is
    // read away after answering is bounded in time, so their slots come back.
    let tricklers: Vec<_> = (0..4)
        .map(|_| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(get.as_bytes()).unwrap();
            std::thread::spawn(move || {
                for _ in 0..40 {
                    if s.write_all(b"x").is_err() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    scraped_again(addr);
    for t in tricklers {
        t.join().unwrap();
    }
    stop_reactors(reactors);
}
