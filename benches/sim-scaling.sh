#!/usr/bin/env bash
# Instructions and verbs calls per 4 KiB I/O of the target on the simulated RDMA fabric, from
# 1 to 4,000 connections per reactor on 1 and 2 reactors (issue 11, deliverable 6): the seed
# experiment of the field (one thread holding 1,000 connections; throughput falling as threads
# are added, from lock contention) run against this design. A benchmark, never part of
# `cargo test`.
#
#     benches/sim-scaling.sh            # the whole matrix, ~20 min
#
# Writes build/sim-scaling.md (and prints it); per run, build/sim-scaling/NAME.{log,callgrind,
# attrib.txt}. Knobs (environment): SIM_CONNS, SIM_REACTORS, SIM_OPS, SIM_SEPARATE_FROM (the
# smallest connection count also run with separate namespaces), SIM_TAG, and the example's own
# (SIM_QUEUES_PER_CTRL, SIM_DEPTH, SIM_OUTSTANDING, SIM_QUANTUM_NS, SIM_WARMUP_ROUNDS, SIM_SHARED_BUFFERS, SIM_IDLE_NAMESPACES; see
# benches/examples/sim_ops.rs).
#
# Method. Each run is `sim_ops OP CONNS REACTORS IOS MODE` (set-up, warm-up rounds of 2,048
# I/Os per reactor, then `measured_phase`: IOS commands, one outstanding on every connection
# at once, round after round) under
#     valgrind --tool=callgrind --collect-atstart=no --toggle-collect='*measured_phase*'
# so only the measured phase is counted. Then benches/callgrind_attrib.py splits it:
#   - whole: every instruction of the measured phase (target, simulated NIC, host, driver).
#   - target: inclusive cost of nvmf_target::core::poll_group::PollGroup::poll (all reactor
#     turns) minus the inclusive cost of the calls it makes into the simulator
#     (`<SimCq as VerbsCq>::poll`, `<SimQp as VerbsQp>::post_send`, `<SimSrq as
#     VerbsSrq>::post_recv`, ...), i.e. what a reactor executes itself, the bdev (null) and the
#     core included, the NIC's work excluded. The acceptor's turn is left out (on a real
#     target it is its own thread); it is printed in NAME.attrib.txt.
# Offered load. By default every connection has one command outstanding (QD1 per connection),
# so the connection count also sets how many commands are in flight: 1 at one connection,
# 1,000 at 1,000. SIM_LOAD=N holds the load instead: each connection carries
# max(1, N / conns) commands (SIM_OUTSTANDING, below SIM_DEPTH), so from 1 to N connections
# the reactor has N in flight and only the connection count changes (SIM_LOAD=32
# SIM_DEPTH=64: 1 x 32, 16 x 2, 256 x 1, ...). `benches/sim-scaling.sh` with
# SIM_LOAD=32 SIM_DEPTH=64 SIM_TAG=load32 is the flatness run of issue 14.
# Empty turns: at a few connections a reactor spins through turns that find nothing while its
# commands cross the fabric; what each costs is counted in a second callgrind run of the same
# set-up (`--toggle-collect=*idle_phase*`, once per set-up: NAME idle-CONNSxREACTORS-MODE), and
# the table gives the target's instructions per I/O both whole and without those turns (busy).
# Verbs calls are the target's: SimFabric::stats() deltas over the measured phase minus the
# host's own calls, which sim_ops counts (1 post_send per command, 1 post_recv per response,
# its CQ polls). Doorbells are post calls.
set -euo pipefail

cd "$(dirname "$0")/.."
# SIM_TAG=x writes build/sim-scaling-x/ and build/sim-scaling-x.md instead (a variant run).
OUT=build/sim-scaling${SIM_TAG:+-$SIM_TAG}
TABLE=$OUT.md
CONNS=${SIM_CONNS:-"1 16 256 1000 4000"}
REACTORS=${SIM_REACTORS:-"1 2"}
OPS=${SIM_OPS:-"read write write-inline"}
SEPARATE_FROM=${SIM_SEPARATE_FROM:-256}

