#!/usr/bin/env bash
# hostile-rdma: a hostile RDMA host (nvmf-hostile-host, the project's raw NVMe-oF/RDMA host)
# attacks tenant A of nvmf-tgt over soft-RoCE while the Linux kernel host (nvme-rdma, fio)
# uses tenant B of the same target, on ONE reactor (-m 0x1: both share it, the worst case).
#   1. transfer timeout 20 s, connect timeout 3 s (nvmf_set_config, our extensions)
#   2. baseline: fio 4 KiB randread QD16 on B
#   3. `stall`: the hostile host submits 127 READs of 128 KiB on an I/O queue and never posts
#      a receive for their responses (their SENDs wait in RNR for ever); nvmf_get_stats shows
#      its requests waiting for data buffers; the same fio on B meanwhile keeps at least a
#      third of the baseline IOPS with no error
#   4. the transfer timeout cuts the hostile I/O queue (the tool sees the disconnect, the
#      target logs why) and pending_data_buffer goes back to 0
#   5. `no-connect`: 32 RDMA connections that never send a Fabrics Connect are all closed by
#      the target within connect timeout + margin; B's I/O works while they are open
#   6. `garbage`: 200 capsules of random bytes and random opcodes; the target lives, B's I/O
#      works during and after, `nvme list` still shows B
#   7. no hostile controller or queue is left; B's I/O still fine; clean shutdown
# Usage: tests/lab/run hostile-rdma [SEED]   (the garbage's seed; random by default, logged)
source "$(dirname "${BASH_SOURCE[0]}")/../guest-lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/../nvmf-lib.sh"
lab_init hostile-rdma

seed=${1:-$RANDOM}
tenant_a=nqn.2016-06.io.spdk:tenant-a
tenant_b=nqn.2016-06.io.spdk:tenant-b
transfer_ms=20000
connect_ms=3000
hostile=$NVMF_BIN_DIR/nvmf-hostile-host
[[ -x $hostile ]] ||
    lab_fail "nvmf-hostile-host is not built in $NVMF_BIN_DIR: run 'cargo build --workspace --release --bins' on the host"

# ---------------------------------------------------------------- helpers --

# tool_line LOG EVENT: the details of the last `[SECONDS] EVENT: details` line of LOG.
tool_line() { sed -n "s/^\[ *[0-9.]*\] $2: //p" "$1" | tail -n1; }
# tool_time LOG EVENT: when (seconds since the tool started) it printed its last EVENT line.
tool_time() { sed -n "s/^\[ *\([0-9.]*\)\] $2: .*/\1/p" "$1" | tail -n1; }
# kv DETAILS KEY: the value of KEY=VALUE in a `done` line.
kv() { awk -v k="$2=" '{for (i = 1; i <= NF; i++) if (index($i, k) == 1) {print substr($i, length(k) + 1); exit}}' <<<"$1"; }
# fcalc EXPR: floating-point arithmetic (awk), printed with two decimals.
fcalc() { awk "BEGIN {printf \"%.2f\n\", $1}"; }
# fcheck EXPR: true if the awk condition holds.
fcheck() { awk "BEGIN {exit !($1)}"; }

# stats TAG: nvmf_get_stats into $LAB_OUT/stats-TAG.json; prints the queue pairs and
# pending_data_buffer summed over poll groups (and the RDMA transport of each):
# "admin=N io=N unassociated=N pending_data_buffer=N".
stats() {
    nvmf_rpc nvmf_get_stats >"$LAB_OUT/stats-$1.json"
    /usr/bin/python3 - "$LAB_OUT/stats-$1.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
groups = doc["poll_groups"]
total = lambda k: sum(g.get(k, 0) for g in groups)
pending = sum(t.get("pending_data_buffer", 0) for g in groups for t in g.get("transports", []))
print(f"admin={total('current_admin_qpairs')} io={total('current_io_qpairs')} "
      f"unassociated={total('current_unassociated_qpairs')} pending_data_buffer={pending}")
PY
}

