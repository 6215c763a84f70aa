# shellcheck shell=bash
# tests/lab/guest-lib.sh: helpers for lab scenarios. Source it from a scenario
# (tests/lab/scenarios/*.sh); it runs INSIDE the guest, as root.
#
#   source "$(dirname "${BASH_SOURCE[0]}")/../guest-lib.sh"
#   lab_init my-scenario         # strict mode, traps, cleanup on exit
#   lab_rxe_up                   # veth0/veth1 + rxe0/rxe1
#   ...
#   lab_pass "what was shown"    # prints the PASS line
#
# Conventions:
# - Every command that could block is bounded by `timeout` (lab_t), so a stuck
#   kernel or tool fails the scenario instead of hanging until the host's
#   overall limit.
# - Functions that produce a value print it on stdout; all logging goes to
#   stderr (the guest entry merges both into scenario.log).
# - What a function creates is recorded in files under $LAB_STATE (not in
#   shell variables), so lab_cleanup can undo it even when the function ran in
#   a $(...) subshell.
# - Results go to $LAB_OUT (the host-visible log dir, a 9p mount). Unix sockets
#   cannot be created there (bind fails with ENXIO): use $LAB_STATE for those.

# Addresses of the two ends of the guest's private veth pair. The traffic
# never leaves the guest.
LAB_ADDR0=${LAB_ADDR0:-10.0.0.1} # veth0 / rxe0: the target side
LAB_ADDR1=${LAB_ADDR1:-10.0.0.2} # veth1 / rxe1: the host (initiator) side
LAB_PREFIX=${LAB_PREFIX:-24}
# wire: packets between rxe0 and rxe1 really cross the veth pair (policy
#       routing, see lab_rxe_up); rxe1 -> rxe0 is a two-device path.
# loopback: no policy routing; an address of the guest resolves as local, so
#       rxe sends to itself (both ends on one rxe device, as LAB.md describes).
LAB_RXE_MODE=${LAB_RXE_MODE:-wire}
# veth MTU. rxe derives its active MTU from it: 1500 -> 1024 (a 4 KiB transfer
# is 4 packets), >= 4200 or so -> 4096 (one packet).
LAB_VETH_MTU=${LAB_VETH_MTU:-1500}
# CPUs (hex mask) that handle everything veth0/veth1 receive (RPS): "last" (the default)
# for the guest's last CPU, "" to leave it to the sending CPU. A veth hands each packet
# to the backlog of the CPU that sent it, and rxe sends one QP's packets from the
# poster's context and from softirq on whichever CPU: the peer then sees PSNs out of
# order, NAKs, and the QP retransmits (rxe hw_counters out_of_seq_request /
# completer_retry_err). A real NIC keeps a flow in order; one receive CPU does the same
# here. The last CPU, because polling programs pin to the first by default (-c/-m 0x1),
# as one keeps applications off a NIC's interrupt CPU.
LAB_VETH_RPS=${LAB_VETH_RPS-last}
LAB_NQN_PREFIX=${LAB_NQN_PREFIX:-nqn.2024-01.io.nvmf-lab}
LAB_OUT=${LAB_OUT:-/tmp/lab-out}
NVMET_CFS=/sys/kernel/config/nvmet
NULLB_CFS=/sys/kernel/config/nullb

# ---------------------------------------------------------------- basics --

# Seconds since boot, for log timestamps.
lab__now() { cut -d' ' -f1 /proc/uptime; }

lab_log() { printf '[lab %7ss] %s\n' "$(lab__now)" "$*" >&2; }

# lab_t SECS CMD...: run CMD bounded by SECS seconds (SIGKILL 5 s after the
# SIGTERM if it ignores it). Returns CMD's status, 124 on timeout.
lab_t() {
    local secs=$1
    shift
    local rc=0
    timeout -k 5 "$secs" "$@" || rc=$?
    if [[ $rc == 124 || $rc == 137 ]]; then
        lab_log "TIMEOUT after ${secs}s: $*"
        return 124
    fi
    return "$rc"
}

# lab_write VALUE FILE: write to a sysfs/configfs attribute, bounded.
lab_write() {
    timeout -k 5 30 sh -c 'printf "%s\n" "$1" > "$2"' _ "$1" "$2" || {
        lab_log "write '$1' > $2 failed"
        return 1
    }
}

lab_modprobe() { lab_t 60 modprobe "$@"; }

