#!/usr/bin/env bash
# device-removal: the target's RDMA device is deleted under a connected Linux host doing I/O
# (`rdma link delete rxe0`, as an admin or a driver reload does), then added back.
#   - The deletion completes. The kernel finishes it only once no process holds anything on
#     the device (rxe cannot take resources back from a process); a target that kept its
#     CQs, SRQ, registrations or contexts made `rdma link delete` hang, unkillable, until
#     the target exited.
#   - The target survives it: its RPC socket answers and `nvmf_get_stats` lists the device
#     no more.
#   - Once the device is back, the listener returns by itself (tried every 2 s, as nvmet
#     repairs its ports), the host reconnects within its ctrl_loss_tmo, and fio, running
#     through the whole episode, saw no I/O error: the host held its I/O and sent it again.
#     A pattern written before the removal reads back the same.
#   - The target serves a second subsystem on the other device (rxe1, 10.0.0.2: the host's
#     own device, a loopback path) with a second Linux host connection. The two devices
#     number their QPs alike, so the target holds equal QP numbers on both (the log shows
#     which): crc32c-verified writes on both paths at once, and the second path's fio runs
#     through the first device's removal without an error or a reconnect.
#   - A device the target never used (another rxe link, added and deleted while the target
#     runs) is let go within seconds too: librdmacm opens every device it lists.
#   - Then every device goes, the last one too (librdmacm alone would keep that one open),
#     comes back, and the target listens and serves again.
source "$(dirname "${BASH_SOURCE[0]}")/../guest-lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/../nvmf-lib.sh"
lab_init device-removal

