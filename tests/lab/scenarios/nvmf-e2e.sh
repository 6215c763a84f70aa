#!/usr/bin/env bash
# nvmf-e2e: the Linux host (kernel nvme-rdma, nvme-cli, fio) against nvmf-tgt over soft-RoCE.
#   1. nvme discover lists our subsystem
#   2. nvme connect -i 2; nvme list, id-ctrl, id-ns, smart-log, error-log, get-feature
#   3. fio random read/write with crc32c verify, 4 KiB-128 KiB blocks, on two namespaces of
#      different block sizes (512 B and 4 KiB)
#   4. default connect; mkfs.ext4, mount, a file written; disconnect, reconnect, read back
#   5. a host vanishing mid-I/O (its link cut under fio) leaves the target serving the next host
#   6. target shutdown while a host is connected: the target stops promptly, the host sees the
#      controller go away
source "$(dirname "${BASH_SOURCE[0]}")/../guest-lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/../nvmf-lib.sh"
lab_init nvmf-e2e

nqn=nqn.2016-06.io.spdk:cnode1
port=4420
lab_rxe_up
nvmf_tgt_start -m 0x3
nvmf_malloc_subsystem "$nqn" "$LAB_ADDR0" "$port" Malloc0:64:512 Malloc1:64:4096

# 1. Discovery.
lab_nvme_discover "$LAB_ADDR0" "$port" | tee "$LAB_OUT/discover.txt" >&2
grep -q "subnqn: *$nqn\$" "$LAB_OUT/discover.txt" || lab_fail "discovery does not list $nqn"
grep -q "trtype: *rdma" "$LAB_OUT/discover.txt" || lab_fail "discovery entry is not rdma"

