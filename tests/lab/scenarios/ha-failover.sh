#!/usr/bin/env bash
# ha-failover: two target nodes, one namespace. Two nvmf-tgt processes in the guest export the
# same backing file (bdev_aio, O_DIRECT, on ext4 over a RAM disk) under the same subsystem NQN,
# serial, model and namespace NGUID/UUID, with ANA reporting and disjoint cntlid ranges (A:
# 1-100 on LAB_ADDR0:4420, B: 101-200 on LAB_ADDR0:4421). The Linux host (native multipath)
# sees one namespace with two paths. fio (libaio, direct, randwrite with crc32c verify of every
# block soon after it is written) runs on the multipath head device throughout these steps:
#   1. optimized: A optimized, B non-optimized; I/O goes to A
#   2. inaccessible: A set inaccessible (ANA change notice); I/O moves to B, no error
#   3. killed: target A killed with kill -9; I/O continues on B
#   4. restarted: A restarted from the config saved after step 2 (its path comes back
#      inaccessible, as saved); still on B
#   5. failback: A set optimized; I/O returns to A
# Each step checks `nvme list-subsys` and `nvme ana-log`, counts writes per path (each
# target's bdev_get_iostat, and the hidden path devices' /sys/block/nvmeXcYnZ/stat), and
# finds the longest pause in fio's 100 ms IOPS log around the step. Passes with zero verify
# errors, a final write-then-verify pass, and a result table.
# Then the userspace initiator (#16 item 4), with the kernel host disconnected: nvmf-perf given
# both addresses runs a 4 KiB randrw mix through the same steps (A inaccessible, A killed, A
# restarted from its saved config, failback), and must end with zero I/O errors, I/O moved to
# the other path at least once and I/O done through each path; then nvmf-host writes 1 MiB
# over the two paths and reads it back identical.
# Arguments: [SECONDS_PER_STEP] (default 8).
source "$(dirname "${BASH_SOURCE[0]}")/../guest-lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/../nvmf-lib.sh"
lab_init ha-failover
source "$(dirname "${BASH_SOURCE[0]}")/../initiator-lib.sh"

step_secs=${1:-8}
nqn=nqn.2016-06.io.spdk:ha
serial=SPDKHA00000000000001
model="nvmf-rs HA lab"
nguid=6E766D66727320484100000000000001
uuid=6e766d66-7273-4841-8000-000000000001
port_a=4420
port_b=4421

lab_rxe_up
lab_nvme_host_up
mnt=$(lab_mount_tmp_ext4 256)
file=$mnt/shared.img
lab_t 30 truncate -s 128M "$file"

# Two targets: nvmf_tgt_start handles one (NVMF_TGT_PID, NVMF_RPC_SOCK, one log), so these
# wrappers keep a socket, a pid and a log per name. Both run on core 0 (-m 0x1): nvmf-tgt
# takes no per-core lock files.
declare -A TGT_PID TGT_SOCK
tgt_rpc() {
    local name=$1
    shift
    NVMF_RPC_SOCK=${TGT_SOCK[$name]} nvmf_rpc "$@"
}
tgt_start() {
    local name=$1 dir
    shift
    ulimit -l unlimited
    dir=$(mktemp -d "/tmp/nvmf-rpc-$name.XXXXXX")
    TGT_SOCK[$name]=$dir/spdk.sock
    lab_log "starting nvmf-tgt $name $*"
    RUST_LOG=${RUST_LOG:-info} "$NVMF_BIN_DIR/nvmf-tgt" -r "${TGT_SOCK[$name]}" "$@" \
        >>"$LAB_OUT/nvmf-tgt-$name.log" 2>&1 &
    TGT_PID[$name]=$!
    lab__record bgpids "${TGT_PID[$name]}"
    lab_wait_until 30 "nvmf-tgt $name RPC socket" test -S "${TGT_SOCK[$name]}" ||
        lab_fail "nvmf-tgt $name: no RPC socket"
    lab_wait_until 30 "nvmf-tgt $name RPC answers" tgt_rpc "$name" spdk_get_version ||
        lab_fail "nvmf-tgt $name: RPC does not answer"
}
# tgt_setup NAME PORT MIN MAX ANA_STATE: the shared namespace behind one target.
tgt_setup() {
    local name=$1 port=$2 min=$3 max=$4 state=$5
    tgt_rpc "$name" nvmf_create_transport -t RDMA >/dev/null
    tgt_rpc "$name" bdev_aio_create "$file" Aio0 4096 >/dev/null
    tgt_rpc "$name" nvmf_create_subsystem "$nqn" -a -s "$serial" -d "$model" -r \
        -i "$min" -I "$max" >/dev/null
    tgt_rpc "$name" nvmf_subsystem_add_ns "$nqn" Aio0 -n 1 -g "$nguid" -u "$uuid" >/dev/null
    tgt_rpc "$name" nvmf_subsystem_add_listener "$nqn" -t rdma -f ipv4 -a "$LAB_ADDR0" \
        -s "$port" -n "$state" >/dev/null
}
set_ana() { # NAME PORT STATE
    tgt_rpc "$1" nvmf_subsystem_listener_set_ana_state "$nqn" -t rdma -f ipv4 \
        -a "$LAB_ADDR0" -s "$2" -n "$3" >/dev/null
}