# good_fio NAME SECS: the good host's 4 KiB randread QD16 on B for SECS seconds; fails the
# scenario on any fio error; prints the IOPS.
good_fio() {
    lab_fio "$1" --filename="$dev_b" --ioengine=libaio --direct=1 --rw=randread --bs=4k \
        --iodepth=16 --runtime="$2" --time_based >&2 || lab_fail "fio $1 on $dev_b (tenant B) failed"
    lab_fio_iops "$LAB_OUT/$1.json"
}

# wait_line LOG EVENT PID SECS: waits until the tool (PID, writing LOG) has printed an EVENT
# line; fails the scenario, showing the tool's output, if it exits or SECS pass first.
wait_line() {
    local deadline=$((SECONDS + $4))
    until grep -q "\] $2: " "$1"; do
        if ! kill -0 "$3" 2>/dev/null; then
            grep -q "\] $2: " "$1" && return 0
            cat "$1" >&2
            lab_fail "$(basename "$1" .log) exited before its '$2' line"
        fi
        if ((SECONDS >= deadline)); then
            cat "$1" >&2
            lab_fail "$(basename "$1" .log): no '$2' line within $4 s"
        fi
        sleep 0.2
    done
}

# wait_exit PID SECS WHAT: waits for a background tool to end; returns its exit status.
wait_exit() {
    lab_wait_until "$2" "$3 to exit" sh -c "! kill -0 $1 2>/dev/null" || lab_fail "$3 did not exit within $2 s"
    local rc=0
    wait "$1" || rc=$?
    return "$rc"
}

target_alive() { kill -0 "$NVMF_TGT_PID" 2>/dev/null || lab_fail "nvmf-tgt died ($1); see $LAB_OUT/nvmf-tgt.log"; }

# ------------------------------------------------------------------ setup --

lab_rxe_up
nvmf_tgt_start -m 0x1
nvmf_rpc nvmf_set_config --transfer-timeout-ms "$transfer_ms" --connect-timeout-ms "$connect_ms" >/dev/null
nvmf_malloc_subsystem "$tenant_a" "$LAB_ADDR0" 4420 MallocA:64:512
nvmf_malloc_subsystem "$tenant_b" "$LAB_ADDR0" 4421 MallocB:64:512
lab_log "transfer timeout ${transfer_ms} ms, connect timeout ${connect_ms} ms; tenant A (hostile) on 4420, B (good) on 4421"

# 2. The good host and its baseline.
dev_b=$(lab_nvme_connect "$tenant_b" "$LAB_ADDR0" 4421)
lab_log "stats with the good host connected: $(stats connected)"
base_iops=$(good_fio baseline 4)
lab_log "baseline: $base_iops IOPS on $dev_b"

# ------------------------------------------------------------------ stall --

stall_log=$LAB_OUT/hostile-stall.log
stall_t0=$(lab__now)
lab_bg hostile-stall 90 "$hostile" stall --addr "$LAB_ADDR0" --port 4420 --nqn "$tenant_a" --seconds 60
stall_pid=$LAB_BG_PID
wait_line "$stall_log" submitted "$stall_pid" 60
lab_log "hostile host: $(tool_line "$stall_log" connected)"
lab_log "hostile host: $(tool_line "$stall_log" submitted)"
# fio at once: under TCG an RPC takes seconds, and the stall lasts one transfer timeout.
fio_start=$(lab__now)
stall_iops=$(good_fio during-stall 6)
fio_end=$(lab__now)
during=$(stats stall)
lab_log "stats right after fio, the hostile queue still stalled: $during"
# 127 READs of 128 KiB: the queue holds its share of the large buffers (a quarter of the pool)
# and the rest wait, parked on it; pending_data_buffer counts them.
if ! grep -q '\] io-queue-disconnected: ' "$stall_log"; then
    (($(kv "$during" pending_data_buffer) > 0)) ||
        lab_fail "no request of the hostile queue waits for a data buffer: is it stalling? ($during)"
fi
# The transfer timeout (20 s) may cut the hostile queue before fio is done under a slow TCG
# boot: then only part of the run saw the stall. Half of it at least, or the check is void.
submitted_at=$(fcalc "$stall_t0 + $(tool_time "$stall_log" submitted)")
if grep -q '\] io-queue-disconnected: ' "$stall_log"; then
    cut_at=$(fcalc "$stall_t0 + $(tool_time "$stall_log" io-queue-disconnected)")
