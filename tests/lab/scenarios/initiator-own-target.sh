#!/usr/bin/env bash
# initiator-own-target: our userspace initiator against our own nvmf-tgt over soft-RoCE:
# nvmf-host discover / identify / write+read back / smart-log / get-log, nvmf-perf randread
# and 70/30 randrw, then the bad situations: unreachable address, no listener on the port,
# wrong subsystem NQN, a host the subsystem does not allow (then allowed), the target killed
# with SIGKILL during nvmf-perf (clear error, non-zero exit, bounded time), with reconnect
# configured I/O resuming after the target is restarted with the same config, and a dropped
# link (all packets lost for 10 s) with and without reconnect.
#
# Usage: tests/lab/run initiator-own-target [RUNTIME_SECONDS]   (default 5)
source "$(dirname "${BASH_SOURCE[0]}")/../guest-lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/../nvmf-lib.sh"
lab_init initiator-own-target

runtime=${1:-5}
port=4420
ulimit -l unlimited
source "$(dirname "${BASH_SOURCE[0]}")/../initiator-lib.sh"

# expect_fail NAME MAX_SECS PATTERN CMD...: CMD must fail (not time out) within MAX_SECS
# and say PATTERN (case-insensitive, extended regex) on stderr/stdout.
expect_fail() {
    local name=$1 max=$2 pat=$3 rc=0 t0=$SECONDS
    shift 3
    lab_t $((max + 30)) "$@" >"$LAB_OUT/bad-$name.log" 2>&1 || rc=$?
    local took=$((SECONDS - t0))
    sed "s/^/    [$name] /" "$LAB_OUT/bad-$name.log" >&2
    ((rc != 0)) || lab_fail "$name: the command succeeded"
    ((rc != 124)) || lab_fail "$name: the command hung (killed after $((max + 30)) s)"
    ((took <= max)) || lab_fail "$name: took ${took}s, more than ${max}s"
    grep -Eiq "$pat" "$LAB_OUT/bad-$name.log" || lab_fail "$name: no message matching /$pat/"
    echo "bad situation $name: exit $rc after ${took}s: $(grep -Ei "$pat" "$LAB_OUT/bad-$name.log" | head -n1)"
}

# finish_reconnect_run NAME WHAT LABEL: waits for the nvmf-perf started with lab_bg NAME (pid
# in perf_pid); it must exit 0 having reconnected. Prints and records its JSON summary.
finish_reconnect_run() {
    local name=$1 what=$2 label=$3 rc=0 line
    wait "$perf_pid" || rc=$?
    cat "$LAB_OUT/$name.log" >&2
    ((rc == 0)) || lab_fail "nvmf-perf with reconnect ($what): exit $rc"
    grep -q 'reconnected' "$LAB_OUT/$name.log" || lab_fail "nvmf-perf did not reconnect ($what)"
    sed -n '/^{/,$p' "$LAB_OUT/$name.log" >"$LAB_OUT/$name.json"
    line=$(perf_summary "$LAB_OUT/$name.json")
    echo "bad situation $what: nvmf-perf reconnected and finished: $line"
    summary+=("$label: $line")
}

lab_rxe_up
nvmf_tgt_start -m 0x1
nqn=nqn.2016-06.io.spdk:cnode1
nvmf_malloc_subsystem "$nqn" "$LAB_ADDR0" "$port" Malloc0:128:4096
# A second subsystem that allows only listed hosts.
nqn2=nqn.2016-06.io.spdk:cnode2
nvmf_rpc nvmf_create_subsystem "$nqn2" -s SPDK00000000000002 -d "nvmf-rs lab closed" >/dev/null
nvmf_rpc bdev_malloc_create -b Malloc1 16 4096 >/dev/null
nvmf_rpc nvmf_subsystem_add_ns "$nqn2" Malloc1 >/dev/null
nvmf_rpc nvmf_subsystem_add_listener "$nqn2" -t rdma -f ipv4 -a "$LAB_ADDR0" -s "$port" >/dev/null
nvmf_rpc save_config >"$LAB_STATE/tgt.json"

base="trtype:RDMA adrfam:IPv4 traddr:$LAB_ADDR0 trsvcid:$port"
r="$base subnqn:$nqn"
summary=()