# The example is run from a private copy: other builds in the workspace may replace
# build/release/examples/sim_ops while the matrix runs. SIM_NO_BUILD=1 reuses the copy made by
# an earlier run (to compare variants on one build).
BINDIR=build/sim-scaling-bin
BIN=$BINDIR/sim_ops
mkdir -p "$BINDIR" "$OUT"
if [ -z "${SIM_NO_BUILD:-}" ]; then
    cargo build --release -p nvmf-benches --example sim_ops
    cp build/release/examples/sim_ops "$BIN.tmp"
    mv "$BIN.tmp" "$BIN"
    # What was measured: the commit, and the files of the target, the fabric and the lab that
    # differed from it when the example was built.
    {
        git rev-parse --short HEAD 2>/dev/null || echo unknown
        git status --short -- target common tests/src 2>/dev/null | awk '{print $2}' | tr '\n' ' '
        echo
    } >"$BINDIR/snapshot.txt"
fi
SNAPSHOT="$(sed -n 1p "$BINDIR/snapshot.txt")"
DIRTY="$(sed -n 2p "$BINDIR/snapshot.txt")"
export SNAPSHOT DIRTY
RESULTS="$OUT/results.tsv"
: >"$RESULTS"
rm -f "$OUT"/idle-*.json

# Two rounds (every connection does two measured I/Os), at least 4,000 I/Os. The measured
# phase then takes under 25 s under callgrind; the largest runs take 1.5-3 min in all, nearly
# all of it connecting 8,000 queues (and 500 admin queues) through the simulator.
ios_for() {
    local total=$1 ios
    ios=$((2 * total))
    if [ "$ios" -lt 4000 ]; then ios=4000; fi
    echo "$ios"
}

for conns in $CONNS; do
    for reactors in $REACTORS; do
        modes="shared"
        if [ "$conns" -ge "$SEPARATE_FROM" ]; then modes="shared separate"; fi
        for mode in $modes; do
            for op in $OPS; do
                name="$op-${conns}x$reactors-$mode"
                ios=$(ios_for $((conns * reactors)))
                if [ -n "${SIM_LOAD:-}" ]; then
                    per_conn=$((SIM_LOAD / conns))
                    if [ "$per_conn" -lt 1 ]; then per_conn=1; fi
                    export SIM_OUTSTANDING=$per_conn
                fi
                start=$(date +%s)
                valgrind --tool=callgrind --collect-atstart=no \
                    '--toggle-collect=*measured_phase*' \
                    --callgrind-out-file="$OUT/$name.callgrind" \
                    "$BIN" "$op" "$conns" "$reactors" "$ios" "$mode" \
                    >"$OUT/$name.log" 2>"$OUT/$name.err"
                python3 benches/callgrind_attrib.py "$OUT/$name.callgrind" "$ios" --top 40 \
                    >"$OUT/$name.attrib.txt"
                attrib=$(python3 benches/callgrind_attrib.py "$OUT/$name.callgrind" "$ios" --json)
                result="$(grep '^RESULT ' "$OUT/$name.log") outstanding=${SIM_OUTSTANDING:-1}"
                # An empty turn's cost with these connections open: a second run counting only
                # `idle_phase` (per reactor turn; the op does not matter, so once per set-up).
                idle_name="idle-${conns}x$reactors-$mode"
                if [ ! -s "$OUT/$idle_name.json" ]; then
                    valgrind --tool=callgrind --collect-atstart=no \
                        '--toggle-collect=*idle_phase*' \
                        --callgrind-out-file="$OUT/$idle_name.callgrind" \
                        "$BIN" "$op" "$conns" "$reactors" "$ios" "$mode" \
                        >"$OUT/$idle_name.log" 2>"$OUT/$idle_name.err"
                    reactor_turns=$(sed -n 's/^IDLE .*reactor_turns=\([0-9]*\).*/\1/p' "$OUT/$idle_name.log")
                    python3 benches/callgrind_attrib.py "$OUT/$idle_name.callgrind" "$reactor_turns" \
                        --top 20 >"$OUT/$idle_name.attrib.txt"
                    python3 benches/callgrind_attrib.py "$OUT/$idle_name.callgrind" "$reactor_turns" \
                        --json >"$OUT/$idle_name.json"
                fi
                printf '%s\t%s\t%s\t%s\n' "$name" "$result" "$attrib" "$(cat "$OUT/$idle_name.json")" >>"$RESULTS"
                echo "$name: $(($(date +%s) - start)) s" >&2
            done
        done
    done