lab_pass() {
    LAB_REPORTED=1
    echo "PASS: $LAB_NAME${1:+: $*}"
}

lab_fail() {
    LAB_REPORTED=1
    if [[ $BASHPID == "$$" ]]; then
        echo "FAIL: $LAB_NAME${1:+: $*}"
    else
        # Inside $(...) stdout is captured: say why on stderr; the scenario
        # then stops with its own FAIL line.
        echo "lab: failing: $*" >&2
    fi
    exit 1
}

# lab_init NAME: call first. Strict mode, state dir, traps.
lab_init() {
    LAB_NAME=$1
    LAB_REPORTED=0
    set -Eeuo pipefail
    # Make `set -e` apply inside $(...) too, so a failing step in a helper
    # whose output is captured stops that helper.
    shopt -s inherit_errexit
    mkdir -p "$LAB_OUT"
    LAB_STATE=$(mktemp -d /tmp/lab-state.XXXXXX)
    export LAB_STATE LAB_NAME LAB_OUT
    trap 'lab__on_err $? $LINENO "$BASH_COMMAND"' ERR
    trap lab__on_exit EXIT
    # Turn signals into a normal exit so the EXIT trap (cleanup) runs.
    trap 'exit 130' INT
    trap 'exit 143' TERM
    lab_log "scenario $LAB_NAME: kernel $(uname -r), $(nproc) vCPUs, results in $LAB_OUT"
}

lab__on_err() {
    # Only report in the scenario's main shell, not in every $(...) level.
    # (and only while errexit is on: after `set +e` a failure is expected).
    if [[ $BASHPID == "$$" && $- == *e* ]]; then
        lab_log "command failed (exit $1) at line $2: $3"
    fi
}

lab__on_exit() {
    local rc=$?
    set +eE
    trap - ERR
    lab_cleanup
    if [[ $rc != 0 && ${LAB_REPORTED:-0} != 1 ]]; then
        echo "FAIL: ${LAB_NAME:-scenario} (exit $rc)"
    fi
    exit "$rc"
}

# lab__record KIND VALUE: remember something to undo in lab_cleanup.
lab__record() { echo "$2" >>"$LAB_STATE/$1"; }

# lab_bg NAME SECS CMD...: start CMD in the background, bounded by SECS,
# output to $LAB_OUT/NAME.log. Sets LAB_BG_PID. Call it directly, not in $(...).
lab_bg() {
    local name=$1 secs=$2
    shift 2
    timeout -k 5 "$secs" "$@" >"$LAB_OUT/$name.log" 2>&1 &
    LAB_BG_PID=$!
    lab__record bgpids "$LAB_BG_PID"
    lab_log "started $name (pid $LAB_BG_PID): $*"
}

# lab_wait_until SECS DESCRIPTION CMD...: poll CMD every 0.2 s until it
# succeeds; fail after SECS.
lab_wait_until() {
    local secs=$1 what=$2
    shift 2
    local deadline=$((SECONDS + secs))
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS >= deadline)); then
            lab_log "timed out after ${secs}s waiting for $what"
            return 1
        fi
        sleep 0.2
    done
}

# ------------------------------------------------------------ soft-RoCE --

lab__rxe_active() {
    local dev
    for dev in "$@"; do
        rdma link show "$dev/1" 2>/dev/null | grep -q 'state ACTIVE' || return 1
        ibv_devices 2>/dev/null | grep -qw "$dev" || return 1
    done
}

