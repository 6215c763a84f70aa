#!/usr/bin/env bash
# two-reactors: the same target with one reactor (-m 0x1) and with two (-m 0x3), in one VM
# boot, under two fio jobs from the kernel host (one per vCPU, so each drives its own I/O
# queue: Linux opens one per CPU, and the acceptor puts I/O queues on the least-loaded
# reactor). Two layouts: separate namespaces (a null bdev per job, two subsystems) and one
# shared namespace (both jobs on one device). A benchmark: it prints a table of IOPS and
# whole-VM CPU per I/O, two reactors against one; it checks only that every run did I/O with
# no error.
#
# Under TCG the guest has two vCPUs that also carry fio and rxe's softirq work, so two
# reactors compete with their own load: read the ratios as what this VM can show, not as
# scaling on hardware (the simulated fabric's benchmark measures that; benches/sim-scaling.sh).
#
# Usage: tests/lab/run two-reactors [RUNTIME_SECONDS [REPEATS]]   (default 5 s, 2 repeats)
source "$(dirname "${BASH_SOURCE[0]}")/../guest-lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/../nvmf-lib.sh"
lab_init two-reactors
LAB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

runtime=${1:-5}
repeats=${2:-2}
nqn1=nqn.2016-06.io.spdk:null1
nqn2=nqn.2016-06.io.spdk:null2
lab_rxe_up
mkdir -p "$LAB_OUT/runs"

# start_target MASK: nvmf-tgt on MASK with two subsystems of one null bdev each.
start_target() {
    nvmf_tgt_start -m "$1"
    nvmf_rpc nvmf_create_transport -t RDMA >/dev/null
    local i nqn
    for i in 1 2; do
        nqn=nqn.2016-06.io.spdk:null$i
        nvmf_rpc bdev_null_create "Null$i" 1024 4096 >/dev/null
        nvmf_rpc nvmf_create_subsystem "$nqn" -a -s "SPDK0000000000000$i" >/dev/null
        nvmf_rpc nvmf_subsystem_add_ns "$nqn" "Null$i" >/dev/null
        nvmf_rpc nvmf_subsystem_add_listener "$nqn" -t rdma -f ipv4 -a "$LAB_ADDR0" -s 4420 >/dev/null
    done
}

# run NAME DEV_A DEV_B: one measured fio run of two jobs, A on vCPU 0 against DEV_A and B on
# vCPU 1 against DEV_B, with CPU snapshots around it. lab_fio names the first job itself, and
# options after a --name belong to that job alone, so each job gets the whole set.
run() {
    local name=$1 job=(--ioengine=libaio --direct=1 --runtime="$runtime" --time_based
        --ramp_time=1 --rw=randread --bs=4k --iodepth=16)
    lab_cpu_snapshot "$LAB_OUT/runs/$name.cpu0"
    lab_fio "runs/$name" "${job[@]}" --filename="$2" --cpus_allowed=0 \
        --name=b "${job[@]}" --filename="$3" --cpus_allowed=1 >/dev/null ||
        lab_fail "fio $name failed"
    lab_cpu_snapshot "$LAB_OUT/runs/$name.cpu1"
}

for mask in 0x1 0x3; do
    start_target "$mask"
    dev1=$(lab_nvme_connect "$nqn1" "$LAB_ADDR0" 4420)
    dev2=$(lab_nvme_connect "$nqn2" "$LAB_ADDR0" 4420)
    lab_log "reactor mask $mask: $(nvmf_rpc framework_get_reactors | grep -c '"lcore"') reactors"
    for ((rep = 1; rep <= repeats; rep++)); do
        run "separate-$mask-$rep" "$dev1" "$dev2"
        run "shared-$mask-$rep" "$dev1" "$dev1"
    done
    # Where the I/O queues went: one reactor each with two.
    nvmf_rpc nvmf_get_stats >"$LAB_OUT/stats-$mask.json"
    lab_nvme_disconnect "$nqn1"
    lab_nvme_disconnect "$nqn2"
    nvmf_tgt_stop
done

/usr/bin/python3 - "$LAB_OUT" "$runtime" "$repeats" "$LAB_DIR" >"$LAB_OUT/table.md" <<'PY' ||
import glob, json, os, statistics, sys
out, runtime, repeats = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, sys.argv[4])
from labstats import cpu_busy, fio_totals
runs = os.path.join(out, "runs")

def busy(stem):
    return cpu_busy(os.path.join(runs, stem + ".cpu0"), os.path.join(runs, stem + ".cpu1"))

rows = {}
for path in glob.glob(os.path.join(runs, "*.json")):
    stem = os.path.basename(path)[:-5]
    layout, mask, rep = stem.rsplit("-", 2)
    iops, _, _, errors = fio_totals(path)
    if iops <= 0 or errors:
        print(f"run {stem}: {iops} IOPS, {errors} errors", file=sys.stderr)
        sys.exit(1)
    rows.setdefault(layout, {}).setdefault(mask, []).append((iops, busy(stem)))

for mask in ("0x1", "0x3"):
    path = os.path.join(out, f"stats-{mask}.json")
    groups = json.load(open(path))["poll_groups"]
    print(f"reactor mask {mask}: I/O qpairs per poll group "
          f"{[g.get('current_io_qpairs', 0) for g in groups]}")
print()
med = statistics.median
print(f"fio 2 jobs x 4 KiB randread QD16, {runtime} s per run, median of {repeats}")
print()
print("| namespaces | 1 reactor IOPS | 2 reactors IOPS | 2/1 | 1 reactor CPU % | 2 reactors CPU % | CPU per I/O 2/1 |")
print("|---|---:|---:|---:|---:|---:|---:|")
for layout in ("separate", "shared"):
    one, two = rows[layout]["0x1"], rows[layout]["0x3"]
    i1, i2 = med([x[0] for x in one]), med([x[0] for x in two])
    c1, c2 = med([x[1] for x in one]), med([x[1] for x in two])
    per1, per2 = med([x[1] / x[0] for x in one]), med([x[1] / x[0] for x in two])
    print(f"| {layout} | {i1:.0f} | {i2:.0f} | {i2 / i1:.2f} | {c1:.0f} | {c2:.0f} | {per2 / per1:.2f} |")
PY
    lab_fail "a run did no I/O or had errors (see above)"
cat "$LAB_OUT/table.md"
lab_pass "two-reactors table in $LAB_OUT/table.md"
