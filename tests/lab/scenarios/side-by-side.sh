#!/usr/bin/env bash
# side-by-side: the same fio jobs, same VM boot, against the kernel's nvmet-rdma target and
# against nvmf-tgt, both on null backends (null_blk without memory backing / bdev_null), both
# on rxe0 at 10.0.0.1, plus ib_write_bw's 4 KiB message rate on the same link. Runs alternate
# between the targets and repeat; the table gives medians and our/kernel ratios, with the busy
# CPU share of the run (rxe is CPU time too: see LAB.md), whole-VM CPU per I/O against the
# kernel's, and idle CPU with the hosts connected.
#
# Usage: tests/lab/run side-by-side [RUNTIME_SECONDS [REPEATS [IDLE_SECONDS]]]
#        (default 5 s, 3 repeats, 10 s idle windows)
# NVMF_SBS_TGT_ARGS: nvmf-tgt's arguments (default "-m 0x1").
source "$(dirname "${BASH_SOURCE[0]}")/../guest-lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/../nvmf-lib.sh"
lab_init side-by-side

runtime=${1:-5}
repeats=${2:-3}
idle_secs=${3:-10}
lab_rxe_up
wire=$(lab_ib_write_bw rxe0 rxe1 "$LAB_ADDR0" 5 4096)
echo "ib_write_bw 4KiB msg/s: $wire" | tee "$LAB_OUT/ib_write_bw.txt"

# Kernel target: null_blk that discards data, like bdev_null.
lab_modprobe null_blk nr_devices=0
nb=$NULLB_CFS/nullb_sbs
lab_t 30 mkdir "$nb"
lab__record nullb "$nb"
lab_write 1024 "$nb/size"
lab_write 4096 "$nb/blocksize"
lab_write 0 "$nb/memory_backed"
lab_write 1 "$nb/power"
lab_wait_until 10 "null_blk" sh -c "test -b /dev/nullb_sbs || ls /dev/nullb* >/dev/null"
nbdev=/dev/nullb_sbs
[[ -b $nbdev ]] || nbdev=/dev/nullb$(cat "$nb/index")
lab_kernel_target_up kernel "$nbdev" "$LAB_ADDR0" 4420
knqn=$(lab_nqn kernel)

# Our target: one reactor on vCPU 0, bdev_null, port 4421.
read -r -a tgt_args <<<"${NVMF_SBS_TGT_ARGS:--m 0x1}"
nvmf_tgt_start "${tgt_args[@]}"
onqn=nqn.2016-06.io.spdk:null
nvmf_rpc nvmf_create_transport -t RDMA >/dev/null
nvmf_rpc bdev_null_create Null0 1024 4096 >/dev/null
nvmf_rpc nvmf_create_subsystem "$onqn" -a -s SPDK00000000000002 >/dev/null
nvmf_rpc nvmf_subsystem_add_ns "$onqn" Null0 >/dev/null
nvmf_rpc nvmf_subsystem_add_listener "$onqn" -t rdma -f ipv4 -a "$LAB_ADDR0" -s 4421 >/dev/null

kdev=$(lab_nvme_connect "$knqn" "$LAB_ADDR0" 4420)
odev=$(lab_nvme_connect "$onqn" "$LAB_ADDR0" 4421)

jobs=(
    "randread-4k-qd1:--rw=randread --bs=4k --iodepth=1"
    "randread-4k-qd32:--rw=randread --bs=4k --iodepth=32"
    "randwrite-4k-qd32:--rw=randwrite --bs=4k --iodepth=32"
    "read-128k-qd8:--rw=read --bs=128k --iodepth=8"
)
mkdir -p "$LAB_OUT/runs"
for ((rep = 1; rep <= repeats; rep++)); do
    # Alternate which target goes first, so drift in the VM does not favour one.
    if ((rep % 2)); then order=(kernel ours); else order=(ours kernel); fi
    for job in "${jobs[@]}"; do
        name=${job%%:*}
        read -r -a args <<<"${job#*:}"
        for who in "${order[@]}"; do
            dev=$kdev
            [[ $who == ours ]] && dev=$odev
            base=$LAB_OUT/runs/$name-$who-$rep
            lab_cpu_snapshot "$base.cpu0"
            lab_fio "runs/$name-$who-$rep" --filename="$dev" --ioengine=libaio --direct=1 \
                --runtime="$runtime" --time_based --ramp_time=1 --size=512M "${args[@]}" >/dev/null
            lab_cpu_snapshot "$base.cpu1"
        done
    done