tgt_start a -m 0x1
tgt_setup a "$port_a" 1 100 optimized
tgt_start b -m 0x1
tgt_setup b "$port_b" 101 200 non_optimized
tgt_rpc a nvmf_subsystem_get_listeners "$nqn" >"$LAB_OUT/listeners-a.json"

# The host: one controller per target. A short reconnect delay so the restarted target is
# found again quickly; a loss timeout long enough to outlive the kill.
conn_opts=(--reconnect-delay=1 --ctrl-loss-tmo=120)
dev=$(lab_nvme_connect "$nqn" "$LAB_ADDR0" "$port_a" "${conn_opts[@]}")
lab_t 60 nvme connect -t rdma -n "$nqn" -a "$LAB_ADDR0" -s "$port_b" "${conn_opts[@]}" >&2
lab_log "multipath head device: $dev"

# ctrl_of PORT: the host controller (nvmeY) whose address has trsvcid PORT.
ctrl_of() {
    local c
    for c in /sys/class/nvme/nvme*; do
        [[ $(cat "$c/subsysnqn" 2>/dev/null) == "$nqn" ]] || continue
        [[ $(cat "$c/address" 2>/dev/null) == *"trsvcid=$1"* ]] && { basename "$c"; return 0; }
    done
    return 1
}
# path_of PORT: the hidden per-path block device (nvmeXcYnZ) of that controller.
path_of() {
    local ctrl p
    ctrl=$(ctrl_of "$1") || return 1
    for p in /sys/class/nvme/"$ctrl"/nvme*c*n*; do
        [[ -e $p ]] && { basename "$p"; return 0; }
    done
    return 1
}
path_state() { # PORT: the ANA state the host holds for that path
    local p
    p=$(path_of "$1") && cat "/sys/block/$p/ana_state" 2>/dev/null || echo gone
}
lab_wait_until 60 "two paths" sh -c "[ \$(ls -d /sys/class/nvme/nvme*/nvme*c*n* 2>/dev/null | wc -l) -ge 2 ]" ||
    lab_fail "the host does not see two paths"
ctrl_a=$(ctrl_of "$port_a") ctrl_b=$(ctrl_of "$port_b")
path_a=$(path_of "$port_a") path_b=$(path_of "$port_b")
lab_log "path A: $ctrl_a/$path_a, path B: $ctrl_b/$path_b"
[[ $(lab_nvme_dev "$nqn" | wc -l) -eq 1 ]] || lab_fail "expected one namespace head, got: $(lab_nvme_dev "$nqn")"
cntlid_a=$(lab_t 10 nvme id-ctrl "/dev/$ctrl_a" | awk '/^cntlid/ {print $3}')
cntlid_b=$(lab_t 10 nvme id-ctrl "/dev/$ctrl_b" | awk '/^cntlid/ {print $3}')
lab_log "cntlid A $cntlid_a, B $cntlid_b (disjoint ranges 1-100, 101-200)"
lab_t 10 nvme id-ctrl "/dev/$ctrl_a" | grep -E '^(cmic|anacap|anatt|anagrpmax|nanagrpid|mnan)' >&2
lab_wait_until 30 "A optimized, B non-optimized on the host" \
    sh -c "[ \"\$(cat /sys/block/$path_a/ana_state)\" = optimized ] && [ \"\$(cat /sys/block/$path_b/ana_state)\" = non-optimized ]" ||
    lab_fail "host path states: A $(path_state $port_a), B $(path_state $port_b)"

