#!/usr/bin/env bash
# AFL++ (coverage-guided) over one target for SECONDS: an instrumented build of nvmf-fuzz
# (cargo-afl; about 2.5 minutes the first time on 2 cores, into build/afl), then afl-fuzz
# feeding each input on stdin to `nvmf-fuzz one TARGET`. Findings land in OUT/default/crashes;
# replay one with: build/release/nvmf-fuzz one TARGET FILE.
#   cargo install cargo-afl && cargo afl config --build     (once)
#   fuzz/afl.sh rpc-stream 600 [OUT]
# On a shared machine wrap it: flock /tmp/nvmf-heavy.lock fuzz/afl.sh ...
set -euo pipefail
target=${1:?usage: fuzz/afl.sh TARGET SECONDS [OUT]}
secs=${2:?usage: fuzz/afl.sh TARGET SECONDS [OUT]}
out=${3:-/tmp/nvmf-afl-$target}
cd "$(dirname "$0")/.."
case $target in
  capsule) corpus=fuzz/corpus/capsule ;;
  rpc-stream|rpc-dispatch) corpus=fuzz/corpus/rpc ;;
  *) echo "targets: capsule rpc-stream rpc-dispatch" >&2; exit 64 ;;
esac
CARGO_TARGET_DIR=build/afl cargo afl build --release -p nvmf-fuzz --bin nvmf-fuzz
export AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 AFL_NO_UI=1
resume=()
[ -d "$out/default" ] && resume=(-i -) || resume=(-i "$corpus")
cargo afl fuzz -V "$secs" "${resume[@]}" -o "$out" -- build/afl/release/nvmf-fuzz one "$target"
grep -E 'execs_done|saved_crashes|saved_hangs' "$out/default/fuzzer_stats"
crashes=$(find "$out/default/crashes" -type f -name 'id:*' | wc -l)
[ "$crashes" = 0 ] || { echo "$crashes crashing input(s) in $out/default/crashes" >&2; exit 1; }
