#!/usr/bin/env bash
# nvmf-smoke: our target over soft-RoCE with the kernel host: discover, connect, a write and a
# read back compared, disconnect, target shutdown.
source "$(dirname "${BASH_SOURCE[0]}")/../guest-lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/../nvmf-lib.sh"
lab_init nvmf-smoke

lab_rxe_up
nvmf_tgt_start -m 0x1
nqn=nqn.2016-06.io.spdk:cnode1
nvmf_malloc_subsystem "$nqn" "$LAB_ADDR0" 4420 Malloc0:64:512

lab_nvme_discover "$LAB_ADDR0" 4420 | tee "$LAB_OUT/discover.txt" >&2
grep -q "subnqn: *$nqn\$" "$LAB_OUT/discover.txt" || lab_fail "discovery does not list $nqn"
blk=$(lab_nvme_connect "$nqn" "$LAB_ADDR0" 4420)
head -c 1048576 /dev/urandom >"$LAB_STATE/pattern"
lab_t 60 dd if="$LAB_STATE/pattern" of="$blk" bs=64k oflag=direct status=none
lab_t 60 dd if="$blk" of="$LAB_STATE/back" bs=64k count=16 iflag=direct status=none
cmp "$LAB_STATE/pattern" "$LAB_STATE/back" || lab_fail "data read back differs"
lab_nvme_disconnect "$nqn"
nvmf_tgt_stop
lab_pass "discover, connect, 1 MiB written and read back identical, disconnect, clean stop"
