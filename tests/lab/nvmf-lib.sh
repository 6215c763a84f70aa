# Functions for scenarios that run the project's own binaries (nvmf-tgt, nvmf-rpc, ...).
# Source after guest-lib.sh and lab_init.

NVMF_BIN_DIR=${NVMF_BIN_DIR:-}
if [[ -z $NVMF_BIN_DIR ]]; then
    repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)
    if [[ -x $repo/build/release/nvmf-tgt ]]; then NVMF_BIN_DIR=$repo/build/release; else NVMF_BIN_DIR=$repo/build/debug; fi
fi
for bin in nvmf-tgt nvmf-rpc; do
    [[ -x $NVMF_BIN_DIR/$bin ]] ||
        lab_fail "$bin is not built in $NVMF_BIN_DIR: run 'cargo build --workspace --release --bins' on the host (tests/lab/run does it unless NVMF_BIN_DIR or NVMF_LAB_NO_BUILD=1 is set)"
done

# nvmf_tgt_start [nvmf-tgt args...]: starts the target in the background with its RPC socket in
# a private directory (Unix sockets cannot live on the 9p results folder), waits until the RPC
# server answers. Sets NVMF_TGT_PID and NVMF_RPC_SOCK.
nvmf_tgt_start() {
    ulimit -l unlimited
    NVMF_RPC_DIR=$(mktemp -d /tmp/nvmf-rpc.XXXXXX)
    NVMF_RPC_SOCK=$NVMF_RPC_DIR/spdk.sock
    lab_log "starting nvmf-tgt $* (binaries: $NVMF_BIN_DIR)"
    RUST_LOG=${RUST_LOG:-info} "$NVMF_BIN_DIR/nvmf-tgt" -r "$NVMF_RPC_SOCK" "$@" \
        >>"$LAB_OUT/nvmf-tgt.log" 2>&1 &
    NVMF_TGT_PID=$!
    lab__record bgpids "$NVMF_TGT_PID"
    lab_wait_until 30 "nvmf-tgt RPC socket" test -S "$NVMF_RPC_SOCK"
    lab_wait_until 30 "nvmf-tgt RPC answers" nvmf_rpc spdk_get_version
    kill -0 "$NVMF_TGT_PID" || lab_fail "nvmf-tgt exited during start-up"
}

# nvmf_rpc METHOD [args...]: the project's rpc.py-compatible client against the running target.
nvmf_rpc() {
    lab_t 30 "$NVMF_BIN_DIR/nvmf-rpc" -s "$NVMF_RPC_SOCK" "$@"
}

# nvmf_tgt_stop [SIGNAL]: stops the target (SIGTERM by default), waits, fails on a hang.
nvmf_tgt_stop() {
    local sig=${1:-TERM} i
    [[ -n ${NVMF_TGT_PID:-} ]] || return 0
    kill -"$sig" "$NVMF_TGT_PID" 2>/dev/null || true
    for i in $(seq 1 300); do
        kill -0 "$NVMF_TGT_PID" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$NVMF_TGT_PID" 2>/dev/null; then
        kill -KILL "$NVMF_TGT_PID"
        lab_fail "nvmf-tgt did not stop within 30 s of SIG$sig"
    fi
    wait "$NVMF_TGT_PID" 2>/dev/null || true
    NVMF_TGT_PID=
}

# nvmf_malloc_subsystem NQN ADDR PORT BDEV:MB:BS...: RDMA transport (once), RAM bdevs, a
# subsystem open to any host with those namespaces, listening on ADDR:PORT.
nvmf_malloc_subsystem() {
    local nqn=$1 addr=$2 port=$3 spec name mb bs
    shift 3
    # Whole output first: `grep -q` closing the pipe early would fail nvmf-rpc's write.
    [[ $(nvmf_rpc nvmf_get_transports) == *'"trtype": "RDMA"'* ]] ||
        nvmf_rpc nvmf_create_transport -t RDMA >/dev/null
    nvmf_rpc nvmf_create_subsystem "$nqn" -a -s SPDK00000000000001 -d "nvmf-rs lab" >/dev/null
    for spec in "$@"; do
        IFS=: read -r name mb bs <<<"$spec"
        nvmf_rpc bdev_malloc_create -b "$name" "$mb" "$bs" >/dev/null
        nvmf_rpc nvmf_subsystem_add_ns "$nqn" "$name" >/dev/null
    done
    nvmf_rpc nvmf_subsystem_add_listener "$nqn" -t rdma -f ipv4 -a "$addr" -s "$port" >/dev/null
}

# nvmf_null_target MODE NQN ADDR PORT [NVMF_TGT_ARGS...]: the benchmarks' target: nvmf-tgt
# idling in MODE (a --poll-mode value, or LABEL=ARG,ARG,... for extra arguments), with one
# bdev_null namespace (1 GiB, 4 KiB blocks) in NQN, open to any host, on ADDR:PORT.
nvmf_null_target() {
    local mode=$1 nqn=$2 addr=$3 port=$4 extra
    shift 4
    if [[ $mode == *=* ]]; then
        IFS=, read -r -a extra <<<"${mode#*=}"
    else
        extra=(--poll-mode "$mode")
    fi
    nvmf_tgt_start "$@" "${extra[@]}"
    nvmf_rpc nvmf_create_transport -t RDMA >/dev/null
    nvmf_rpc bdev_null_create Null0 1024 4096 >/dev/null
    nvmf_rpc nvmf_create_subsystem "$nqn" -a -s SPDK00000000000002 >/dev/null
    nvmf_rpc nvmf_subsystem_add_ns "$nqn" Null0 >/dev/null
    nvmf_rpc nvmf_subsystem_add_listener "$nqn" -t rdma -f ipv4 -a "$addr" -s "$port" >/dev/null
}
