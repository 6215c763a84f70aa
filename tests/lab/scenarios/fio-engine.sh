#!/usr/bin/env bash
# fio-engine: fio drives our userspace initiator through the `nvmf` ioengine
# (fio/build-engine.sh), against our nvmf-tgt (malloc bdev) and against the kernel's
# nvmet-rdma target (memory-backed null_blk), in one boot:
# 1. data integrity: fio/jobs/verify.fio (crc32c, 4-128 KiB random writes, read back) through
#    the engine on both targets, zero copy; the same with nvmf_copy=1 (bounce buffers) on the
#    kernel target;
#    I/O above the maximum transfer (MDTS): crc32c verify with blocks larger than the
#    target's MDTS (up to 1 MiB on ours, whose MDTS is max_io_size, 128 KiB by default;
#    4 MiB on nvmet-rdma, whose MDTS is 1 MiB), zero copy and bounce buffers; the engine's
#    log must show the MDTS it found and I/Os split into several commands; what the split
#    writes stored is read back by the kernel host (ours) and from null_blk (kernel);
# 2. every other job file of fio/jobs through the engine on the kernel target, briefly (they
#    run, with thread=1 and the engine's options);
# 3. fio/jobs/randread-4k-qd32.fio through the engine (pure polling, and yielding when idle)
#    vs the same job on the kernel block device (nvme connect + libaio) of the same target,
#    both targets, rotating order, repeated; a table of median IOPS, p99, busy vCPU share and
#    the engine/kernel ratios.
#
# Build on the host first:
#   fio/build-engine.sh && cargo build --release -p nvmf-target -p nvmf-rpc --bins
# Usage: tests/lab/run fio-engine [RUNTIME_SECONDS [REPEATS]]   (default 5 s, 2 repeats;
# tests/run-all passes 2 1: the checks are the same, the table is only indicative)
source "$(dirname "${BASH_SOURCE[0]}")/../guest-lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/../nvmf-lib.sh"
lab_init fio-engine

runtime=${1:-5}
repeats=${2:-2}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd -P)
JOBS=$repo/fio/jobs
SO=$NVMF_BIN_DIR/libnvmf_fio_engine.so
eng=external:$SO
[[ -f $SO ]] || lab_fail "no $SO: run fio/build-engine.sh on the host"
[[ -x $NVMF_BIN_DIR/nvmf-tgt ]] || lab_fail "nvmf-tgt not built in $NVMF_BIN_DIR"
ulimit -l unlimited

lab_rxe_up

# The kernel target: a memory-backed null_blk (keeps data, so verify works) on port 4420.
nullb=$(lab_null_blk 1 256 4096)
lab_kernel_target_up fio-kt "$nullb" "$LAB_ADDR0" 4420
knqn=$(lab_nqn fio-kt)
# Ours: one reactor, a 256 MiB malloc bdev with 4 KiB blocks, port 4421.
nvmf_tgt_start -m 0x1
onqn=nqn.2016-06.io.spdk:fio
nvmf_malloc_subsystem "$onqn" "$LAB_ADDR0" 4421 Malloc0:256:4096

# fio splits file names at ':'; the NQNs have one.
tid() { echo "trtype=RDMA adrfam=IPv4 traddr=$LAB_ADDR0 trsvcid=$1 subnqn=${2//:/\\:} ns=1"; }
kfile=$(tid 4420 "$knqn")
ofile=$(tid 4421 "$onqn")

# fio_job NAME JOB FILENAME ENGINE RUNTIME: a job file of fio/jobs with JSON output in
# $LAB_OUT/NAME.json; prints lab_fio_json_iops's summary. Fails if fio fails.
fio_job() {
    local name=$1 job=$2 file=$3 engine=$4 rt=$5
    local json=$LAB_OUT/$name.json
    lab_log "fio $name: $(basename "$job") on '$file' ($engine)"
    # From the state dir: verify jobs write a state file into the current directory.
    if ! (cd "$LAB_STATE" && export FILENAME=$file ENGINE=$engine RUNTIME=$rt &&
        lab_t $((rt + 120)) fio --output-format=json --output="$json" "$job" >&2); then
        lab_log "fio $name failed; output:"
        cat "$json" >&2 2>/dev/null || true
        return 1
    fi
    lab_fio_json_iops "$json"
}

