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