done

python3 - "$RESULTS" >"$TABLE" <<'EOF'
import json, sys
rows = []
for line in open(sys.argv[1]):
    name, result, attrib, idle = line.rstrip("\n").split("\t")
    kv = dict(p.split("=", 1) for p in result.split()[1:])
    a = json.loads(attrib)
    empty_turn = json.loads(idle)["target_per_io"]
    ios = int(kv["ios"])
    per = lambda k: int(kv[k]) / ios
    busy = a["target_per_io"] - per("empty_reactor_turns") * empty_turn
    rows.append((
        int(kv["conns"]), int(kv["reactors"]), kv["op"], kv["mode"],
        a["target_per_io"], a["whole_per_io"],
        per("t_post_send"), per("t_send_wrs"), per("t_post_recv"),
        per("t_cq_polls"), per("t_empty_polls"), ios,
        per("empty_reactor_turns"), empty_turn, busy,
        int(kv.get("outstanding", 1)),
    ))
rows.sort(key=lambda r: (r[2], r[3] != "shared", r[1], r[0]))
import os
print("# Target cost per 4 KiB I/O on the simulated RDMA fabric\n")
dirty = os.environ.get("DIRTY", "").strip()
print(f"Built from {os.environ.get('SNAPSHOT', '?')}"
      + (f" with uncommitted changes to {dirty}" if dirty else "") + ". "
      + ("QD1 on every connection" if not os.environ.get("SIM_LOAD") else
         f"{os.environ['SIM_LOAD']} commands in flight per reactor, at least 1 per connection")
      + ", all connections outstanding at once; null bdev; write: keyed "
      "SGL, the target fetches the data with an RDMA READ; write-inline: the data in the "
      "command capsule, as Linux and SPDK hosts send a 4 KiB write; "
      "instructions from callgrind over the measured phase only (target = the reactors' "
      "`PollGroup::poll` minus the simulator calls it makes; whole = the measured phase of the "
      "process: target, simulated NIC, host and driver); verbs calls are the target's "
      "(doorbells = post calls). Method: benches/sim-scaling.sh.")
# SIM_LOAD sets SIM_OUTSTANDING per row (the table's column).
knobs = sorted(f"{k}={v}" for k, v in os.environ.items()
               if k.startswith("SIM_") and k not in ("SIM_TAG", "SIM_NO_BUILD", "SIM_CONNS", "SIM_REACTORS",
                                                     "SIM_OPS", "SIM_SEPARATE_FROM")
               and not (k == "SIM_OUTSTANDING" and os.environ.get("SIM_LOAD")))
print("Example knobs: " + (", ".join(knobs) if knobs else "defaults") + ".\n")
print("Empty turns: reactor turns of the measured phase that found no work (a polled reactor "
      "spins while its few connections wait on the fabric); empty turn instr = the target's "
      "instructions per reactor turn in `idle_phase` (same set-up, every connection open, "
      "nothing in flight); busy instr/I/O = target instr/I/O - empty turns/I/O x empty turn "
      "instr, i.e. what serving the I/O costs, without the spinning between I/Os.\n")
print("| conns/reactor | commands per conn | reactors | op | namespace | target instr/I/O | busy instr/I/O "
      "| empty turns/I/O | empty turn instr | whole instr/I/O "
      "| send doorbells/I/O | send WRs/I/O | recv doorbells/I/O | CQ polls/I/O "
      "| empty polls/I/O | I/Os |")
print("|---:|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in rows:
    print(f"| {r[0]} | {r[15]} | {r[1]} | {r[2]} | {r[3]} | {r[4]:,.0f} | {r[14]:,.0f} | {r[12]:.2f} "
          f"| {r[13]:,.0f} | {r[5]:,.0f} | {r[6]:.3f} "
          f"| {r[7]:.3f} | {r[8]:.3f} | {r[9]:.3f} | {r[10]:.3f} | {r[11]} |")
EOF
cat "$TABLE"
