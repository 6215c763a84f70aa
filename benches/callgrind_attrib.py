#!/usr/bin/env python3
"""Splits a callgrind profile of `sim_ops` (collected only inside `measured_phase`) into the
target's own instructions, the simulator's, and the host's/driver's.

    callgrind_attrib.py CALLGRIND_OUT IOS [--top N] [--json]

Method (see also benches/sim-scaling.sh):

* whole = every instruction collected, i.e. the measured phase of the process (target, the
  simulated NIC, the raw host, the driver loop).
* reactor (the "target" column) = inclusive cost of
  `nvmf_target::core::poll_group::PollGroup::poll` (every reactor turn), minus the inclusive
  cost of each call made from inside it into the simulator (functions whose own path is
  `nvmf_common::rdma::sim::...`, e.g. `<SimCq as VerbsCq>::poll`, `<SimQp as
  VerbsQp>::post_send`, `<SimSrq as VerbsSrq>::post_recv`, `SimFabric::lock`). A call edge's
  inclusive cost is exact in callgrind's data; what is estimated is which share of the calls a
  non-simulator caller makes comes from inside `PollGroup::poll`: that share is propagated down
  the call graph, weighted by call cost (context-insensitive; it is 1 for the target's own
  functions on the reactor path, and only generic helpers shared with the host, like `DmaBuf`
  methods, get a fraction).
* A second, independent estimate walks every function's self cost up to its nearest classified
  caller (reactor / acceptor / simulator / host) with the same weights; both are printed and
  should agree closely.

The acceptor (`RdmaTransport::acceptor_turn`, called once per driver turn) is target code but
no reactor's: it is reported on its own and left out of the target column.
"""

import json
import re
import sys
from collections import defaultdict

ROOT = "nvmf_target::core::poll_group::PollGroup::poll"
SIM_PREFIX = "nvmf_common::rdma::sim::"
TARGET_PREFIX = "nvmf_target::"
HOST_PREFIXES = ("nvmf_tests::", "sim_ops::")


def owner(name):
    """The path that says whose code a symbol is: the impl's self type for `<X as T>::f`,
    generic arguments stripped."""
    n = name.strip()
    if n.startswith("<"):
        depth = 0
        for i, ch in enumerate(n):
            if ch == "<":
                depth += 1
            elif ch == ">":
                depth -= 1
                if depth == 0:
                    inner = n[1:i]
                    break
            elif depth == 1 and n.startswith(" as ", i):
                inner = n[1:i]
                break
        else:
            inner = n[1:]
        n = inner
    return n.split("<", 1)[0]


def classify(name):
    o = owner(name)
    if o.startswith(SIM_PREFIX):
        return "sim"
    if o.startswith(TARGET_PREFIX):
        return "target"
    if o.startswith(HOST_PREFIXES):
        return "host"
    return "other"


def parse(path):
    names = {}  # (kind, id) -> name
    self_cost = defaultdict(int)  # fn name -> Ir
    edges = defaultdict(int)  # (caller, callee) -> inclusive Ir
    calls = defaultdict(int)  # (caller, callee) -> call count
    totals = None
    cur = None
    pending_call = None  # callee name whose cost line comes next
    call_count = 0
    comp = re.compile(r"^\((\d+)\)(?:\s+(.*))?$")

    def name_of(kind, spec):
        m = comp.match(spec.strip())
        if not m:
            return spec.strip()
        key = (kind, m.group(1))
        if m.group(2) is not None:
            names[key] = m.group(2)
        return names.get(key, spec)

    cfn = None
    with open(path, errors="replace") as f:
        for line in f:
            if not line or line[0] == "#":
                continue
            c = line[0]
            if c.isdigit() or c in "+-*":
                parts = line.split()
                cost = int(parts[1]) if len(parts) > 1 else 0
                if pending_call is not None:
                    edges[(cur, pending_call)] += cost
                    calls[(cur, pending_call)] += call_count
                    pending_call = None
                else:
                    self_cost[cur] += cost
                continue
            if line.startswith("fn="):
                cur = name_of("fn", line[3:])
                cfn = None
            elif line.startswith("cfn="):
                cfn = name_of("fn", line[4:])
            elif line.startswith("calls="):
                call_count = int(line[6:].split()[0])
                pending_call = cfn
            elif line.startswith("totals:") or line.startswith("summary:"):
                totals = int(line.split(":", 1)[1].split()[0])
            elif line.startswith(("fl=", "fi=", "fe=", "cfl=", "cfi=", "ob=", "cob=")):
                kind = "fl" if line[0] == "f" or line.startswith("cf") else "ob"
                spec = line.split("=", 1)[1]
                # Register the name (compression ids are per kind); the value is not needed.
                name_of(kind, spec)
    return self_cost, edges, calls, totals


