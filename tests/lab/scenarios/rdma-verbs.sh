#!/usr/bin/env bash
# rdma-verbs: the project's safe verbs layer (nvmf_common::rdma) on soft-RoCE.
# Runs the hardware test common/tests/rdma_loopback.rs: RDMA CM connect/accept
# with private data both ways, SEND/RECV (SRQ and plain receive queue), inline
# SEND, RDMA WRITE + READ through registered memory and a registered buffer
# pool, completion channel, SEND_WITH_INVALIDATE when supported, disconnect.
# Listener on rxe0 ($LAB_ADDR0); in the default wire mode the connecting side
# goes out through veth1, so both rxe devices are used.
#
# Build it on the host first:
#   cargo test -p nvmf-common --test rdma_loopback --no-run
#   cargo build -p nvmf-common --example rdma_devinfo   (optional; also run)
# Usage: tests/lab/run rdma-verbs
#   NVMF_RDMA_TEST_BIN=PATH overrides which test binary runs (default: the
#   newest build/{debug,release}/deps/rdma_loopback-*).
source "$(dirname "${BASH_SOURCE[0]}")/../guest-lib.sh"
lab_init rdma-verbs

bin=${NVMF_RDMA_TEST_BIN:-}
if [[ -z $bin ]]; then
    bin=$(find "$LAB_REPO/build/debug/deps" "$LAB_REPO/build/release/deps" \
        -maxdepth 1 -type f -name 'rdma_loopback-*' -perm -u+x -printf '%T@ %p\n' 2>/dev/null |
        sort -n | tail -n1 | cut -d' ' -f2-)
fi
[[ -n $bin && -x $bin ]] ||
    lab_fail "no rdma_loopback test binary; run: cargo test -p nvmf-common --test rdma_loopback --no-run"
lab_log "test binary: $bin"

ulimit -l unlimited

# run_test MODE: bring soft-RoCE up in MODE (wire: the connecting side leaves
# through veth1/rxe1, two devices; loopback: both ends on rxe0) and run the test.
run_test() {
    local mode=$1 log=$LAB_OUT/rdma_loopback-$1.log
    LAB_RXE_MODE=$mode
    lab_rxe_up
    # The device listing example, when built (cargo build -p nvmf-common --examples):
    # Device::list, Context::open and the query verbs outside RDMA CM.
    local devinfo=$LAB_REPO/build/debug/examples/rdma_devinfo
    if [[ $mode == wire && -x $devinfo ]]; then
        lab_t 30 "$devinfo" | tee "$LAB_OUT/rdma_devinfo.txt" >&2
        grep -q '^rxe0: ' "$LAB_OUT/rdma_devinfo.txt" || lab_fail "rdma_devinfo does not list rxe0"
        grep -q 'port 1: ACTIVE' "$LAB_OUT/rdma_devinfo.txt" || lab_fail "rdma_devinfo: port not ACTIVE"
    fi
    NVMF_RDMA_TEST_ADDR=$LAB_ADDR0 RUST_BACKTRACE=1 \
        lab_t 300 "$bin" --nocapture --test-threads=1 >"$log" 2>&1 || true
    cat "$log" >&2
    grep -q '^test result: ok. 1 passed; 0 failed' "$log" ||
        lab_fail "rdma_loopback failed in $mode mode (see $(basename "$log"))"
    grep -q '^connection ' "$log" ||
        lab_fail "rdma_loopback skipped in $mode mode (NVMF_RDMA_TEST_ADDR not seen)"
    lab_rxe_down
}

run_test wire
run_test loopback

# The module's unit tests take their hardware branches when devices exist (the event
# channel test creates a CM id): run them with rxe up too, when the lib test binary is built
# (cargo test -p nvmf-common --lib --no-run).
unit=$(find "$LAB_REPO/build/debug/deps" -maxdepth 1 -type f -name 'nvmf_common-*' -perm -u+x \
    -printf '%T@ %p\n' 2>/dev/null | sort -n | tail -n1 | cut -d' ' -f2-)
if [[ -n $unit ]]; then
    LAB_RXE_MODE=wire
    lab_rxe_up
    lab_t 120 "$unit" rdma:: >"$LAB_OUT/rdma-unit.log" 2>&1 || true
    cat "$LAB_OUT/rdma-unit.log" >&2
    grep -q '^test result: ok\.' "$LAB_OUT/rdma-unit.log" || lab_fail "rdma unit tests failed with rxe up"
fi

lab_pass "rdma_loopback passed on $LAB_ADDR0 over rxe1->rxe0 (wire) and rxe0 loopback"
