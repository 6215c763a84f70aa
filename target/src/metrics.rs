//! Prometheus metrics (`nvmf-tgt --metrics-listen`): a small HTTP endpoint serving `/metrics` in
//! Prometheus' text format 0.0.4, from the counters the RPC statistics read: reactor busy and
//! idle turns, per poll group qpairs and pending bdev I/O, per subsystem controllers and hosts,
//! per namespace operations, bytes, errors and read/write latency histograms.
//!
//! A scrape never slows the data plane down: poll groups answer a message with copies of their
//! own histograms (kept per reactor, summed here), the control-plane lock is held only to copy
//! the subsystem list. Each connection is served on a thread of its own, at most
//! [`MAX_CONNECTIONS`] at once, and must send its request within [`HEAD_TIMEOUT`]: a client
//! that trickles bytes, or connects and says nothing, cannot hold the scrapes up.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nvmf_common::reactor::ReactorStats;

use crate::core::latency::{LatencyHistogram, NamespaceLatency, BUCKETS};
use crate::core::subsystem::SubsystemKind;
use crate::rpc::Control;

/// How long a scrape waits for each poll group's answer.
const POLL_GROUP_TIMEOUT: Duration = Duration::from_secs(2);
/// A request head larger than this is not a scrape.
const MAX_REQUEST: usize = 8 * 1024;
/// The whole request head must have come by then.
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// Writing an answer takes at most this in all.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections served at once; another one gets 503 at once.
const MAX_CONNECTIONS: usize = 4;
/// Writing a refusal, and reading away the request after it, each take at most this.
const REFUSE_TIME: Duration = Duration::from_millis(50);
/// After answering, how long and how much of a client's leftover request is read away.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(1);
const MAX_DRAIN: usize = 64 * 1024;

/// A reactor's accounting, with the core it runs on.
#[derive(Clone)]
pub struct ReactorCounters {
    pub core: usize,
    pub stats: Arc<ReactorStats>,
}

/// Parses `--metrics-listen`: `PORT` binds 127.0.0.1 (loopback unless asked), `ADDR:PORT` (or
/// `[V6]:PORT`) binds exactly that.
pub fn parse_listen(spec: &str) -> Result<SocketAddr, String> {
    if let Ok(port) = spec.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    spec.to_socket_addrs()
        .map_err(|e| format!("--metrics-listen {spec}: {e} (expected PORT or ADDR:PORT)"))?
        .next()
        .ok_or_else(|| format!("--metrics-listen {spec}: no address"))
}

/// Binds `addr` and serves scrapes on a thread of its own until the process ends.
pub fn serve(
    addr: SocketAddr,
    control: Arc<Mutex<Control>>,
    reactors: Vec<ReactorCounters>,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let bound = listener.local_addr()?;
    let reactors = Arc::new(reactors);
    let serving = Arc::new(AtomicUsize::new(0));
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                if serving.load(Ordering::Acquire) >= MAX_CONNECTIONS {
                    refuse(stream);
                    continue;
                }
                serving.fetch_add(1, Ordering::AcqRel);
                let (control, reactors, done) = (
                    Arc::clone(&control),
                    Arc::clone(&reactors),
                    Arc::clone(&serving),
                );
                let spawned = std::thread::Builder::new()
                    .name("metrics-scrape".into())
                    .spawn(move || {
                        if let Err(e) = answer(stream, &control, &reactors) {
                            tracing::debug!(error = %e, "metrics request failed");
                        }
                        done.fetch_sub(1, Ordering::AcqRel);
                    });
                if let Err(e) = spawned {
                    serving.fetch_sub(1, Ordering::AcqRel);
                    tracing::warn!("cannot start a thread for a metrics request: {e}");
                }
            }
        })?;
    tracing::info!(%bound, "Prometheus metrics at http://{bound}/metrics");
    Ok(bound)
}

fn answer(
    mut stream: TcpStream,
    control: &Mutex<Control>,
    reactors: &[ReactorCounters],
) -> std::io::Result<()> {
    let deadline = Instant::now() + HEAD_TIMEOUT;
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 512];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return respond(&mut stream, "408 Request Timeout", "request too slow\n");
        }
        stream.set_read_timeout(Some(left))?;
        let n = match stream.read(&mut chunk) {
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return respond(&mut stream, "408 Request Timeout", "request too slow\n");
            }
            Err(e) => return Err(e),
        };
        if n == 0 || head.len() + n > MAX_REQUEST {
            return respond(&mut stream, "400 Bad Request", "bad request\n");
        }
        head.extend_from_slice(&chunk[..n]);
    }
    let line = String::from_utf8_lossy(&head);
    let mut words = line.split_whitespace();
    match (words.next(), words.next()) {
        (Some("GET"), Some(path)) if path == "/metrics" || path.starts_with("/metrics?") => {
            let body = render(control, reactors);
            respond(&mut stream, "200 OK", &body)
        }
        (Some("GET"), Some(_)) => respond(&mut stream, "404 Not Found", "try /metrics\n"),
        _ => respond(&mut stream, "405 Method Not Allowed", "GET /metrics\n"),
    }
}

