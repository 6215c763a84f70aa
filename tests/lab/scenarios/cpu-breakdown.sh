#!/usr/bin/env bash
# cpu-breakdown: where the whole VM's CPU goes per I/O, ours against the kernel's nvmet-rdma,
# in one boot. The same fio job runs against each target (null backends, both on rxe0); around
# each run the scenario takes the exact counters the kernel keeps: whole-VM CPU split into
# user, system, softirq (where rxe runs) and irq, context switches and interrupts (/proc/stat),
# busy and softirq time by vCPU, softirqs by kind (/proc/softirqs), soft-RoCE's hardware
# counters (packets, retries, RNR NAKs), every thread's user and system time (/proc/*/task), and
# for our target its threads' voluntary and involuntary context switches and read/write
# syscalls (/proc/PID). The report gives each per I/O, so the difference between the targets
# shows where it is spent (our reactor, wake-ups, rxe, the host) rather than only how large it
# is. (perf's cpu-clock sampling is biased under TCG, which has no PMU: samples land after
# halts.)
#
# Usage: tests/lab/run cpu-breakdown [RUNTIME_SECONDS [FIO_ARGS...]]
#        (default 8 s of 4 KiB random reads at queue depth 32)
# NVMF_CPU_MODES: our idle modes to measure, each a --poll-mode value or LABEL=ARG,ARG,...
#   (default "adaptive"); one reactor on vCPU 0 unless ARGs hold -m (e.g. cpu1=--poll-mode,adaptive,-m,0x2).
# NVMF_CPU_ALT_BIN: a directory with another build's nvmf-tgt and nvmf-rpc; modes whose label
#   starts with "alt" run those (an A/B of two builds in one boot: list the modes alternating,
#   e.g. "a1=--poll-mode,adaptive alt1=--poll-mode,adaptive a2=... alt2=...").
# NVMF_CPU_FTRACE: kernel functions whose calls to count in each run, space separated (a
#   kprobe each, with a histogram of the call stacks: this kernel has no function profiler);
#   written per run to $LAB_OUT/NAME.ftrace. Probes slow what they count: a run with them is
#   for counting calls and their callers, not for its CPU time.
# NVMF_CPU_SYSCALLS=1: count every thread's system calls by number in each run (a histogram
#   on raw_syscalls:sys_enter), written to $LAB_OUT/NAME.syscalls as "calls tid comm nr".
# NVMF_CPU_SOFTIRQS=1: count the softirqs each thread was running when they ran, by kind
#   (irq:softirq_entry), written to $LAB_OUT/NAME.softirqs as "runs tid comm vec" (vec: 6 is
#   TASKLET, 3 NET_RX; ksoftirqd/N is CPU N's deferred ones).
source "$(dirname "${BASH_SOURCE[0]}")/../guest-lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/../nvmf-lib.sh"
lab_init cpu-breakdown
LAB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