# 2. Connect with two I/O queues; the admin commands nvme-cli issues.
lab_nvme_connect "$nqn" "$LAB_ADDR0" "$port" -i 2 >/dev/null
lab_wait_until 30 "both namespaces" sh -c "[ \$(ls /sys/class/nvme-subsystem/*/ | grep -c '^nvme[0-9]*n[0-9]*\$') -ge 2 ]" || true
mapfile -t devs < <(lab_nvme_devs_by_nsid "$nqn")
((${#devs[@]} == 2)) || lab_fail "expected 2 namespaces, got: ${devs[*]}"
ns512=${devs[0]}
ns4k=${devs[1]}
ctrl=/dev/$(basename "$(ls -d /sys/class/nvme-subsystem/*/nvme[0-9]* | grep -v 'n[0-9]*$' | sed -n 1p)")
lab_log "controller $ctrl, namespaces $ns512 $ns4k"
queues=$(ls /sys/class/nvme/"$(basename "$ctrl")"/ 2>/dev/null | wc -l)
lab_t 30 nvme list | tee "$LAB_OUT/nvme-list.txt" >&2
grep -q "$ns512" "$LAB_OUT/nvme-list.txt" || lab_fail "nvme list does not show $ns512"
lab_t 30 nvme id-ctrl "$ctrl" | tee "$LAB_OUT/id-ctrl.txt" >&2
grep -q "subnqn *: $nqn" "$LAB_OUT/id-ctrl.txt" || lab_fail "id-ctrl subnqn"
grep -q "^sn *: SPDK00000000000001" "$LAB_OUT/id-ctrl.txt" || lab_fail "id-ctrl serial number"
grep -q "^mdts *: 5" "$LAB_OUT/id-ctrl.txt" || lab_fail "id-ctrl mdts"
lab_t 30 nvme id-ns "$ns512" | tee "$LAB_OUT/id-ns-512.txt" >&2
grep -q "lbads:9 .*in use" "$LAB_OUT/id-ns-512.txt" || lab_fail "id-ns 512-byte format"
lab_t 30 nvme id-ns "$ns4k" | tee "$LAB_OUT/id-ns-4k.txt" >&2
grep -q "lbads:12 .*in use" "$LAB_OUT/id-ns-4k.txt" || lab_fail "id-ns 4 KiB format"
lab_t 30 nvme smart-log "$ctrl" | tee "$LAB_OUT/smart-log.txt" >&2
grep -Eqi "available_spare[[:space:]]*:[[:space:]]*100%" "$LAB_OUT/smart-log.txt" || lab_fail "smart-log"
lab_t 30 nvme error-log "$ctrl" -e 4 | tee "$LAB_OUT/error-log.txt" >&2
grep -q "error_count" "$LAB_OUT/error-log.txt" || lab_fail "error-log"
lab_t 30 nvme get-feature "$ctrl" -f 7 | tee "$LAB_OUT/get-feature-7.txt" >&2
grep -q "Current value:0x00010001" "$LAB_OUT/get-feature-7.txt" || lab_fail "get-feature number of queues (2 I/O queues granted)"

# The host asks for 5000 ms; the transport's min_kato (SPDK's default, 10000 ms) raises it.
lab_t 30 nvme get-feature "$ctrl" -f 0xf | tee "$LAB_OUT/get-feature-kato.txt" >&2
grep -qi "Current value:0x00002710" "$LAB_OUT/get-feature-kato.txt" ||
    lab_fail "get-feature keep alive timer (the host's 5000 ms raised to min_kato 10000 ms)"

# 3. Data integrity across block sizes, both namespaces at once.
for dev in "$ns512" "$ns4k"; do
    name=verify-$(basename "$dev")
    lab_fio "$name" --filename="$dev" --ioengine=libaio --direct=1 --rw=randrw --bsrange=4k-128k \
        --iodepth=8 --size=24M --verify=crc32c --do_verify=1 --verify_fatal=1 \
        --verify_backlog=64 >/dev/null || lab_fail "fio verify on $dev"
done
lab_log "fio crc32c verify passed on $ns512 and $ns4k (4k-128k)"

# Compare through nvme-cli's passthrough: the namespace's first 4 KiB as read are equal; with
# one byte changed they miscompare (Compare Failure, which nvme-cli reports and exits on).
lab_t 30 dd if="$ns512" of="$LAB_STATE/first4k" bs=4096 count=1 iflag=direct status=none
lab_t 30 nvme compare "$ns512" --start-block=0 --block-count=7 --data-size=4096 \
    --data="$LAB_STATE/first4k" >&2 || lab_fail "nvme compare of the data just read failed"
printf '\xff' | dd of="$LAB_STATE/first4k" bs=1 seek=1000 conv=notrunc status=none
cmp -s "$LAB_STATE/first4k" <(dd if="$ns512" bs=4096 count=1 iflag=direct status=none) &&
    lab_fail "the changed byte was 0xff already"
if nvme compare "$ns512" --start-block=0 --block-count=7 --data-size=4096 \
    --data="$LAB_STATE/first4k" >"$LAB_OUT/compare-changed.txt" 2>&1; then
    lab_fail "nvme compare of changed data succeeded"
fi
grep -qi "compare" "$LAB_OUT/compare-changed.txt" ||
    lab_fail "nvme compare of changed data failed without a Compare Failure: $(cat "$LAB_OUT/compare-changed.txt")"
lab_log "nvme compare: equal data matches, one changed byte miscompares ($(tr '\n' ' ' <"$LAB_OUT/compare-changed.txt"))"
lab_nvme_disconnect "$nqn"

# 4. File system on the 4 KiB namespace survives disconnect and reconnect.
dev=$(lab_nvme_connect "$nqn" "$LAB_ADDR0" "$port")
dev=$(lab_nvme_devs_by_nsid "$nqn" | tail -n1)
lab_t 120 mkfs.ext4 -q -F "$dev"
mnt=$(mktemp -d /tmp/nvmf-mnt.XXXXXX)
lab_t 30 mount "$dev" "$mnt"
lab__record mounts "$mnt"
lab_t 60 dd if=/dev/urandom of="$mnt/file" bs=1M count=8 status=none
sum=$(sha256sum <"$mnt/file")
lab_t 60 umount "$mnt"
lab_nvme_disconnect "$nqn"
lab_nvme_connect "$nqn" "$LAB_ADDR0" "$port" >/dev/null
dev=$(lab_nvme_devs_by_nsid "$nqn" | tail -n1)
lab_t 30 mount "$dev" "$mnt"
[[ $(sha256sum <"$mnt/file") == "$sum" ]] || lab_fail "file differs after reconnect"
lab_t 60 umount "$mnt"
lab_log "ext4 file identical after disconnect and reconnect"
lab_nvme_disconnect "$nqn"

# 5. A host vanishing mid-I/O: cut its link while fio writes, then another host connects.
dev=$(lab_nvme_connect "$nqn" "$LAB_ADDR0" "$port" --ctrl-loss-tmo=5 --reconnect-delay=1)
victims=$(nvmf_rpc nvmf_subsystem_get_controllers "$nqn" | sed -n 's/.*"cntlid": *\([0-9]*\).*/\1/p' | tr '\n' ' ')
[[ -n $victims ]] || lab_fail "no controller listed for the connected host"
lab_bg fio-victim 120 fio --name=victim --filename="$dev" --ioengine=libaio --direct=1 \
    --rw=randwrite --bs=16k --iodepth=16 --runtime=60 --time_based
sleep 3
# Under TCG with fio writing at depth 16, taking the link down has once waited 11 s for the
# guest kernel (rtnl, rxe's port teardown) while both vCPUs were busy: the link still went
# down, and the target still failed the controller at its keep-alive deadline. 30 s keeps a
# hung command from hanging the suite without failing on a slow guest.
lab_t 30 ip link set veth1 down
lab_log "host link cut mid-I/O (controllers $victims)"
# The target notices by itself: keep-alive expiry or transport errors close the controller.
# (The kernel host may reconnect through the target's own address meanwhile: that is a new
# controller; the vanished one must be gone.)
gone() {
    local now c
    now=$("$NVMF_BIN_DIR/nvmf-rpc" -s "$NVMF_RPC_SOCK" nvmf_subsystem_get_controllers "$nqn" |
        sed -n 's/.*"cntlid": *\([0-9]*\).*/\1/p')
    for c in $victims; do grep -qx "$c" <<<"$now" && return 1; done
    return 0
}
lab_wait_until 60 "target to drop the vanished host's controller" gone ||
    lab_fail "target kept the vanished host's controller"
grep -q "keep alive timeout" "$LAB_OUT/nvmf-tgt.log" && lab_log "target: keep-alive timeout tore the vanished controller down"
kill "$LAB_BG_PID" 2>/dev/null || true
# Link up first, then disconnect: a 6.12 host still retrying on the dead link may not let go
# of its controller, and a later connect to the same address is refused as "already
# connected". Then wait until the host really holds no controller.
lab_t 10 ip link set veth1 up
lab_wait_until 30 "rxe1 active again" lab__rxe_active rxe0 rxe1
lab_t 60 nvme disconnect-all >/dev/null 2>&1 || true
lab_wait_until 60 "the host to drop its controllers" \
    sh -c "! ls /sys/class/nvme/ 2>/dev/null | grep -q '^nvme[0-9]'" || {
    for c in /sys/class/nvme/nvme*; do lab_log "host still has $c: $(cat "$c/state" 2>&1)"; done
    ps -eo pid,stat,wchan:32,cmd | grep -E 'fio|nvme' | grep -v grep >&2 || true
    lab_fail "the host kept a controller after disconnect-all"
}
dev=$(lab_nvme_connect "$nqn" "$LAB_ADDR0" "$port")
lab_fio after-victim --filename="$dev" --ioengine=libaio --direct=1 --rw=randrw --bs=4k \
    --iodepth=8 --size=8M --verify=crc32c --do_verify=1 --verify_fatal=1 >/dev/null ||
    lab_fail "the next host could not do verified I/O"
lab_log "target served the next host after the first vanished"

# 6. Target shutdown with a host connected (I/O running).
lab_bg fio-during-shutdown 60 fio --name=shutdown --filename="$dev" --ioengine=libaio \
    --direct=1 --rw=randread --bs=4k --iodepth=8 --runtime=30 --time_based
sleep 2
start=$SECONDS
nvmf_tgt_stop TERM
lab_log "nvmf-tgt stopped $((SECONDS - start)) s after SIGTERM with a host connected"
ctrl_name=$(basename "$(ls -d /sys/class/nvme-subsystem/*/nvme[0-9]* 2>/dev/null | grep -v 'n[0-9]*$' | sed -n 1p)")
if [[ -n $ctrl_name ]]; then
    lab_wait_until 30 "host to see the controller go away" \
        sh -c "! grep -qx live /sys/class/nvme/$ctrl_name/state" || lab_fail "host still sees a live controller"
fi
grep -q "controller destroyed" "$LAB_OUT/nvmf-tgt.log" || lab_fail "target log shows no controller teardown"
lab_pass "discover; connect -i 2; nvme-cli admin commands; fio crc32c verify 4k-128k on 512 B and 4 KiB namespaces; ext4 across reconnect; vanished host cleaned up; clean shutdown with a host connected"
