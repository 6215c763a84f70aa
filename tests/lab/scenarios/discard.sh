#!/usr/bin/env bash
# discard: the Linux host's block-layer discard (TRIM) against our target. Run it on both host
# kernels: `tests/lab/run discard` and `tests/lab/run --kernel 6.12 discard`.
#   - RAM namespace (4 KiB blocks): blkdiscard at several sizes and offsets, each range reads
#     back as zeroes and everything around it is untouched; blkdiscard -z; a multi-range
#     Dataset Management in the capsule shape the block layer uses (4 KiB of ranges, NR ranges
#     used) through nvme-cli's io-passthru; ext4 made and mounted with -o discard, files
#     written and deleted, fstrim -v trims bytes, fsck -n is clean.
#   - file namespace (bdev_uring on ext4): a discard punches holes, so the backing file's
#     allocated blocks shrink.
#   - the capsule the host sent for its first block-layer discard, from the target's trace.
source "$(dirname "${BASH_SOURCE[0]}")/../guest-lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/../nvmf-lib.sh"
lab_init discard

ram_nqn=nqn.2016-06.io.spdk:discard-ram
file_nqn=nqn.2016-06.io.spdk:discard-file
port=4420
MiB=1048576
lab_rxe_up
mnt=$(lab_mount_tmp_ext4 160)
file=$mnt/ns.img
lab_t 30 truncate -s 64M "$file"

# The trace line of every Dataset Management capsule shows what the host sent.
RUST_LOG=info,nvmf_target::cmd::io=trace nvmf_tgt_start -m 0x1
nvmf_malloc_subsystem "$ram_nqn" "$LAB_ADDR0" "$port" Malloc0:128:4096
nvmf_rpc bdev_uring_create "$file" Uring0 4096 >/dev/null
nvmf_rpc nvmf_create_subsystem "$file_nqn" -a -s SPDK00000000000017 >/dev/null
nvmf_rpc nvmf_subsystem_add_ns "$file_nqn" Uring0 >/dev/null
nvmf_rpc nvmf_subsystem_add_listener "$file_nqn" -t rdma -f ipv4 -a "$LAB_ADDR0" -s "$port" >/dev/null

blk=$(lab_nvme_connect "$ram_nqn" "$LAB_ADDR0" "$port")
queue=/sys/block/$(basename "$blk")/queue
lab_log "host $(uname -r): discard_max_bytes $(cat "$queue/discard_max_bytes")" \
    "discard_granularity $(cat "$queue/discard_granularity")" \
    "max_discard_segments $(cat "$queue/max_discard_segments")" \
    "write_zeroes_max_bytes $(cat "$queue/write_zeroes_max_bytes")"
(($(cat "$queue/discard_max_bytes") > 0)) || lab_fail "the host does not see discard support"
(($(cat "$queue/max_discard_segments") > 1)) || lab_fail "the host sends single-range discards only"

# A pattern over the first 16 MiB; `expected` follows every discard with zeroes.
lab_t 60 head -c $((16 * MiB)) /dev/urandom >"$LAB_STATE/expected"
lab_t 60 dd if="$LAB_STATE/expected" of="$blk" bs=1M oflag=direct status=none
zero_expected() { # OFFSET LENGTH, in bytes, both multiples of 4 KiB
    lab_t 30 dd if=/dev/zero of="$LAB_STATE/expected" bs=4096 seek=$(($1 / 4096)) \
        count=$(($2 / 4096)) conv=notrunc status=none
}
check_media() { # WHAT
    lab_t 60 dd if="$blk" of="$LAB_STATE/back" bs=1M count=16 iflag=direct status=none
    cmp -s "$LAB_STATE/expected" "$LAB_STATE/back" ||
        lab_fail "$1: the namespace differs from what it should hold ($(cmp "$LAB_STATE/expected" "$LAB_STATE/back" | head -n1))"
}
check_media "pattern written"

# blkdiscard OFFSET LENGTH: 1 MiB at 0 (the issue's failing command), one 4 KiB block, an odd
# offset and size, 2 MiB across the 8 MiB mark.
for range in "0 $MiB" "$((3 * MiB + 4096)) 4096" "$((5 * MiB + 8192)) $((68 * 4096))" \
    "$((7 * MiB)) $((2 * MiB))"; do
    read -r off len <<<"$range"
    lab_t 60 blkdiscard -o "$off" -l "$len" "$blk" || lab_fail "blkdiscard -o $off -l $len failed"
    zero_expected "$off" "$len"
    check_media "after blkdiscard -o $off -l $len"
done
lab_log "blkdiscard: 4 ranges deallocated, reads back zeroes, neighbours intact"

grep -m1 "dataset management capsule" "$LAB_OUT/nvmf-tgt.log" >"$LAB_OUT/first-discard-capsule.txt" ||
    lab_fail "the target traced no Dataset Management capsule"