done

# Idle with hosts connected: both targets' hosts connected and quiet; later (below) ours
# disconnected and stopped while the kernel target and its host stay: the difference is what
# our target and its connected host cost while idle.
sleep 2
lab_cpu_snapshot "$LAB_OUT/idle-both.cpu0"
sleep "$idle_secs"
lab_cpu_snapshot "$LAB_OUT/idle-both.cpu1"

/usr/bin/python3 - "$LAB_OUT/runs" "$wire" "$runtime" "$repeats" <<'PY' | tee "$LAB_OUT/table.md"
import glob, json, os, statistics, sys
runs, wire, runtime, repeats = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]

def cpu_busy(before, after):
    def load(p):
        for line in open(p):
            f = line.split()
            if f[0] == "cpu":
                return [int(x) for x in f[1:]]
    a, b = load(before), load(after)
    d = [y - x for x, y in zip(a, b)]
    total = sum(d)
    return 100.0 * (total - d[3] - d[4]) / total if total else 0.0

rows = {}
for path in glob.glob(os.path.join(runs, "*.json")):
    stem = os.path.basename(path)[:-5]
    name, who, rep = stem.rsplit("-", 2)
    text = open(path).read()
    doc = json.loads(text[text.index("{"):])
    iops = p99 = 0.0
    for job in doc["jobs"]:
        for d in ("read", "write"):
            r = job[d]
            if r["total_ios"]:
                iops += r["iops"]
                p99 = max(p99, r["clat_ns"]["percentile"]["99.000000"] / 1000)
    cpu = cpu_busy(os.path.join(runs, stem + ".cpu0"), os.path.join(runs, stem + ".cpu1"))
    rows.setdefault(name, {}).setdefault(who, []).append((iops, p99, cpu))

med = lambda xs: statistics.median(xs)
print(f"ib_write_bw 4 KiB on the same link: {wire} msg/s; fio {runtime} s per run, median of {repeats}")
print()
print("| job | kernel IOPS | ours IOPS | ours/kernel | kernel p99 us | ours p99 us | kernel CPU % | ours CPU % | CPU per I/O ours/kernel | ours IOPS / wire msg rate |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
order = ["randread-4k-qd1", "randread-4k-qd32", "randwrite-4k-qd32", "read-128k-qd8"]
for name in order:
    k, o = rows.get(name, {}).get("kernel", []), rows.get(name, {}).get("ours", [])
    if not k or not o:
        continue
    ki, oi = med([x[0] for x in k]), med([x[0] for x in o])
    # Whole-VM busy share over IOPS: CPU per I/O (the same runtime and vCPUs for both).
    kc, oc = med([x[2] / x[0] for x in k if x[0]]), med([x[2] / x[0] for x in o if x[0]])
    print(f"| {name} | {ki:.0f} | {oi:.0f} | {oi / ki:.2f} | {med([x[1] for x in k]):.0f} | "
          f"{med([x[1] for x in o]):.0f} | {med([x[2] for x in k]):.0f} | {med([x[2] for x in o]):.0f} | "
          f"{oc / kc:.2f} | {oi / wire:.2f} |")
PY

lab_nvme_disconnect "$onqn"
nvmf_tgt_stop
sleep 2
lab_cpu_snapshot "$LAB_OUT/idle-kernel.cpu0"
sleep "$idle_secs"
lab_cpu_snapshot "$LAB_OUT/idle-kernel.cpu1"
/usr/bin/python3 - "$LAB_OUT" <<'PY' | tee -a "$LAB_OUT/table.md"
import os, sys
out = sys.argv[1]
def busy(stem):
    def load(p):
        for line in open(p):
            f = line.split()
            if f[0] == "cpu":
                return [int(x) for x in f[1:]]
    a, b = load(os.path.join(out, stem + ".cpu0")), load(os.path.join(out, stem + ".cpu1"))
    d = [y - x for x, y in zip(a, b)]
    return 100.0 * (sum(d) - d[3] - d[4]) / sum(d) if sum(d) else 0.0
both, kernel = busy("idle-both"), busy("idle-kernel")
print()
print(f"idle, whole VM: {kernel:.1f}% with the kernel target and its host connected; "
      f"{both:.1f}% with ours and its host connected too (ours adds {both - kernel:.1f} points)")
PY
lab_nvme_disconnect "$knqn"
lab_pass "side-by-side table in $LAB_OUT/table.md"