# check_host STEP: nvme list-subsys and each live controller's ANA log, into the results.
check_host() {
    local step=$1 c
    {
        echo "== $step: nvme list-subsys"
        lab_t 10 nvme list-subsys "$dev" || true
        for c in $ctrl_a $ctrl_b; do
            echo "== $step: nvme ana-log /dev/$c ($(cat /sys/class/nvme/"$c"/state 2>/dev/null))"
            lab_t 10 nvme ana-log "/dev/$c" 2>&1 || true
        done
    } >>"$LAB_OUT/host-view.txt" 2>&1
    lab_t 10 nvme list-subsys "$dev" >&2 || true
}
# ana_log_state CTRL: the state of group 1 in that controller's ANA log (nvme-cli's JSON).
ana_log_state() {
    lab_t 10 nvme ana-log "/dev/$1" -o json 2>/dev/null | /usr/bin/python3 -c '
import json, sys
log = json.load(sys.stdin)
# nvme-cli spells the key "ANA DESC LIST " (trailing space) in most releases, "State" in some.
descs = next((v for k, v in log.items() if k.strip() == "ANA DESC LIST"), [])
for d in descs:
    d = {k.lower(): v for k, v in d.items()}
    if int(d.get("grpid", 0)) == 1:
        print(d.get("state", "?"))
'
}
# writes_of NAME: the target's write count on the shared bdev ("-" when it is down).
writes_of() {
    tgt_rpc "$1" bdev_get_iostat -b Aio0 2>/dev/null | /usr/bin/python3 -c '
import json, sys
print(json.load(sys.stdin)["bdevs"][0]["num_write_ops"])' 2>/dev/null || echo -
}
# path_writes PATHDEV: writes completed through that hidden path device (sysfs stat field 5).
path_writes() { awk '{print $5}' "/sys/block/$1/stat" 2>/dev/null || echo -; }
delta() { [[ $1 == - || $2 == - ]] && echo - || echo $(($2 - $1)); }

# fio on the multipath head for the whole run: every block verified soon after it is written
# (verify_backlog), any mismatch fatal, IOPS logged every 100 ms to find pauses. The steps'
# own commands take an unknown time under TCG, so fio runs until the last step is measured
# and is then stopped with SIGINT (it ends its job and writes its JSON as usual).
total=1500
fio_start=$(date +%s.%N)
lab_bg fio "$((total + 60))" bash -c "cd '$LAB_STATE' && fio --name=ha --filename='$dev' \
    --ioengine=libaio --direct=1 --rw=randwrite --bs=4k --iodepth=8 --size=64M \
    --verify=crc32c --verify_backlog=64 --verify_fatal=1 --do_verify=1 \
    --time_based --runtime=$total --log_avg_msec=100 --write_iops_log='$LAB_STATE/ha' \
    --output-format=json --output='$LAB_OUT/fio-ha.json'"
fio_pid=$LAB_BG_PID
sleep 2

declare -a rows
# measure STEP: counts writes per path for step_secs and records one result row.
measure() {
    local step=$1 t wa0 wb0 pa0 pb0 wa1 wb1 pa1 pb1
    t=$(/usr/bin/python3 -c "import time; print(round(time.time() - $fio_start, 2))")
    wa0=$(writes_of a) wb0=$(writes_of b) pa0=$(path_writes "$path_a") pb0=$(path_writes "$path_b")
    sleep "$step_secs"
    kill -0 "$fio_pid" 2>/dev/null || lab_fail "fio stopped during step $step (see fio.log)"
    wa1=$(writes_of a) wb1=$(writes_of b) pa1=$(path_writes "$path_a") pb1=$(path_writes "$path_b")
    check_host "$step"
    rows+=("$step|$t|$(path_state $port_a)|$(path_state $port_b)|$(delta "$wa0" "$wa1")|$(delta "$wb0" "$wb1")|$(delta "$pa0" "$pa1")|$(delta "$pb0" "$pb1")")
    lab_log "step $step at ${t}s: target writes A $(delta "$wa0" "$wa1") B $(delta "$wb0" "$wb1"); path writes A $(delta "$pa0" "$pa1") B $(delta "$pb0" "$pb1")"
    LAST_A=$(delta "$wa0" "$wa1") LAST_B=$(delta "$wb0" "$wb1")
}
# mostly NAME COUNT OTHER: the path carrying the I/O carries at least 90% of it.
mostly() {
    [[ $2 != - && $2 -gt 0 ]] || lab_fail "$1: no writes reached it (other path: $3)"
    [[ $3 == - ]] || ((10 * $3 <= $2)) || lab_fail "$1: only $2 writes against $3 on the other path"
}