/// Past [`MAX_CONNECTIONS`]: 503 at once, without reading the request (on the accepting
/// thread, so in at most [`REFUSE_TIME`] twice).
fn refuse(mut stream: TcpStream) {
    let answer =
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    let _ = send_then_close(&mut stream, answer, REFUSE_TIME, REFUSE_TIME);
}

fn respond(stream: &mut TcpStream, status: &str, body: &str) -> std::io::Result<()> {
    let answer = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    send_then_close(stream, answer.as_bytes(), IO_TIMEOUT, DRAIN_TIMEOUT)
}

/// Writes `answer` within `write_time` in all (a client reading slowly gets cut off), ends
/// our side, then reads away what the client still sends for at most `drain_time` in all
/// and [`MAX_DRAIN`] bytes: closing with unread request bytes would reset the connection
/// before the client read the answer.
fn send_then_close(
    stream: &mut impl Connection,
    answer: &[u8],
    write_time: Duration,
    drain_time: Duration,
) -> std::io::Result<()> {
    let deadline = Instant::now() + write_time;
    let mut rest = answer;
    while !rest.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ErrorKind::TimedOut.into());
        }
        stream.set_write_timeout(Some(left))?;
        match stream.write(rest) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => rest = &rest[n..],
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            // The socket's own timeout (what was left of the deadline) ran out.
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Err(ErrorKind::TimedOut.into()),
            Err(e) => return Err(e),
        }
    }
    stream.shutdown_write()?;
    let deadline = Instant::now() + drain_time;
    let mut sink = [0u8; 4096];
    let mut drained = 0;
    while drained < MAX_DRAIN {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        stream.set_read_timeout(Some(left))?;
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => drained += n,
        }
    }
    Ok(())
}

/// What [`send_then_close`] needs of a connection (a TCP stream; a test's stand-in).
trait Connection: Read + Write {
    fn set_write_timeout(&self, timeout: Option<Duration>) -> std::io::Result<()>;
    fn set_read_timeout(&self, timeout: Option<Duration>) -> std::io::Result<()>;
    fn shutdown_write(&self) -> std::io::Result<()>;
}

impl Connection for TcpStream {
    fn set_write_timeout(&self, timeout: Option<Duration>) -> std::io::Result<()> {
        TcpStream::set_write_timeout(self, timeout)
    }
    fn set_read_timeout(&self, timeout: Option<Duration>) -> std::io::Result<()> {
        TcpStream::set_read_timeout(self, timeout)
    }
    fn shutdown_write(&self) -> std::io::Result<()> {
        self.shutdown(std::net::Shutdown::Write)
    }
}

/// One poll group's answer.
struct GroupSample {
    name: String,
    qpairs: usize,
    pending_bdev_io: usize,
    latencies: Vec<(String, u32, NamespaceLatency)>,
}

struct NamespaceSample {
    nqn: String,
    nsid: u32,
    bdev: String,
    read_ops: u64,
    write_ops: u64,
    bytes_read: u64,
    bytes_written: u64,
    errors: u64,
}

struct SubsystemSample {
    nqn: String,
    controllers: usize,
    hosts: usize,
    namespaces: usize,
}

