#!/usr/bin/env bash
# initiator-kernel-target: our userspace initiator against the Linux kernel's nvmet-rdma
# target (a target we did not write), on a memory-backed null_blk and on a brd RAM disk:
# nvmf-host discover / identify, a pattern written with nvmf-host and read back identical
# (with the pool's key, and with per-command memory-window keys the target invalidates),
# nvmf-perf 4k randread qd32 and 70/30 randrw (IOPS, p99) and 128k randrw with memory
# windows, the library's hardware test (pool keys, then memory windows), and
# nvmf-perf and fio through our ioengine (if fio/build-engine.sh built it) against the kernel
# host's fio on its block device of the same target (same size and depth, three rotating
# rounds, medians) in the same boot.
#
# Usage: tests/lab/run initiator-kernel-target [RUNTIME_SECONDS [ROUNDS]]   (default 5 s, 3 rounds;
# tests/run-all passes 2 1: every check is kept, the side-by-side line is only indicative)
source "$(dirname "${BASH_SOURCE[0]}")/../guest-lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/../nvmf-lib.sh"
lab_init initiator-kernel-target

runtime=${1:-5}
rounds=${2:-3}
port=4420
ulimit -l unlimited
source "$(dirname "${BASH_SOURCE[0]}")/../initiator-lib.sh"

lab_rxe_up
nullb=$(lab_null_blk 1 256 4096)
ram=$(lab_brd 256 1)
lab_kernel_target_up kt-nullb "$nullb" "$LAB_ADDR0" "$port"
lab_kernel_target_up kt-ram "$ram" "$LAB_ADDR0" "$port"

