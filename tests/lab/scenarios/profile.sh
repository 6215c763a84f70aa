#!/usr/bin/env bash
# profile: nvmf-tgt under callgrind while the kernel host does a fixed number of 4 KiB reads
# and writes (null bdev), so instruction counts per I/O can be read from the profile.
# Output: $LAB_OUT/callgrind.out (open with callgrind_annotate / kcachegrind) and a summary.
#
# Usage: tests/lab/run profile [IOS]   (default 2000 reads + 2000 writes)
source "$(dirname "${BASH_SOURCE[0]}")/../guest-lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/../nvmf-lib.sh"
lab_init profile

ios=${1:-2000}
nqn=nqn.2016-06.io.spdk:profile
lab_rxe_up
ulimit -l unlimited
NVMF_RPC_DIR=$(mktemp -d /tmp/nvmf-rpc.XXXXXX)
NVMF_RPC_SOCK=$NVMF_RPC_DIR/spdk.sock
valgrind --tool=callgrind --callgrind-out-file="$LAB_OUT/callgrind.out" \
    "$NVMF_BIN_DIR/nvmf-tgt" -m 0x1 -r "$NVMF_RPC_SOCK" >>"$LAB_OUT/nvmf-tgt.log" 2>&1 &
NVMF_TGT_PID=$!
lab__record bgpids "$NVMF_TGT_PID"
lab_wait_until 120 "nvmf-tgt RPC socket" test -S "$NVMF_RPC_SOCK"
lab_wait_until 60 "nvmf-tgt RPC answers" nvmf_rpc spdk_get_version
nvmf_rpc nvmf_create_transport -t RDMA >/dev/null
nvmf_rpc bdev_null_create Null0 256 4096 >/dev/null
nvmf_rpc nvmf_create_subsystem "$nqn" -a -s SPDK00000000000005 >/dev/null
nvmf_rpc nvmf_subsystem_add_ns "$nqn" Null0 >/dev/null
nvmf_rpc nvmf_subsystem_add_listener "$nqn" -t rdma -f ipv4 -a "$LAB_ADDR0" -s 4420 >/dev/null
dev=$(lab_nvme_connect "$nqn" "$LAB_ADDR0" 4420)
LAB_FIO_TIMEOUT=600 lab_fio reads --filename="$dev" --ioengine=libaio --direct=1 --rw=randread --bs=4k \
    --iodepth=4 --number_ios="$ios" --size=64M >&2
LAB_FIO_TIMEOUT=600 lab_fio writes --filename="$dev" --ioengine=libaio --direct=1 --rw=randwrite --bs=4k \
    --iodepth=4 --number_ios="$ios" --size=64M >&2
lab_nvme_disconnect "$nqn"
kill -TERM "$NVMF_TGT_PID"
lab_wait_until 120 "callgrind to write its profile" sh -c "! kill -0 $NVMF_TGT_PID"
callgrind_annotate --inclusive=yes "$LAB_OUT/callgrind.out" 2>/dev/null | sed -n 1,80p >"$LAB_OUT/summary-inclusive.txt"
callgrind_annotate "$LAB_OUT/callgrind.out" 2>/dev/null | sed -n 1,60p >"$LAB_OUT/summary-self.txt"
echo "I/Os: $((2 * ios)) (4 KiB, null bdev)" | tee "$LAB_OUT/ios.txt"
lab_pass "callgrind profile of nvmf-tgt in $LAB_OUT"