runtime=${1:-8}
shift || true
fio_args=("$@")
((${#fio_args[@]})) || fio_args=(--rw=randread --bs=4k --iodepth=32)
read -r -a modes <<<"${NVMF_CPU_MODES:-adaptive}"

lab_rxe_up
# What the guest CPU mitigates on each syscall and switch (it prices user-space work under TCG).
grep -H . /sys/devices/system/cpu/vulnerabilities/* >"$LAB_OUT/cpu-vulnerabilities" 2>/dev/null || true
nbdev=$(lab_null_blk 1 1024 4096 0)
lab_kernel_target_up kernel "$nbdev" "$LAB_ADDR0" 4420
kdev=$(lab_nvme_connect "$(lab_nqn kernel)" "$LAB_ADDR0" 4420)

# snapshot FILE [PID]: the counters, with those of PID's threads when given.
snapshot() {
    {
        echo "uptime $(lab__now)"
        grep -E '^(cpu[0-9]*|ctxt|intr) ' /proc/stat | cut -d' ' -f1-12
        sed -n 's/^ *\([A-Z_]*\): *\(.*\)/softirq_\1 \2/p' /proc/softirqs
        # Soft-RoCE's own counters (packets, retries, RNR NAKs, deferred ACKs), all devices.
        local c
        for c in /sys/class/infiniband/*/ports/*/hw_counters/*; do
            [[ -r $c ]] && echo "rxe_$(basename "$c") $(cat "$c")"
        done
        # Every thread's stat line (user and system time): where the whole VM's time went, by
        # thread. One process, so the snapshot itself costs little of the window it measures.
        # (a thread may exit between the glob and its read: cat then fails, the rest is read)
        { cat /proc/[0-9]*/task/[0-9]*/stat 2>/dev/null || true; } | sed 's/^/thread_stat /'
        if [[ -n ${2:-} ]]; then
            local t
            for t in /proc/"$2"/task/*; do
                # comm may hold spaces: the fields after its closing parenthesis.
                echo "task $(tr ' ' _ <"$t/comm") $(sed 's/.*) //' "$t/stat" | cut -d' ' -f12,13)" \
                    "$(awk '/^(voluntary|nonvoluntary)_ctxt_switches/ {printf "%s ", $2}' "$t/status")"
            done
            grep -E '^sysc[rw]' /proc/"$2"/io | tr -d :
        fi
    } >"$1"
}

# A tracefs of the scenario's own: the guest's /sys/kernel/tracing may be read-only.
TRACING=
read -r -a traced <<<"${NVMF_CPU_FTRACE:-}"
if ((${#traced[@]})) || [[ -n ${NVMF_CPU_SYSCALLS:-} || -n ${NVMF_CPU_SOFTIRQS:-} ]]; then
    TRACING=$(mktemp -d /tmp/tracefs.XXXXXX)
    mount -t tracefs nodev "$TRACING"
fi
if ((${#traced[@]})); then
    probed=()
    for f in "${traced[@]}"; do
        if echo "p:lab/$f $f" >>"$TRACING/kprobe_events" 2>/dev/null; then
            probed+=("$f")
        else
            lab_log "cannot probe $f (inlined or not traceable): not counted"
        fi
    done
    traced=("${probed[@]}")
fi
SYSCALL_HIST='hist:keys=common_pid,id:vals=hitcount:sort=hitcount.descending:size=8192'
SOFTIRQ_HIST='hist:keys=common_pid,vec:vals=hitcount:sort=hitcount.descending:size=8192'
ftrace_start() {
    local f
    [[ -z ${NVMF_CPU_SYSCALLS:-} ]] ||
        echo "$SYSCALL_HIST" >"$TRACING/events/raw_syscalls/sys_enter/trigger"
    [[ -z ${NVMF_CPU_SOFTIRQS:-} ]] ||
        echo "$SOFTIRQ_HIST" >"$TRACING/events/irq/softirq_entry/trigger"
    for f in "${traced[@]}"; do
        echo 'hist:keys=stacktrace:vals=hitcount:sort=hitcount.descending:size=4096' \
            >"$TRACING/events/lab/$f/trigger"
    done
}
# per_thread_dump EVENT KEY HIST OUT: an event's per-thread histogram taken since
# ftrace_start, as "count tid comm KEY" lines in OUT ("{ common_pid: 1234, KEY: 1 } hitcount: 56"
# -> "56 1234 COMM 1"), and the histogram removed.
per_thread_dump() {
    local event=$1 key=$2 hist=$3 out=$4 count tid value
    sed -n "s/^{ common_pid: *\([0-9]*\), $key: *\([0-9]*\) *} hitcount: *\([0-9]*\).*/\3 \1 \2/p" \
        "$TRACING/events/$event/hist" |
        while read -r count tid value; do
            echo "$count $tid $(tr ' ' _ <"/proc/$tid/comm" 2>/dev/null || echo gone) $value"
        done >"$out"
    echo "!$hist" >"$TRACING/events/$event/trigger"
}
# ftrace_stop NAME: the calls counted since ftrace_start, with their stacks.
ftrace_stop() {
    local f
    [[ -z ${NVMF_CPU_SYSCALLS:-} ]] ||
        per_thread_dump raw_syscalls/sys_enter id "$SYSCALL_HIST" "$LAB_OUT/$1.syscalls"
    [[ -z ${NVMF_CPU_SOFTIRQS:-} ]] ||
        per_thread_dump irq/softirq_entry vec "$SOFTIRQ_HIST" "$LAB_OUT/$1.softirqs"
    for f in "${traced[@]}"; do
        {
            echo "=== $f"
            cat "$TRACING/events/lab/$f/hist"
        } >>"$LAB_OUT/$1.ftrace"
        echo '!hist:keys=stacktrace:vals=hitcount:sort=hitcount.descending:size=4096' \
            >"$TRACING/events/lab/$f/trigger"
    done
}

# measure NAME DEV [PID]: one fio run against DEV between two snapshots (and, for our target,
# two nvmf_get_stats and thread_get_stats: requests per send doorbell, polls, busy time).
measure() {
    local name=$1 dev=$2 pid=${3:-}
    [[ -n $pid ]] && nvmf_rpc nvmf_get_stats >"$LAB_OUT/$name.stats0"
    [[ -n $pid ]] && nvmf_rpc thread_get_stats >"$LAB_OUT/$name.threads0"
    snapshot "$LAB_OUT/$name.snap0" "$pid"
    ftrace_start
    lab_fio "$name" --filename="$dev" --ioengine=libaio --direct=1 --runtime="$runtime" \
        --time_based --size=512M "${fio_args[@]}" >/dev/null
    ftrace_stop "$name"
    snapshot "$LAB_OUT/$name.snap1" "$pid"
    [[ -n $pid ]] && nvmf_rpc nvmf_get_stats >"$LAB_OUT/$name.stats1"
    [[ -n $pid ]] && nvmf_rpc thread_get_stats >"$LAB_OUT/$name.threads1"
    return 0
}

measure kernel "$kdev"
onqn=nqn.2016-06.io.spdk:null
for spec in "${modes[@]}"; do
    mode=${spec%%=*}
    # One reactor on vCPU 0 unless the mode's own arguments place it (",-m,0x2").
    mask=(-m 0x1)
    [[ ,$spec, == *,-m,* ]] && mask=()
    bin_dir=$NVMF_BIN_DIR
    if [[ $mode == alt* ]]; then
        [[ -n ${NVMF_CPU_ALT_BIN:-} ]] || lab_fail "mode $mode needs NVMF_CPU_ALT_BIN"
        NVMF_BIN_DIR=$NVMF_CPU_ALT_BIN
    fi
    nvmf_null_target "$spec" "$onqn" "$LAB_ADDR0" 4421 "${mask[@]}"
    odev=$(lab_nvme_connect "$onqn" "$LAB_ADDR0" 4421)
    measure "$mode" "$odev" "$NVMF_TGT_PID"
    lab_nvme_disconnect "$onqn"
    nvmf_tgt_stop
    NVMF_BIN_DIR=$bin_dir
done
# The kernel once more, last: drift over the boot shows as the gap between its two runs.
measure kernel-again "$kdev"
lab_nvme_disconnect "$(lab_nqn kernel)"

/usr/bin/python3 "$LAB_DIR/cpu-breakdown.py" "$LAB_OUT" kernel "${modes[@]%%=*}" kernel-again |
    tee "$LAB_OUT/breakdown.md"
lab_pass "CPU breakdown in $LAB_OUT/breakdown.md"
