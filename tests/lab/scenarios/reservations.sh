#!/usr/bin/env bash
# reservations: persistent reservations (NVMe 2.0 base 8.19) from the Linux host with nvme-cli.
#   - our nvmf-tgt exports one RAM namespace with a ptpl_file; the host connects twice, as two
#     hosts (two host NQNs, two host IDs): native multipath may merge them into one subsystem
#     with two controllers, so every command goes to a controller's char device (/dev/nvmeX,
#     -n 1) and the path that fails is known
#   - both register (A with CPTPL=11b: persist through power loss), A acquires Write
#     Exclusive; a write from B fails with Reservation Conflict, a read from B succeeds,
#     writes from A succeed
#   - B preempts A (PRKEY = A's key): A's registration goes, B holds the reservation, now A's
#     write conflicts; resv-report from both controllers shows the same state
#   - B releases, A registers again; Get Features Reservation Persistence (83h) says 1
#   - the target is stopped and started again from its save_config output (which names the
#     ptpl_file): resv-report after reconnecting shows both registrations and PTPL back
source "$(dirname "${BASH_SOURCE[0]}")/../guest-lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/../nvmf-lib.sh"
lab_init reservations

nqn=nqn.2016-06.io.spdk:resv
host_a=nqn.2014-08.org.nvmexpress:uuid:a0a0a0a0-0000-4000-8000-00000000000a
host_b=nqn.2014-08.org.nvmexpress:uuid:b0b0b0b0-0000-4000-8000-00000000000b
id_a=${host_a##*:}
id_b=${host_b##*:}
key_a=0xa1a1
key_b=0xb2b2
ptpl_dir=$(mktemp -d /tmp/nvmf-ptpl.XXXXXX)
ptpl_file=$ptpl_dir/resv-ns1.json

lab_rxe_up
nvmf_tgt_start -m 0x1
nvmf_rpc nvmf_create_transport -t RDMA >/dev/null
nvmf_rpc bdev_malloc_create -b Malloc0 32 512 >/dev/null
nvmf_rpc nvmf_create_subsystem "$nqn" -a -s SPDK0000000000RESV -d "nvmf-rs lab" >/dev/null
nvmf_rpc nvmf_subsystem_add_ns "$nqn" Malloc0 -p "$ptpl_file" >/dev/null
# Host B comes through a second port: nvme-cli 2.3 refuses a second connection to the same
# address and subsystem ("already connected") whatever the host NQN, -D or not.
for port in 4420 4421; do
    nvmf_rpc nvmf_subsystem_add_listener "$nqn" -t rdma -f ipv4 -a "$LAB_ADDR0" -s "$port" >/dev/null
done
lab_nvme_host_up

# ctrl_for HOSTNQN: the controller character device (/dev/nvmeN) of $nqn connected as HOSTNQN.
ctrl_for() {
    local c
    for c in /sys/class/nvme/nvme*; do
        [[ -r $c/subsysnqn && -r $c/hostnqn ]] || continue
        [[ $(cat "$c/subsysnqn") == "$nqn" && $(cat "$c/hostnqn") == "$1" ]] || continue
        echo "/dev/$(basename "$c")"
        return 0
    done
    return 1
}

# connect_both: host A through port 4420, then host B through port 4421.
connect_both() {
    lab_nvme_connect "$nqn" "$LAB_ADDR0" 4420 --hostnqn="$host_a" --hostid="$id_a" >/dev/null
    lab_t 60 nvme connect -t rdma -n "$nqn" -a "$LAB_ADDR0" -s 4421 \
        --hostnqn="$host_b" --hostid="$id_b" >&2
    lab_wait_until 30 "a controller for host B" ctrl_for "$host_b"
    ctrl_a=$(ctrl_for "$host_a") || lab_fail "no controller for host A"
    ctrl_b=$(ctrl_for "$host_b") || lab_fail "no controller for host B"
    [[ $ctrl_a != "$ctrl_b" ]] || lab_fail "both hosts on one controller ($ctrl_a)"
    lab_log "host A on $ctrl_a, host B on $ctrl_b"
}

disconnect_all() {
    lab_nvme_disconnect "$nqn"
}

# report CTRL TAG: resv-report with the extended data structure, as JSON in $LAB_OUT/TAG.json.
report() {
    lab_t 30 nvme resv-report "$1" -n 1 --eds -o json >"$LAB_OUT/$2.json" ||
        lab_fail "resv-report on $1 failed"
    lab_log "resv-report $2: $(tr -d ' \n' <"$LAB_OUT/$2.json")"
}

# report_field TAG EXPR: a Python expression over the report `r` (dict) of $LAB_OUT/TAG.json.
report_field() {
    python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' \
        "$LAB_OUT/$1.json" "$2"
}

# registrants TAG: "hostid:rkey:rcsts" per registrant, sorted (hex keys, lower-case host IDs).
registrants() {
    python3 - "$LAB_OUT/$1.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
regs = r.get("regctlext") or r.get("regctl_eds") or []
out = []
for c in regs:
    hostid = str(c.get("hostid", "")).lower().replace("-", "")
    rkey = c.get("rkey", 0)
    rkey = int(rkey, 0) if isinstance(rkey, str) else int(rkey)
    out.append(f"{hostid}:{rkey:#x}:{int(c.get('rcsts', 0))}")
print(" ".join(sorted(out)))
EOF
}

# io CTRL OP: a 1-block write (opcode 01h) or read (02h) at LBA 0 through CTRL's path; prints
# "ok" or the nvme-cli error text.
io() {
    local ctrl=$1 op=$2 out=$LAB_STATE/io.out
    local args=(--opcode="$op" --namespace-id=1 --cdw10=0 --cdw11=0 --cdw12=0 --data-len=512)
    if [[ $op == 0x01 ]]; then
        args+=(--write --input-file="$LAB_STATE/block")
    else
        args+=(--read)
    fi
    if lab_t 30 nvme io-passthru "$ctrl" "${args[@]}" >"$out" 2>&1; then
        echo ok
    else
        tr '\n' ' ' <"$out"
    fi
}

expect_conflict() {
    local what=$1 got=$2
    grep -qi 'reservation.conflict' <<<"$got" || lab_fail "$what: expected Reservation Conflict, got: $got"
    lab_log "$what: Reservation Conflict"
}

expect_ok() {
    [[ $2 == ok ]] || lab_fail "$1: expected success, got: $2"
    lab_log "$1: ok"
}

head -c 512 /dev/urandom >"$LAB_STATE/block"
connect_both

# Register both; A switches PTPL on (CPTPL=11b).
lab_t 30 nvme resv-register "$ctrl_a" -n 1 --nrkey="$key_a" --rrega=0 --cptpl=3 >&2 ||
    lab_fail "register A"
lab_t 30 nvme resv-register "$ctrl_b" -n 1 --nrkey="$key_b" --rrega=0 >&2 || lab_fail "register B"
report "$ctrl_a" registered
[[ $(report_field registered 'r["regctl"]') == 2 ]] || lab_fail "two registrants expected"
[[ $(report_field registered 'r["ptpls"]') == 1 ]] || lab_fail "PTPL not on after CPTPL=11b"
[[ -s $ptpl_file ]] || lab_fail "no PTPL file at $ptpl_file"
lab_log "ptpl file: $(tr -d ' \n' <"$ptpl_file")"

# A takes Write Exclusive.
lab_t 30 nvme resv-acquire "$ctrl_a" -n 1 --crkey="$key_a" --rtype=1 --racqa=0 >&2 ||
    lab_fail "acquire by A"
expect_conflict "write from B under A's Write Exclusive" "$(io "$ctrl_b" 0x01)"
expect_ok "read from B under A's Write Exclusive" "$(io "$ctrl_b" 0x02)"
expect_ok "write from A (holder)" "$(io "$ctrl_a" 0x01)"
# A wrong key is a conflict too.
if lab_t 30 nvme resv-release "$ctrl_b" -n 1 --crkey=0x1234 --rtype=1 --rrela=0 >"$LAB_STATE/out" 2>&1; then
    lab_fail "release with a wrong key succeeded"
fi
expect_conflict "release with a wrong key" "$(tr '\n' ' ' <"$LAB_STATE/out")"

# B preempts A.
lab_t 30 nvme resv-acquire "$ctrl_b" -n 1 --crkey="$key_b" --prkey="$key_a" --rtype=1 --racqa=1 >&2 ||
    lab_fail "preempt by B"
report "$ctrl_a" preempted-from-a
report "$ctrl_b" preempted-from-b
for tag in preempted-from-a preempted-from-b; do
    [[ $(report_field "$tag" 'r["regctl"]') == 1 ]] || lab_fail "$tag: A should be unregistered"
    [[ $(report_field "$tag" 'r["rtype"]') == 1 ]] || lab_fail "$tag: Write Exclusive expected"
done
[[ $(registrants preempted-from-a) == "$(registrants preempted-from-b)" ]] ||
    lab_fail "the two controllers report different states"
[[ $(registrants preempted-from-b) == "${id_b//-/}:$key_b:1" ]] ||
    lab_fail "B should be the only registrant and the holder: $(registrants preempted-from-b)"
expect_conflict "write from A after the preempt" "$(io "$ctrl_a" 0x01)"
expect_ok "write from B (new holder)" "$(io "$ctrl_b" 0x01)"

# B releases; A registers again (PTPL is still on).
lab_t 30 nvme resv-release "$ctrl_b" -n 1 --crkey="$key_b" --rtype=1 --rrela=0 >&2 || lab_fail "release by B"
lab_t 30 nvme resv-register "$ctrl_a" -n 1 --nrkey="$key_a" --rrega=0 >&2 || lab_fail "register A again"
expect_ok "write from A after the release" "$(io "$ctrl_a" 0x01)"
lab_t 30 nvme get-feature "$ctrl_a" -n 1 -f 0x83 >"$LAB_STATE/out" 2>&1 || lab_fail "get-feature 83h"
grep -qi 'current value:[[:space:]]*0x0*1\b' "$LAB_STATE/out" ||
    lab_fail "Reservation Persistence is not 1: $(tr '\n' ' ' <"$LAB_STATE/out")"
report "$ctrl_a" before-restart
before=$(registrants before-restart)

# Restart the target from its saved config: the registrations come back from the ptpl file.
nvmf_rpc save_config >"$LAB_OUT/config.json"
grep -q "\"ptpl_file\": *\"$ptpl_file\"" "$LAB_OUT/config.json" || lab_fail "save_config lacks the ptpl_file"
disconnect_all
nvmf_tgt_stop
nvmf_tgt_start -m 0x1 -c "$LAB_OUT/config.json"
connect_both
report "$ctrl_a" after-restart-a
report "$ctrl_b" after-restart-b
[[ $(report_field after-restart-a 'r["ptpls"]') == 1 ]] || lab_fail "PTPL lost across the restart"
after=$(registrants after-restart-a)
[[ $after == "$before" && $after == "$(registrants after-restart-b)" ]] ||
    lab_fail "registrations changed across the restart: before '$before', after '$after'"
[[ $(report_field after-restart-a 'r["regctl"]') == 2 ]] || lab_fail "two registrants expected after restart"
lab_log "after restart: $after"

disconnect_all
nvmf_tgt_stop
rm -rf "$ptpl_dir"
lab_pass "register from two hosts, Write Exclusive enforced per path (B's write conflicts, its read passes), preempt by B, reports agree on both controllers, release, PTPL file written and the registrations back after a restart from save_config"
