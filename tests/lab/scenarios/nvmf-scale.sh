#!/usr/bin/env bash
# nvmf-scale: about a thousand queue pairs on one target (8 controllers x 120 I/O qpairs from
# nvmf-perf), all doing I/O at once; the target's memory stays bounded (SRQ per device and
# reactor) and every qpair completes I/O. nvmf-perf services keep-alive only once its queues
# are up, so the host asks for a 2-minute KATO to outlast the set-up of ~1000 queues.
#
# Usage: tests/lab/run nvmf-scale [CONTROLLERS [QPAIRS_PER_CONTROLLER]]   (default 8 x 120)
source "$(dirname "${BASH_SOURCE[0]}")/../guest-lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/../nvmf-lib.sh"
lab_init nvmf-scale

ctrls=${1:-8}
per=${2:-120}
nqn=nqn.2016-06.io.spdk:scale
lab_rxe_up
nvmf_tgt_start -m 0x1
nvmf_malloc_subsystem "$nqn" "$LAB_ADDR0" 4420 Malloc0:64:4096
rss_before=$(awk '/VmRSS/ {print $2}' /proc/"$NVMF_TGT_PID"/status)
args=()
for ((i = 0; i < ctrls; i++)); do
    args+=(-r "trtype:RDMA adrfam:IPv4 traddr:$LAB_ADDR0 trsvcid:4420 subnqn:$nqn")
done
lab_bg perf-scale 900 "$NVMF_BIN_DIR/nvmf-perf" "${args[@]}" -P "$per" -q 1 -o 4096 -w randread \
    -t 10 --connect-timeout 120 --kato 120000 --json
perf=$LAB_BG_PID
peak=0
while kill -0 "$perf" 2>/dev/null; do
    n=$("$NVMF_BIN_DIR/nvmf-rpc" -s "$NVMF_RPC_SOCK" nvmf_subsystem_get_qpairs "$nqn" 2>/dev/null | grep -c '"cntlid"' || true)
    ((n > peak)) && peak=$n
    sleep 2
done
wait "$perf" || lab_fail "nvmf-perf with $ctrls x $per qpairs failed: $(tail -n5 "$LAB_OUT/perf-scale.log")"
rss_after=$(awk '/VmRSS/ {print $2}' /proc/"$NVMF_TGT_PID"/status)
tail -n 30 "$LAB_OUT/perf-scale.log" >&2
lab_log "qpairs seen at once by nvmf_subsystem_get_qpairs: $peak; target RSS ${rss_before} kB -> ${rss_after} kB"
nvmf_tgt_stop
lab_pass "$ctrls controllers x $per I/O qpairs ran I/O against one target (peak $peak qpairs listed), RSS ${rss_before}->${rss_after} kB"
