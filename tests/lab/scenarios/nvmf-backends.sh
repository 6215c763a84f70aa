#!/usr/bin/env bash
# nvmf-backends: real storage behind namespaces, seen by the Linux host.
#   - ns1 on a file (bdev_uring, O_DIRECT, on ext4 over a RAM disk): data written by the host
#     and flushed lands byte for byte in the file and survives a kill -9 of the target; a
#     restart from the saved config reads it back
#   - ns2 on an error-injection bdev: an injected failure reaches the host as an I/O error
#     while ns1 keeps working
#   - ns3 on a delay bdev: fio's completion latency shows the configured delay
source "$(dirname "${BASH_SOURCE[0]}")/../guest-lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/../nvmf-lib.sh"
lab_init nvmf-backends

nqn=nqn.2016-06.io.spdk:backends
port=4420
lab_rxe_up
mnt=$(lab_mount_tmp_ext4 256)
file=$mnt/ns1.img
lab_t 30 truncate -s 64M "$file"

nvmf_tgt_start -m 0x1
nvmf_rpc nvmf_create_transport -t RDMA >/dev/null
nvmf_rpc bdev_uring_create "$file" Uring0 4096 >/dev/null
nvmf_rpc bdev_malloc_create -b Malloc0 16 4096 >/dev/null
nvmf_rpc bdev_error_create Malloc0 >/dev/null
nvmf_rpc bdev_malloc_create -b Malloc1 16 4096 >/dev/null
nvmf_rpc bdev_delay_create -b Malloc1 -d Delay0 -r 2000 -t 2000 -w 2000 -n 2000 >/dev/null
nvmf_rpc nvmf_create_subsystem "$nqn" -a -s SPDK00000000000003 >/dev/null
nvmf_rpc nvmf_subsystem_add_ns "$nqn" Uring0 -n 1 >/dev/null
nvmf_rpc nvmf_subsystem_add_ns "$nqn" EE_Malloc0 -n 2 >/dev/null
nvmf_rpc nvmf_subsystem_add_ns "$nqn" Delay0 -n 3 >/dev/null
nvmf_rpc nvmf_subsystem_add_listener "$nqn" -t rdma -f ipv4 -a "$LAB_ADDR0" -s "$port" >/dev/null
nvmf_rpc save_config >"$LAB_STATE/saved.json"
grep -q "Engine\|engine" "$LAB_OUT/nvmf-tgt.log" && grep -i "engine" "$LAB_OUT/nvmf-tgt.log" | head -n2 >&2

lab_nvme_connect "$nqn" "$LAB_ADDR0" "$port" >/dev/null
lab_wait_until 30 "three namespaces" sh -c "[ \$(ls /sys/class/nvme-subsystem/*/ | grep -c '^nvme[0-9]*n[0-9]*\$') -ge 3 ]"
mapfile -t devs < <(lab_nvme_devs_by_nsid "$nqn")
ns1=${devs[0]} ns2=${devs[1]} ns3=${devs[2]}

# Durability: write, flush, kill -9, then look at the file itself.
head -c 4194304 /dev/urandom >"$LAB_STATE/pattern"
lab_t 60 dd if="$LAB_STATE/pattern" of="$ns1" bs=128k seek=8 oflag=direct status=none
lab_t 30 nvme flush "$ns1" -n 1 >&2
nvmf_tgt_stop KILL 2>/dev/null || true
lab_t 60 nvme disconnect-all >/dev/null 2>&1 || true
lab_t 30 dd if="$file" of="$LAB_STATE/in-file" bs=128k skip=8 count=32 iflag=direct status=none
cmp "$LAB_STATE/pattern" "$LAB_STATE/in-file" || lab_fail "flushed data is not in the backing file after kill -9"
lab_log "flushed data found byte for byte in $file after kill -9"

# Restart from the saved configuration; the host reads the same data back.
nvmf_tgt_start -m 0x1 -c "$LAB_STATE/saved.json"
lab_nvme_connect "$nqn" "$LAB_ADDR0" "$port" >/dev/null
lab_wait_until 30 "three namespaces" sh -c "[ \$(ls /sys/class/nvme-subsystem/*/ | grep -c '^nvme[0-9]*n[0-9]*\$') -ge 3 ]"
mapfile -t devs < <(lab_nvme_devs_by_nsid "$nqn")
ns1=${devs[0]} ns2=${devs[1]} ns3=${devs[2]}
lab_t 60 dd if="$ns1" of="$LAB_STATE/back" bs=128k skip=8 count=32 iflag=direct status=none
cmp "$LAB_STATE/pattern" "$LAB_STATE/back" || lab_fail "data differs after restart"
lab_log "restart from save_config read the data back"

# Error injection: reads of ns2 fail on the host; ns1 is unaffected. A media error carries no
# DNR, so the host retries (nvme_max_retries, 5 by default): inject more failures than that.
lab_t 30 dd if=/dev/zero of="$ns2" bs=4k count=16 oflag=direct status=none
nvmf_rpc bdev_error_inject_error EE_Malloc0 read failure -n 64 >/dev/null
if lab_t 60 dd if="$ns2" of=/dev/null bs=4k count=1 iflag=direct status=none 2>"$LAB_STATE/dd-err"; then
    lab_fail "an injected read failure did not reach the host"