else
    cut_at=$fio_end
fi
covered=$(fcalc "(($cut_at < $fio_end ? $cut_at : $fio_end) - $fio_start) / ($fio_end - $fio_start)")
lab_log "fio ran ${fio_start}..${fio_end} s; READs submitted at $submitted_at s, stall until ${cut_at} s: ${covered} of the run under the stall"
fcheck "$covered >= 0.5" ||
    lab_fail "the stall covered only $covered of the good host's fio run (the guest is too slow for an ${transfer_ms} ms transfer timeout)"
# Soft-RoCE under TCG is noisy (the two runs can differ by 2x with nothing else going on, and
# the 2 vCPUs also carry rxe's softirq work for the hostile queue), so the bound is loose: a
# third of the baseline. What it must catch is starvation, which looks nothing like noise:
# the good host's commands waiting behind the hostile host's pinned buffers collapse its IOPS
# to near zero, or its I/O times out and fio fails.
((stall_iops * 3 >= base_iops)) ||
    lab_fail "the good host starved while the hostile host stalled: $stall_iops IOPS vs $base_iops baseline"
lab_log "good host during the stall: $stall_iops IOPS (baseline $base_iops)"

# ---------------------------------------------------------------- recovery --

# Within 45 s of the end of fio: the tool reports the cut (and exits 2 s later).
wait_line "$stall_log" io-queue-disconnected "$stall_pid" 45
lab_log "hostile host: $(tool_line "$stall_log" io-queue-disconnected)"
lab_wait_until 10 "the target's log line for the cut" \
    grep -q "host completed no transfer within the transfer timeout; closing qpair" "$LAB_OUT/nvmf-tgt.log" ||
    lab_fail "the hostile I/O queue went down, but not by the transfer timeout (nvmf-tgt.log has no such line)"
wait_exit "$stall_pid" 30 "nvmf-hostile-host stall" || lab_fail "nvmf-hostile-host stall failed: $(tail -n3 "$stall_log")"
stall_done=$(tool_line "$stall_log" done)
lab_log "hostile host: done: $stall_done"
[[ $(kv "$stall_done" io_responses) == 0 ]] ||
    lab_fail "the hostile host received responses without posting receives: $stall_done"
cut_after=$(kv "$stall_done" io_queue_cut_after)
cut_after=${cut_after%s}
fcheck "$cut_after >= $transfer_ms / 1000 - 0.5 && $cut_after <= $transfer_ms / 1000 + 15" ||
    lab_fail "the hostile I/O queue was cut after $cut_after s, not by an ${transfer_ms} ms transfer timeout"
# Its admin queue shares the reactor with the stalled queue: one Keep Alive a second, every
# one answered at least until the cut (the controller may or may not outlive its I/O queue).
ka=$(kv "$stall_done" keep_alives)
fcheck "${ka%/*} > 0 && ${ka%/*} >= int($cut_after) - 2" ||
    lab_fail "the hostile host's admin queue was not served while its I/O queue stalled (keep-alives answered/sent $ka in ${cut_after} s)"
lab_log "hostile admin queue: keep-alives answered/sent $ka, cut by the target: $(kv "$stall_done" admin_queue_cut)"
# The hostile host has gone (its admin queue too): nothing of it may be left.
drained() { [[ $(kv "$(stats drained)" pending_data_buffer) == 0 ]]; }
lab_wait_until 15 "pending_data_buffer back to 0" drained ||
    lab_fail "requests still wait for data buffers after the hostile queue was cut: $(stats drained)"
target_alive "after the stall"
after=$(stats after-stall)
lab_log "stats after the cut: $after"
(($(kv "$after" unassociated) == 0)) || lab_fail "queue pairs with no controller left: $after"

# -------------------------------------------------------------- no-connect --

nc_log=$LAB_OUT/hostile-no-connect.log
lab_bg hostile-no-connect 90 "$hostile" no-connect --addr "$LAB_ADDR0" --port 4420 --nqn "$tenant_a" \
    --count 32 --seconds 30
