#!/usr/bin/env bash
# isolation: tenants on one target, seen from the kernel host with nvme-cli.
#   - tenant A listens on 4420 only, tenant B on 4421 only: `nvme connect` to either through
#     the other's port is refused (and the host is told the NQN is the bad parameter); each
#     port's `nvme discover` lists only its own tenant and the current discovery subsystem
#   - tenant C allows one host NQN: any other host is refused, that host gets in
#   - the leak once reproduced here: Get Features Host Identifier with SEL=011b asked 300
#     times on A's controller while another host writes a marker pattern to B: no reply may
#     carry a byte of it
source "$(dirname "${BASH_SOURCE[0]}")/../guest-lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/../nvmf-lib.sh"
lab_init isolation

tenant_a=nqn.2016-06.io.spdk:tenant-a
tenant_b=nqn.2016-06.io.spdk:tenant-b
tenant_c=nqn.2016-06.io.spdk:tenant-c
host_c=nqn.2014-08.org.nvmexpress:uuid:c0c0c0c0-0000-4000-8000-00000000000c
lab_rxe_up
nvmf_tgt_start -m 0x1
nvmf_malloc_subsystem "$tenant_a" "$LAB_ADDR0" 4420 MallocA:32:512
nvmf_malloc_subsystem "$tenant_b" "$LAB_ADDR0" 4421 MallocB:32:512
nvmf_rpc bdev_malloc_create -b MallocC 32 512 >/dev/null
nvmf_rpc nvmf_create_subsystem "$tenant_c" -s SPDK0000000000000C >/dev/null
nvmf_rpc nvmf_subsystem_add_ns "$tenant_c" MallocC >/dev/null
nvmf_rpc nvmf_subsystem_add_host "$tenant_c" "$host_c" >/dev/null
nvmf_rpc nvmf_subsystem_add_listener "$tenant_c" -t rdma -f ipv4 -a "$LAB_ADDR0" -s 4420 >/dev/null
lab_nvme_host_up

# ctrl_of NQN: the controller character device (/dev/nvmeN) of the connected subsystem NQN.
ctrl_of() {
    local s c
    for s in /sys/class/nvme-subsystem/nvme-subsys*; do
        [[ $(cat "$s/subsysnqn") == "$1" ]] || continue
        for c in "$s"/nvme*; do
            [[ $(basename "$c") =~ ^nvme[0-9]+$ ]] && { echo "/dev/$(basename "$c")"; return 0; }
        done
    done
    return 1
}

