#!/usr/bin/env bash
# kernel-target: the Linux kernel's own NVMe-oF RDMA target (nvmet-rdma) on a
# memory-backed null_blk, served on rxe0 at 10.0.0.1:4420 and used by the
# kernel host (nvme-rdma) from rxe1: discover, connect, fio 4k randread QD32
# (IOPS), fio write + crc32c verify, disconnect, teardown.
#
# This is the reference the project's own target is compared to: same VM,
# same path, same fio jobs.
#
# Usage: tests/lab/run kernel-target [RUNTIME_SECONDS]   (default 5)
source "$(dirname "${BASH_SOURCE[0]}")/../guest-lib.sh"
lab_init kernel-target

runtime=${1:-5}
port=4420
name=kernel-target
nqn=$(lab_nqn "$name")

lab_rxe_up

dev=$(lab_null_blk 1 256 4096)
lab_kernel_target_up "$name" "$dev" "$LAB_ADDR0" "$port"

# Discovery must list our subsystem on the RDMA port.
lab_nvme_discover "$LAB_ADDR0" "$port" | tee "$LAB_OUT/discover.txt" >&2
grep -q "subnqn: *$nqn\$" "$LAB_OUT/discover.txt" || lab_fail "discovery does not list $nqn"
grep -q 'trtype: *rdma' "$LAB_OUT/discover.txt" || lab_fail "discovery entry is not rdma"

blk=$(lab_nvme_connect "$nqn" "$LAB_ADDR0" "$port")
# Which path the host took (src_addr 10.0.0.2 = from rxe1 over the veth pair).
for c in /sys/class/nvme-subsystem/nvme-subsys*/nvme[0-9]*; do
    [[ -r $c/address ]] && lab_log "controller $(basename "$c"): $(cat "$c/address")"
done
lab_t 30 nvme list >&2 || true

common=(--filename="$blk" --ioengine=libaio --direct=1 --bs=4k)

lab_cpu_snapshot "$LAB_OUT/cpu-before.txt"
lab_fio randread-4k-qd32 "${common[@]}" --rw=randread --iodepth=32 \
    --runtime="$runtime" --time_based --ramp_time=1
lab_cpu_snapshot "$LAB_OUT/cpu-after.txt"
iops=$(lab_fio_iops "$LAB_OUT/randread-4k-qd32.json" read)
echo "kernel target fio 4k randread qd32 ${runtime}s: $iops IOPS"
lab_cpu_report "$LAB_OUT/cpu-before.txt" "$LAB_OUT/cpu-after.txt"
((iops > 0)) || lab_fail "randread did no I/O"

# Data integrity: write 32 MiB of checksummed blocks, read them back, verify.
lab_fio write-verify "${common[@]}" --rw=randwrite --iodepth=16 --size=32M \
    --verify=crc32c --do_verify=1 --verify_fatal=1 --verify_dump=1 ||
    lab_fail "fio write+verify (crc32c) failed"

lab_rxe_counters >&2

lab_nvme_disconnect "$nqn"
[[ ! -b $blk ]] || lab_fail "$blk still present after disconnect"
lab_kernel_target_down

lab_pass "discover+connect over rdma, randread 4k qd32: $iops IOPS, crc32c verify OK, disconnect OK"
