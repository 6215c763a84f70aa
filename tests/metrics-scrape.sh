#!/usr/bin/env bash
# Checks nvmf-tgt's Prometheus endpoint against Prometheus itself, on this machine (no VM, no
# RDMA: a RAM namespace and the metrics need neither): Debian's `promtool check metrics` lints
# the exposition, and a real Prometheus server scrapes it and answers queries over it.
# Usage: tests/metrics-scrape.sh [BIN_DIR]   (default build/release; installs prometheus, curl)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-$repo/build/release}
log() { printf 'metrics-scrape: %s\n' "$*"; }
fail() { log "FAIL: $*"; exit 1; }

missing=()
for p in prometheus curl; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

work=$(mktemp -d /tmp/nvmf-metrics.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
mport=$(free_port)
pport=$(free_port)
sock=$work/spdk.sock
nqn=nqn.2016-06.io.spdk:metrics

"$bin/nvmf-tgt" -m 0x1 -r "$sock" --metrics-listen "$mport" >"$work/nvmf-tgt.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [[ -S $sock ]] && break; sleep 0.1; done
[[ -S $sock ]] || { cat "$work/nvmf-tgt.log"; fail "nvmf-tgt did not start"; }
rpc() { "$bin/nvmf-rpc" -s "$sock" "$@" >/dev/null; }
rpc bdev_malloc_create -b Malloc0 16 512
rpc nvmf_create_subsystem "$nqn" -a -s SPDK00000000000099
rpc nvmf_subsystem_add_ns "$nqn" Malloc0

curl -fsS "http://127.0.0.1:$mport/metrics" >"$work/metrics.txt" || fail "no answer at /metrics"
promtool check metrics <"$work/metrics.txt" || fail "promtool check metrics found problems"
grep -q "^nvmf_subsystem_namespaces{nqn=\"$nqn\"} 1$" "$work/metrics.txt" ||
    fail "the subsystem's namespace is not in the metrics"
log "promtool check metrics: clean ($(grep -c '^nvmf_' "$work/metrics.txt") samples)"

cat >"$work/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: nvmf
    static_configs:
      - targets: ['127.0.0.1:$mport']
EOF
promtool check config "$work/prometheus.yml" >/dev/null || fail "prometheus.yml"
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
    --web.listen-address="127.0.0.1:$pport" >"$work/prometheus.log" 2>&1 &
pids+=($!)
query() { curl -fsS "http://127.0.0.1:$pport/api/v1/query" --data-urlencode "query=$1" 2>/dev/null; }
ok=0
for _ in $(seq 60); do
    if query "nvmf_subsystem_namespaces{nqn=\"$nqn\"}" | grep -q '"value":\[[0-9.]*,"1"\]' &&
        query "up{job=\"nvmf\"}" | grep -q '"value":\[[0-9.]*,"1"\]'; then
        ok=1
        break
    fi
    sleep 1
done
((ok)) || { tail -20 "$work/prometheus.log"; fail "Prometheus did not scrape nvmf-tgt"; }
log "Prometheus $(prometheus --version 2>&1 | head -n1 | awk '{print $3}') scraped nvmf-tgt: up=1, nvmf_subsystem_namespaces=1"
echo "metrics-scrape: 1 passed, 0 failed"
