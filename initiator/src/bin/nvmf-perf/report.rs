//! What `nvmf-perf` prints at the end: per association and in total, IOPS, bandwidth and
//! latency (spdk_nvme_perf's table and its `-L`/`-LL` latency summaries and histograms, or
//! JSON), the multipath state of each namespace, and `--transport-stats`.

use std::time::Duration;

use nvmf_initiator::{Histogram, MultipathStats, QpairStats};

use crate::args::{Args, MultipathMode};
use crate::worker::{NsCtx, Stats};

/// `--transport-stats`: each I/O qpair's counters (on stdout; on stderr with `--json`).
pub(crate) fn print_transport_stats(args: &Args, stats: &[(String, u16, QpairStats)]) {
    let mut out = String::from("RDMA transport statistics (per I/O qpair):\n");
    for (label, qid, s) in stats {
        out += &format!(
            "{label} qid {qid}:\n  submitted {}  completed {}  timeouts {}  reconnects {}  \
             requeued {}\n  remote invalidations {}  local invalidations {}\n",
            s.submitted,
            s.completed,
            s.timeouts,
            s.reconnects,
            s.requeued,
            s.remote_invalidations,
            s.local_invalidations
        );
    }
    if args.json {
        eprint!("{out}");
    } else {
        print!("{out}");
    }
}

/// spdk_nvme_perf's `-L` cut-offs: the latency below which each fraction of the I/Os
/// completed.
const LATENCY_CUTOFFS: [f64; 15] = [
    0.01, 0.10, 0.25, 0.50, 0.75, 0.90, 0.95, 0.98, 0.99, 0.995, 0.999, 0.9999, 0.99999, 0.999999,
    0.9999999,
];

/// `-L`: the summary (percentiles at [`LATENCY_CUTOFFS`]); `-LL`: also every non-empty
/// bucket with the cumulative share.
fn latency_report(name: &str, h: &Histogram, level: u8) -> String {
    let mut out = format!("Summary latency data for {name}:\n{}\n", "=".repeat(81));
    for c in LATENCY_CUTOFFS {
        out += &format!(
            "{:9.5}% : {:9.3}us\n",
            c * 100.0,
            us(h.percentile(c * 100.0))
        );
    }
    out.push('\n');
    if level >= 2 {
        out += &format!(
            "Latency histogram for {name}:\n{}\n       Range in us     Cumulative    IO count\n",
            "=".repeat(78)
        );
        let mut so_far = 0u64;
        for (lo, hi, n) in h.buckets() {
            so_far += n;
            out += &format!(
                "{:9.3} - {:9.3}: {:9.4}%  ({n:9})\n",
                us(lo),
                us(hi),
                100.0 * so_far as f64 / h.count().max(1) as f64
            );
        }
        out.push('\n');
    }
    out
}