# ---------------------------------------------------------------- 1. verify --
NVMF_FIO_LOG=nvmf_fio=info fio_job verify-ours "$JOBS/verify.fio" "$ofile" "$eng" "$runtime" ||
    lab_fail "verify through the engine on nvmf-tgt failed"
NVMF_FIO_LOG=nvmf_fio=info fio_job verify-kernel "$JOBS/verify.fio" "$kfile" "$eng" "$runtime" ||
    lab_fail "verify through the engine on the kernel target failed"
lab_fio verify-kernel-copy --ioengine="$eng" --thread=1 --nvmf_copy=1 --filename="$kfile" \
    --rw=randwrite --bsrange=4k-128k --iodepth=8 --size=32M --verify=crc32c --do_verify=1 \
    --verify_fatal=1 ||
    lab_fail "verify through the engine's bounce buffers on the kernel target failed"
# What the engine wrote is what the kernel target stores: written through the engine, then
# verified by reading the backing null_blk directly (fio's verify_only pass, same layout).
vargs=(--rw=write --bs=64k --size=4M --offset=64M --verify=crc32c --randrepeat=1)
lab_fio backing-write --ioengine="$eng" --thread=1 --filename="$kfile" --do_verify=0 \
    "${vargs[@]}" >/dev/null || lab_fail "writing through the engine failed"
lab_fio backing-verify --ioengine=libaio --direct=1 --filename="$nullb" --verify_only=1 \
    "${vargs[@]}" >/dev/null || lab_fail "null_blk does not hold what the engine wrote"

# -------------------------------------------- 1b. I/O above the MDTS --
# The kernel host's block devices of both targets: here to read back what split writes
# stored, in 3. for the comparison.
kdev=$(lab_nvme_connect "$knqn" "$LAB_ADDR0" 4420)
odev=$(lab_nvme_connect "$onqn" "$LAB_ADDR0" 4421)

# split_job NAME FILENAME MAX_BS FIO_ARGS...: fio through the engine with its log (info) in
# $LAB_OUT/NAME.engine.log. Fails if fio fails, or unless the log shows the maximum
# transfer the engine found below MAX_BS (bytes) and I/Os split into several commands.
split_job() {
    local name=$1 file=$2 max_bs=$3 log=$LAB_OUT/$1.engine.log mdts nsplit rc=0
    shift 3
    NVMF_FIO_LOG=nvmf_fio=info lab_fio "$name" --ioengine="$eng" --thread=1 \
        --filename="$file" "$@" 2>"$log" || rc=$?
    cat "$log" >&2
    ((rc == 0)) || lab_fail "$name: fio through the engine failed (see $log)"
    mdts=$(sed -n 's/.*maximum transfer \([0-9][0-9]*\) bytes.*/\1/p' "$log" | head -n 1)
    nsplit=$(sed -n 's/.* \([0-9][0-9]*\) split above the maximum transfer.*/\1/p' "$log" |
        awk '{ n += $1 } END { print n + 0 }')
    [[ -n $mdts ]] || lab_fail "$name: the engine logged no maximum transfer"
    ((max_bs > mdts)) ||
        lab_fail "$name: blocks of up to $max_bs bytes are not above the maximum transfer ($mdts bytes)"
    ((nsplit > 0)) || lab_fail "$name: no I/O was split into several commands"
    lab_log "$name: maximum transfer $mdts bytes, blocks up to $max_bs bytes, $nsplit I/Os split"
    echo "$name: maximum transfer $mdts bytes, blocks up to $max_bs bytes, $nsplit I/Os split" \
        >>"$LAB_OUT/split.txt"
}
sverify=(--rw=randwrite --iodepth=4 --verify=crc32c --do_verify=1 --verify_fatal=1)
# Ours (MDTS 128 KiB): mixed sizes, zero copy (fio's buffers cut into 128 KiB pieces) and
# bounce buffers.
split_job split-ours "$ofile" $((1 << 20)) "${sverify[@]}" --bsrange=4k-1m --size=32M \
    --offset=128M
