"""Helpers the lab's benchmark scenarios share: whole-VM CPU from /proc/stat snapshots
(lab_cpu_snapshot), fio JSON totals and nvmf_get_stats RDMA counters."""
import json


def _cpu_line(path):
    for line in open(path):
        f = line.split()
        if f and f[0] == "cpu":
            return [int(x) for x in f[1:]]
    raise ValueError(f"no cpu line in {path}")


def cpu_busy(before, after):
    """Busy share of the whole VM (all vCPUs) between two snapshots, in percent: everything
    but idle and iowait."""
    a, b = _cpu_line(before), _cpu_line(after)
    d = [y - x for x, y in zip(a, b)]
    total = sum(d)
    return 100.0 * (total - d[3] - d[4]) / total if total else 0.0


def fio_totals(path):
    """(IOPS, worst p99 completion latency in us, mean total latency in us, errors) of one fio
    JSON output, summed over its jobs and directions.

    The mean is fio's total latency (submission + completion, `lat_ns`), what the application
    waits: with nvme-rdma on soft-RoCE the capsule leaves inside io_submit, and how much of the
    round trip falls inside it (fio's slat) rather than after (clat) depends on how fast the
    target answers, so completion latency alone misorders fast targets at queue depth 1 (a
    pure-polling run measured 167 us clat for 506 us total). fio gives percentiles of the
    completion latency only, hence p99 is that one's."""
    text = open(path).read()
    doc = json.loads(text[text.index("{"):])
    iops = p99 = 0.0
    lat_sum = ios = 0.0
    errors = 0
    for job in doc["jobs"]:
        errors += job.get("error", 0)
        for d in ("read", "write"):
            r = job[d]
            if r["total_ios"]:
                iops += r["iops"]
                p99 = max(p99, r["clat_ns"]["percentile"]["99.000000"] / 1000)
                lat_sum += r["lat_ns"]["mean"] / 1000 * r["total_ios"]
                ios += r["total_ios"]
    return iops, p99, (lat_sum / ios if ios else 0.0), errors


def rdma_counters(path):
    """Sums of nvmf_get_stats' RDMA device counters over every poll group and device."""
    doc = json.load(open(path))
    sums = {}
    for group in doc.get("poll_groups", []):
        for transport in group.get("transports", []):
            for dev in transport.get("devices", []):
                for k, v in dev.items():
                    if isinstance(v, int):
                        sums[k] = sums.get(k, 0) + v
    return sums