summary=()
for name in kt-nullb kt-ram; do
    nqn=$(lab_nqn "$name")
    r="trtype:RDMA adrfam:IPv4 traddr:$LAB_ADDR0 trsvcid:$port subnqn:$nqn"

    # Discovery must list the subsystem.
    lab_t 60 "$HOST" discover -r "trtype:RDMA adrfam:IPv4 traddr:$LAB_ADDR0 trsvcid:$port" \
        | tee "$LAB_OUT/$name-discover.txt" >&2 || lab_fail "nvmf-host discover failed"
    grep -q "subnqn: *$nqn\$" "$LAB_OUT/$name-discover.txt" || lab_fail "discovery does not list $nqn"

    lab_t 60 "$HOST" identify -r "$r" ctrl | tee "$LAB_OUT/$name-id-ctrl.txt" >&2 || lab_fail "identify ctrl failed"
    grep -q "^subnqn *: *$nqn" "$LAB_OUT/$name-id-ctrl.txt" || lab_fail "identify ctrl: no subnqn $nqn"
    lab_t 60 "$HOST" identify -r "$r" ns -n 1 | tee "$LAB_OUT/$name-id-ns.txt" >&2 || lab_fail "identify ns failed"
    grep -q "^nsze *: *0x" "$LAB_OUT/$name-id-ns.txt" || lab_fail "identify ns: no nsze"

    # Data integrity: 4 MiB of random data written, read back and compared, and found on
    # the backing device. The block size is the namespace's (null_blk: 4 KiB, brd: 512 B).
    lbads=$(sed -n 's/^lbaf .*lbads:\([0-9]*\).*(in use).*/\1/p' "$LAB_OUT/$name-id-ns.txt")
    [[ -n $lbads ]] || lab_fail "identify ns: no LBA format in use"
    bs=$((1 << lbads))
    count=$(((4 << 20) / bs))
    # Once with the pool's key (auto on rxe), once with per-command keys (memory windows,
    # Keyed SGL subtype Invalidate: the kernel target RDMA READs the 128 KiB writes through
    # each command's window and invalidates its key with SEND_WITH_INVALIDATE).
    dev=$nullb
    [[ $name == kt-ram ]] && dev=$ram
    for keys in auto:1000 on:3000; do
        mw=${keys%:*} lba=${keys#*:}
        head -c $((4 << 20)) /dev/urandom >"$LAB_STATE/pattern"
        lab_t 60 "$HOST" write -r "$r" -n 1 -s "$lba" -c "$count" -f "$LAB_STATE/pattern" \
            --memory-windows "$mw" >&2 || lab_fail "nvmf-host write (memory windows $mw) failed"
        lab_t 60 "$HOST" read -r "$r" -n 1 -s "$lba" -c "$count" -f "$LAB_STATE/back" \
            --memory-windows "$mw" >&2 || lab_fail "nvmf-host read (memory windows $mw) failed"
        cmp "$LAB_STATE/pattern" "$LAB_STATE/back" ||
            lab_fail "$name: data read back differs (memory windows $mw)"
        lab_t 30 dd if="$dev" of="$LAB_STATE/direct" bs="$bs" skip="$lba" count="$count" \
            iflag=direct status=none
        cmp "$LAB_STATE/pattern" "$LAB_STATE/direct" ||
            lab_fail "$name: backing device differs from what was written (memory windows $mw)"
    done

    lab_t 30 "$HOST" smart-log -r "$r" >&2 || lab_fail "smart-log failed"

    for job in "randread -q 32" "randrw -M 70 -q 32"; do
        tag=$(echo "$job" | awk '{print $1}')
        # shellcheck disable=SC2086
        lab_t $((runtime + 60)) "$PERF" -r "$r" -o 4096 -w $job -t "$runtime" --json \
            >"$LAB_OUT/$name-perf-$tag.json" 2>"$LAB_OUT/$name-perf-$tag.err" ||
            { cat "$LAB_OUT/$name-perf-$tag.err" >&2; lab_fail "$name: nvmf-perf $job failed"; }
        line=$(perf_summary "$LAB_OUT/$name-perf-$tag.json")
        echo "nvmf-perf $name 4k $tag qd32 ${runtime}s: $line"
        summary+=("nvmf-perf $name $tag: $line")
    done
    lab_t $((runtime + 60)) "$PERF" -r "$r" -o 131072 -w randrw -M 50 -q 16 -t "$runtime" \
        --memory-windows on --json >"$LAB_OUT/$name-perf-mw.json" 2>"$LAB_OUT/$name-perf-mw.err" ||
        { cat "$LAB_OUT/$name-perf-mw.err" >&2; lab_fail "$name: nvmf-perf with memory windows failed"; }
    perf_check_keys "$LAB_OUT/$name-perf-mw.json" remote
    summary+=("nvmf-perf $name 128k randrw qd16, memory windows: $(perf_summary "$LAB_OUT/$name-perf-mw.json")")
done

# The library's own hardware test on the null_blk subsystem.
run_host_test "$(lab_nqn kt-nullb)" "$port" kernel auto
run_host_test "$(lab_nqn kt-nullb)" "$port" kernel-windows on remote

# nvmf-perf and fio through our ioengine (when fio/build-engine.sh built it) against the
# kernel host's fio on the same kernel target, same size and depth, alternating (three
# rounds, the order rotated each round): the machine is shared, so single runs are off by
# 20-30%; medians of the same boot are what count.
SO=$NVMF_BIN_DIR/libnvmf_fio_engine.so
lab_nvme_host_up
nqn=$(lab_nqn kt-nullb)
r="trtype:RDMA adrfam:IPv4 traddr:$LAB_ADDR0 trsvcid:$port subnqn:$nqn"
blk=$(lab_nvme_connect "$nqn" "$LAB_ADDR0" "$port")
kfio() { # NAME RW [fio args]
    local n=$1 rw=$2
    shift 2
    lab_fio "$n" "--filename=$blk" --ioengine=libaio --direct=1 --bs=4k --rw="$rw" --iodepth=32 \
        --runtime="$runtime" --time_based "$@" >/dev/null
}
efio() { # NAME RW [fio args]: the same job as kfio through our ioengine
    local n=$1 rw=$2
    shift 2
    lab_fio "$n" "--filename=trtype=RDMA adrfam=IPv4 traddr=$LAB_ADDR0 trsvcid=$port subnqn=${nqn//:/\\:} ns=1" \
        --ioengine="external:$SO" --thread=1 --bs=4k --rw="$rw" --iodepth=32 \
        --runtime="$runtime" --time_based "$@" >/dev/null
}
uperf() { # NAME -w ARGS...
    local n=$1
    shift
    lab_t $((runtime + 60)) "$PERF" -r "$r" -o 4096 -q 32 -t "$runtime" --json "$@" \
        >"$LAB_OUT/$n.json" 2>"$LAB_OUT/$n.err" || { cat "$LAB_OUT/$n.err" >&2; lab_fail "nvmf-perf $* failed"; }
}
for ((round = 1; round <= rounds; round++)); do
    for job in randread randrw; do
        mix=()
        [[ $job == randrw ]] && mix=(-M 70)
        fmix=()
        [[ $job == randrw ]] && fmix=(--rwmixread=70)
        order=(perf kfio efio)
        ((round == 2)) && order=(kfio efio perf)
        ((round == 3)) && order=(efio perf kfio)
        for who in "${order[@]}"; do
            case $who in
            perf) uperf "cmp-perf-$job-$round" -w "$job" "${mix[@]}" ;;
            kfio) kfio "cmp-kfio-$job-$round" "$job" "${fmix[@]}" ;;
            efio)
                [[ -f $SO ]] || continue
                efio "cmp-efio-$job-$round" "$job" "${fmix[@]}" || lab_fail "fio through the engine failed"
                ;;
            esac
        done
    done