# delete_link DEV LIMIT: `rdma link delete DEV` must finish within LIMIT seconds; prints its
# time. A deletion that hangs cannot be killed (it waits in the kernel): the target is killed
# so the lab can clean up, and the scenario fails.
delete_link() {
    local dev=$1 limit=$2 pid start i
    start=$(date +%s%N)
    rdma link delete "$dev" &
    pid=$!
    for ((i = 0; i < limit * 10; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        lab_log "rdma link delete $dev still waiting after ${limit} s, in $(cat /proc/$pid/wchan)"
        nvmf_tgt_stop KILL || true
        wait "$pid" || true
        lab_fail "rdma link delete $dev hung while nvmf-tgt ran (it finished once the target was killed)"
    fi
    wait "$pid" || lab_fail "rdma link delete $dev failed"
    echo $((($(date +%s%N) - start) / 1000000))
}

# target_qpns DEV: the QP numbers nvmf-tgt's threads (the reactors make the QPs) hold on DEV.
target_qpns() {
    local tids
    tids=$(ls "/proc/$NVMF_TGT_PID/task" | tr '\n' ' ')
    rdma res show qp |
        awk -v dev="$1/1" -v tids=" $tids" '$1 == "link" && $2 == dev {
            q = ""; p = ""
            for (i = 1; i < NF; i++) { if ($i == "lqpn") q = $(i + 1); if ($i == "pid") p = $(i + 1) }
            if (p != "" && index(tids, " " p " ")) print q
        }' | sort -n | tr '\n' ' '
}

lab_rxe_up
nvmf_tgt_start -m 0x3
nqn=nqn.2016-06.io.spdk:cnode1
nqn_b=nqn.2016-06.io.spdk:cnode2
nvmf_malloc_subsystem "$nqn" "$LAB_ADDR0" 4420 Malloc0:64:512
nvmf_malloc_subsystem "$nqn_b" "$LAB_ADDR1" 4420 Malloc1:64:512
# The second device's path first: the target's QPs on it then take numbers its first device
# hands out too. The host's end of it is bound to the same device (a loopback path on rxe1),
# so removing rxe0 leaves it whole: without --host-traddr the lab's routing sends it
# through veth0, and Linux deletes a controller whose own device goes.
blk_b=$(lab_nvme_connect "$nqn_b" "$LAB_ADDR1" 4420 --host-traddr="$LAB_ADDR1")
blk=$(lab_nvme_connect "$nqn" "$LAB_ADDR0" 4420 --ctrl-loss-tmo=120 --reconnect-delay=2)
# controller_of NQN: the host's controller (nvmeN) of subsystem NQN.
controller_of() {
    local c
    for c in /sys/class/nvme/nvme*; do
        [[ $(cat "$c/subsysnqn") == "$1" ]] && basename "$c"
    done
    return 0
}
ctrl_a=$(controller_of "$nqn")
ctrl_b=$(controller_of "$nqn_b")
[[ -n $ctrl_a && -n $ctrl_b ]] || lab_fail "no controller of $nqn or $nqn_b"
q0=$(target_qpns rxe0)
q1=$(target_qpns rxe1)
both=$(comm -12 <(tr ' ' '\n' <<<"$q0" | sed '/^$/d' | sort) <(tr ' ' '\n' <<<"$q1" | sed '/^$/d' | sort) | tr '\n' ' ')
lab_log "target QP numbers: rxe0 [$q0] rxe1 [$q1]; on both devices: [$both]"
[[ -n ${both// /} ]] || lab_fail "the target's QPs on rxe0 and rxe1 share no number: the two-device check would prove nothing"
rdma res show qp >&2
# Both paths at once, every block verified: a capsule taken for another device's qpair
# would land on the wrong namespace.
lab_fio verify-a --filename="$blk" --rw=randwrite --bs=4k --iodepth=16 --ioengine=libaio \
    --direct=1 --offset=40M --size=8M --verify=crc32c >&2 &
va=$!
lab_fio verify-b --filename="$blk_b" --rw=randwrite --bs=4k --iodepth=16 --ioengine=libaio \
    --direct=1 --offset=40M --size=8M --verify=crc32c >&2 ||
    lab_fail "verified writes through the second device failed"
wait "$va" || lab_fail "verified writes through the first device failed"

head -c 1048576 /dev/urandom >"$LAB_STATE/pattern"
lab_t 60 dd if="$LAB_STATE/pattern" of="$blk" bs=64k oflag=direct status=none

lab_log "rdma resources before: $(rdma res show 2>&1 | tr '\n' ';')"
# fio through the whole episode on both paths: 4 KiB random reads and writes past the pattern.
lab_fio through-removal --filename="$blk" --rw=randrw --bs=4k --iodepth=8 --ioengine=libaio \
    --direct=1 --offset=8M --size=32M --time_based --runtime=40 >"$LAB_STATE/fio.txt" &
fio_pid=$!
lab_fio beside-removal --filename="$blk_b" --rw=randrw --bs=4k --iodepth=8 --ioengine=libaio \
    --direct=1 --offset=8M --size=32M --time_based --runtime=40 >"$LAB_STATE/fio-b.txt" &
fio_b_pid=$!
sleep 5

ms=$(delete_link rxe0 30)
lab_log "rdma link delete rxe0 took $ms ms"
kill -0 "$NVMF_TGT_PID" || lab_fail "nvmf-tgt died with its device"
[[ $(cat "/sys/class/nvme/$ctrl_b/state") == live ]] ||
    lab_fail "the second device's path left live when the first device went ($(cat "/sys/class/nvme/$ctrl_b/state"))"
grep -q "RDMA device removed" "$LAB_OUT/nvmf-tgt.log" || lab_fail "the target did not log the removal"
stats=$(nvmf_rpc nvmf_get_stats)
[[ $stats != *'"name": "rxe0"'* ]] || lab_fail "nvmf_get_stats still lists rxe0 after its removal"
lab_log "rdma resources with rxe0 gone: $(rdma res show 2>&1 | tr '\n' ';')"

sleep 3
lab_t 30 rdma link add rxe0 type rxe netdev veth0
lab_wait_until 60 "rxe0 ACTIVE" sh -c "rdma link show rxe0/1 | grep -q 'state ACTIVE'"
lab_wait_until 30 "the listener back on rxe0" grep -q "RDMA listener back" "$LAB_OUT/nvmf-tgt.log"
lab_wait_until 60 "the host to reconnect" grep -qx live "/sys/class/nvme/$ctrl_a/state"
wait "$fio_pid" || lab_fail "fio saw I/O errors through the removal: $(cat "$LAB_STATE/fio.txt")"
lab_log "fio through the removal: $(cat "$LAB_STATE/fio.txt")"
wait "$fio_b_pid" || lab_fail "fio on the second device saw I/O errors: $(cat "$LAB_STATE/fio-b.txt")"
lab_log "fio on the second device meanwhile: $(cat "$LAB_STATE/fio-b.txt")"
! grep -q "$ctrl_b: \(Reconnecting\|reconnect\|resetting\)" <(dmesg) ||
    lab_fail "the second device's path reconnected: $(dmesg | grep "$ctrl_b:" | tail -5)"
lab_t 60 dd if="$blk" of="$LAB_STATE/back" bs=64k count=16 iflag=direct status=none
cmp "$LAB_STATE/pattern" "$LAB_STATE/back" || lab_fail "the pattern written before the removal reads back different"
stats=$(nvmf_rpc nvmf_get_stats)
[[ $stats == *'"name": "rxe0"'* ]] || lab_fail "nvmf_get_stats does not list rxe0 once it is back"

# A device the target never used.
lab_t 10 ip link add veth2 type veth peer name veth3
lab_t 10 ip link set veth2 up
lab_t 10 ip link set veth3 up
lab_t 30 rdma link add rxe2 type rxe netdev veth2
sleep 5
ms2=$(delete_link rxe2 30)
lab_log "rdma link delete rxe2 (never used by the target) took $ms2 ms"
lab_t 10 ip link del veth2

lab_nvme_disconnect "$nqn"
lab_nvme_disconnect "$nqn_b"

# The machine's last RDMA device. librdmacm stops looking when none is left and would keep
# the last one's context open until the target exits; the target closes it itself once it
# holds nothing on it. Both go, rxe0 last, with the target listening on each.
ms3=$(delete_link rxe1 30)
ms4=$(delete_link rxe0 30)
lab_log "rdma link delete rxe1 took $ms3 ms, then rxe0 (the last device) $ms4 ms"
kill -0 "$NVMF_TGT_PID" || lab_fail "nvmf-tgt died when its last device went"
lab_wait_until 10 "the target to see no device left" grep -q "no RDMA device is left" "$LAB_OUT/nvmf-tgt.log"
back=$(grep -c "RDMA listener back" "$LAB_OUT/nvmf-tgt.log")
lab_t 30 rdma link add rxe0 type rxe netdev veth0
lab_t 30 rdma link add rxe1 type rxe netdev veth1
lab_wait_until 60 "rxe0/rxe1 ACTIVE" lab__rxe_active rxe0 rxe1
lab_wait_until 30 "both listeners back" sh -c "[ \$(grep -c 'RDMA listener back' '$LAB_OUT/nvmf-tgt.log') -ge $((back + 2)) ]"
blk=$(lab_nvme_connect "$nqn" "$LAB_ADDR0" 4420)
lab_t 60 dd if="$blk" of="$LAB_STATE/back2" bs=64k count=16 iflag=direct status=none
cmp "$LAB_STATE/pattern" "$LAB_STATE/back2" || lab_fail "the pattern reads back different after the last device returned"
lab_nvme_disconnect "$nqn"

nvmf_tgt_stop
lab_pass "rdma link delete under I/O took $ms ms (unused device: $ms2 ms; the last device: $ms4 ms); listener back, host reconnected, fio without errors, data intact; the other device's path untouched; QP numbers on both devices: [$both]"