# lab_rxe_up: veth pair veth0 (LAB_ADDR0) <-> veth1 (LAB_ADDR1), rxe0 on
# veth0, rxe1 on veth1; waits until both are ACTIVE.
lab_rxe_up() {
    lab_log "rxe up ($LAB_RXE_MODE mode, veth MTU $LAB_VETH_MTU)"
    lab__record rxe 1
    lab_t 10 ip link set lo up
    if ! ip link show veth0 >/dev/null 2>&1; then
        lab_t 10 ip link add veth0 type veth peer name veth1
    fi
    lab_t 10 ip link set veth0 mtu "$LAB_VETH_MTU"
    lab_t 10 ip link set veth1 mtu "$LAB_VETH_MTU"
    lab_t 10 ip addr replace "$LAB_ADDR0/$LAB_PREFIX" dev veth0
    lab_t 10 ip addr replace "$LAB_ADDR1/$LAB_PREFIX" dev veth1
    lab_t 10 ip link set veth0 up
    lab_t 10 ip link set veth1 up
    if [[ -n $LAB_VETH_RPS ]]; then
        local q mask=$LAB_VETH_RPS
        [[ $mask == last ]] && mask=$(printf '%x' $((1 << ($(nproc) - 1))))
        for q in /sys/class/net/veth0/queues/rx-*/rps_cpus /sys/class/net/veth1/queues/rx-*/rps_cpus; do
            echo "$mask" >"$q"
        done
        # One CPU now takes every packet: give its backlog room for bursts (a 128 KiB
        # RDMA READ response is 128 packets per QP) rather than drop and retransmit.
        lab_t 10 sysctl -qw net.core.netdev_max_backlog=16384
        lab_log "veth receive on CPU mask $mask (RPS)"
    fi

    if [[ $LAB_RXE_MODE == wire ]]; then
        # Both addresses belong to this guest, so by default the kernel
        # delivers 10.0.0.1 -> 10.0.0.2 through `lo`. rxe drops packets that
        # arrive on a netdev without an rxe device, so rxe0 -> rxe1 would
        # connect and then move no data. Make locally generated traffic to the
        # other end leave through its own veth instead:
        # - rules 10/11 (only for locally originated packets: iif lo) route
        #   to the peer's address out of the own veth, with the own source;
        # - the `local` table moves behind them (pref 100), so it still
        #   decides delivery of packets arriving on the other veth;
        # - accept_local + no rp_filter: accept packets whose source is a
        #   local address (the other end's) when they arrive on a veth.
        local i sysctls=()
        for i in all default veth0 veth1; do
            sysctls+=("net.ipv4.conf.$i.rp_filter=0" "net.ipv4.conf.$i.accept_local=1")
        done
        lab_t 10 sysctl -qw "${sysctls[@]}"
        lab_t 10 ip route replace "$LAB_ADDR1/32" dev veth0 src "$LAB_ADDR0" table 100
        lab_t 10 ip route replace "$LAB_ADDR0/32" dev veth1 src "$LAB_ADDR1" table 101
        ip rule show pref 10 | grep -q . || lab_t 10 ip rule add pref 10 iif lo to "$LAB_ADDR1" lookup 100
        ip rule show pref 11 | grep -q . || lab_t 10 ip rule add pref 11 iif lo to "$LAB_ADDR0" lookup 101
        ip rule show pref 100 | grep -q . || lab_t 10 ip rule add pref 100 lookup local
        if ip rule show pref 0 | grep -q 'lookup local'; then
            lab_t 10 ip rule del pref 0 lookup local
        fi
        lab_log "route to $LAB_ADDR0: $(ip route get "$LAB_ADDR0" | head -n1)"
    fi

    lab_modprobe rdma_rxe
    rdma link show rxe0 >/dev/null 2>&1 || lab_t 30 rdma link add rxe0 type rxe netdev veth0
    rdma link show rxe1 >/dev/null 2>&1 || lab_t 30 rdma link add rxe1 type rxe netdev veth1
    lab_wait_until 60 "rxe0/rxe1 ACTIVE" lab__rxe_active rxe0 rxe1
    lab_log "rxe0/rxe1 ACTIVE, active_mtu $(ibv_devinfo -d rxe0 | awk '/active_mtu/ {print $2}')"
}

# lab_rxe_counters: packets sent/received per rxe device so far (shows which
# devices a run used; in wire mode host->target traffic is rxe1 -> rxe0).
lab_rxe_counters() {
    local d c
    for d in /sys/class/infiniband/rxe*; do
        [[ -d $d ]] || continue
        c=$d/ports/1/hw_counters
        echo "$(basename "$d"): sent_pkts=$(cat "$c/sent_pkts" 2>/dev/null || echo ?)" \
            "rcvd_pkts=$(cat "$c/rcvd_pkts" 2>/dev/null || echo ?)" \
            "retry_exceeded=$(cat "$c/retry_exceeded_err" 2>/dev/null || echo ?)" \
            "retries=$(cat "$c/completer_retry_err" 2>/dev/null || echo ?)" \
            "out_of_seq=$(cat "$c/out_of_seq_request" 2>/dev/null || echo ?)" \
            "dup_req=$(cat "$c/duplicate_request" 2>/dev/null || echo ?)"
    done
}