# 1. A optimized, B non-optimized: the host's numa policy uses A.
measure optimized
mostly "path A (optimized)" "$LAST_A" "$LAST_B"
[[ $(ana_log_state "$ctrl_a") == optimized && $(ana_log_state "$ctrl_b") == non-optimized ]] ||
    lab_fail "ana-log: A $(ana_log_state "$ctrl_a"), B $(ana_log_state "$ctrl_b")"

# 2. A inaccessible: the ANA change notice makes the host re-read A's log; I/O moves to B.
set_ana a "$port_a" inaccessible
lab_wait_until 30 "path A inaccessible on the host" sh -c "[ \"\$(cat /sys/block/$path_a/ana_state)\" = inaccessible ]" ||
    lab_fail "the host did not learn A is inaccessible (state $(path_state $port_a))"
[[ $(ana_log_state "$ctrl_a") == inaccessible ]] || lab_fail "ana-log of A: $(ana_log_state "$ctrl_a")"
tgt_rpc a save_config >"$LAB_STATE/tgt-a.json"
grep -q '"nvmf_subsystem_listener_set_ana_state"\|"ana_state": "inaccessible"' "$LAB_STATE/tgt-a.json" ||
    lab_fail "A's saved config does not carry its ANA state"
measure inaccessible
mostly "path B (A inaccessible)" "$LAST_B" "$LAST_A"

# 3. kill -9 A: the host loses that controller (it keeps trying to reconnect); I/O stays on B.
kill -KILL "${TGT_PID[a]}"
wait "${TGT_PID[a]}" 2>/dev/null || true
measure killed
[[ $LAST_B != - && $LAST_B -gt 0 ]] || lab_fail "no writes on B after A was killed"

# 4. A restarted from its saved config: the host reconnects; A's path comes back inaccessible.
tgt_start a -m 0x1 -c "$LAB_STATE/tgt-a.json"
lab_wait_until 90 "controller A live again" sh -c "[ \"\$(cat /sys/class/nvme/$ctrl_a/state)\" = live ]" ||
    lab_fail "the host did not reconnect to the restarted target A"
lab_wait_until 30 "path A inaccessible after the restart" sh -c "[ \"\$(cat /sys/block/$path_a/ana_state)\" = inaccessible ]" ||
    lab_fail "after the restart path A is $(path_state $port_a), not inaccessible as saved"
measure restarted
mostly "path B (A restarted inaccessible)" "$LAST_B" "$LAST_A"

# 5. Failback: A optimized again, I/O returns to A.
set_ana a "$port_a" optimized
lab_wait_until 30 "path A optimized on the host" sh -c "[ \"\$(cat /sys/block/$path_a/ana_state)\" = optimized ]" ||
    lab_fail "the host did not learn A is optimized again (state $(path_state $port_a))"
measure failback
mostly "path A (failback)" "$LAST_A" "$LAST_B"

lab_log "stopping fio after the last step"
pkill -INT -x fio || lab_fail "fio is not running after the last step (see fio.log)"
wait "$fio_pid" || true
grep -qi "verify.*fail\|bad magic\|crc32c.*mismatch" "$LAB_OUT/fio.log" &&
    lab_fail "fio found corrupt data: see $LAB_OUT/fio.log"
