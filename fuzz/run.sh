#!/usr/bin/env bash
# Runs every fuzz target for SECONDS each with the seeded mutator (a fresh seed per run,
# printed so a failure can be replayed: nvmf-fuzz run TARGET SECONDS SEED). A failing input
# is saved under $TMPDIR/nvmf-fuzz-crashes and replays with: nvmf-fuzz one TARGET FILE.
# CI (tests/run-all): fuzz/run.sh 25: four targets, about 1.7 minutes after the build.
# It takes no lock itself; on a shared machine wrap it: flock /tmp/nvmf-heavy.lock fuzz/run.sh 45
set -euo pipefail
secs=${1:?usage: fuzz/run.sh SECONDS}
cd "$(dirname "$0")/.."
cargo build --release -p nvmf-fuzz --bin nvmf-fuzz
bin=build/release/nvmf-fuzz
for target in capsule rpc-stream rpc-dispatch rdma-chaos; do
    "$bin" run "$target" "$secs"
done