lab_rxe_down() {
    local d
    for d in rxe0 rxe1; do
        if rdma link show "$d" >/dev/null 2>&1; then
            lab_t 30 rdma link delete "$d" || true
        fi
    done
    if ip rule show pref 100 | grep -q 'lookup local'; then
        ip rule show pref 0 | grep -q 'lookup local' || lab_t 10 ip rule add pref 0 lookup local || true
        lab_t 10 ip rule del pref 100 || true
    fi
    lab_t 10 ip rule del pref 10 2>/dev/null || true
    lab_t 10 ip rule del pref 11 2>/dev/null || true
    lab_t 10 ip route flush table 100 2>/dev/null || true
    lab_t 10 ip route flush table 101 2>/dev/null || true
    if ip link show veth0 >/dev/null 2>&1; then
        lab_t 10 ip link del veth0 || true
    fi
}

# lab_ib_write_bw SERVER_DEV CLIENT_DEV SERVER_ADDR [SECS] [SIZE]: run
# perftest's ib_write_bw for SECS seconds (server on SERVER_DEV in the
# background, client on CLIENT_DEV to SERVER_ADDR); prints the message rate in
# messages per second. Full output in $LAB_OUT/ib_write_bw-*.log.
lab_ib_write_bw() {
    local sdev=$1 cdev=$2 addr=$3 secs=${4:-5} size=${5:-4096}
    local port tag="$sdev-$cdev-$size"
    # A fresh TCP port per run (a counter in a file: this usually runs in $(...)).
    port=$(($(cat "$LAB_STATE/perfport" 2>/dev/null || echo 18514) + 1))
    echo "$port" >"$LAB_STATE/perfport"
    # -F: don't fail because the (virtual) CPU has no cpufreq max;
    # -D: run for SECS seconds; -p: a fresh TCP port per run for the exchange.
    lab_bg "ib_write_bw-server-$tag" $((secs + 60)) \
        ib_write_bw -d "$sdev" -s "$size" -D "$secs" -F -p "$port"
    local spid=$LAB_BG_PID
    lab_wait_until 20 "ib_write_bw server on port $port" \
        sh -c "ss -Hltn 'sport = :$port' | grep -q ."
    local out=$LAB_OUT/ib_write_bw-client-$tag.log
    lab_t $((secs + 60)) ib_write_bw -d "$cdev" -s "$size" -D "$secs" -F -p "$port" "$addr" \
        >"$out" 2>&1 || {
        cat "$out" >&2
        lab_log "ib_write_bw client failed"
        return 1
    }
    lab_t 30 tail --pid="$spid" -f /dev/null || true
    # Result row: "#bytes #iterations BW-peak BW-average MsgRate[Mpps]".
    local mpps
    mpps=$(awk -v s="$size" '$1 == s && NF >= 5 {print $5}' "$out" | tail -n1)
    [[ -n $mpps ]] || {
        cat "$out" >&2
        lab_log "no result row in ib_write_bw output"
        return 1
    }
    awk -v m="$mpps" 'BEGIN {printf "%d\n", m * 1e6}'
}

# ------------------------------------------------------ block devices --

# lab_null_blk N SIZE_MB BS [MEMORY_BACKED]: create N null_blk devices through
# configfs; prints their paths. Memory-backed by default (data written is kept,
# so verify works); MEMORY_BACKED=0 discards writes and reads zeroes, as
# bdev_null does (the benchmarks' backend).
lab_null_blk() {
    local n=$1 size_mb=$2 bs=$3 backed=${4:-1} i name dir idx devpath
    lab_modprobe null_blk nr_devices=0
    for ((i = 0; i < n; i++)); do
        # The 6.1 kernel names the disk after the configfs directory (newer
        # and older ones may use nullb<index>): take whichever appears.
        idx=0
        while [[ -e $NULLB_CFS/nullb_lab$idx || -e /dev/nullb_lab$idx ]]; do idx=$((idx + 1)); done
        name=nullb_lab$idx
        dir=$NULLB_CFS/$name
        lab_t 30 mkdir "$dir"
        lab__record nullb "$dir"
        lab_write "$size_mb" "$dir/size"
        lab_write "$bs" "$dir/blocksize"
        lab_write "$backed" "$dir/memory_backed"
        lab_write 1 "$dir/power"
        idx=$(cat "$dir/index")
        lab_wait_until 30 "null_blk disk $name" \
            sh -c "test -b /dev/$name || test -b /dev/nullb$idx"
        devpath=/dev/$name
        [[ -b $devpath ]] || devpath=/dev/nullb$idx
        lab_log "null_blk $devpath: ${size_mb} MiB, bs $bs, memory_backed=$backed"
        echo "$devpath"
    done
}

