#!/usr/bin/env bash
# smoke: the lab itself works. Soft-RoCE comes up (rxe0 on veth0, rxe1 on
# veth1, PORT_ACTIVE) and moves data: a 5 s ib_write_bw with 4 KiB messages
# from rxe0 to rxe1 (server on rxe1, client to its address). The message rate
# is the ceiling any NVMe-oF target can reach over this path in this VM.
#
# Usage: tests/lab/run smoke [SECONDS]   (default 5)
source "$(dirname "${BASH_SOURCE[0]}")/../guest-lib.sh"
lab_init smoke

secs=${1:-5}

lab_rxe_up

lab_t 30 ibv_devinfo -d rxe0 | tee "$LAB_OUT/ibv_devinfo-rxe0.txt" >&2
grep -q 'state:.*PORT_ACTIVE' "$LAB_OUT/ibv_devinfo-rxe0.txt" || lab_fail "rxe0 port is not PORT_ACTIVE"
lab_t 30 rdma link show >&2

# Two-device path: client on rxe0 (10.0.0.1) writes to the server on rxe1.
rate=$(lab_ib_write_bw rxe1 rxe0 "$LAB_ADDR1" "$secs" 4096)
echo "ib_write_bw 4KiB rxe0->rxe1 ($LAB_RXE_MODE): $rate msg/s"
((rate > 0)) || lab_fail "ib_write_bw moved no data between rxe0 and rxe1"

# For reference: both ends on rxe0 (rxe's internal loopback, the path a host
# and a target in one guest take when no policy routing is set up).
lrate=$(lab_ib_write_bw rxe0 rxe0 "$LAB_ADDR0" "$secs" 4096)
echo "ib_write_bw 4KiB rxe0->rxe0 (loopback): $lrate msg/s"
((lrate > 0)) || lab_fail "ib_write_bw moved no data on rxe0 loopback"

lab_pass "rxe0/rxe1 PORT_ACTIVE; ib_write_bw 4KiB: $rate msg/s rxe0->rxe1, $lrate msg/s loopback"
