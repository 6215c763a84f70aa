# Shared by the initiator-* scenarios (sourced after guest-lib.sh and nvmf-lib.sh).

PERF=$NVMF_BIN_DIR/nvmf-perf
HOST=$NVMF_BIN_DIR/nvmf-host
[[ -x $PERF && -x $HOST ]] || lab_fail "nvmf-perf / nvmf-host not built in $NVMF_BIN_DIR"

# perf_summary JSON: "IOPS p99 avg ios" of nvmf-perf --json output, plus how the per-command
# keys were invalidated.
perf_summary() {
    /usr/bin/python3 - "$1" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))["total"]
lat = t["latency_us"]
keys = t.get("keys", {})
print("%.0f IOPS p99=%.0fus avg=%.0fus ios=%d inv=%s/%s" % (
    t["iops"], lat["p99"], lat["avg"], t["ios"],
    keys.get("remote_invalidations", "-"), keys.get("local_invalidations", "-")))
PY
}

# run_host_test NQN PORT TAG WINDOWS [INVALIDATION]: the library's hardware test
# (initiator/tests/rdma_host.rs: every I/O command, with memory windows WINDOWS (auto, on,
# off) and then pool keys, per-command keys invalidated the way INVALIDATION (remote|local)
# says, two qpairs on two threads, keep-alive, clean disconnect) against NQN on PORT. Build
# it on the host first:
# cargo test --release -p nvmf-initiator --test rdma_host --no-run
run_host_test() {
    local bin log=$LAB_OUT/rdma_host-$3.log
    # Whichever profile has it, newest first (find fails on a profile never built: not fatal).
    bin=$({ find "$LAB_REPO/build/release/deps" "$LAB_REPO/build/debug/deps" -maxdepth 1 -type f \
        -name 'rdma_host-*' -perm -u+x -printf '%T@ %p\n' 2>/dev/null || true; } |
        sort -n | tail -n1 | cut -d' ' -f2-)
    [[ -n $bin ]] || lab_fail "no rdma_host test binary: cargo test --release -p nvmf-initiator --test rdma_host --no-run"
    NVMF_RDMA_TEST_ADDR=$LAB_ADDR0 NVMF_RDMA_TEST_PORT=$2 NVMF_RDMA_TEST_SUBNQN=$1 \
        NVMF_RDMA_TEST_MEMORY_WINDOWS=$4 NVMF_RDMA_TEST_INVALIDATION=${5:-} \
        lab_t 180 "$bin" --nocapture --test-threads=1 >"$log" 2>&1 || { cat "$log" >&2; lab_fail "library hardware test against $1 failed"; }
    grep -q 'test result: ok. 2 passed' "$log" || { cat "$log" >&2; lab_fail "library hardware test did not run"; }
    if [[ $4 == on ]]; then
        grep -q '^memory windows: true' "$log" || { cat "$log" >&2; lab_fail "the library did not use memory windows on rxe"; }
    fi
    echo "library hardware test ($3): $(grep -E '^cntlid|^qpair|^keys' "$log" | tr '\n' ' ')"
}

# perf_check_keys JSON remote|local: nvmf-perf (run with --memory-windows on) used per-I/O
# memory windows and every key was invalidated the given way (the kernel's nvmet-rdma
# invalidates with its response; our target does not on soft-RoCE, so the initiator
# invalidates locally).
perf_check_keys() {
    /usr/bin/python3 - "$1" "$2" <<'PY' || lab_fail "nvmf-perf data keys in $1 are not as expected ($2 invalidation)"
import json, sys
keys = json.load(open(sys.argv[1]))["total"]["keys"]
want = sys.argv[2]
other = "local" if want == "remote" else "remote"
ok = keys["memory_windows"] and keys[want + "_invalidations"] > 0 and keys[other + "_invalidations"] == 0
print(keys, file=sys.stderr)
sys.exit(0 if ok else 1)
PY
}