# lab_brd SIZE_MB [N]: (re)load brd with N RAM disks of SIZE_MB each; prints
# their paths (/dev/ram0...).
lab_brd() {
    local size_mb=$1 n=${2:-1} i
    if lsmod | grep -qw '^brd'; then lab_t 30 rmmod brd; fi
    lab_modprobe brd rd_nr="$n" rd_size=$((size_mb * 1024)) max_part=0
    lab__record brd 1
    for ((i = 0; i < n; i++)); do
        lab_wait_until 30 "/dev/ram$i" test -b "/dev/ram$i"
        echo "/dev/ram$i"
    done
}

# lab_mount_tmp_ext4 SIZE_MB: ext4 on a brd RAM disk, mounted under a fresh
# mktemp -d folder (the guest's /tmp is tmpfs, which has no O_DIRECT, and /mnt
# is read-only); prints the mount point. For file-backed namespaces.
lab_mount_tmp_ext4() {
    local size_mb=$1 dev mnt
    dev=$(lab_brd "$size_mb" 1)
    lab_t 120 mkfs.ext4 -q -F "$dev"
    mnt=$(mktemp -d /tmp/lab-ext4.XXXXXX)
    lab_t 30 mount -t ext4 "$dev" "$mnt"
    lab__record mounts "$mnt"
    lab_log "ext4 on $dev mounted at $mnt"
    echo "$mnt"
}

# --------------------------------------------------- kernel NVMe-oF target --

# lab_nqn NAME: the NQN the lab uses for subsystem NAME (a full NQN passes).
lab_nqn() {
    case $1 in
    nqn.*) echo "$1" ;;
    *) echo "$LAB_NQN_PREFIX:$1" ;;
    esac
}

# lab_kernel_target_up NAME BACKING_DEV ADDR PORT: kernel nvmet-rdma target:
# subsystem NAME (any host allowed), namespace 1 on BACKING_DEV (block device
# or file), listening on ADDR:PORT over RDMA.
lab_kernel_target_up() {
    local nqn addr=$3 svc=$4 dev=$2
    nqn=$(lab_nqn "$1")
    lab_modprobe nvmet
    lab_modprobe nvmet-rdma
    local sub=$NVMET_CFS/subsystems/$nqn
    lab_t 30 mkdir "$sub"
    lab_write 1 "$sub/attr_allow_any_host"
    lab_t 30 mkdir "$sub/namespaces/1"
    lab_write "$dev" "$sub/namespaces/1/device_path"
    lab_write 1 "$sub/namespaces/1/enable"

    # Reuse a port already bound to ADDR:PORT over rdma, else make a new one.
    local p port=""
    for p in "$NVMET_CFS"/ports/*; do
        [[ -d $p ]] || continue
        if [[ $(cat "$p/addr_traddr") == "$addr" && $(cat "$p/addr_trsvcid") == "$svc" &&
            $(cat "$p/addr_trtype") == rdma ]]; then
            port=$p
        fi
    done
    if [[ -z $port ]]; then
        local id=1
        while [[ -e $NVMET_CFS/ports/$id ]]; do id=$((id + 1)); done
        port=$NVMET_CFS/ports/$id
        lab_t 30 mkdir "$port"
        lab_write rdma "$port/addr_trtype"
        lab_write ipv4 "$port/addr_adrfam"
        lab_write "$addr" "$port/addr_traddr"
        lab_write "$svc" "$port/addr_trsvcid"
    fi
    # Linking the subsystem into the port enables the port: nvmet-rdma starts
    # listening here (and the link fails if it cannot).
    lab_t 30 ln -s "$sub" "$port/subsystems/$nqn"
    lab_log "kernel target: $nqn ns1=$dev on rdma $addr:$svc ($(basename "$port"))"
}

# lab_kernel_target_down: remove all nvmet configuration (ports, subsystems,
# namespaces, hosts). Everything under nvmet in this guest is the lab's.
lab_kernel_target_down() {
    [[ -d $NVMET_CFS ]] || return 0
    local p l s n h
    for p in "$NVMET_CFS"/ports/*; do
        [[ -d $p ]] || continue
        for l in "$p"/subsystems/*; do [[ -L $l ]] && timeout 30 rm -f "$l"; done
        timeout 30 rmdir "$p" || lab_log "rmdir $p failed"
    done
    for s in "$NVMET_CFS"/subsystems/*; do
        [[ -d $s ]] || continue
        for h in "$s"/allowed_hosts/*; do [[ -L $h ]] && timeout 30 rm -f "$h"; done
        for n in "$s"/namespaces/*; do
            [[ -d $n ]] || continue
            lab_write 0 "$n/enable" || true
            timeout 30 rmdir "$n" || lab_log "rmdir $n failed"
        done
        timeout 30 rmdir "$s" || lab_log "rmdir $s failed"
    done
    for h in "$NVMET_CFS"/hosts/*; do [[ -d $h ]] && timeout 30 rmdir "$h"; done
    return 0
}

# ----------------------------------------------------- NVMe-oF host side --

# lab_nvme_host_up: kernel NVMe-oF host side. nvme-cli needs the nvme-fabrics
# module (/dev/nvme-fabrics) loaded before discover/connect ("Failed to scan
# topology" otherwise) and a host NQN.
lab_nvme_host_up() {
    lab_modprobe nvme-rdma
    lab_wait_until 10 /dev/nvme-fabrics test -c /dev/nvme-fabrics
    if [[ ! -s /etc/nvme/hostnqn ]]; then
        mkdir -p /etc/nvme
        lab_t 10 nvme gen-hostnqn >/etc/nvme/hostnqn
    fi
}

# lab_nvme_discover ADDR PORT: discovery log page over RDMA, on stdout.
lab_nvme_discover() {
    lab_nvme_host_up
    lab_t 60 nvme discover -t rdma -a "$1" -s "$2"
}

# lab_nvme_dev NQN: print the usable block device(s) of the connected
# subsystem NQN. With native multipath (Debian's default) that is the head
# node /dev/nvmeXnY under the subsystem; /dev/nvmeXcYnZ are hidden per-path
# nodes and are skipped.
lab_nvme_dev() {
    local nqn=$1 s b name found=1
    for s in /sys/class/nvme-subsystem/nvme-subsys*; do
        [[ -r $s/subsysnqn && $(cat "$s/subsysnqn") == "$nqn" ]] || continue
        for b in "$s"/nvme*n* "$s"/nvme*/nvme*n*; do
            [[ -e $b ]] || continue
            name=$(basename "$b")
            [[ $name =~ ^nvme[0-9]+c[0-9]+n[0-9]+$ ]] && continue
            [[ $name =~ ^nvme[0-9]+n[0-9]+$ ]] || continue
            [[ -b /dev/$name ]] || continue
            echo "/dev/$name"
            found=0
        done
    done
    return $found
}

