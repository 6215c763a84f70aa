#!/usr/bin/env bash
# demo: the main job end to end. nvmf-tgt starts from tests/lab/demo-config.json (a 256 MiB RAM
# namespace on RDMA 10.0.0.1:4420); the Linux host discovers and connects with nvme-cli; short
# fio jobs run against /dev/nvmeXnY; a result table is printed; everything is torn down.
source "$(dirname "${BASH_SOURCE[0]}")/../guest-lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/../nvmf-lib.sh"
lab_init demo

runtime=${1:-5}
nqn=nqn.2016-06.io.spdk:demo
lab_rxe_up
nvmf_tgt_start -m 0x1 -c "$(dirname "${BASH_SOURCE[0]}")/../demo-config.json"
lab_nvme_discover "$LAB_ADDR0" 4420 | tee "$LAB_OUT/discover.txt" >&2
grep -q "subnqn: *$nqn\$" "$LAB_OUT/discover.txt" || lab_fail "discovery does not list $nqn"
dev=$(lab_nvme_connect "$nqn" "$LAB_ADDR0" 4420)
lab_t 30 nvme list >&2

common=(--filename="$dev" --ioengine=libaio --direct=1 --runtime="$runtime" --time_based --ramp_time=1)
lab_fio randread-4k-qd16 "${common[@]}" --rw=randread --bs=4k --iodepth=16 >/dev/null
lab_fio randrw70-4k-qd16 "${common[@]}" --rw=randrw --rwmixread=70 --bs=4k --iodepth=16 >/dev/null
lab_fio read-128k-qd4 "${common[@]}" --rw=read --bs=128k --iodepth=4 >/dev/null
lab_fio verify-4k --filename="$dev" --ioengine=libaio --direct=1 --rw=randwrite --bs=4k --iodepth=8 --size=16M \
    --verify=crc32c --do_verify=1 --verify_fatal=1 >/dev/null || lab_fail "fio verify failed"

/usr/bin/python3 - "$LAB_OUT" <<'PY'
import json, sys
out = sys.argv[1]
print()
print(f"{'job':<20} {'dir':<6} {'IOPS':>8} {'MiB/s':>8} {'avg us':>8} {'p99 us':>8}")
for name in ["randread-4k-qd16", "randrw70-4k-qd16", "read-128k-qd4", "verify-4k"]:
    text = open(f"{out}/{name}.json").read()
    job = json.loads(text[text.index("{"):])["jobs"][0]
    for d in ("read", "write"):
        r = job[d]
        if r["total_ios"]:
            clat = r["clat_ns"]
            print(f"{name:<20} {d:<6} {r['iops']:>8.0f} {r['bw'] / 1024:>8.1f} "
                  f"{clat['mean'] / 1000:>8.0f} {clat['percentile']['99.000000'] / 1000:>8.0f}")
print()
PY
lab_nvme_disconnect "$nqn"
nvmf_tgt_stop
lab_pass "nvmf-tgt from demo-config.json; nvme discover/connect; fio read, 70/30 mix, 128k sequential, crc32c verify; torn down"