# Wrong port: refused, nothing appears.
for wrong in "$tenant_a 4421" "$tenant_b 4420"; do
    read -r nqn svc <<<"$wrong"
    if lab_t 60 nvme connect -t rdma -n "$nqn" -a "$LAB_ADDR0" -s "$svc" >"$LAB_STATE/out" 2>&1; then
        lab_fail "connect to $nqn through port $svc was accepted"
    fi
    lab_log "connect $nqn via $svc refused: $(tr '\n' ' ' <"$LAB_STATE/out")"
    ! grep -qsxF "$nqn" /sys/class/nvme-subsystem/*/subsysnqn || lab_fail "$nqn appeared through port $svc"
done

# Discovery per port.
for port_tenant in "4420 $tenant_a $tenant_b" "4421 $tenant_b $tenant_a"; do
    read -r svc mine theirs <<<"$port_tenant"
    lab_nvme_discover "$LAB_ADDR0" "$svc" >"$LAB_OUT/discover-$svc.txt"
    grep -q "subnqn: *$mine\$" "$LAB_OUT/discover-$svc.txt" || lab_fail "port $svc does not list $mine"
    ! grep -q "subnqn: *$theirs\$" "$LAB_OUT/discover-$svc.txt" || lab_fail "port $svc lists $theirs"
    grep -q "subnqn: *nqn.2014-08.org.nvmexpress.discovery\$" "$LAB_OUT/discover-$svc.txt" ||
        lab_fail "port $svc has no current discovery subsystem entry"
    ! grep -q "subnqn: *$tenant_c\$" "$LAB_OUT/discover-$svc.txt" ||
        lab_fail "port $svc lists $tenant_c to a host it does not allow"
done
lab_log "discovery: each port lists its own tenant and itself"

# Allow list.
if lab_t 60 nvme connect -t rdma -n "$tenant_c" -a "$LAB_ADDR0" -s 4420 >"$LAB_STATE/out" 2>&1; then
    lab_fail "a host not on $tenant_c's list got in"
fi
# Linux refuses one host ID under two host NQNs: each extra host NQN brings its own.
blk_c=$(lab_nvme_connect "$tenant_c" "$LAB_ADDR0" 4420 --hostnqn="$host_c" --hostid="${host_c##*:}")
lab_log "allow list: only $host_c gets $blk_c"
lab_nvme_disconnect "$tenant_c"

# The leak: another host (its own host NQN) writes a marker to tenant B while A's host asks
# for the Host Identifier with SEL=011b (answered in dword 0, no data) 300 times.
blk_a=$(lab_nvme_connect "$tenant_a" "$LAB_ADDR0" 4420)
blk_b=$(lab_nvme_connect "$tenant_b" "$LAB_ADDR0" 4421 \
    --hostnqn=nqn.2014-08.org.nvmexpress:uuid:b0b0b0b0-0000-4000-8000-00000000000b \
    --hostid=b0b0b0b0-0000-4000-8000-00000000000b)
ctrl_a=$(ctrl_of "$tenant_a") || lab_fail "no controller device for $tenant_a"
[[ -c $ctrl_a ]] || lab_fail "no controller device for $tenant_a"
# The counter itself works: Identify Controller's data holds the subsystem NQN, three of three.
lab_t 60 python3 "$LAB_REPO/tests/lab/admin-repeat.py" "$ctrl_a" 3 0x06 1 4096 \
    "$(printf tenant-a | xxd -p)" >"$LAB_STATE/replies" || lab_fail "Identify through admin-repeat failed"
grep -qx 'sent=3 failed=0 marked=3' "$LAB_STATE/replies" ||
    lab_fail "admin-repeat does not see the NQN in Identify Controller: $(cat "$LAB_STATE/replies")"
python3 -c 'import sys; sys.stdout.buffer.write(bytes([0xDE,0xAD,0xBE,0xEF]) * 262144)' >"$LAB_STATE/marker"
# One write first, so the pool's buffers already hold the marker when the questions start.
dd if="$LAB_STATE/marker" of="$blk_b" bs=128k oflag=direct status=none
(for _ in $(seq 1 200); do
    dd if="$LAB_STATE/marker" of="$blk_b" bs=128k oflag=direct status=none || exit 1
done) &
writer=$!
lab__record bgpids "$writer"
# One process sends the 300 commands 10 ms apart, while the writer runs (admin-repeat.py:
# NVME_IOCTL_ADMIN_CMD, each into a zeroed 16-byte buffer) and counts the replies holding a
# rotation of the marker.
lab_t 300 python3 "$LAB_REPO/tests/lab/admin-repeat.py" "$ctrl_a" 300 0x0a 0x381 16 deadbeef 10 \
    >"$LAB_STATE/replies" || lab_fail "Get Features SEL=3 failed: $(cat "$LAB_STATE/replies")"
kill "$writer" 2>/dev/null || true
wait "$writer" 2>/dev/null || true
read -r sent failed marked < <(sed 's/[a-z]*=//g' "$LAB_STATE/replies")
((sent == 300 && failed == 0)) || lab_fail "Get Features SEL=3: $(cat "$LAB_STATE/replies")"
((marked == 0)) || lab_fail "$marked of 300 Host Identifier replies carried another tenant's bytes"
lab_log "Host Identifier SEL=3: 300 replies, none with another tenant's bytes"
lab_nvme_disconnect "$tenant_a"
lab_nvme_disconnect "$tenant_b"
nvmf_tgt_stop
lab_pass "wrong-port connects refused both ways, discovery per port, allow list, 300 SEL=3 Host Identifier replies without another tenant's bytes"