# perf_multipath_run NQN ADDR PORT1 PORT2 SECS JSON_OUT [NVMF-PERF ARGS...]: starts nvmf-perf
# in the background on the namespaces of NQN through two paths (ADDR:PORT1 preferred,
# ADDR:PORT2), active-passive multipath (pass `--multipath active_active` to change), a
# 4 KiB randrw 50/50 mix at queue depth 32 on core 1 for SECS seconds, reconnecting every
# second, failing I/O only after 30 s without any path. Its --json document goes to JSON_OUT,
# its stderr to JSON_OUT.err; the pid is in PERF_MP_PID. Both targets must export the
# namespace with the same NGUID or UUID (nvmf-perf refuses paths that are not provably one
# namespace). Meanwhile the scenario may kill one target; then perf_multipath_finish.
perf_multipath_run() {
    local nqn=$1 addr=$2 p1=$3 p2=$4 secs=$5 json=$6
    shift 6
    local base="trtype:RDMA adrfam:IPv4 traddr:$addr"
    timeout -k 5 $((secs + 240)) "$PERF" \
        -r "$base trsvcid:$p1 subnqn:$nqn" -r "$base trsvcid:$p2 subnqn:$nqn" \
        -c 0x2 -o 4096 -w randrw -M 50 -q 32 -t "$secs" --json --io-timeout 5 \
        --reconnect-delay 1 --ctrl-loss-tmo 120 --fast-io-fail-timeout-sec 30 "$@" \
        >"$json" 2>"$json.err" &
    PERF_MP_PID=$!
    lab__record bgpids "$PERF_MP_PID"
    lab_log "started nvmf-perf multipath (pid $PERF_MP_PID) on $nqn via $addr:$p1 and $addr:$p2"
}

# perf_multipath_finish JSON_OUT [MIN_FAILOVERS]: waits for perf_multipath_run's nvmf-perf and
# fails the scenario unless it exited 0 with I/O done, zero I/O errors and at least
# MIN_FAILOVERS (default 1) I/Os moved to another path. Prints the per-path I/O counts.
# Then, with the same two paths, writes 256 blocks of random data at LBA 0 with nvmf-host and
# reads them back through whichever path serves, which must give the same bytes.
perf_multipath_finish() {
    local json=$1 min=${2:-1} rc=0 nqn addr p1 p2
    wait "$PERF_MP_PID" || rc=$?
    ((rc == 0)) || { cat "$json.err" >&2; lab_fail "nvmf-perf multipath: exit $rc"; }
    /usr/bin/python3 - "$json" "$min" <<'PY' || { cat "$json.err" >&2; lab_fail "nvmf-perf multipath: $json is not as expected"; }
import json, sys
d = json.load(open(sys.argv[1]))
t = d["total"]
mp = t.get("multipath")
paths = [(p["address"], p["ios"]) for n in d["namespaces"] for p in n.get("multipath", {}).get("paths", [])]
print("multipath: ios=%d errors=%d failovers=%s ana=%s paths=%s" % (
    t["ios"], t["errors"], mp and mp["failovers"], mp and mp["ana_errors"], paths))
ok = mp is not None and t["ios"] > 0 and t["errors"] == 0 and not d["errors"] \
    and mp["failovers"] >= int(sys.argv[2])
sys.exit(0 if ok else 1)
PY
    read -r nqn addr p1 p2 < <(/usr/bin/python3 - "$json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["config"]["transport"]
kv = [dict(w.split(":", 1) for w in t.split()) for t in r]
print(kv[0]["subnqn"], kv[0]["traddr"], kv[0]["trsvcid"], kv[1]["trsvcid"])
PY
)
    local base="trtype:RDMA adrfam:IPv4 traddr:$addr" data=$LAB_OUT/multipath-data.bin
    head -c $((1024 * 1024)) /dev/urandom >"$data"
    lab_t 120 "$HOST" write -r "$base trsvcid:$p1 subnqn:$nqn" -r "$base trsvcid:$p2 subnqn:$nqn" \
        -s 0 -c 256 -f "$data" --fast-io-fail-timeout-sec 30 || lab_fail "nvmf-host multipath write failed"
    lab_t 120 "$HOST" read -r "$base trsvcid:$p1 subnqn:$nqn" -r "$base trsvcid:$p2 subnqn:$nqn" \
        -s 0 -c 256 -f "$data.back" --fast-io-fail-timeout-sec 30 || lab_fail "nvmf-host multipath read failed"
    cmp -n "$(stat -c %s "$data.back")" "$data" "$data.back" ||
        lab_fail "multipath: data read back differs from what was written"
    echo "multipath: 256 blocks written and read back identical over the paths"
}