# lab_nvme_devs_by_nsid NQN: the namespace block devices of NQN, one a line, in NSID order
# (Linux 6.12 scans namespaces in parallel, so nvme0n1 is not always NSID 1).
lab_nvme_devs_by_nsid() {
    local d
    for d in $(lab_nvme_dev "$1"); do
        echo "$(cat "/sys/block/$(basename "$d")/nsid") $d"
    done | sort -n | cut -d' ' -f2
}

# lab_wait_nvme_dev NQN [SECS]: wait for the namespace block device of NQN to
# appear after `nvme connect`; prints it.
lab_wait_nvme_dev() {
    local nqn=$1 secs=${2:-30}
    lab_wait_until "$secs" "block device of $nqn" lab_nvme_dev "$nqn"
    lab_nvme_dev "$nqn" | sed -n 1p  # sed reads all: no SIGPIPE with several namespaces
}

# lab_nvme_connect NQN ADDR PORT [nvme-connect options...]: connect over RDMA
# and print the block device.
lab_nvme_connect() {
    local nqn=$1 addr=$2 svc=$3
    shift 3
    lab_nvme_host_up
    lab_t 60 nvme connect -t rdma -n "$nqn" -a "$addr" -s "$svc" "$@" >&2
    lab__record nvme_nqns "$nqn"
    local dev
    dev=$(lab_wait_nvme_dev "$nqn" 60)
    lab_log "connected $nqn at $addr:$svc -> $dev"
    echo "$dev"
}

# lab_nvme_disconnect NQN: disconnect and wait until the device is gone.
lab_nvme_disconnect() {
    local nqn=$1
    lab_t 60 nvme disconnect -n "$nqn" >&2
    lab_wait_until 30 "$nqn devices to go away" sh -c "! grep -qsxF '$nqn' /sys/class/nvme-subsystem/*/subsysnqn"
}

# ------------------------------------------------------------------- fio --

