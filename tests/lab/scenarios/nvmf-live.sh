#!/usr/bin/env bash
# nvmf-live: configuration changes over JSON-RPC while a Linux host stays connected.
#   - a namespace added live appears on the host without reconnecting (AEN, Changed NS List)
#   - a namespace removed under running I/O completes that I/O and disappears
#   - a namespace's bdev grown (bdev_null_resize) shows its new size on the host (AEN), and
#     does not shrink while in use
#   - host allow-list changes apply to new connections
#   - removing a listener disconnects the host's controller that came through it, not the
#     one through another port; deleting the subsystem disconnects it too
#   - save_config replayed with -c at start gives the same configuration
source "$(dirname "${BASH_SOURCE[0]}")/../guest-lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/../nvmf-lib.sh"
lab_init nvmf-live

nqn=nqn.2016-06.io.spdk:live
port=4420
lab_rxe_up
nvmf_tgt_start -m 0x3
nvmf_malloc_subsystem "$nqn" "$LAB_ADDR0" "$port" Malloc0:32:4096
nvmf_rpc bdev_malloc_create -b Malloc1 32 512 >/dev/null

nscount() { lab_nvme_dev "$nqn" 2>/dev/null | wc -l; }
dev1=$(lab_nvme_connect "$nqn" "$LAB_ADDR0" "$port")
[[ $(nscount) == 1 ]] || lab_fail "expected one namespace at first"

# Add a namespace: the host learns through an Asynchronous Event and rescans.
nvmf_rpc nvmf_subsystem_add_ns "$nqn" Malloc1 -n 2 >/dev/null
lab_wait_until 30 "namespace 2 to appear on the host" sh -c "[ \$(ls /sys/class/nvme-subsystem/*/ | grep -c '^nvme[0-9]*n[0-9]*\$') -ge 2 ]" ||
    lab_fail "namespace added live did not appear on the host"
dev2=$(lab_nvme_devs_by_nsid "$nqn" | tail -n1)
lab_log "namespace 2 appeared live as $dev2"
lab_fio ns2-verify --filename="$dev2" --ioengine=libaio --direct=1 --rw=randwrite --bs=4k \
    --iodepth=4 --size=4M --verify=crc32c --do_verify=1 --verify_fatal=1 >/dev/null ||
    lab_fail "I/O on the live-added namespace"

# Remove it under running I/O: the I/O ends (with errors once it is gone), the device goes.
lab_bg fio-ns2 60 fio --name=busy --filename="$dev2" --ioengine=libaio --direct=1 --rw=randread \
    --bs=4k --iodepth=8 --runtime=30 --time_based
sleep 2
nvmf_rpc nvmf_subsystem_remove_ns "$nqn" 2 >/dev/null
lab_wait_until 30 "namespace 2 to disappear" sh -c "[ \$(ls /sys/class/nvme-subsystem/*/ | grep -c '^nvme[0-9]*n[0-9]*\$') -le 1 ]" ||
    lab_fail "removed namespace still on the host"
lab_wait_until 40 "fio on the removed namespace to end" sh -c "! kill -0 $LAB_BG_PID"
lab_log "namespace 2 removed live; its fio ended"
# Namespace 1 kept working throughout.
lab_fio ns1-verify --filename="$dev1" --ioengine=libaio --direct=1 --rw=randwrite --bs=4k \
    --iodepth=4 --size=4M --verify=crc32c --do_verify=1 --verify_fatal=1 >/dev/null ||
    lab_fail "namespace 1 after the live removal"

# Grow a namespace live (bdev_null_resize): the host is told (AEN) and takes the new size
# without reconnecting, the new blocks serve I/O, and the bdev, in use, does not shrink.
nvmf_rpc bdev_null_create Null9 8 4096 >/dev/null
nvmf_rpc nvmf_subsystem_add_ns "$nqn" Null9 -n 3 >/dev/null
lab_wait_until 30 "namespace 3 to appear on the host" sh -c "[ \$(ls /sys/class/nvme-subsystem/*/ | grep -c '^nvme[0-9]*n[0-9]*\$') -ge 2 ]" ||
    lab_fail "namespace 3 did not appear"
dev3=$(lab_nvme_devs_by_nsid "$nqn" | tail -n1)
[[ $(blockdev --getsize64 "$dev3") == $((8 << 20)) ]] || lab_fail "namespace 3 is not 8 MiB at first"
nvmf_rpc bdev_null_resize Null9 16 >/dev/null
lab_wait_until 30 "the host to see namespace 3 grow to 16 MiB" sh -c "[ \$(blockdev --getsize64 $dev3) -eq $((16 << 20)) ]" ||
    lab_fail "the host did not take the grown size"
lab_t 30 dd if="$dev3" of=/dev/null bs=1M skip=12 count=4 iflag=direct status=none ||
    lab_fail "reading the grown blocks"
if nvmf_rpc bdev_null_resize Null9 4 >/dev/null 2>&1; then
    lab_fail "a namespace's bdev shrank under its host"
