"""Summarizes the cpu-breakdown scenario: per run, IOPS and, per I/O, the whole VM's CPU split
into user, system, softirq and irq time, its context switches and interrupts; busy and softirq
time by vCPU; every thread's CPU (and fio's, from its own report); softirqs by kind;
soft-RoCE's hardware counters; and for our target its threads' CPU time, context switches and
read/write syscalls, and the requests per send doorbell, polls and idle polls its
nvmf_get_stats counted and the busy time thread_get_stats reports (busy: turns that did work
and the first idle turns of a spin, before the reactor looks at the clock; the rest of a spin
is idle).

Usage: cpu-breakdown.py OUT_DIR RUN_NAME...
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from labstats import fio_totals, rdma_counters  # noqa: E402

USER_HZ = 100
CPU_FIELDS = ["user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"]


def read_snapshot(path):
    snap = {"tasks": {}}
    for line in open(path):
        f = line.split()
        if not f:
            continue
        if f[0] == "cpu":
            snap["cpu"] = dict(zip(CPU_FIELDS, map(int, f[1:9])))
        elif f[0].startswith("cpu"):
            snap.setdefault("vcpus", {})[f[0]] = dict(zip(CPU_FIELDS, map(int, f[1:9])))
        elif f[0] in ("ctxt", "intr", "syscr", "syscw"):
            snap[f[0]] = int(f[1])
        elif f[0].startswith("softirq_"):
            snap[f[0]] = sum(map(int, f[1:]))
        elif f[0].startswith("rxe_") and len(f) == 2:
            # the same counter of several devices or ports: summed
            snap[f[0]] = snap.get(f[0], 0) + int(f[1])
        elif f[0] == "thread_stat":
            # "thread_stat PID (COMM) STATE ...": every thread of the VM (exited ones, such as
            # fio's, drop out). COMM may hold spaces and parentheses: split at the last ")".
            head, _, rest = line.rpartition(")")
            name = head.split("(", 1)[1].replace(" ", "_")
            # a kworker's name carries the workqueue it last ran: keep the worker's part
            if name.startswith("kworker/"):
                name = name.split("-")[0]
            stat = rest.split()
            all_threads = snap.setdefault("threads", {})
            all_threads[name] = all_threads.get(name, 0) + int(stat[11]) + int(stat[12])
        elif f[0] == "task":
            # task COMM UTIME STIME VOLUNTARY NONVOLUNTARY
            name = f[1]
            vals = list(map(int, f[2:6]))
            old = snap["tasks"].get(name, [0, 0, 0, 0])
            snap["tasks"][name] = [a + b for a, b in zip(old, vals)]
    return snap


def main():
    out, runs = sys.argv[1], sys.argv[2:]
    rows = []
    for run in runs:
        base = os.path.join(out, run)
        if not os.path.exists(base + ".json"):
            continue
        iops, p99, mean, errors = fio_totals(base + ".json")
        a, b = read_snapshot(base + ".snap0"), read_snapshot(base + ".snap1")
        text = open(base + ".json").read()
        doc = json.loads(text[text.index("{"):])
        ios = sum(j[d]["total_ios"] for j in doc["jobs"] for d in ("read", "write")) or 1

        def per_io_us(ticks):
            return ticks * 1e6 / USER_HZ / ios

        cpu = {k: b["cpu"][k] - a["cpu"][k] for k in CPU_FIELDS}
        # fio's threads exit before the last snapshot: their CPU is fio's own report, in
        # percent of one CPU over each job's run time.
        fio_us = sum((j["usr_cpu"] + j["sys_cpu"]) / 100 * j["job_runtime"] * 1e3
                     for j in doc["jobs"]) / ios
        busy = sum(cpu.values()) - cpu["idle"] - cpu["iowait"]
        vcpus = {}
        for name, after in b.get("vcpus", {}).items():
            before = a.get("vcpus", {}).get(name, dict.fromkeys(CPU_FIELDS, 0))
            d = {k: after[k] - before[k] for k in CPU_FIELDS}
            vcpus[name] = (per_io_us(sum(d.values()) - d["idle"] - d["iowait"]),
                           per_io_us(d["softirq"]))
        row = {
            "run": run,
            "iops": iops,
            "p99": p99,
            "busy_us": per_io_us(busy),
            "user_us": per_io_us(cpu["user"] + cpu["nice"]),
            "sys_us": per_io_us(cpu["system"]),
            "softirq_us": per_io_us(cpu["softirq"]),
            "irq_us": per_io_us(cpu["irq"]),
            "ctxt": (b["ctxt"] - a["ctxt"]) / ios,
            "intr": (b["intr"] - a["intr"]) / ios,
            "softirqs": {k[8:]: (b[k] - a.get(k, 0)) / ios for k in b if k.startswith("softirq_")},
            "rxe": {k[4:]: (b[k] - a.get(k, 0)) / ios for k in b if k.startswith("rxe_")},
            "tasks": {},
            "vcpus": vcpus,
            "threads": {n: per_io_us(t - a.get("threads", {}).get(n, 0))
                        for n, t in b.get("threads", {}).items()} | {"fio (its report)": fio_us},
        }
        for name, vals in b["tasks"].items():
            old = a["tasks"].get(name, [0, 0, 0, 0])
            d = [y - x for x, y in zip(old, vals)]
            row["tasks"][name] = (per_io_us(d[0]), per_io_us(d[1]), d[2] / ios, d[3] / ios)
        if os.path.exists(base + ".stats1"):
            sa, sb = rdma_counters(base + ".stats0"), rdma_counters(base + ".stats1")
            bells = sb.get("send_doorbell_updates", 0) - sa.get("send_doorbell_updates", 0)
            reqs = sb.get("requests", 0) - sa.get("requests", 0)
            row["per_bell"] = reqs / bells if bells else None
            row["polls"] = (sb.get("polls", 0) - sa.get("polls", 0)) / ios
            row["idle_polls"] = (sb.get("idle_polls", 0) - sa.get("idle_polls", 0)) / ios
        if os.path.exists(base + ".threads1"):
            def busy_ns(path):
                return sum(t["busy"] for t in json.load(open(path))["threads"])
            row["reactor_busy_us"] = (busy_ns(base + ".threads1")
                                      - busy_ns(base + ".threads0")) / 1e3 / ios
        if "syscr" in b:
            row["syscr"] = (b["syscr"] - a["syscr"]) / ios
            row["syscw"] = (b["syscw"] - a["syscw"]) / ios
        rows.append(row)

    print("## Whole VM, per I/O\n")
    print("| run | IOPS | p99 ms | busy us | user us | system us | softirq us | irq us "
          "| context switches | interrupts |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['run']} | {r['iops']:.0f} | {r['p99'] / 1000:.0f} | {r['busy_us']:.0f} "
              f"| {r['user_us']:.0f} | {r['sys_us']:.0f} | {r['softirq_us']:.0f} "
              f"| {r['irq_us']:.0f} | {r['ctxt']:.2f} | {r['intr']:.2f} |")
    names = sorted({n for r in rows for n in r["vcpus"]}, key=lambda n: int(n[3:]))
    if names:
        print("\n## Busy and softirq us per I/O, by vCPU\n")
        print("| run | " + " | ".join(f"{n} busy | {n} softirq" for n in names) + " |")
        print("|---|" + "---:|---:|" * len(names))
        for r in rows:
            print(f"| {r['run']} | " + " | ".join(
                "{:.0f} | {:.0f}".format(*r["vcpus"].get(n, (0, 0))) for n in names) + " |")
    busiest = sorted({n for r in rows for n, us in r["threads"].items() if us >= 2})
    if busiest:
        print("\n## Busiest threads of the VM, user + system us per I/O\n")
        print("(a thread's time includes the softirqs that ran while it was current)\n")
        print("| thread | " + " | ".join(r["run"] for r in rows) + " |")
        print("|---|" + "---:|" * len(rows))
        for n in busiest:
            print(f"| {n} | " + " | ".join(f"{r['threads'].get(n, 0):.0f}" for r in rows) + " |")
    kinds = sorted({k for r in rows for k, v in r["softirqs"].items() if v >= 0.05})
    print("\n## Softirqs per I/O\n")
    print("| run | " + " | ".join(kinds) + " |")
    print("|---|" + "---:|" * len(kinds))
    for r in rows:
        print(f"| {r['run']} | " + " | ".join(f"{r['softirqs'].get(k, 0):.2f}" for k in kinds) + " |")
    counters = sorted({k for r in rows for k, v in r["rxe"].items() if v >= 0.005})
    if counters:
        print("\n## Soft-RoCE counters per I/O\n")
        print("| run | " + " | ".join(counters) + " |")
        print("|---|" + "---:|" * len(counters))
        for r in rows:
            print(f"| {r['run']} | " + " | ".join(f"{r['rxe'].get(k, 0):.2f}" for k in counters)
                  + " |")
    print("\n## Our target's threads, per I/O\n")
    print("| run | thread | user us | system us | voluntary switches | involuntary switches |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        for name, (u, s, v, nv) in sorted(r["tasks"].items()):
            if u + s + v + nv > 0:
                print(f"| {r['run']} | {name} | {u:.0f} | {s:.0f} | {v:.2f} | {nv:.2f} |")
        if "syscr" in r:
            print(f"| {r['run']} | read / write syscalls | | | {r['syscr']:.2f} | {r['syscw']:.2f} |")
    if any(r.get("per_bell") for r in rows):
        print("\n## Our target: doorbells, polls and busy time\n")
        print("| run | requests per doorbell | polls per I/O | idle polls per I/O "
              "| reactor busy us per I/O |")
        print("|---|---:|---:|---:|---:|")
        for r in rows:
            if r.get("per_bell"):
                busy = r.get("reactor_busy_us")
                print(f"| {r['run']} | {r['per_bell']:.2f} | {r['polls']:.1f} "
                      f"| {r['idle_polls']:.1f} | {'' if busy is None else f'{busy:.1f}'} |")


if __name__ == "__main__":
    main()
