#!/usr/bin/env bash
# side-by-side: the same fio jobs, same VM boot, against the kernel's nvmet-rdma target and
# against nvmf-tgt, both on null backends (null_blk without memory backing / bdev_null), both
# on rxe0 at 10.0.0.1, plus ib_write_bw's 4 KiB message rate on the same link. Runs alternate
# between the targets and repeat; the table gives medians and our/kernel ratios, with the busy
# CPU share of the run (rxe is CPU time too: see LAB.md), whole-VM CPU per I/O against the
# kernel's, and idle CPU with the hosts connected.
#
# Ours runs in each idle mode of NVMF_SBS_MODES (default "adaptive pure backoff": sleeping on
# completion channels, SPDK's pure polling, the old spin/yield/nap back-off), restarted per
# mode within each repeat; the back-off mode runs only the QD1 job (its latency and idle CPU
# are what adaptive polling replaces). Each mode gets an idle window with its host connected,
# and the kernel target one alone. Requests per send doorbell come from nvmf_get_stats taken
# around each of our runs.
#
# Usage: tests/lab/run side-by-side [RUNTIME_SECONDS [REPEATS [IDLE_SECONDS]]]
#        (default 5 s, 3 repeats, 10 s idle windows)
# NVMF_SBS_TGT_ARGS: nvmf-tgt's arguments (default "-m 0x1").
# NVMF_SBS_MODES: our runs, each a --poll-mode value or LABEL=ARG,ARG,... (extra nvmf-tgt
#   arguments), e.g. "adaptive eager=--poll-mode,adaptive,--max-spin-us,0 pure".
# NVMF_SBS_JOBS: a regular expression picking jobs by name (default: all).
source "$(dirname "${BASH_SOURCE[0]}")/../guest-lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/../nvmf-lib.sh"
lab_init side-by-side
LAB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

runtime=${1:-5}
repeats=${2:-3}
idle_secs=${3:-10}
lab_rxe_up
wire=$(lab_ib_write_bw rxe0 rxe1 "$LAB_ADDR0" 5 4096)
echo "ib_write_bw 4KiB msg/s: $wire" | tee "$LAB_OUT/ib_write_bw.txt"

# Kernel target: null_blk that discards data, like bdev_null.
nbdev=$(lab_null_blk 1 1024 4096 0)
lab_kernel_target_up kernel "$nbdev" "$LAB_ADDR0" 4420
knqn=$(lab_nqn kernel)

# Our target: one reactor on vCPU 0, bdev_null, port 4421.
read -r -a tgt_args <<<"${NVMF_SBS_TGT_ARGS:--m 0x1}"
read -r -a modes <<<"${NVMF_SBS_MODES:-adaptive pure backoff}"
onqn=nqn.2016-06.io.spdk:null

# ours_up MODE: starts our target idling in MODE (a --poll-mode value, or LABEL=ARG,ARG,...)
# and connects the host; sets odev.
ours_up() {
    nvmf_null_target "$1" "$onqn" "$LAB_ADDR0" 4421 "${tgt_args[@]}"
    odev=$(lab_nvme_connect "$onqn" "$LAB_ADDR0" 4421)
}

ours_down() {
    lab_nvme_disconnect "$onqn"
    nvmf_tgt_stop
}

# idle_window NAME: whole-VM CPU over IDLE_SECONDS with nothing running.
idle_window() {
    sleep 2
    lab_cpu_snapshot "$LAB_OUT/idle/$1.cpu0"
    sleep "$idle_secs"
    lab_cpu_snapshot "$LAB_OUT/idle/$1.cpu1"
}

kdev=$(lab_nvme_connect "$knqn" "$LAB_ADDR0" 4420)