split_job split-ours-copy "$ofile" $((1 << 20)) "${sverify[@]}" --nvmf_copy=1 \
    --bsrange=4k-1m --size=32M --offset=160M
# nvmet-rdma (MDTS 1 MiB): 4 MiB blocks.
split_job split-kernel "$kfile" $((4 << 20)) "${sverify[@]}" --bs=4m --size=32M --offset=128M
# More parts than the qpair holds (32 I/Os of 1 MiB are 256 commands of 128 KiB; nvmf-tgt's
# queues hold 128): parts wait for room and go out as others complete, and verify holds.
split_job split-ours-full "$ofile" $((1 << 20)) --rw=randwrite --iodepth=32 --bs=1m \
    --size=32M --offset=224M --verify=crc32c --do_verify=1 --verify_fatal=1
waited=$(sed -n 's/.*; \([0-9][0-9]*\) waited for room.*/\1/p' "$LAB_OUT/split-ours-full.engine.log" |
    awk '{ n += $1 } END { print n + 0 }')
((waited > 0)) || lab_fail "split-ours-full: no I/O waited for room in the qpair"
echo "split-ours-full: $waited I/Os waited for room in the qpair" >>"$LAB_OUT/split.txt"
# Each part landed where it belongs: written through the engine in split blocks, verified
# through another path (the kernel host's block device; null_blk itself).
vargs=(--rw=write --bs=1m --size=8M --offset=200M --verify=crc32c --randrepeat=1)
lab_fio split-write-ours --ioengine="$eng" --thread=1 --filename="$ofile" --do_verify=0 \
    "${vargs[@]}" >/dev/null || lab_fail "writing 1 MiB blocks through the engine (nvmf-tgt) failed"
lab_fio split-verify-ours --ioengine=libaio --direct=1 --filename="$odev" --verify_only=1 \
    "${vargs[@]}" >/dev/null || lab_fail "nvmf-tgt does not hold what the engine wrote in 1 MiB blocks"
vargs=(--rw=write --bs=4m --size=16M --offset=200M --verify=crc32c --randrepeat=1)
lab_fio split-write-kernel --ioengine="$eng" --thread=1 --filename="$kfile" --do_verify=0 \
    "${vargs[@]}" >/dev/null || lab_fail "writing 4 MiB blocks through the engine (nvmet-rdma) failed"
lab_fio split-verify-kernel --ioengine=libaio --direct=1 --filename="$nullb" --verify_only=1 \
    "${vargs[@]}" >/dev/null || lab_fail "null_blk does not hold what the engine wrote in 4 MiB blocks"

# ------------------------------------------------------- 2. the job files --
for job in randread-4k-qd1 randwrite-4k-qd1 randwrite-4k-qd32 randrw-70-30 seq-read-128k seq-write-128k; do
    fio_job "jobs-$job" "$JOBS/$job.fio" "$kfile" "$eng" 2 >"$LAB_OUT/jobs-$job.txt" ||
        lab_fail "job file $job.fio through the engine failed"
    cat "$LAB_OUT/jobs-$job.txt"
done

