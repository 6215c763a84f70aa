#!/usr/bin/env bash
# tests/lab/guest-entry.sh ENVFILE SCENARIO_SCRIPT [ARGS...]
#
# Runs INSIDE the guest (started by tests/lab/run through `vng --exec`), as
# root. Loads the environment the host passed, prepares the guest the same way
# for every scenario, runs the scenario with a guest-side time limit (shorter
# than the host's, so a stuck scenario still gets its logs saved), saves dmesg
# and the exit status into the log dir, and returns the scenario's status
# (vng hands it back to the host).
set -uo pipefail

# The whole script is one { ... } block: bash parses it completely before
# running it, so editing this file cannot disturb a run already in progress.
{

envfile=$1
script=$2
shift 2

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

guest_timeout=${LAB_GUEST_TIMEOUT:-1100}
# -k: SIGKILL if the scenario's cleanup itself hangs after SIGTERM.
timeout -k 30 "$guest_timeout" bash "$script" "$@"
rc=$?
if [[ $rc == 124 || $rc == 137 ]]; then
    echo "lab-guest: FAIL: $(basename "$script" .sh) timed out after ${guest_timeout}s (guest-side limit)"
fi

dmesg >"$LAB_OUT/dmesg.log" 2>&1 || true
echo "$rc" >"$LAB_OUT/exit-status"
exit "$rc"
}