jobs=(
    "randread-4k-qd1:--rw=randread --bs=4k --iodepth=1"
    "randread-4k-qd32:--rw=randread --bs=4k --iodepth=32"
    "randwrite-4k-qd32:--rw=randwrite --bs=4k --iodepth=32"
    "read-128k-qd8:--rw=read --bs=128k --iodepth=8"
)
mkdir -p "$LAB_OUT/runs" "$LAB_OUT/idle"
for ((rep = 1; rep <= repeats; rep++)); do
    # Alternate the order of modes and of targets, so drift in the VM favours none.
    phase=("${modes[@]}")
    if ((rep % 2 == 0)); then
        phase=()
        for ((i = ${#modes[@]} - 1; i >= 0; i--)); do phase+=("${modes[i]}"); done
    fi
    for spec in "${phase[@]}"; do
        mode=${spec%%=*}
        ours_up "$spec"
        for job in "${jobs[@]}"; do
            name=${job%%:*}
            [[ $mode == backoff && $name != randread-4k-qd1 ]] && continue
            [[ $name =~ ${NVMF_SBS_JOBS:-.} ]] || continue
            read -r -a args <<<"${job#*:}"
            if ((rep % 2)); then order=(kernel "$mode"); else order=("$mode" kernel); fi
            for who in "${order[@]}"; do
                dev=$kdev
                [[ $who != kernel ]] && dev=$odev
                # The kernel runs once per mode phase: its runs are told apart by the phase.
                run=$name~$who~$rep-$mode
                base=$LAB_OUT/runs/$run
                [[ $who != kernel ]] && nvmf_rpc nvmf_get_stats >"$base.stats0"
                lab_cpu_snapshot "$base.cpu0"
                lab_fio "runs/$run" --filename="$dev" --ioengine=libaio --direct=1 \
                    --runtime="$runtime" --time_based --ramp_time=1 --size=512M "${args[@]}" >/dev/null
                lab_cpu_snapshot "$base.cpu1"
                [[ $who != kernel ]] && nvmf_rpc nvmf_get_stats >"$base.stats1"
            done
        done
        # Idle with both targets' hosts connected and quiet.
        idle_window "$mode~$rep"
        ours_down
    done
    # The kernel target and its host alone: the difference is what ours and its host cost.
    idle_window "kernel~$rep"
done
lab_nvme_disconnect "$knqn"

/usr/bin/python3 - "$LAB_OUT" "$wire" "$runtime" "$repeats" "$LAB_DIR" <<'PY' | tee "$LAB_OUT/table.md"
import glob, os, statistics, sys
out, wire, runtime, repeats = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
sys.path.insert(0, sys.argv[5])
from labstats import cpu_busy, fio_totals, rdma_counters

runs = os.path.join(out, "runs")
rows = {}
# (who, "REPEAT-PHASE") -> (IOPS, mean latency, CPU) per job, to pair each of our runs with
# the kernel's run next to it (same repeat, same phase) and with pure polling's run of
# the same repeat: run-to-run swings under TCG are larger than the differences measured.
paired = {}
for path in glob.glob(os.path.join(runs, "*.json")):
    stem = os.path.basename(path)[:-5]
    name, who, rep = stem.split("~")
    iops, p99, mean, errors = fio_totals(path)
    if errors:
        sys.exit(f"run {stem}: fio reported {errors} errors")
    base = os.path.join(runs, stem)
    cpu = cpu_busy(base + ".cpu0", base + ".cpu1")
    per_bell = None
    if os.path.exists(base + ".stats1"):
        a, b = rdma_counters(base + ".stats0"), rdma_counters(base + ".stats1")
        bells = b.get("send_doorbell_updates", 0) - a.get("send_doorbell_updates", 0)
        reqs = b.get("requests", 0) - a.get("requests", 0)
        per_bell = reqs / bells if bells else None
    rows.setdefault(name, {}).setdefault(who, []).append((iops, p99, mean, cpu, per_bell))
    paired.setdefault(name, {})[(who, rep)] = (iops, mean, cpu)

med = statistics.median
print(f"ib_write_bw 4 KiB on the same link: {wire} msg/s; fio {runtime} s per run, median of "
      f"{repeats} repeats (the kernel's runs: of every mode phase); mean latency is fio's "
      f"total (submission + completion), p99 the completion latency's")
print()
print("| job | target | IOPS | vs kernel | mean lat us | p99 us | VM CPU % | CPU per I/O vs kernel | requests per send doorbell | IOPS / wire msg rate |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
order = ["randread-4k-qd1", "randread-4k-qd32", "randwrite-4k-qd32", "read-128k-qd8"]
for name in order:
    by = rows.get(name, {})
    k = by.get("kernel")
    if not k:
        continue
    ki = med([x[0] for x in k])
    kc = med([x[3] / x[0] for x in k if x[0]])
    known = ["adaptive", "pure", "backoff"]
    others = sorted(w for w in by if w != "kernel" and w not in known)
    for who in ["kernel"] + [w for w in known + others if w in by]:
        xs = by[who]
        iops = med([x[0] for x in xs])
        per_io = med([x[3] / x[0] for x in xs if x[0]])
        bells = [x[4] for x in xs if x[4] is not None]
        bell = f"{med(bells):.2f}" if bells else "-"
        print(f"| {name} | {who} | {iops:.0f} | {iops / ki:.2f} | {med([x[2] for x in xs]):.0f} | "
              f"{med([x[1] for x in xs]):.0f} | {med([x[3] for x in xs]):.0f} | {per_io / kc:.2f} | "
              f"{bell} | {f'{iops / wire:.2f}' if wire else '-'} |")

print()
print("Paired, medians of per-repeat ratios: each of our runs against the kernel's run of the "
      "same job next to it (same repeat, same phase; the order alternates by repeat), and "
      "against pure polling's run of the same repeat. The kernel's runs in a pure phase have "
      "our idle target spinning beside them: only the adaptive pairs compare against an "
      "undisturbed kernel.")
print()
print("| job | target | IOPS vs kernel | CPU per I/O vs kernel | mean lat vs kernel | mean lat vs pure | pairs |")
print("|---|---|---:|---:|---:|---:|---:|")
for name in order:
    runs_of = paired.get(name, {})
    whos = sorted({w for (w, _) in runs_of if w != "kernel"}, key=lambda w: (w != "adaptive", w))
    for who in whos:
        iops_r, cpu_r, lat_r, pure_r = [], [], [], []
        for (w, rep), (iops, mean, cpu) in runs_of.items():
            if w != who or not iops:
                continue
            k = runs_of.get(("kernel", rep))
            if k and k[0]:
                iops_r.append(iops / k[0])
                cpu_r.append((cpu / iops) / (k[2] / k[0]))
                lat_r.append(mean / k[1])
            pure = [v for (pw, prep), v in runs_of.items()
                    if pw == "pure" and prep.split("-", 1)[0] == rep.split("-", 1)[0]]
            if who != "pure" and pure and pure[0][1]:
                pure_r.append(mean / pure[0][1])
        fmt = lambda xs: f"{med(xs):.2f}" if xs else "-"
        print(f"| {name} | {who} | {fmt(iops_r)} | {fmt(cpu_r)} | {fmt(lat_r)} | {fmt(pure_r)} | "
              f"{len(iops_r)} |")

idle = {}
for path in glob.glob(os.path.join(out, "idle", "*.cpu0")):
    stem = path[:-5]
    who = os.path.basename(stem).split("~")[0]
    idle.setdefault(who, []).append(cpu_busy(stem + ".cpu0", stem + ".cpu1"))
if "kernel" in idle:
    kernel = med(idle["kernel"])
    print()
    print(f"idle, whole VM, median: {kernel:.1f}% with the kernel target and its host connected")
    for who in sorted(w for w in idle if w != "kernel"):
        if who in idle:
            both = med(idle[who])
            print(f"- with ours ({who}) and its host connected too: {both:.1f}% "
                  f"(ours adds {both - kernel:.1f} points)")
PY
lab_pass "side-by-side table in $LAB_OUT/table.md"