# lab_fio NAME FIO-ARGS...: run one fio job with JSON output to
# $LAB_OUT/NAME.json (bounded by LAB_FIO_TIMEOUT, default 300 s); prints the
# summary (lab_fio_json_iops). Fails if fio fails (e.g. a verify error).
lab_fio() {
    local name=$1
    shift
    local json=$LAB_OUT/$name.json
    lab_log "fio $name: $*"
    # Run from the state dir: verify jobs write a state file into the current
    # directory, and the guest's view of the repo is read-only.
    if ! (cd "$LAB_STATE" && lab_t "${LAB_FIO_TIMEOUT:-300}" fio --name="$name" \
        --output-format=json --output="$json" "$@" >&2); then
        lab_log "fio $name failed; output:"
        cat "$json" >&2 2>/dev/null || true
        return 1
    fi
    lab_fio_json_iops "$json"
}

# lab_fio_json_iops FILE: one line per job and direction with IOPS, bandwidth
# and completion latency (mean, p50, p99, p99.9) from fio's JSON output.
# Also fails if any job reports an error.
lab_fio_json_iops() {
    /usr/bin/python3 - "$1" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
# fio may print warnings before the JSON document.
doc = json.loads(text[text.index("{"):])
bad = 0
for job in doc["jobs"]:
    if job.get("error"):
        bad = 1
        print(f"{job['jobname']}: error {job['error']}")
    for d in ("read", "write", "trim"):
        r = job.get(d)
        if not r or r.get("total_ios", 0) == 0:
            continue
        clat = r.get("clat_ns", {})
        pct = clat.get("percentile", {})
        def us(v):
            return f"{v / 1000:.0f}us" if v is not None else "n/a"
        print(f"{job['jobname']}: {d} iops={r['iops']:.0f} bw={r['bw'] / 1024:.1f}MiB/s "
              f"lat_mean={us(clat.get('mean'))} p50={us(pct.get('50.000000'))} "
              f"p99={us(pct.get('99.000000'))} p99.9={us(pct.get('99.900000'))} "
              f"ios={r['total_ios']}")
sys.exit(bad)
PY
}

# lab_fio_iops FILE [read|write]: total IOPS (integer) over all jobs.
lab_fio_iops() {
    /usr/bin/python3 - "$1" "${2:-read}" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
doc = json.loads(text[text.index("{"):])
print(int(round(sum(j[sys.argv[2]]["iops"] for j in doc["jobs"]))))
PY
}

# ------------------------------------------------------------------- CPU --

# lab_cpu_snapshot [FILE]: per-vCPU counters from /proc/stat (plus uptime) to
# FILE or stdout. Take one before and one after a run, then lab_cpu_report.
lab_cpu_snapshot() {
    {
        echo "uptime $(lab__now)"
        grep '^cpu' /proc/stat
    } >"${1:-/dev/stdout}"
}

# lab_cpu_report BEFORE AFTER: busy % per vCPU between two snapshots, split
# into user, system, softirq (where rxe does its work) and irq.
lab_cpu_report() {
    awk '
        FNR == NR { if ($1 ~ /^cpu/) for (i = 2; i <= NF; i++) a[$1, i] = $i; next }
        $1 ~ /^cpu/ {
            tot = 0; for (i = 2; i <= NF; i++) { d[i] = $i - a[$1, i]; tot += d[i] }
            if (tot <= 0) next
            idle = d[5] + d[6]
            printf "%-5s busy=%5.1f%% user=%5.1f%% sys=%5.1f%% softirq=%5.1f%% irq=%5.1f%%\n",
                $1, 100 * (tot - idle) / tot, 100 * (d[2] + d[3]) / tot, 100 * d[4] / tot,
                100 * d[8] / tot, 100 * d[7] / tot
        }' "$1" "$2"
}

# --------------------------------------------------------------- cleanup --