fi
lab_log "host saw: $(head -n1 "$LAB_STATE/dd-err")"
lab_t 30 dd if="$ns1" of=/dev/null bs=128k count=8 iflag=direct status=none || lab_fail "ns1 failed alongside ns2"
nvmf_rpc bdev_error_inject_error EE_Malloc0 clear failure >/dev/null
lab_t 30 dd if="$ns2" of=/dev/null bs=4k count=1 iflag=direct status=none || lab_fail "ns2 read after the injected failure"
lab_t 30 dd if="$ns1" of=/dev/null bs=128k count=8 iflag=direct status=none || lab_fail "ns1 failed alongside ns2"

# Delay: completion latency of a 2 ms delay bdev against the plain RAM namespace.
lab_fio delay-qd1 --filename="$ns3" --ioengine=libaio --direct=1 --rw=randread --bs=4k \
    --iodepth=1 --runtime=3 --time_based >&2
lab_fio plain-qd1 --filename="$ns2" --ioengine=libaio --direct=1 --rw=randread --bs=4k \
    --iodepth=1 --runtime=3 --time_based >&2
lat() {
    /usr/bin/python3 -c 'import json,sys; t=open(sys.argv[1]).read(); print(int(json.loads(t[t.index("{"):])["jobs"][0]["read"]["clat_ns"]["mean"]/1000))' "$1"
}
delayed=$(lat "$LAB_OUT/delay-qd1.json")
plain=$(lat "$LAB_OUT/plain-qd1.json")
lab_log "fio clat mean: delay bdev ${delayed} us, plain ${plain} us"
((delayed >= 2000 && delayed >= plain + 1500)) || lab_fail "delay bdev latency not visible in fio clat (${delayed} us vs ${plain} us)"

# A full file system: ns4 is a sparse 64 MiB file on a 4 MiB tmpfs (no O_DIRECT there, so the
# bdev falls back to buffered I/O). Writing past the free space gets ENOSPC, which the host
# sees as a write error (Capacity Exceeded, DNR: no retries); the namespace keeps serving reads.
small=$(mktemp -d /tmp/nvmf-full.XXXXXX)
lab_t 10 mount -t tmpfs -o size=4m tmpfs "$small"
lab__record mounts "$small"
lab_t 10 truncate -s 64M "$small/full.img"
nvmf_rpc bdev_uring_create "$small/full.img" Full0 4096 >/dev/null
nvmf_rpc nvmf_subsystem_add_ns "$nqn" Full0 -n 4 >/dev/null
lab_wait_until 30 "namespace 4 to appear" sh -c "[ \$(ls /sys/class/nvme-subsystem/*/ | grep -c '^nvme[0-9]*n[0-9]*\$') -ge 4 ]" ||
    lab_fail "namespace 4 did not appear"
ns4=$(lab_nvme_devs_by_nsid "$nqn" | tail -n1)
if lab_t 120 dd if=/dev/urandom of="$ns4" bs=1M count=16 oflag=direct status=none 2>"$LAB_STATE/full-err"; then
    lab_fail "writing 16 MiB into a 4 MiB file system succeeded"
fi
lab_log "full file system: host saw: $(head -n1 "$LAB_STATE/full-err")"
ctrl=/dev/$(basename "$(ls -d /sys/class/nvme-subsystem/*/nvme[0-9]* | grep -v 'n[0-9]*$' | sed -n 1p)")
lab_t 30 nvme error-log "$ctrl" -e 16 >"$LAB_OUT/error-log.txt" 2>&1 || true
# Capacity Exceeded is generic status 0x81 with DNR: status field (0x4081 << 1) = 0x8102.
grep -qi "0x8102\|capacity" "$LAB_OUT/error-log.txt" || lab_fail "controller error log has no Capacity Exceeded entry"
lab_t 30 dd if="$ns4" of=/dev/null bs=4k count=16 iflag=direct status=none || lab_fail "ns4 reads after ENOSPC"

# A real block device (memory-backed null_blk, 512-byte sectors) behind bdev_uring, block size
# and size taken from the device: data the host writes is on the device itself.
blk=$(lab_null_blk 1 32 512)
nvmf_rpc bdev_uring_create "$blk" Blk0 >/dev/null
nvmf_rpc bdev_get_bdevs -b Blk0 >"$LAB_OUT/blk0.json"
grep -q '"block_size": 512' "$LAB_OUT/blk0.json" || lab_fail "block size not taken from $blk"
grep -q '"num_blocks": 65536' "$LAB_OUT/blk0.json" || lab_fail "size not taken from $blk"
nvmf_rpc nvmf_subsystem_add_ns "$nqn" Blk0 -n 5 >/dev/null
lab_wait_until 30 "namespace 5 to appear" sh -c "[ \$(ls /sys/class/nvme-subsystem/*/ | grep -c '^nvme[0-9]*n[0-9]*\$') -ge 5 ]" ||
    lab_fail "namespace 5 did not appear"
ns5=$(lab_nvme_devs_by_nsid "$nqn" | tail -n1)
head -c 1048576 /dev/urandom >"$LAB_STATE/blk-pattern"
lab_t 60 dd if="$LAB_STATE/blk-pattern" of="$ns5" bs=64k oflag=direct status=none
lab_t 30 dd if="$blk" of="$LAB_STATE/blk-back" bs=64k count=16 iflag=direct status=none
cmp "$LAB_STATE/blk-pattern" "$LAB_STATE/blk-back" || lab_fail "data not on the block device $blk"
lab_log "block device $blk: geometry from the device, host data found on it"

lab_nvme_disconnect "$nqn"
nvmf_tgt_stop
lab_pass "block device namespace; full file system gives Capacity Exceeded; file durability across kill -9 and restart; injected error reached the host alone; delay ${delayed} us vs ${plain} us"