/// The whole exposition, in Prometheus' text format.
pub fn render(control: &Mutex<Control>, reactors: &[ReactorCounters]) -> String {
    let (groups, subsystems, namespaces) = {
        let c = control.lock().unwrap_or_else(|e| e.into_inner());
        let groups = c.target.poll_groups().to_vec();
        let mut subsystems = Vec::new();
        let mut namespaces = Vec::new();
        for s in c.target.subsystems() {
            if s.kind != SubsystemKind::Nvm {
                continue;
            }
            let controllers = s.shared.controllers();
            let hosts: BTreeSet<&str> = controllers.iter().map(|c| c.hostnqn.as_str()).collect();
            subsystems.push(SubsystemSample {
                nqn: s.nqn.clone(),
                controllers: controllers.len(),
                hosts: hosts.len(),
                namespaces: s.namespaces.len(),
            });
            for ns in s.namespaces.values() {
                let st = ns.stats.snapshot();
                namespaces.push(NamespaceSample {
                    nqn: s.nqn.clone(),
                    nsid: ns.nsid,
                    bdev: ns.bdev.name().to_string(),
                    read_ops: st.read_ops,
                    write_ops: st.write_ops,
                    bytes_read: st.bytes_read,
                    bytes_written: st.bytes_written,
                    errors: st.errors,
                });
            }
        }
        (groups, subsystems, namespaces)
    };
    let (tx, rx) = crossbeam::channel::unbounded::<GroupSample>();
    for pg in &groups {
        let tx = tx.clone();
        pg.send(move |pg| {
            let _ = tx.send(GroupSample {
                name: format!("nvmf_tgt_poll_group_{:03}", pg.core.group),
                qpairs: pg.qpair_count(),
                pending_bdev_io: pg.core.io_in_flight(),
                latencies: pg.core.namespace_latencies(),
            });
        });
    }
    drop(tx);
    let deadline = Instant::now() + POLL_GROUP_TIMEOUT;
    let mut samples: Vec<GroupSample> = Vec::with_capacity(groups.len());
    while samples.len() < groups.len() {
        match rx.recv_deadline(deadline) {
            Ok(s) => samples.push(s),
            Err(_) => break,
        }
    }
    samples.sort_by(|a, b| a.name.cmp(&b.name));

    let mut o = Exposition::default();
    type TurnsOf = fn(&ReactorStats) -> u64;
    let turns: [(&str, &str, TurnsOf); 4] = [
        (
            "nvmf_reactor_busy_turns_total",
            "Reactor poll turns that found work.",
            |s| s.busy_turns.load(Ordering::Relaxed),
        ),
        (
            "nvmf_reactor_idle_turns_total",
            "Reactor poll turns that found nothing to do.",
            |s| s.idle_turns.load(Ordering::Relaxed),
        ),
        (
            "nvmf_reactor_sleeps_total",
            "Times an idle reactor slept until a completion, a message or a timer.",
            |s| s.sleeps.load(Ordering::Relaxed),
        ),
        (
            "nvmf_reactor_early_wakeups_total",
            "Sleeps a completion or a message ended before their timer.",
            |s| s.woken_early.load(Ordering::Relaxed),
        ),
    ];
    for (name, help, get) in turns {
        o.family(name, "counter", help);
        for r in reactors {
            o.sample(name, &[("core", &r.core.to_string())], get(&r.stats));
        }
    }
    o.family(
        "nvmf_poll_groups_answering",
        "gauge",
        "Poll groups that answered this scrape in time (a stuck reactor shows as missing).",
    );
    o.sample("nvmf_poll_groups_answering", &[], samples.len() as u64);
    o.family(
        "nvmf_poll_group_qpairs",
        "gauge",
        "Queue pairs a poll group serves.",
    );
    for s in &samples {
        o.sample(
            "nvmf_poll_group_qpairs",
            &[("poll_group", &s.name)],
            s.qpairs as u64,
        );
    }
    o.family(
        "nvmf_poll_group_pending_bdev_io",
        "gauge",
        "Bdev I/O a poll group has in flight.",
    );
    for s in &samples {
        let v = s.pending_bdev_io as u64;
        o.sample(
            "nvmf_poll_group_pending_bdev_io",
            &[("poll_group", &s.name)],
            v,
        );
    }
    for (name, help, get) in [
        (
            "nvmf_subsystem_controllers",
            "Controllers (hosts' associations) of an NVM subsystem.",
            (|s: &SubsystemSample| s.controllers) as fn(&SubsystemSample) -> usize,
        ),
        (
            "nvmf_subsystem_connected_hosts",
            "Distinct host NQNs with a controller on the subsystem.",
            |s| s.hosts,
        ),
        (
            "nvmf_subsystem_namespaces",
            "Namespaces of the subsystem.",
            |s| s.namespaces,
        ),
    ] {
        o.family(name, "gauge", help);
        for s in &subsystems {
            o.sample(name, &[("nqn", &s.nqn)], get(s) as u64);
        }
    }
    type NsGet = fn(&NamespaceSample) -> u64;
    let ns_counters: [(&str, &str, NsGet); 5] = [
        ("nvmf_namespace_read_ops_total", "Reads completed.", |n| {
            n.read_ops
        }),
        ("nvmf_namespace_write_ops_total", "Writes completed.", |n| {
            n.write_ops
        }),
        ("nvmf_namespace_read_bytes_total", "Bytes read.", |n| {
            n.bytes_read
        }),
        (
            "nvmf_namespace_written_bytes_total",
            "Bytes written.",
            |n| n.bytes_written,
        ),
        (
            "nvmf_namespace_errors_total",
            "I/O commands that failed.",
            |n| n.errors,
        ),
    ];
    for (name, help, get) in ns_counters {
        o.family(name, "counter", help);
        for n in &namespaces {
            let nsid = n.nsid.to_string();
            let labels = [("nqn", n.nqn.as_str()), ("nsid", &nsid), ("bdev", &n.bdev)];
            o.sample(name, &labels, get(n));
        }
    }
    // Latency: every reactor's histograms of a namespace, summed.
    let mut latency: BTreeMap<(String, u32), NamespaceLatency> = BTreeMap::new();
    for s in &samples {
        for (nqn, nsid, l) in &s.latencies {
            let sum = latency.entry((nqn.clone(), *nsid)).or_default();
            sum.read.merge(&l.read);
            sum.write.merge(&l.write);
        }
    }
    let name = "nvmf_namespace_io_latency_seconds";
    o.family(
        name,
        "histogram",
        "Time from a read or write capsule's arrival to its bdev completion.",
    );
    for ((nqn, nsid), l) in &latency {
        for (op, h) in [("read", &l.read), ("write", &l.write)] {
            o.histogram(name, nqn, *nsid, op, h);
        }
    }
    o.text
}

