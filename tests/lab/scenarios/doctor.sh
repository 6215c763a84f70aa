#!/usr/bin/env bash
# doctor: nvmf-doctor on a good soft-RoCE set-up (every check OK, exit 0) and on deliberately
# broken ones, each checked by the doctor's line and exit status:
#   - memlock 64 KiB: WARN as root (CAP_IPC_LOCK lifts the limit), FAIL without CAP_IPC_LOCK;
#     nvmf-tgt itself is started both ways to show the verdicts are right;
#   - no rxe link: FAIL naming `rdma link add`;
#   - listen address on a plain veth without rxe: FAIL, and nvmf-tgt's own error names the
#     doctor;
#   - veth MTU 9000 on the target's side, 1500 on the host's: WARN (exit 2).
# Every output is kept in $LAB_OUT/doctor-CASE.txt.
source "$(dirname "${BASH_SOURCE[0]}")/../guest-lib.sh"
lab_init doctor

doctor_bin=$NVMF_BIN_DIR/nvmf-doctor
[[ -x $doctor_bin ]] || lab_fail "no $doctor_bin: cargo build --workspace --release --bins"
config_dir=$(mktemp -d /tmp/doctor-config.XXXXXX)

# doctor CASE ARGS...: runs the doctor (through `env` so a caller can prefix setpriv), keeps
# its output in $LAB_OUT/doctor-CASE.txt, shows it in the log; sets DOCTOR_RC and DOCTOR_OUT.
doctor() {
    local name=$1
    shift
    DOCTOR_OUT=$LAB_OUT/doctor-$name.txt
    DOCTOR_RC=0
    lab_t 60 "$@" >"$DOCTOR_OUT" 2>&1 || DOCTOR_RC=$?
    lab_log "doctor $name: exit $DOCTOR_RC: $*"
    sed 's/^/    /' "$DOCTOR_OUT" >&2
}

# expect_line REGEX WHAT: the last doctor output has a line matching REGEX.
expect_line() {
    grep -Eq "$1" "$DOCTOR_OUT" || lab_fail "$2: no line matching /$1/ in $DOCTOR_OUT"
}

expect_rc() {
    [[ $DOCTOR_RC == "$1" ]] || lab_fail "$2: exit status $DOCTOR_RC, expected $1"
}

# tgt_config FILE ADDR: nvmf-tgt config with one RDMA listener on ADDR:4420.
tgt_config() {
    cat >"$1" <<EOF
{"subsystems": [
  {"subsystem": "bdev", "config": [
    {"method": "bdev_malloc_create", "params": {"name": "Malloc0", "num_blocks": 2048, "block_size": 4096}}]},
  {"subsystem": "nvmf", "config": [
    {"method": "nvmf_create_transport", "params": {"trtype": "RDMA"}},
    {"method": "nvmf_create_subsystem", "params": {"nqn": "nqn.2016-06.io.spdk:doctor", "allow_any_host": true}},
    {"method": "nvmf_subsystem_add_ns", "params": {"nqn": "nqn.2016-06.io.spdk:doctor", "namespace": {"bdev_name": "Malloc0"}}},
    {"method": "nvmf_subsystem_add_listener", "params": {"nqn": "nqn.2016-06.io.spdk:doctor",
      "listen_address": {"trtype": "RDMA", "adrfam": "IPv4", "traddr": "$2", "trsvcid": "4420"}}}]}]}
EOF
}

# tgt_try NAME PREFIX-CMD...: starts nvmf-tgt with $config_dir/good.json under PREFIX-CMD
# (a subshell's limits apply), waits until its reactor has registered the RDMA device or said
# it cannot, stops it; prints "ready" or "refused". Log in $LAB_OUT/nvmf-tgt-NAME.log.
tgt_try() {
    local name=$1 log=$LAB_OUT/nvmf-tgt-$1.log pid i
    shift
    "$@" "$NVMF_BIN_DIR/nvmf-tgt" -m 0x1 -r "$config_dir/$name.sock" -c "$config_dir/good.json" \
        >"$log" 2>&1 &
    pid=$!
    lab__record bgpids "$pid"
    for i in $(seq 1 300); do
        grep -q -e 'RDMA device ready' -e 'cannot prepare RDMA device resources' "$log" && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
    done
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    if grep -q 'RDMA device ready' "$log"; then echo ready; else echo refused; fi
}

# ------------------------------------------------------------------- good --
lab_rxe_up
lab_modprobe ib_uverbs
lab_modprobe rdma_ucm
lab_nvme_host_up
tgt_config "$config_dir/good.json" "$LAB_ADDR0"
doctor good "$doctor_bin" --host -c "$config_dir/good.json" --peer "$LAB_ADDR1"
expect_rc 0 "good set-up"
if grep -Eq '^(WARN|FAIL)' "$DOCTOR_OUT"; then lab_fail "good set-up: a check is not OK"; fi
expect_line "^OK +listen +$LAB_ADDR0: on veth0, RDMA port rxe0/1" "good set-up"
expect_line "^OK +gid +$LAB_ADDR0 on rxe0/1: RoCE v2 GID" "good set-up"
expect_line "^OK +mtu .*both ends at RoCE payload 1024" "good set-up"
expect_line "^OK +memlock +RLIMIT_MEMLOCK: unlimited" "good set-up"
doctor good-json "$doctor_bin" --host -a "$LAB_ADDR0" --json
expect_rc 0 "good set-up, --json"
/usr/bin/python3 -c '
import json, sys
doc = json.load(open(sys.argv[1]))
assert doc["exit_status"] == 0 and doc["summary"]["fail"] == 0, doc["summary"]
assert all(c["status"] == "OK" for c in doc["checks"])
assert any(c["check"] == "listen" for c in doc["checks"])
' "$DOCTOR_OUT" || lab_fail "good set-up: --json output"