done
lab_nvme_disconnect "$nqn"
/usr/bin/python3 - "$LAB_OUT" "$rounds" <<'PY' | tee "$LAB_OUT/compare.txt"
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def load(p):
    t = open(p).read()
    return json.loads(t[t.index("{"):])
def fio_run(path):
    j = load(path)["jobs"][0]
    iops = j["read"]["iops"] + j["write"]["iops"]
    p99 = max(j[d]["clat_ns"]["percentile"]["99.000000"] for d in ("read", "write") if j[d]["total_ios"]) / 1000
    return iops, p99
med = statistics.median
for job in ("randread", "randrw"):
    p_iops, p_p99, k_iops, k_p99, e_iops, e_p99 = [], [], [], [], [], []
    for r in range(1, rounds + 1):
        t = load(f"{out}/cmp-perf-{job}-{r}.json")["total"]
        p_iops.append(t["iops"]); p_p99.append(t["latency_us"]["p99"])
        i, p = fio_run(f"{out}/cmp-kfio-{job}-{r}.json"); k_iops.append(i); k_p99.append(p)
        try:
            i, p = fio_run(f"{out}/cmp-efio-{job}-{r}.json"); e_iops.append(i); e_p99.append(p)
        except FileNotFoundError:
            pass
    ratio = lambda xs: med(a / b for a, b in zip(xs, k_iops) if b)
    line = (f"4k {job} qd32 (median of {rounds}): nvmf-perf {med(p_iops):.0f} IOPS p99 {med(p_p99):.0f}us"
            f" | kernel host fio {med(k_iops):.0f} IOPS p99 {med(k_p99):.0f}us"
            f" | nvmf-perf/kernel {ratio(p_iops):.2f}")
    if len(e_iops) == rounds:
        line += (f" | fio+our engine {med(e_iops):.0f} IOPS p99 {med(e_p99):.0f}us"
                 f" | engine/kernel {ratio(e_iops):.2f}")
    print(line)
PY
while read -r l; do summary+=("$l"); done <"$LAB_OUT/compare.txt"

summary+=("rxe counters: $(lab_rxe_counters | tr '\n' ' ')")
printf '%s\n' "${summary[@]}" | tee "$LAB_OUT/summary.txt"
lab_kernel_target_down
lab_pass "discover, identify, 4 MiB write+read back identical on null_blk and brd (pool keys and memory windows with remote invalidation), nvmf-perf randread and randrw, nvmf-perf and our fio engine side by side with kernel fio"