lab_log "the host's first discard capsule: $(sed 's/.*dataset management capsule//' "$LAB_OUT/first-discard-capsule.txt")"

# blkdiscard -z: Write Zeroes (or the block layer's zero writes) over 1 MiB of the pattern.
lab_t 60 blkdiscard -z -o $((10 * MiB)) -l $MiB "$blk" || lab_fail "blkdiscard -z failed"
zero_expected $((10 * MiB)) $MiB
check_media "after blkdiscard -z"

# Three ranges in one command, in the block layer's capsule shape: a 4 KiB range buffer, NR=2
# (zero-based) used. Each range is a 16-byte little-endian {cattr, nlb, slba} record.
python3 - "$LAB_STATE/ranges.bin" $((12 * 256)) 16 $((13 * 256 + 5)) 3 $((14 * 256)) 256 <<'PY'
import struct, sys
out, nums = sys.argv[1], [int(v) for v in sys.argv[2:]]
buf = b"".join(struct.pack("<IIQ", 0, nlb, slba) for slba, nlb in zip(nums[::2], nums[1::2]))
open(out, "wb").write(buf.ljust(4096, b"\0"))
PY
ns_id=$(cat "/sys/block/$(basename "$blk")/nsid")
lab_t 60 nvme io-passthru "$blk" --opcode=0x09 --namespace-id="$ns_id" --cdw10=2 --cdw11=4 \
    --data-len=4096 --write --input-file="$LAB_STATE/ranges.bin" >&2 ||
    lab_fail "a three-range Dataset Management with a 4 KiB range buffer failed"
zero_expected $((12 * MiB)) $((16 * 4096))
zero_expected $((13 * MiB + 5 * 4096)) $((3 * 4096))
zero_expected $((14 * MiB)) $MiB
check_media "after a three-range deallocate"
lab_log "multi-range deallocate: three ranges gone, the rest intact"

# ext4 with online discard, then fstrim.
lab_t 120 mkfs.ext4 -q -F "$blk"
fsdir=$(mktemp -d /tmp/lab-discard-fs.XXXXXX)
lab_t 30 mount -o discard "$blk" "$fsdir"
lab__record mounts "$fsdir"
for i in 1 2 3 4; do lab_t 60 dd if=/dev/urandom of="$fsdir/f$i" bs=1M count=8 status=none; done
lab_t 30 sync
lab_t 30 rm "$fsdir/f2" "$fsdir/f4"
lab_t 30 sync
trimmed=$(lab_t 120 fstrim -v "$fsdir") || lab_fail "fstrim failed"
lab_log "fstrim: $trimmed"
bytes=$(sed -n 's/.*(\([0-9]*\) bytes) trimmed.*/\1/p' <<<"$trimmed")
[[ -n $bytes ]] && ((bytes > 0)) || lab_fail "fstrim trimmed nothing: '$trimmed'"
lab_t 30 umount "$fsdir"
lab_t 120 fsck.ext4 -n -f "$blk" >"$LAB_OUT/fsck.txt" 2>&1 || {
    cat "$LAB_OUT/fsck.txt" >&2
    lab_fail "fsck -n found errors after discards"
}
dmesg | grep -i "nvme.*\(I/O Cmd\|I/O error\)" >"$LAB_OUT/host-io-errors.txt" || true
[[ ! -s $LAB_OUT/host-io-errors.txt ]] || {
    cat "$LAB_OUT/host-io-errors.txt" >&2
    lab_fail "the host logged NVMe I/O errors"
}
lab_nvme_disconnect "$ram_nqn"

# A file namespace: discards punch holes in the backing file.
fblk=$(lab_nvme_connect "$file_nqn" "$LAB_ADDR0" "$port")
lab_t 60 dd if=/dev/urandom of="$fblk" bs=1M count=32 oflag=direct status=none
lab_t 30 sync
before=$(stat -c %b "$file")
lab_t 60 blkdiscard -o 0 -l $((24 * MiB)) "$fblk" || lab_fail "blkdiscard on the file namespace failed"
after=$(stat -c %b "$file")
lab_log "backing file: $((before / 2)) KiB allocated before the discard, $((after / 2)) KiB after"
# 24 MiB is 49152 blocks of 512 bytes; allow for file-system rounding.
((before - after >= 49152 - 2048)) || lab_fail "the discard did not punch holes in the backing file"
lab_t 60 cmp -n $((24 * MiB)) "$fblk" /dev/zero || lab_fail "discarded file blocks do not read as zeroes"
lab_nvme_disconnect "$file_nqn"
nvmf_tgt_stop

lab_pass "blkdiscard (4 ranges, -z), a 3-range 4 KiB-buffer DSM, ext4 -o discard + fstrim ($bytes bytes) + fsck clean, file holes punched ($((before / 2)) -> $((after / 2)) KiB) on Linux $(uname -r)"