# ---------------------------------------------------------- memlock 64 KiB --
# As root the shell keeps CAP_IPC_LOCK, with which the kernel lets registrations exceed
# RLIMIT_MEMLOCK: the doctor warns (a service user would fail) and nvmf-tgt does start.
doctor memlock-root bash -c "ulimit -l 64 && exec $doctor_bin -a $LAB_ADDR0"
expect_rc 2 "memlock 64 KiB as root"
expect_line "^WARN +memlock +RLIMIT_MEMLOCK: memlock limit 64 KiB is below .*CAP_IPC_LOCK" "memlock 64 KiB as root"
# Without CAP_IPC_LOCK (as a service user runs it): FAIL, and nvmf-tgt cannot register.
nocap=(setpriv --inh-caps=-ipc_lock --bounding-set=-ipc_lock)
doctor memlock "${nocap[@]}" bash -c "ulimit -l 64 && exec $doctor_bin -a $LAB_ADDR0"
expect_rc 1 "memlock 64 KiB without CAP_IPC_LOCK"
expect_line "^FAIL +memlock +RLIMIT_MEMLOCK: memlock limit 64 KiB is below the 48\.1 MiB.*; fix: .*ulimit -l unlimited" "memlock 64 KiB"
root_tgt=$(tgt_try memlock-root bash -c 'ulimit -l 64 && exec "$0" "$@"')
nocap_tgt=$(tgt_try memlock-nocap "${nocap[@]}" bash -c 'ulimit -l 64 && exec "$0" "$@"')
lab_log "nvmf-tgt with memlock 64 KiB: as root $root_tgt, without CAP_IPC_LOCK $nocap_tgt"
[[ $root_tgt == ready ]] || lab_fail "nvmf-tgt as root with memlock 64 KiB did not register (the doctor said it would)"
[[ $nocap_tgt == refused ]] || lab_fail "nvmf-tgt without CAP_IPC_LOCK registered under a 64 KiB limit (the doctor said FAIL)"

# ------------------------------------------------------------- no rxe link --
lab_t 30 rdma link delete rxe0
lab_t 30 rdma link delete rxe1
doctor no-rxe "$doctor_bin" -a "$LAB_ADDR0"
expect_rc 1 "no rxe link"
expect_line "^FAIL +device .*no RDMA device.*rdma link add rxe_veth0 type rxe netdev veth0" "no rxe link"
expect_line "^FAIL +listen +$LAB_ADDR0: on veth0, which has no RDMA device" "no rxe link"
lab_rxe_up

# ------------------------------------------------- address on a plain veth --
lab_t 10 ip link add veth2 type veth peer name veth3
lab_t 10 ip addr add 10.0.2.1/24 dev veth2
lab_t 10 ip link set veth2 up
lab_t 10 ip link set veth3 up
doctor plain-veth "$doctor_bin" -a 10.0.2.1
expect_rc 1 "address on a plain veth"
expect_line "^FAIL +listen +10\.0\.2\.1: on veth2, which has no RDMA device.*; fix: .*rdma link add rxe_veth2 type rxe netdev veth2.*RDMA netdev \(veth0, veth1\)" "address on a plain veth"
# nvmf-tgt refuses the listener and points to the doctor.
tgt_config "$config_dir/plain.json" 10.0.2.1
rc=0
lab_t 60 "$NVMF_BIN_DIR/nvmf-tgt" -m 0x1 -r "$config_dir/plain.sock" -c "$config_dir/plain.json" \
    >"$LAB_OUT/nvmf-tgt-plain-veth.log" 2>&1 || rc=$?
sed 's/^/    /' "$LAB_OUT/nvmf-tgt-plain-veth.log" >&2
[[ $rc != 0 ]] || lab_fail "nvmf-tgt started with a listener on a plain veth"
grep -q 'run `nvmf-doctor -a 10.0.2.1` to diagnose' "$LAB_OUT/nvmf-tgt-plain-veth.log" ||
    lab_fail "nvmf-tgt's listener error does not point to nvmf-doctor"
lab_t 10 ip link del veth2

# ------------------------------------------------------- mismatched MTUs --
# The target's veth0 at 9000 (rxe0 then runs 4096-byte payloads), the host's veth1 at 1500.
lab_t 10 ip link set veth0 mtu 9000
lab_wait_until 30 "rxe0 active_mtu 4096" sh -c "ibv_devinfo -d rxe0 | grep -q 'active_mtu:.*4096'"
doctor mtu "$doctor_bin" -a "$LAB_ADDR0" --peer "$LAB_ADDR1"
expect_rc 2 "mismatched MTUs"
expect_line "^WARN +mtu +veth0 \(rxe0/1\) peer $LAB_ADDR1: MTU mismatch: veth0 has MTU 9000 \(RoCE payload 4096, port active_mtu 4096\), the peer's veth1 has MTU 1500 \(RoCE payload 1024\).*; fix: .*ip link set dev veth1 mtu 9000" "mismatched MTUs"
if grep -q '^FAIL' "$DOCTOR_OUT"; then lab_fail "mismatched MTUs: a FAIL besides the warning"; fi
lab_t 10 ip link set veth0 mtu "$LAB_VETH_MTU"

lab_pass "good set-up all OK (exit 0, --json too); memlock 64 KiB WARN as root and FAIL without CAP_IPC_LOCK, matching nvmf-tgt ($root_tgt / $nocap_tgt); no rxe link FAIL naming rdma link add; address on a plain veth FAIL, nvmf-tgt's error names the doctor; MTU 9000 vs 1500 WARN (exit 2)"