def analyse(path, ios, top):
    self_cost, edges, calls, totals = parse(path)
    fns = set(self_cost) | {a for a, _ in edges} | {b for _, b in edges}
    cls = {f: classify(f) for f in fns}
    incoming = defaultdict(list)
    for (a, b), cost in edges.items():
        if a != b:
            incoming[b].append((a, cost))

    # Method 1: share of each non-simulator function's calls made inside PollGroup::poll and
    # not under the simulator (t), then subtract the simulator calls at the boundary.
    t = {f: 0.0 for f in fns}
    t[ROOT] = 1.0
    for _ in range(60):
        changed = 0.0
        for f in fns:
            if f == ROOT or cls[f] in ("sim", "host"):
                continue
            inc = incoming.get(f)
            if not inc:
                continue
            tot = sum(c for _, c in inc)
            if tot == 0:
                continue
            v = sum(c * t[g] for g, c in inc) / tot
            changed = max(changed, abs(v - t[f]))
            t[f] = v
        if changed < 1e-12:
            break
    root_incl = sum(c for g, c in incoming.get(ROOT, []) if g != ROOT)
    boundary = []
    sim_in_reactor = 0.0
    for (a, b), cost in edges.items():
        if cls[b] == "sim" and cls[a] != "sim" and t.get(a, 0) > 0:
            sim_in_reactor += cost * t[a]
            boundary.append((cost * t[a], a, b, t[a], calls[(a, b)]))
    reactor = root_incl - sim_in_reactor

    # Method 2: every function's self cost goes to the context of its nearest classified
    # caller: reactor (under PollGroup::poll), acceptor (target code elsewhere), sim, host.
    ctxs = ("reactor", "acceptor", "sim", "host")
    ctx = {f: dict.fromkeys(ctxs, 0.0) for f in fns}
    for f in fns:
        if f == ROOT:
            ctx[f]["reactor"] = 1.0
        elif cls[f] == "sim":
            ctx[f]["sim"] = 1.0
        elif cls[f] == "host":
            ctx[f]["host"] = 1.0
    for _ in range(60):
        changed = 0.0
        for f in fns:
            if f == ROOT or cls[f] in ("sim", "host"):
                continue
            inc = incoming.get(f)
            if not inc:
                continue
            tot = sum(c for _, c in inc)
            if tot == 0:
                continue
            new = dict.fromkeys(ctxs, 0.0)
            for g, c in inc:
                for k, v in ctx[g].items():
                    if cls[f] == "target" and k in ("host", "sim"):
                        k = "acceptor"
                    new[k] += c * v / tot
            changed = max(changed, max(abs(new[k] - ctx[f][k]) for k in ctxs))
            ctx[f] = new
        if changed < 1e-12:
            break
    buckets = dict.fromkeys(ctxs, 0.0)
    unplaced = 0.0
    for f, s in self_cost.items():
        share = sum(ctx[f].values())
        for k in ctxs:
            buckets[k] += s * ctx[f][k]
        unplaced += s * (1.0 - share)
    own = sorted(
        ((s * ctx[f]["reactor"], f) for f, s in self_cost.items() if ctx[f]["reactor"] > 0),
        reverse=True,
    )
    whole = totals if totals is not None else sum(self_cost.values())
    return {
        "ios": ios,
        "whole": whole,
        "reactor_incl": root_incl,
        "sim_in_reactor": sim_in_reactor,
        "reactor": reactor,
        "buckets": buckets,
        "unplaced": unplaced,
        "boundary": sorted(boundary, reverse=True)[:top],
        "top_reactor_self": own[:top],
    }


def main():
    args = sys.argv[1:]
    top = 25
    as_json = False
    if "--top" in args:
        i = args.index("--top")
        top = int(args[i + 1])
        del args[i : i + 2]
    if "--json" in args:
        args.remove("--json")
        as_json = True
    if len(args) != 2:
        sys.exit(__doc__)
    path, ios = args[0], int(args[1])
    r = analyse(path, ios, top)
    per = lambda x: x / max(ios, 1)
    if as_json:
        print(
            json.dumps(
                {
                    "ios": ios,
                    "whole_per_io": per(r["whole"]),
                    "target_per_io": per(r["reactor"]),
                    "reactor_incl_per_io": per(r["reactor_incl"]),
                    "sim_in_reactor_per_io": per(r["sim_in_reactor"]),
                    "buckets_per_io": {k: per(v) for k, v in r["buckets"].items()},
                }
            )
        )
        return
    b = r["buckets"]
    print(f"{path}: {ios} I/Os")
    print(f"  whole measured phase      {per(r['whole']):12.0f} Ir/I/O")
    print(f"  PollGroup::poll inclusive {per(r['reactor_incl']):12.0f} Ir/I/O")
    print(f"  - simulator calls in it   {per(r['sim_in_reactor']):12.0f} Ir/I/O")
    print(f"  = target (reactors)       {per(r['reactor']):12.0f} Ir/I/O")
    print(
        "  self-cost walk: reactor {:.0f}, acceptor {:.0f}, simulator {:.0f}, host+driver {:.0f}, unplaced {:.0f} Ir/I/O".format(
            per(b["reactor"]), per(b["acceptor"]), per(b["sim"]), per(b["host"]), per(r["unplaced"])
        )
    )
    print("  simulator calls from the reactors (Ir/I/O, caller share, callgrind calls/I/O):")
    for cost, a, bb, share, n in r["boundary"]:
        print(f"    {per(cost):9.1f}  {share:5.3f}  {n / max(ios, 1):8.3f}  {a} -> {bb}")
    print("  the reactors' own functions by self cost (Ir/I/O):")
    for cost, f in r["top_reactor_self"]:
        print(f"    {per(cost):9.1f}  {f}")


if __name__ == "__main__":
    main()