# lab_cleanup: undo everything the lab set up. Idempotent, never fails, every
# step bounded. Installed as the EXIT trap by lab_init.
lab_cleanup() {
    local x
    [[ -n ${LAB_STATE:-} && -d $LAB_STATE ]] || return 0
    lab_log "cleanup"
    if [[ -f $LAB_STATE/bgpids ]]; then
        while read -r x; do kill "$x" 2>/dev/null || true; done <"$LAB_STATE/bgpids"
        sleep 0.5
        while read -r x; do kill -9 "$x" 2>/dev/null || true; done <"$LAB_STATE/bgpids"
    fi
    if [[ -f $LAB_STATE/nvme_nqns ]] || ls /sys/class/nvme-fabrics/ctl/nvme* >/dev/null 2>&1; then
        timeout -k 5 60 nvme disconnect-all >/dev/null 2>&1 || lab_log "nvme disconnect-all failed"
    fi
    lab_kernel_target_down || true
    if [[ -f $LAB_STATE/nullb ]]; then
        while read -r x; do
            [[ -d $x ]] || continue
            lab_write 0 "$x/power" || true
            timeout 30 rmdir "$x" || true
        done <"$LAB_STATE/nullb"
    fi
    if [[ -f $LAB_STATE/mounts ]]; then
        while read -r x; do
            timeout -k 5 60 umount "$x" || timeout 30 umount -l "$x" || true
            rmdir "$x" 2>/dev/null || true
        done <"$LAB_STATE/mounts"
    fi
    if [[ -f $LAB_STATE/dm ]]; then
        while read -r x; do
            [[ -e /dev/mapper/$x ]] && { timeout 30 dmsetup remove "$x" || true; }
        done <"$LAB_STATE/dm"
    fi
    if [[ -f $LAB_STATE/brd ]]; then timeout 30 rmmod brd 2>/dev/null || true; fi
    if [[ -f $LAB_STATE/rxe ]]; then lab_rxe_down || true; fi
    rm -rf "$LAB_STATE"
    LAB_STATE=
}

# lab_reset_guest: put the guest back as it booted, without $LAB_STATE: used between the
# scenarios of one boot (tests/lab/run --suite), where a scenario stopped by its time limit
# (SIGKILL) may have left processes, connections, devices or mounts behind. Never fails.
lab_reset_guest() {
    local x
    # Every program a scenario starts in the background; the scenario's shell is gone.
    # (-x matches the kernel's 15-character process name: nvmf-hostile-ho is nvmf-hostile-host.)
    for x in nvmf-tgt nvmf-perf nvmf-host nvmf-rpc nvmf-doctor nvmf-hostile-ho fio ib_write_bw \
        ib_read_bw ib_send_bw ib_write_lat dd spdk-rpc spdk_rpc.py spdk-cli; do
        pkill -KILL -x "$x" 2>/dev/null || true
    done
    pkill -KILL -f 'spdk-rpc|spdk-cli|rpc\.py' 2>/dev/null || true
    sleep 0.5
    if ls /sys/class/nvme-fabrics/ctl/nvme* >/dev/null 2>&1; then
        timeout -k 5 60 nvme disconnect-all >/dev/null 2>&1 || echo "lab-guest: reset: nvme disconnect-all failed"
    fi
    lab_kernel_target_down >/dev/null 2>&1 || true
    # Scenarios mount only below /tmp (itself virtme's overlay, left alone); newest first.
    # Not virtme's 9p shares: a repo cloned under /tmp has its results folder there, and
    # unmounting it sent every later scenario's logs into the guest's overlay.
    for x in $(awk '$2 ~ /^\/tmp\/./ && $3 != "9p" {print $2}' /proc/mounts | tac); do
        timeout -k 5 60 umount "$x" || timeout 30 umount -l "$x" || true
        rmdir "$x" 2>/dev/null || true
    done
    if command -v dmsetup >/dev/null; then
        for x in $(dmsetup ls 2>/dev/null | awk '$1 ~ /^(lab|nvmf)/ {print $1}'); do
            timeout 30 dmsetup remove --force "$x" >/dev/null 2>&1 || true
        done
    fi
    if [[ -d $NULLB_CFS ]]; then
        for x in "$NULLB_CFS"/*/; do
            [[ -d $x ]] || continue
            lab_write 0 "$x/power" 2>/dev/null || true
            timeout 30 rmdir "$x" 2>/dev/null || true
        done
    fi
    grep -q '^brd ' /proc/modules && { timeout 30 rmmod brd 2>/dev/null || true; }
    lab_rxe_down >/dev/null 2>&1 || true
    for x in $(rdma link show 2>/dev/null | awk '{print $2}' | cut -d/ -f1 | sort -u); do
        timeout 30 rdma link delete "$x" >/dev/null 2>&1 || true
    done
    for x in $(ip -o link show type veth 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1); do
        ip link show "$x" >/dev/null 2>&1 && { timeout 10 ip link del "$x" >/dev/null 2>&1 || true; }
    done
    rm -rf /tmp/lab-state.* 2>/dev/null || true
    return 0
}