fi
sleep 2
[[ $(blockdev --getsize64 "$dev3") == $((16 << 20)) ]] || lab_fail "namespace 3 changed size after a refused shrink"
nvmf_rpc nvmf_subsystem_remove_ns "$nqn" 3 >/dev/null
lab_wait_until 30 "namespace 3 to disappear" sh -c "[ \$(ls /sys/class/nvme-subsystem/*/ | grep -c '^nvme[0-9]*n[0-9]*\$') -le 1 ]" ||
    lab_fail "namespace 3 still on the host"
lab_log "namespace 3 grew live from 8 to 16 MiB on the host; its shrink was refused"

# Allow list: closing the subsystem to unknown hosts refuses new connections; adding ours
# lets it in again.
lab_nvme_disconnect "$nqn"
hostnqn=$(cat /etc/nvme/hostnqn)
nvmf_rpc nvmf_subsystem_allow_any_host -d "$nqn" >/dev/null
if lab_t 60 nvme connect -t rdma -n "$nqn" -a "$LAB_ADDR0" -s "$port" >/dev/null 2>&1; then
    lab_fail "a host not on the allow list connected"
fi
nvmf_rpc nvmf_subsystem_add_host "$nqn" "$hostnqn" >/dev/null
lab_nvme_connect "$nqn" "$LAB_ADDR0" "$port" >/dev/null
lab_log "allow list honoured for new connections"

# save_config, then restart from it: the same configuration comes back.
nvmf_rpc save_config >"$LAB_STATE/saved.json"
nvmf_rpc framework_get_config nvmf >"$LAB_STATE/before.json"

# Removing a listener disconnects the controllers that came through it, and only those: a
# second controller of the host, through another port, stays live.
port2=4421
nvmf_rpc nvmf_subsystem_add_listener "$nqn" -t rdma -f ipv4 -a "$LAB_ADDR0" -s "$port2" >/dev/null
lab_t 60 nvme connect -t rdma -n "$nqn" -a "$LAB_ADDR0" -s "$port2" >/dev/null ||
    lab_fail "a second controller through port $port2"
# state_on PORT: the state of the host's controller that goes to PORT.
state_on() {
    local c
    for c in /sys/class/nvme/nvme*; do
        grep -qs "trsvcid=$1\b" "$c/address" && cat "$c/state"
    done
    return 0
}
not_live_on() { [[ $(state_on "$1") != live ]]; }
lab_wait_until 30 "controllers on ports $port and $port2 live" sh -c \
    "[ \"\$(grep -lsx live /sys/class/nvme/nvme*/state | wc -l)\" -ge 2 ]" ||
    lab_fail "not two live controllers"
nvmf_rpc nvmf_subsystem_get_qpairs "$nqn" >"$LAB_STATE/qpairs.json"
/usr/bin/python3 - "$LAB_STATE/qpairs.json" "$port" "$port2" <<'PY' || lab_fail "nvmf_subsystem_get_qpairs does not name each admin queue's listener"
import json, sys
q = json.load(open(sys.argv[1]))
seen = sorted(x["listen_address"]["trsvcid"] for x in q if x["qid"] == 0)
sys.exit(0 if seen == sorted(sys.argv[2:]) else 1)
PY
nvmf_rpc nvmf_subsystem_remove_listener "$nqn" -t rdma -f ipv4 -a "$LAB_ADDR0" -s "$port" >/dev/null
lab_wait_until 30 "the controller on port $port to leave live" not_live_on "$port" ||
    lab_fail "host controller still live after its listener went away"
sleep 3
[[ $(state_on "$port2") == live ]] ||
    lab_fail "the controller on port $port2 left live when the listener on $port was removed"
nvmf_rpc nvmf_subsystem_remove_listener "$nqn" -t rdma -f ipv4 -a "$LAB_ADDR0" -s "$port2" >/dev/null
lab_t 60 nvme disconnect-all >/dev/null 2>&1 || true
nvmf_rpc nvmf_subsystem_add_listener "$nqn" -t rdma -f ipv4 -a "$LAB_ADDR0" -s "$port" >/dev/null
lab_nvme_connect "$nqn" "$LAB_ADDR0" "$port" >/dev/null
nvmf_rpc nvmf_delete_subsystem "$nqn" >/dev/null
lab_wait_until 30 "controller gone after subsystem delete" sh -c "! grep -qsx live /sys/class/nvme/nvme*/state" ||
    lab_fail "host controller still live after the subsystem was deleted"
lab_t 60 nvme disconnect-all >/dev/null 2>&1 || true
nvmf_tgt_stop

nvmf_tgt_start -m 0x3 -c "$LAB_STATE/saved.json"
nvmf_rpc framework_get_config nvmf >"$LAB_STATE/after.json"
diff -u "$LAB_STATE/before.json" "$LAB_STATE/after.json" >&2 || lab_fail "restart from save_config differs"
lab_nvme_connect "$nqn" "$LAB_ADDR0" "$port" >/dev/null
lab_nvme_disconnect "$nqn"
nvmf_tgt_stop
lab_pass "namespace added and removed live; allow list; listener removal and subsystem delete disconnect; save_config round trip"
