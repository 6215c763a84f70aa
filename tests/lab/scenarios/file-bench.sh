#!/usr/bin/env bash
# file-bench: a file behind a namespace (bdev_uring, O_DIRECT) against fio on the same file
# directly, in the same VM boot: sequential 128 KiB and random 4 KiB, write and read. The
# ratio is what the fabric and the target cost; under TCG + soft-RoCE the fabric dominates.
#
# Usage: tests/lab/run file-bench [RUNTIME_SECONDS]   (default 5)
source "$(dirname "${BASH_SOURCE[0]}")/../guest-lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/../nvmf-lib.sh"
lab_init file-bench

runtime=${1:-5}
jobs_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../fio/jobs" && pwd)
nqn=nqn.2016-06.io.spdk:file
lab_rxe_up
mnt=$(lab_mount_tmp_ext4 384)
file=$mnt/bench.img
lab_t 60 fallocate -l 256M "$file"

run_jobs() {
    local who=$1 target=$2 job
    for job in seq-write-128k seq-read-128k randwrite-4k-qd32 randread-4k-qd32; do
        (cd "$LAB_STATE" && FILENAME=$target ENGINE=libaio RUNTIME=$runtime \
            lab_t 120 fio --output-format=json --output="$LAB_OUT/$job-$who.json" \
            "$jobs_dir/$job.fio" >&2) || lab_fail "fio $job on $who"
    done
}

run_jobs direct "$file"
nvmf_tgt_start -m 0x1
nvmf_rpc nvmf_create_transport -t RDMA >/dev/null
nvmf_rpc bdev_uring_create "$file" File0 4096 >/dev/null
nvmf_rpc nvmf_create_subsystem "$nqn" -a -s SPDK00000000000004 >/dev/null
nvmf_rpc nvmf_subsystem_add_ns "$nqn" File0 >/dev/null
nvmf_rpc nvmf_subsystem_add_listener "$nqn" -t rdma -f ipv4 -a "$LAB_ADDR0" -s 4420 >/dev/null
dev=$(lab_nvme_connect "$nqn" "$LAB_ADDR0" 4420)
run_jobs target "$dev"
lab_nvme_disconnect "$nqn"
nvmf_tgt_stop

/usr/bin/python3 - "$LAB_OUT" "$runtime" <<'PY' | tee "$LAB_OUT/table.md"
import json, sys
out, runtime = sys.argv[1], sys.argv[2]
def load(name):
    t = open(f"{out}/{name}.json").read()
    job = json.loads(t[t.index("{"):])["jobs"][0]
    d = job["read"] if job["read"]["total_ios"] else job["write"]
    return d["iops"], d["bw"] / 1024
print(f"fio {runtime} s per job on a 256 MiB file (ext4 on a RAM disk), direct vs through nvmf-tgt (bdev_uring) over soft-RoCE")
print()
print("| job | direct IOPS | direct MiB/s | via target IOPS | via target MiB/s | ratio |")
print("|---|---:|---:|---:|---:|---:|")
for job in ["seq-write-128k", "seq-read-128k", "randwrite-4k-qd32", "randread-4k-qd32"]:
    di, db = load(f"{job}-direct")
    ti, tb = load(f"{job}-target")
    print(f"| {job} | {di:.0f} | {db:.1f} | {ti:.0f} | {tb:.1f} | {ti / di:.3f} |")
PY
lab_pass "file benchmark table in $LAB_OUT/table.md"