# ---- the good path
lab_t 60 "$HOST" discover -r "$base" | tee "$LAB_OUT/discover.txt" >&2 || lab_fail "nvmf-host discover failed"
grep -q "subnqn: *$nqn\$" "$LAB_OUT/discover.txt" || lab_fail "discovery does not list $nqn"
# cnode2 is not listed: a discovery controller only shows subsystems the host may use.
lab_t 60 "$HOST" identify -r "$r" ctrl | tee "$LAB_OUT/id-ctrl.txt" >&2 || lab_fail "identify ctrl failed"
grep -q "^subnqn *: *$nqn" "$LAB_OUT/id-ctrl.txt" || lab_fail "identify ctrl: no subnqn $nqn"
lab_t 60 "$HOST" identify -r "$r" ns -n 1 | tee "$LAB_OUT/id-ns.txt" >&2 || lab_fail "identify ns failed"
grep -q "^nsze *: *0x8000" "$LAB_OUT/id-ns.txt" || lab_fail "identify ns: nsze is not 0x8000 (128 MiB of 4 KiB)"
head -c $((4 << 20)) /dev/urandom >"$LAB_STATE/pattern"
lab_t 60 "$HOST" write -r "$r" -n 1 -s 1000 -c 1024 -f "$LAB_STATE/pattern" >&2 || lab_fail "nvmf-host write failed"
lab_t 60 "$HOST" read -r "$r" -n 1 -s 1000 -c 1024 -f "$LAB_STATE/back" >&2 || lab_fail "nvmf-host read failed"
cmp "$LAB_STATE/pattern" "$LAB_STATE/back" || lab_fail "data read back differs"
# Small writes travel in the capsule (4 KiB fits our target's default in-capsule size):
# an unaligned single block round trip too.
head -c 4096 /dev/urandom >"$LAB_STATE/one"
lab_t 60 "$HOST" write -r "$r" -n 1 -s 7 -c 1 -f "$LAB_STATE/one" >&2 || lab_fail "1-block write failed"
lab_t 60 "$HOST" read -r "$r" -n 1 -s 7 -c 1 -f "$LAB_STATE/one-back" >&2 || lab_fail "1-block read failed"
cmp "$LAB_STATE/one" "$LAB_STATE/one-back" || lab_fail "1-block read back differs"
lab_t 30 "$HOST" smart-log -r "$r" >&2 || lab_fail "smart-log failed"
lab_t 30 "$HOST" get-log -r "$r" -i 2 -l 512 >"$LAB_OUT/get-log-2.txt" || lab_fail "get-log failed"
grep -q '^0000:' "$LAB_OUT/get-log-2.txt" || lab_fail "get-log printed no hex dump"
expect_fail out-of-range 30 'outside namespace' "$HOST" read -r "$r" -n 1 -s 32760 -c 16 -f "$LAB_STATE/x"

for job in "randread -q 32" "randrw -M 70 -q 32"; do
    tag=${job%% *}
    # shellcheck disable=SC2086
    lab_t $((runtime + 60)) "$PERF" -r "$r" -c 0x2 -o 4096 -w $job -t "$runtime" --json --memory-windows on \
        >"$LAB_OUT/perf-$tag.json" 2>"$LAB_OUT/perf-$tag.err" ||
        { cat "$LAB_OUT/perf-$tag.err" >&2; lab_fail "nvmf-perf $job failed"; }
    perf_check_keys "$LAB_OUT/perf-$tag.json" local
    line=$(perf_summary "$LAB_OUT/perf-$tag.json")
    echo "nvmf-perf own target 4k $tag qd32 ${runtime}s: $line"
    summary+=("nvmf-perf $tag: $line")
