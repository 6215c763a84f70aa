#!/usr/bin/env bash
# power-cut: what a host flushed survives a power cut; what it did not flush may not.
# The namespace is a block device behind device-mapper's log-writes target, which records every
# write, FUA and flush the device completes. Replaying that log as a device with a volatile
# cache would survive a power cut (writes before the last flush, plus FUA writes:
# dm-log-replay.py) must show every byte the host made durable:
#   A  written, then an NVMe Flush           (Flush -> fdatasync of the device)
#   B  one Write with FUA                    (FUA -> RWF_DSYNC)
#   C  written, then `nvme disconnect`       (the host's shutdown notification, CC.SHN)
# and, as the control that proves the check can fail, X written with no flush before the
# target is killed (kill -9) must be missing.
source "$(dirname "${BASH_SOURCE[0]}")/../guest-lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/../nvmf-lib.sh"
lab_init power-cut

nqn=nqn.2016-06.io.spdk:power-cut
MiB=1048576
lab_rxe_up
mapfile -t rams < <(lab_brd 64 2)
data=${rams[0]} logdev=${rams[1]}
lab_modprobe dm-log-writes
sectors=$(blockdev --getsz "$data")
lab_t 30 dmsetup create nvmf-lw --table "0 $sectors log-writes $data $logdev"
lab__record dm nvmf-lw
dev=/dev/mapper/nvmf-lw

nvmf_tgt_start -m 0x1
nvmf_rpc nvmf_create_transport -t RDMA >/dev/null
nvmf_rpc bdev_uring_create "$dev" Lw0 512 >/dev/null
nvmf_rpc nvmf_create_subsystem "$nqn" -a -s SPDK00000000000012 >/dev/null
nvmf_rpc nvmf_subsystem_add_ns "$nqn" Lw0 >/dev/null
nvmf_rpc nvmf_subsystem_add_listener "$nqn" -t rdma -f ipv4 -a "$LAB_ADDR0" -s 4420 >/dev/null
blk=$(lab_nvme_connect "$nqn" "$LAB_ADDR0" 4420)
nsid=$(cat "/sys/block/$(basename "$blk")/nsid")

pattern() { # NAME BYTES: a file of random bytes
    lab_t 30 head -c "$2" /dev/urandom >"$LAB_STATE/$1"
}
pattern A $((4 * MiB))
pattern B $((128 * 1024))
pattern C $((2 * MiB))
pattern X $((1 * MiB))

# A: direct writes, then an NVMe Flush.
lab_t 60 dd if="$LAB_STATE/A" of="$blk" bs=1M seek=0 oflag=direct status=none
lab_t 30 nvme flush "$blk" --namespace-id="$nsid" >&2 || lab_fail "nvme flush failed"
# B: one 128 KiB Write with FUA at 8 MiB (LBA 16384, 256 blocks).
lab_t 30 nvme write "$blk" --start-block=16384 --block-count=255 --data-size=131072 \
    --data="$LAB_STATE/B" --force-unit-access >&2 || lab_fail "nvme write --force-unit-access failed"
# C: direct writes at 16 MiB, then the host disconnects (shutdown notification).
lab_t 60 dd if="$LAB_STATE/C" of="$blk" bs=1M seek=16 oflag=direct status=none
lab_nvme_disconnect "$nqn"
grep -q "flush at controller shutdown failed" "$LAB_OUT/nvmf-tgt.log" && lab_fail "shutdown flush failed"
# X: reconnect, direct writes at 32 MiB, and the target dies before anyone flushes.
blk=$(lab_nvme_connect "$nqn" "$LAB_ADDR0" 4420)
lab_t 60 dd if="$LAB_STATE/X" of="$blk" bs=1M seek=32 oflag=direct status=none
# The power fails here: the mark is where the replay stops.
lab_t 30 dmsetup message nvmf-lw 0 mark power-cut
nvmf_tgt_stop KILL
lab_t 60 nvme disconnect-all >/dev/null 2>&1 || true

# Close the log (dm-log-writes writes its super block) and replay it up to the power cut.
lab_t 30 dmsetup remove nvmf-lw
summary=$(lab_t 120 python3 "$LAB_REPO/tests/lab/dm-log-replay.py" "$logdev" \
    $((sectors * 512)) "$LAB_STATE/after-cut.img" power-cut) || lab_fail "log replay failed"
lab_log "log: $summary"
survived() { # NAME OFFSET_BYTES
    cmp -s -n "$(stat -c %s "$LAB_STATE/$1")" -i "$2:0" "$LAB_STATE/after-cut.img" "$LAB_STATE/$1"
}
survived A 0 || lab_fail "data written and flushed (A) did not survive the power cut"
survived B $((8 * MiB)) || lab_fail "a FUA write (B) did not survive the power cut"
survived C $((16 * MiB)) || lab_fail "data written before the host's shutdown (C) did not survive"
if survived X $((32 * MiB)); then
    lab_fail "the control failed: unflushed data (X) survived, so the check proves nothing"
fi
lab_log "after the cut: A (flushed), B (FUA), C (shutdown) survive; X (never flushed) is gone"
lab_pass "power cut through dm-log-writes: flushed, FUA and shutdown-flushed data survive; unflushed data is lost ($summary)"