errors=$(/usr/bin/python3 -c '
import json, sys
t = open(sys.argv[1]).read()
j = json.loads(t[t.index("{"):])
print(sum(job["error"] for job in j["jobs"]))' "$LAB_OUT/fio-ha.json")
[[ $errors -eq 0 ]] || lab_fail "fio reported $errors errors"

# The longest pause fio saw around each step: the largest gap between 100 ms IOPS samples
# with I/O, from 1 s before a step began to its end.
cp "$LAB_STATE"/ha_iops.*.log "$LAB_OUT/" 2>/dev/null || true
pauses=$(/usr/bin/python3 - "$step_secs" "$LAB_STATE"/ha_iops.*.log "--" "${rows[@]}" <<'PY'
import sys
step = float(sys.argv[1])
args = sys.argv[2:]
logs, rows = args[:args.index("--")], args[args.index("--") + 1:]
busy = {}
for path in logs:
    for line in open(path):
        f = [x.strip() for x in line.split(",")]
        if len(f) >= 2 and int(f[1]) > 0:
            busy[int(f[0])] = True
times = sorted(busy)
for row in rows:
    start = float(row.split("|")[1]) * 1000
    lo, hi = start - 1000, start + step * 1000 + 500
    inside = [t for t in times if lo <= t <= hi]
    edges = [lo] + inside + [hi]
    gap = max(b - a for a, b in zip(edges, edges[1:]))
    print(int(gap))
PY
)
mapfile -t pause <<<"$pauses"

# 6. Data written through both paths and both targets verifies end to end.
lab_fio ha-final-verify --filename="$dev" --ioengine=libaio --direct=1 --rw=write --bs=64k \
    --size=32M --verify=crc32c --do_verify=1 --verify_fatal=1 >&2 ||
    lab_fail "write-then-verify after failback failed"
check_host final

{
    printf '%-13s %8s %-14s %-14s %9s %9s %9s %9s %10s\n' step 'at (s)' 'host: path A' 'path B' \
        'A writes' 'B writes' 'A path' 'B path' 'pause ms'
    for i in "${!rows[@]}"; do
        IFS='|' read -r s t sa sb wa wb pa pb <<<"${rows[$i]}"
        printf '%-13s %8s %-14s %-14s %9s %9s %9s %9s %10s\n' "$s" "$t" "$sa" "$sb" "$wa" "$wb" \
            "$pa" "$pb" "${pause[$i]:-?}"
    done
    echo "writes: each target's bdev_get_iostat (- = target down); path: /sys/block/nvmeXcYnZ/stat"
    echo "pause: longest gap between 100 ms fio IOPS samples with I/O, from 1 s before the step"
} | tee "$LAB_OUT/result.txt" >&2


# 7. The userspace initiator through the same steps, the kernel host gone.
lab_nvme_disconnect "$nqn"
set_ana a "$port_a" optimized
# writing NAME WHAT: fails with WHAT unless target NAME's write count grows within 2 s.
writing() {
    local w0 w1
    w0=$(writes_of "$1")
    sleep 2
    w1=$(writes_of "$1")
    [[ $w0 != - && $w1 != - ]] && ((w1 > w0)) ||
        lab_fail "$2: writes on $1 $w0 -> $w1 (see $LAB_OUT/perf-multipath.json.err)"
}
# Runs until stopped with SIGINT after the last step (it then reports as usual).
perf_secs=600
perf_multipath_run "$nqn" "$LAB_ADDR0" "$port_a" "$port_b" "$perf_secs" "$LAB_OUT/perf-multipath.json"
sleep "$step_secs"
writing a "nvmf-perf does no I/O through A (optimized)"
set_ana a "$port_a" inaccessible
lab_log "nvmf-perf: A set inaccessible"
sleep "$step_secs"
writing b "nvmf-perf did not move to B when A went inaccessible"
tgt_rpc a save_config >"$LAB_STATE/tgt-a.json"
kill -KILL "${TGT_PID[a]}"
wait "${TGT_PID[a]}" 2>/dev/null || true
lab_log "nvmf-perf: A killed"
sleep "$step_secs"
kill -0 "$PERF_MP_PID" 2>/dev/null || lab_fail "nvmf-perf stopped after A was killed (see $LAB_OUT/perf-multipath.json.err)"
tgt_start a -m 0x1 -c "$LAB_STATE/tgt-a.json"
lab_log "nvmf-perf: A restarted (inaccessible, as saved)"
sleep "$step_secs"
set_ana a "$port_a" optimized
lab_log "nvmf-perf: A optimized again (failback)"
sleep "$step_secs"
writing a "nvmf-perf did not fail back to A"
kill -INT "$PERF_MP_PID" || lab_fail "nvmf-perf is not running after the last step"
# Not in a pipeline: the function waits for nvmf-perf, a child of this shell only.
perf_multipath_finish "$LAB_OUT/perf-multipath.json" 0 >"$LAB_STATE/multipath.txt"
tee -a "$LAB_OUT/result.txt" <"$LAB_STATE/multipath.txt" >&2
/usr/bin/python3 - "$LAB_OUT/perf-multipath.json" <<'PYEOF' || lab_fail "nvmf-perf: a path carried no I/O"
import json, sys
d = json.load(open(sys.argv[1]))
paths = [p["ios"] for n in d["namespaces"] for p in n["multipath"]["paths"]]
sys.exit(0 if len(paths) == 2 and all(n > 0 for n in paths) else 1)
PYEOF

lab_pass "one namespace, two target processes, two paths: I/O followed ANA (A optimized -> A inaccessible -> A killed -> A restarted from its saved config -> failback), zero verify errors; nvmf-perf and nvmf-host over both paths followed the same steps with zero I/O errors"