# ------------------------------------------- 3. engine vs kernel block device --
# The engine twice: pure polling (its default, as SPDK's), and giving the vCPU away after
# $idle_spin empty polls for ${idle_us} us (rxe's work and, under TCG, the other vCPU's host
# time compete with a spinning vCPU).
idle_spin=${NVMF_FIO_LAB_IDLE_SPIN:-32}
idle_us=${NVMF_FIO_LAB_IDLE_US:-20}
mkdir -p "$LAB_OUT/runs"
for ((rep = 1; rep <= repeats; rep++)); do
    # Rotate the order, so drift in the VM favours none.
    case $((rep % 3)) in
    1) order=(poll idle bdev) ;;
    2) order=(bdev poll idle) ;;
    0) order=(idle bdev poll) ;;
    esac
    for target in kernel ours; do
        for how in "${order[@]}"; do
            file=$kfile engine=$eng
            [[ $target == ours ]] && file=$ofile
            if [[ $how == bdev ]]; then
                file=$kdev engine=libaio
                [[ $target == ours ]] && file=$odev
            fi
            spin=0
            [[ $how == idle ]] && spin=$idle_spin
            base=runs/$target-$how-$rep
            lab_cpu_snapshot "$LAB_OUT/$base.cpu0"
            NVMF_FIO_IDLE_SPIN=$spin NVMF_FIO_IDLE_SLEEP_US=$idle_us \
                fio_job "$base" "$JOBS/randread-4k-qd32.fio" "$file" "$engine" "$runtime" >/dev/null ||
                lab_fail "randread-4k-qd32 $target $how failed"
            lab_cpu_snapshot "$LAB_OUT/$base.cpu1"
        done
    done
done
lab_nvme_disconnect "$knqn"
lab_nvme_disconnect "$onqn"

/usr/bin/python3 - "$LAB_OUT/runs" "$runtime" "$repeats" "$idle_spin" "$idle_us" <<'PY' | tee "$LAB_OUT/table.md"
import glob, json, os, statistics, sys
runs, runtime, repeats, spin, us = sys.argv[1:6]

def busy(base):
    def load(p):
        for line in open(p):
            f = line.split()
            if f[0] == "cpu":
                return [int(x) for x in f[1:]]
    a, b = load(base + ".cpu0"), load(base + ".cpu1")
    d = [y - x for x, y in zip(a, b)]
    tot = sum(d)
    return 100.0 * (tot - d[3] - d[4]) / tot if tot else 0.0

def run(path):
    text = open(path).read()
    r = json.loads(text[text.index("{"):])["jobs"][0]["read"]
    return r["iops"], r["clat_ns"]["percentile"].get("99.000000", 0) / 1000

rows = {}
for path in sorted(glob.glob(os.path.join(runs, "*.json"))):
    target, how, rep = os.path.basename(path)[:-5].split("-")
    iops, p99 = run(path)
    rows.setdefault(target, {}).setdefault(how, []).append((iops, p99, busy(path[:-5])))

med = lambda xs, i: statistics.median(x[i] for x in xs)
print(f"fio/jobs/randread-4k-qd32.fio, {runtime} s runs x {repeats}, one boot. engine: our ioengine")
print(f"(poll: pure polling; idle: sleeps {us} us after {spin} empty polls); bdev: the")
print("kernel host's block device (nvme connect + libaio) on the same target. Medians of IOPS,")
print("p99 completion latency, busy share of all vCPUs; ratios of median IOPS.")
print()
print("| target | engine poll | engine idle | kernel bdev | poll/bdev | idle/bdev |")
print("|---|---:|---:|---:|---:|---:|")
for target in ("kernel", "ours"):
    r = rows[target]
    cell = lambda how: f"{med(r[how], 0):.0f} IOPS, p99 {med(r[how], 1) / 1000:.1f} ms, {med(r[how], 2):.0f}% busy"
    k = med(r["bdev"], 0)
    ratio = lambda how: f"{med(r[how], 0) / k:.2f}" if k else "n/a"
    name = "kernel nvmet-rdma (null_blk)" if target == "kernel" else "nvmf-tgt (malloc)"
    print(f"| {name} | {cell('poll')} | {cell('idle')} | {cell('bdev')} | {ratio('poll')} | {ratio('idle')} |")
PY

nvmf_tgt_stop
lab_kernel_target_down
lab_pass "fio verify (crc32c) through the engine on nvmf-tgt and nvmet-rdma, zero copy and bounce buffers, also with blocks above the MDTS split into several commands; every job file runs; engine vs kernel block device table"