/// How the I/Os' data keys were handled (see `ControllerOptions::memory_windows`).
#[derive(Clone, Copy, Default)]
pub(crate) struct KeyUse {
    pub(crate) windows: bool,
    pub(crate) remote_invalidations: u64,
    pub(crate) local_invalidations: u64,
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

pub(crate) fn report(
    args: &Args,
    results: &[NsCtx],
    elapsed: Duration,
    ctrl_errors: &[String],
    keys: KeyUse,
) -> anyhow::Result<bool> {
    let secs = elapsed.as_secs_f64().max(1e-9);
    let mut total = Stats::default();
    let mut failures: Vec<String> = ctrl_errors.to_vec();
    let mut mp_total = MultipathStats::default();
    for c in results {
        total.merge(&c.stats);
        mp_total.merge(&c.mp_stats);
        if let Some(f) = &c.failed {
            failures.push(format!("{} (core {}): {f}", c.label, c.core));
        }
    }
    let row = |s: &Stats| {
        let iops = s.ios as f64 / secs;
        (iops, s.bytes as f64 / secs / (1024.0 * 1024.0))
    };
    if args.json {
        let one = |label: &str, core: Option<usize>, s: &Stats| {
            let (iops, mibs) = row(s);
            serde_json::json!({
                "device": label,
                "core": core,
                "ios": s.ios,
                "reads": s.reads,
                "writes": s.writes,
                "errors": s.errors,
                "iops": iops,
                "mib_per_s": mibs,
                "latency_us": {
                    "avg": s.hist.mean() / 1000.0,
                    "min": us(s.hist.min()),
                    "max": us(s.hist.max()),
                    "p50": us(s.hist.percentile(50.0)),
                    "p99": us(s.hist.percentile(99.0)),
                    "p99_9": us(s.hist.percentile(99.9)),
                },
            })
        };
        let mut total_doc = one("Total", None, &total);
        total_doc["keys"] = serde_json::json!({
            "memory_windows": keys.windows,
            "remote_invalidations": keys.remote_invalidations,
            "local_invalidations": keys.local_invalidations,
        });
        let mut namespaces = Vec::new();
        for c in results {
            let mut doc = one(&c.label, Some(c.core), &c.stats);
            if !c.path_labels.is_empty() {
                doc["multipath"] = multipath_json(c);
            }
            namespaces.push(doc);
        }
        if results.iter().any(|c| !c.path_labels.is_empty()) {
            total_doc["multipath"] = serde_json::json!({
                "failovers": mp_total.failovers,
                "ana_errors": mp_total.ana_errors,
                "no_path_failures": mp_total.no_path_failures,
                "retries_exhausted": mp_total.retries_exhausted,
            });
        }
        let doc = serde_json::json!({
            "config": {
                "transport": args.transport,
                "queue_depth": args.queue_depth,
                "io_size": args.io_size,
                "pattern": args.pattern,
                "rwmixread": args.rwmixread,
                "time_s": args.time,
                "core_mask": args.core_mask,
                "qpairs_per_ns": args.qpairs,
                "multipath": multipath_mode_name(args.multipath),
                "fast_io_fail_timeout_sec": args.fast_io_fail_timeout_sec,
            },
            "elapsed_s": secs,
            "namespaces": namespaces,
            "total": total_doc,
            "errors": failures,
            "first_io_error": total.first_error,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        let w = results
            .iter()
            .map(|c| c.label.len() + 14)
            .max()
            .unwrap_or(20)
            .max(20);
        println!("{}", "=".repeat(w + 58));
        println!("{:>width$}", "Latency(us)", width = w + 57);
        println!(
            "{:<w$}: {:>10} {:>10} {:>10} {:>10} {:>10}",
            "Device Information", "IOPS", "MiB/s", "Average", "min", "max"
        );
        let print_row = |name: &str, s: &Stats| {
            let (iops, mibs) = row(s);
            println!(
                "{:<w$}: {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2}",
                name,
                iops,
                mibs,
                s.hist.mean() / 1000.0,
                us(s.hist.min()),
                us(s.hist.max())
            );
        };
        for c in results {
            print_row(&format!("{} from core {:>2}", c.label, c.core), &c.stats);
        }
        println!("{}", "=".repeat(w + 58));
        print_row("Total", &total);
        println!();
        println!(
            "{:<w$}: {:>10} {:>10} {:>10}",
            "Latency percentiles (us)", "p50", "p99", "p99.9"
        );
        for c in results {
            let h = &c.stats.hist;
            println!(
                "{:<w$}: {:>10.2} {:>10.2} {:>10.2}",
                format!("{} from core {:>2}", c.label, c.core),
                us(h.percentile(50.0)),
                us(h.percentile(99.0)),
                us(h.percentile(99.9))
            );
        }
        let h = &total.hist;
        println!(
            "{:<w$}: {:>10.2} {:>10.2} {:>10.2}",
            "Total",
            us(h.percentile(50.0)),
            us(h.percentile(99.0)),
            us(h.percentile(99.9))
        );
        if total.reads > 0 && total.writes > 0 {
            println!(
                "reads {} writes {} ({:.1}% reads)",
                total.reads,
                total.writes,
                100.0 * total.reads as f64 / (total.ios.max(1)) as f64
            );
        }
        if args.latency > 0 && total.ios > 0 {
            println!();
            for c in results {
                let name = format!("{} from core {}", c.label, c.core);
                print!("{}", latency_report(&name, &c.stats.hist, args.latency));
            }
        }
        for c in results.iter().filter(|c| !c.path_labels.is_empty()) {
            print!("{}", multipath_text(c));
        }
        if keys.windows {
            println!(
                "data keys: per-I/O memory windows, {} invalidated by the target, {} locally",
                keys.remote_invalidations, keys.local_invalidations
            );
        } else {
            println!("data keys: the buffer pool's registration");
        }
    }
    if total.errors > 0 {
        eprintln!(
            "nvmf-perf: {} I/O errors (first: {})",
            total.errors,
            total.first_error.as_deref().unwrap_or("?")
        );
    }
    for f in &failures {
        eprintln!("nvmf-perf: error: {f}");
    }
    // -Q: I/O errors do not fail the run (they were reported); lost controllers still do.
    let errors_fail = args.continue_on_error.is_none() && total.errors > 0;
    Ok(!errors_fail && failures.is_empty())
}

fn multipath_mode_name(m: MultipathMode) -> &'static str {
    match m {
        MultipathMode::Disable => "disable",
        MultipathMode::On(nvmf_initiator::Policy::ActivePassive) => "active_passive",
        MultipathMode::On(nvmf_initiator::Policy::ActiveActive) => "active_active",
    }
}

/// A multipath namespace's paths (I/Os completed through each) and failovers, for `--json`.
fn multipath_json(c: &NsCtx) -> serde_json::Value {
    let s = &c.mp_stats;
    let paths: Vec<_> = c
        .path_labels
        .iter()
        .enumerate()
        .map(|(i, addr)| {
            serde_json::json!({
                "address": addr,
                "ios": s.path_ios.get(i).copied().unwrap_or(0),
            })
        })
        .collect();
    serde_json::json!({
        "paths": paths,
        "failovers": s.failovers,
        "ana_errors": s.ana_errors,
        "no_path_failures": s.no_path_failures,
        "retries_exhausted": s.retries_exhausted,
    })
}

/// The same as [`multipath_json`], as lines after the table.
fn multipath_text(c: &NsCtx) -> String {
    let s = &c.mp_stats;
    let mut out = format!("multipath {} from core {}:\n", c.label, c.core);
    for (i, addr) in c.path_labels.iter().enumerate() {
        out += &format!(
            "  path {addr}: {} I/Os\n",
            s.path_ios.get(i).copied().unwrap_or(0)
        );
    }
    out += &format!(
        "  failovers {}  ANA statuses {}  failed for want of a path {}  out of retries {}\n",
        s.failovers, s.ana_errors, s.no_path_failures, s.retries_exhausted
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvmf_initiator::NamespaceInfo;

    #[test]
    fn multipath_report_lists_paths_and_failovers() {
        let c = NsCtx {
            label: "ns".into(),
            ns: NamespaceInfo {
                nsid: 1,
                block_size: 512,
                blocks: 8,
            },
            core: 0,
            qpairs: Vec::new(),
            path_labels: vec!["10.0.0.1:4420".into(), "10.0.0.1:4421".into()],
            mp_stats: MultipathStats {
                path_ios: vec![10, 20],
                failovers: 3,
                ana_errors: 1,
                no_path_failures: 0,
                retries_exhausted: 0,
            },
            bufs: Vec::new(),
            start: Vec::new(),
            qp_of: Vec::new(),
            is_read: Vec::new(),
            depth: 0,
            blocks_per_io: 1,
            slots: 8,
            seq: 0,
            zipf: None,
            retry: Vec::new(),
            stats: Stats::default(),
            failed: None,
        };
        let j = multipath_json(&c);
        assert_eq!(j["paths"][1]["address"], "10.0.0.1:4421");
        assert_eq!(j["paths"][1]["ios"], 20);
        assert_eq!(j["failovers"], 3);
        let t = multipath_text(&c);
        assert!(t.contains("path 10.0.0.1:4420: 10 I/Os"), "{t}");
        assert!(t.contains("failovers 3"), "{t}");
    }

    #[test]
    fn latency_summary_and_histogram_levels() {
        let mut h = Histogram::new();
        for v in 1..=1000u64 {
            h.record(v * 1000);
        }
        let one = latency_report("ns", &h, 1);
        assert!(one.contains("Summary latency data for ns"));
        assert!(one.contains(" 50.00000% :"), "{one}");
        assert!(!one.contains("Latency histogram"));
        let two = latency_report("ns", &h, 2);
        assert!(two.starts_with(&one));
        assert!(two.contains("Latency histogram for ns"));
        assert!(two.contains("100.0000%"), "{two}");
    }
}
