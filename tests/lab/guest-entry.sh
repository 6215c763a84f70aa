#!/usr/bin/env bash
# tests/lab/guest-entry.sh ENVFILE SCENARIO_SCRIPT [ARGS...]
# tests/lab/guest-entry.sh ENVFILE --suite LIST_FILE
#
# Runs INSIDE the guest (started by tests/lab/run through `vng --exec`), as
# root. Loads the environment the host passed, prepares the guest the same way
# for every scenario, runs the scenario with a guest-side time limit (shorter
# than the host's, so a stuck scenario still gets its logs saved), saves dmesg
# and the exit status into the log dir, and returns the scenario's status
# (vng hands it back to the host).
#
# --suite: LIST_FILE has one scenario a line, "SCRIPT<TAB>OUT_DIR<TAB>LIMIT<TAB>ARGS" (ARGS
# separated by ':'), run one after the other in this one boot, each with its own log dir,
# limit, dmesg and exit status; between two of them the guest is put back as it booted
# (lab_reset_guest). Returns 0 if all passed, else 1.
set -uo pipefail

# The whole script is one { ... } block: bash parses it completely before
# running it, so editing this file cannot disturb a run already in progress.
{

envfile=$1
shift

# shellcheck disable=SC1090
source "$envfile"
# One stream: the host shows stdout live and stores it as scenario.log.
exec 2>&1
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:${PATH:-}
cd "$LAB_REPO" || exit 1

echo "lab-guest: kernel $(uname -r), up $(cut -d' ' -f1 /proc/uptime) s at scenario start," \
    "$(nproc) vCPUs, $(awk '/MemTotal/ {print int($2/1024)}' /proc/meminfo) MiB"

# Large RDMA memory registrations need it (the default memlock limit is small).
ulimit -l unlimited
# nvmet and null_blk are configured through configfs; virtme does not mount it.
if ! mountpoint -q /sys/kernel/config; then
    timeout 30 modprobe configfs 2>/dev/null || true
    timeout 30 mount -t configfs none /sys/kernel/config || echo "lab-guest: warning: configfs mount failed"
fi

# run_one SCRIPT OUT_DIR LIMIT [ARGS...]: one scenario, its dmesg and exit status in OUT_DIR
# (and, in a suite, its own scenario.log there: the host keeps the suite's whole output).
run_one() {
    local script=$1 out=$2 limit=$3 rc
    shift 3
    mkdir -p "$out"
    # -k: SIGKILL if the scenario's cleanup itself hangs after SIGTERM.
    if [[ $suite == 1 ]]; then
        LAB_OUT=$out LAB_SCENARIO=$(basename "$script" .sh) timeout -k 30 "$limit" bash "$script" "$@" 2>&1 |
            tee "$out/scenario.log"
        rc=${PIPESTATUS[0]}
    else
        LAB_OUT=$out LAB_SCENARIO=$(basename "$script" .sh) timeout -k 30 "$limit" bash "$script" "$@"
        rc=$?
    fi
    if [[ $rc == 124 || $rc == 137 ]]; then
        echo "lab-guest: FAIL: $(basename "$script" .sh) timed out after ${limit}s (guest-side limit)"
    fi
    dmesg >"$out/dmesg.log" 2>&1 || true
    echo "$rc" >"$out/exit-status"
    return "$rc"
}

suite=0
if [[ ${1:-} != --suite ]]; then
    script=$1
    shift
    run_one "$script" "$LAB_OUT" "${LAB_GUEST_TIMEOUT:-1100}" "$@"
    exit $?
fi

# shellcheck source=tests/lab/guest-lib.sh
source "$LAB_REPO/tests/lab/guest-lib.sh"
suite=1
list=$2
all=0
first=1
while IFS=$'\t' read -r script out limit args; do
    if ((first == 0)); then
        lab_reset_guest
        dmesg -C 2>/dev/null || true
    fi
    first=0
    name=$(basename "$script" .sh)
    echo "lab-guest: suite: $name (limit ${limit}s), up $(cut -d' ' -f1 /proc/uptime) s"
    IFS=: read -r -a argv <<<"$args"
    run_one "$script" "$out" "$limit" "${argv[@]}"
    rc=$?
    echo "lab-guest: suite: $name exit $rc"
    ((rc == 0)) || all=1
done <"$list"
exit "$all"
}