#[derive(Default)]
struct Exposition {
    text: String,
}

impl Exposition {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.text, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: u64) {
        self.text.push_str(name);
        self.labels(labels);
        let _ = writeln!(self.text, " {value}");
    }

    fn labels(&mut self, labels: &[(&str, &str)]) {
        if labels.is_empty() {
            return;
        }
        self.text.push('{');
        for (i, (k, v)) in labels.iter().enumerate() {
            if i > 0 {
                self.text.push(',');
            }
            let _ = write!(self.text, "{k}=\"{}\"", escape(v));
        }
        self.text.push('}');
    }

    fn histogram(&mut self, name: &str, nqn: &str, nsid: u32, op: &str, h: &LatencyHistogram) {
        let nsid = nsid.to_string();
        let mut cumulative = 0;
        for i in 0..BUCKETS {
            cumulative += h.counts[i];
            let le = match LatencyHistogram::bound_us(i) {
                Some(us) => format!("{}", us as f64 / 1e6),
                None => "+Inf".to_string(),
            };
            let labels = [("nqn", nqn), ("nsid", &nsid), ("op", op), ("le", &le)];
            self.sample(&format!("{name}_bucket"), &labels, cumulative);
        }
        let labels = [("nqn", nqn), ("nsid", nsid.as_str()), ("op", op)];
        self.text.push_str(&format!("{name}_sum"));
        self.labels(&labels);
        let _ = writeln!(self.text, " {}", h.sum_ns as f64 / 1e9);
        self.sample(&format!("{name}_count"), &labels, h.count());
    }
}

/// Label values escape backslash, double quote and newline.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client that takes a byte every 2 ms: every write makes progress, so no timeout of a
    /// single write ever fires, and only the overall deadline ends an answer it would take
    /// minutes to read (a deadline per write let it hold a scrape's thread, and one of the
    /// few slots, for as long as it liked).
    struct Trickle {
        taken: usize,
    }

    impl Read for Trickle {
        fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
            Ok(0)
        }
    }

    impl Write for Trickle {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            std::thread::sleep(Duration::from_millis(2));
            self.taken += 1;
            Ok(buf.len().min(1))
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Connection for Trickle {
        fn set_write_timeout(&self, _: Option<Duration>) -> std::io::Result<()> {
            Ok(())
        }
        fn set_read_timeout(&self, _: Option<Duration>) -> std::io::Result<()> {
            Ok(())
        }
        fn shutdown_write(&self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_slow_reader_is_cut_off_by_the_overall_write_deadline() {
        let mut client = Trickle { taken: 0 };
        let answer = vec![b'x'; 64 * 1024];
        let err = send_then_close(
            &mut client,
            &answer,
            Duration::from_millis(200),
            Duration::ZERO,
        )
        .expect_err("a 64 KiB answer at 500 bytes a second cannot have been written");
        assert_eq!(err.kind(), ErrorKind::TimedOut);
        assert!(client.taken > 0 && client.taken < answer.len());
    }
}