nc_pid=$LAB_BG_PID
wait_line "$nc_log" connected "$nc_pid" 60
lab_log "hostile host: $(tool_line "$nc_log" connected)"
lab_log "stats with the unconnected queues open: $(stats no-connect)"
nc_iops=$(good_fio during-no-connect 2)
lab_log "good host while they were open: $nc_iops IOPS"
wait_exit "$nc_pid" 60 "nvmf-hostile-host no-connect" ||
    lab_fail "nvmf-hostile-host no-connect failed: $(tail -n3 "$nc_log")"
nc_done=$(tool_line "$nc_log" done)
lab_log "hostile host: done: $nc_done"
accepted=$(kv "$nc_done" accepted)
((accepted > 0)) || lab_fail "the target accepted none of the 32 connections: $nc_done"
[[ $(kv "$nc_done" disconnected) == "$accepted" && $(kv "$nc_done" open) == 0 ]] ||
    lab_fail "the target left connections without a Connect open: $nc_done"
# Margin over the connect timeout: the target looks every 10 ms, but the disconnect crosses
# rxe and RDMA CM under emulation, and the tool notices while it is still connecting others.
last=$(kv "$nc_done" last)
fcheck "${last%s} <= $connect_ms / 1000 + 4" ||
    lab_fail "a connection without a Connect lived ${last%s} s (connect timeout $connect_ms ms)"
target_alive "after the connections without Connect"
after=$(stats after-no-connect)
lab_log "stats after: $after"
(($(kv "$after" unassociated) == 0)) || lab_fail "unconnected queue pairs left: $after"

# ----------------------------------------------------------------- garbage --

gb_log=$LAB_OUT/hostile-garbage.log
lab_bg hostile-garbage 200 "$hostile" garbage --addr "$LAB_ADDR0" --port 4420 --nqn "$tenant_a" \
    --count 200 --seed "$seed" --seconds 150
gb_pid=$LAB_BG_PID
gb_iops=$(good_fio during-garbage 3)
lab_log "good host while the garbage was sent: $gb_iops IOPS"
wait_exit "$gb_pid" 200 "nvmf-hostile-host garbage" ||
    lab_fail "nvmf-hostile-host garbage failed: $(tail -n3 "$gb_log")"
gb_done=$(tool_line "$gb_log" done)
lab_log "hostile host (seed $seed): done: $gb_done"
# Every capsule went out: the target kept accepting the host that kept sending it garbage.
[[ $(kv "$gb_done" sent) == 200 ]] ||
    lab_fail "the garbage run stopped early (target refusing connections, or too slow): $gb_done"
target_alive "after the garbage (seed $seed)"
lab_t 30 nvme list >"$LAB_OUT/nvme-list.txt" 2>&1 || lab_fail "nvme list failed"
grep -q "$dev_b" "$LAB_OUT/nvme-list.txt" || lab_fail "nvme list no longer shows $dev_b (tenant B)"

# ------------------------------------------------------------------- final --

controllers_a() { nvmf_rpc nvmf_subsystem_get_controllers "$tenant_a" | grep -c '"cntlid"' || true; }
no_controllers_a() { [[ $(controllers_a) == 0 ]]; }
lab_wait_until 15 "tenant A's hostile controllers to go" no_controllers_a ||
    lab_fail "tenant A still has $(controllers_a) controllers after the hostile host left"
final=$(stats final)
lab_log "stats at the end: $final"
[[ $(kv "$final" unassociated) == 0 && $(kv "$final" pending_data_buffer) == 0 ]] ||
    lab_fail "the hostile host left resources behind: $final"
final_iops=$(good_fio final 2)
target_alive "at the end"
lab_log "good host at the end: $final_iops IOPS"
lab_t 60 nvme disconnect-all >&2
nvmf_tgt_stop
lab_pass "one reactor, hostile host on tenant A: stalled I/O queue (127 x 128 KiB READs, no receives) cut by the ${transfer_ms} ms transfer timeout after ${cut_after} s, buffers back; good host on B at $stall_iops IOPS during the stall (baseline $base_iops); $accepted connections without Connect closed (last after ${last%s} s); 200 garbage capsules (seed $seed: $(kv "$gb_done" responses) answered, $(kv "$gb_done" target_disconnects) queues closed) survived; B still at $final_iops IOPS"