done
# The human-readable report, once.
lab_t 60 "$PERF" -r "$r" -c 0x2 -o 4096 -w randread -q 8 -P 2 -t 2 >&2 || lab_fail "nvmf-perf -P 2 failed"
# Commands that came before the completion freeing their slot waited for one (soft-RoCE
# does not order them); none of them cost a queue.
waited=$(nvmf_rpc nvmf_get_stats | /usr/bin/python3 -c '
import json, sys
stats = json.load(sys.stdin)
print(sum(d.get("pending_free_request", 0) for g in stats["poll_groups"]
          for t in g.get("transports", []) for d in t.get("devices", [])))')
echo "commands that waited for a free request slot so far: $waited"
summary+=("commands that waited for a free request slot: $waited")

run_host_test "$nqn" "$port" own on local

# A namespace added while nvmf-perf runs: the AER surfaces as a namespace change event.
lab_bg perf-aer 120 "$PERF" -r "$r" -c 0x2 -o 4096 -w randread -q 8 -t 30
perf_pid=$LAB_BG_PID
lab_wait_until 60 "nvmf-perf to start its workers" grep -q 'Launching workers' "$LAB_OUT/perf-aer.log"
nvmf_rpc bdev_malloc_create -b Malloc2 16 4096 >/dev/null
nvmf_rpc nvmf_subsystem_add_ns "$nqn" Malloc2 >/dev/null
lab_wait_until 20 "the namespace change event" grep -q 'NamespaceChanged' "$LAB_OUT/perf-aer.log" || true
kill -0 "$perf_pid" || { cat "$LAB_OUT/perf-aer.log" >&2; lab_fail "nvmf-perf ended before the event could arrive"; }
kill -INT "$perf_pid"
rc=0
wait "$perf_pid" || rc=$?
((rc == 0)) || { cat "$LAB_OUT/perf-aer.log" >&2; lab_fail "nvmf-perf during a namespace add: exit $rc"; }
grep -q 'NamespaceChanged { nsids: \[2\] }' "$LAB_OUT/perf-aer.log" ||
    { cat "$LAB_OUT/perf-aer.log" >&2; lab_fail "no namespace change event for NSID 2"; }
echo "async event: $(grep -o 'NamespaceChanged.*' "$LAB_OUT/perf-aer.log" | head -n1)"

# ---- bad situations
expect_fail unreachable 20 'unreachable' \
    "$HOST" --connect-timeout 3 identify -r "trtype:RDMA adrfam:IPv4 traddr:10.0.0.99 trsvcid:$port subnqn:$nqn" ctrl
expect_fail unreachable-perf 20 'unreachable' \
    "$PERF" --connect-timeout 3 -r "trtype:RDMA adrfam:IPv4 traddr:10.0.0.99 trsvcid:$port subnqn:$nqn" -w randread -t 2
expect_fail no-listener 20 'refused|rejected' \
    "$HOST" identify -r "trtype:RDMA adrfam:IPv4 traddr:$LAB_ADDR0 trsvcid:4999 subnqn:$nqn" ctrl
expect_fail wrong-nqn 20 'subsystem' \
    "$PERF" -r "$base subnqn:nqn.2016-06.io.spdk:nosuch" -w randread -t 2
stranger=nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555
expect_fail host-not-allowed 20 'not allowed' \
    "$HOST" --hostnqn "$stranger" identify -r "$base subnqn:$nqn2" ctrl
nvmf_rpc nvmf_subsystem_add_host "$nqn2" "$stranger" >/dev/null
lab_t 60 "$HOST" --hostnqn "$stranger" identify -r "$base subnqn:$nqn2" ctrl >/dev/null ||
    lab_fail "the host is still refused after nvmf_subsystem_add_host"
echo "bad situation host-allowed-after-add_host: OK"

# Target killed mid-run, no reconnect: a clear error and a non-zero exit, well before the
# run time (20 s) would have ended it; bounded by the I/O timeout (5 s) plus slack.
lab_bg perf-killed 120 "$PERF" -r "$r" -c 0x2 -o 4096 -w randrw -M 70 -q 32 -t 20 --io-timeout 5
perf_pid=$LAB_BG_PID
# Kill it while I/O runs, not during the connection set-up.
lab_wait_until 60 "nvmf-perf to start its workers" grep -q 'Launching workers' "$LAB_OUT/perf-killed.log"
sleep 3
kill -0 "$perf_pid" || { cat "$LAB_OUT/perf-killed.log" >&2; lab_fail "nvmf-perf ended before the target was killed"; }
kill -9 "$NVMF_TGT_PID"
t0=$SECONDS
rc=0
wait "$perf_pid" || rc=$?
took=$((SECONDS - t0))
cat "$LAB_OUT/perf-killed.log" >&2
((rc != 0 && rc != 124)) || lab_fail "nvmf-perf after the target was killed: exit $rc"
((took <= 15)) || lab_fail "nvmf-perf took ${took}s to notice the target was killed"
grep -Eiq 'error' "$LAB_OUT/perf-killed.log" || lab_fail "nvmf-perf printed no error after the kill"
echo "bad situation target-killed: nvmf-perf exit $rc ${took}s after SIGKILL: $(grep -Ei 'error' "$LAB_OUT/perf-killed.log" | head -n1)"
NVMF_TGT_PID=

# Target killed, then restarted with the same config, with reconnect configured: I/O
# resumes and the run ends cleanly (every I/O completed, none failed).
nvmf_tgt_start -m 0x1 -c "$LAB_STATE/tgt.json"
lab_bg perf-reconnect 180 "$PERF" -r "$r" -c 0x2 -o 4096 -w randread -q 32 -t 25 --io-timeout 5 \
    --reconnect-delay 1 --ctrl-loss-tmo 60 --json
perf_pid=$LAB_BG_PID
lab_wait_until 60 "nvmf-perf to start its workers" grep -q 'Launching workers' "$LAB_OUT/perf-reconnect.log"
sleep 3
kill -9 "$NVMF_TGT_PID"
NVMF_TGT_PID=
sleep 3
nvmf_tgt_start -m 0x1 -c "$LAB_STATE/tgt.json"
finish_reconnect_run perf-reconnect target-restarted "reconnect run"

# Link dropped: every packet on the veth pair lost (netem), the links stay up. With
# reconnect: the I/O timeout / keep-alive notice, the association is rebuilt once packets
# flow again, timed-out commands are retried, the run ends cleanly.
lab_modprobe sch_netem
link_drop() {
    lab_t 10 tc qdisc replace dev veth1 root netem loss 100%
    lab_t 10 tc qdisc replace dev veth0 root netem loss 100%
}
link_restore() {
    lab_t 10 tc qdisc del dev veth1 root 2>/dev/null || true
    lab_t 10 tc qdisc del dev veth0 root 2>/dev/null || true
}
lab_bg perf-linkdrop 180 "$PERF" -r "$r" -c 0x2 -o 4096 -w randread -q 32 -t 30 --io-timeout 5 \
    --kato 4 --reconnect-delay 1 --ctrl-loss-tmo 60 --json
perf_pid=$LAB_BG_PID
lab_wait_until 60 "nvmf-perf to start its workers" grep -q 'Launching workers' "$LAB_OUT/perf-linkdrop.log"
sleep 3
link_drop
sleep 10
link_restore
finish_reconnect_run perf-linkdrop "link-dropped (reconnect)" "link dropped 10 s, reconnect"

# Link dropped without reconnect: a clear error and a non-zero exit within the I/O timeout
# (5 s) plus slack.
lab_bg perf-linkdrop-fail 120 "$PERF" -r "$r" -c 0x2 -o 4096 -w randread -q 32 -t 30 --io-timeout 5 --kato 4
perf_pid=$LAB_BG_PID
lab_wait_until 60 "nvmf-perf to start its workers" grep -q 'Launching workers' "$LAB_OUT/perf-linkdrop-fail.log"
sleep 3
link_drop
t0=$SECONDS
rc=0
wait "$perf_pid" || rc=$?
took=$((SECONDS - t0))
link_restore
cat "$LAB_OUT/perf-linkdrop-fail.log" >&2
((rc != 0 && rc != 124)) || lab_fail "nvmf-perf across a dropped link without reconnect: exit $rc"
((took <= 20)) || lab_fail "nvmf-perf took ${took}s to give up on a dropped link"
echo "bad situation link-dropped (no reconnect): nvmf-perf exit $rc ${took}s after the drop: $(grep -Ei 'error' "$LAB_OUT/perf-linkdrop-fail.log" | head -n1)"

nvmf_tgt_stop
printf '%s\n' "${summary[@]}" | tee "$LAB_OUT/summary.txt"
lab_pass "good path (discover, identify, write+read back, logs, perf) and bad situations (unreachable, no listener, wrong NQN, host not allowed, target killed, reconnect after restart, link dropped)"
