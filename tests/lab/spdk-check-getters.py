"""Reads back every *_get_* answer of nvmf-tgt through SPDK's own Python client and checks the
fields SPDK's tools (spdkcli, rpc.py's callers, SPDK's test scripts) read from it.

Run with a release's venv python (tests/lab/spdk-clients):
    VENV/bin/python spdk-check-getters.py SOCK NQN HOSTNQN WRITTEN_BDEV
Exit 0 when every answer has SPDK's layout; otherwise one line per problem on stderr, exit 1.
"""

import json
import sys

from spdk.rpc.client import JSONRPCClient

sock, nqn, hostnqn, written_bdev = sys.argv[1:5]
client = JSONRPCClient(sock)
problems = []


def call(method, **params):
    try:
        return client.call(method, params) if params else client.call(method)
    except Exception as e:  # SPDK's client raises JSONRPCException on an error answer
        problems.append(f"{method}: {e}")
        return None


def need(where, obj, *keys):
    if not isinstance(obj, dict):
        problems.append(f"{where}: expected an object, got {json.dumps(obj)[:200]}")
        return False
    missing = [k for k in keys if k not in obj]
    if missing:
        problems.append(f"{where}: missing {missing} in {json.dumps(obj)[:300]}")
    return not missing


def each(where, items, *keys):
    if not isinstance(items, list):
        problems.append(f"{where}: expected an array, got {json.dumps(items)[:200]}")
        return []
    for i, item in enumerate(items):
        need(f"{where}[{i}]", item, *keys)
    return items


ADDRESS = ("trtype", "adrfam", "traddr", "trsvcid")

version = call("spdk_get_version")
need("spdk_get_version", version, "version", "fields")

methods = call("rpc_get_methods") or []
for m in ("nvmf_get_subsystems", "bdev_get_bdevs", "framework_get_config"):
    if m not in methods:
        problems.append(f"rpc_get_methods: {m} missing")

bdevs = each("bdev_get_bdevs", call("bdev_get_bdevs"), "name", "aliases", "product_name",
             "block_size", "num_blocks", "uuid", "claimed", "supported_io_types",
             "driver_specific", "assigned_rate_limits")

for t in each("nvmf_get_transports", call("nvmf_get_transports"), "trtype", "max_queue_depth",
              "max_io_qpairs_per_ctrlr", "in_capsule_data_size", "max_io_size", "io_unit_size",
              "max_aq_depth", "num_shared_buffers", "buf_cache_size", "abort_timeout_sec"):
    if str(t.get("trtype", "")).upper() != "RDMA":
        problems.append(f"nvmf_get_transports: trtype {t.get('trtype')}")

subs = each("nvmf_get_subsystems", call("nvmf_get_subsystems"), "nqn", "subtype",
            "listen_addresses", "allow_any_host", "hosts")
ours = [s for s in subs if s.get("nqn") == nqn]
if len(ours) != 1:
    problems.append(f"nvmf_get_subsystems: {nqn} listed {len(ours)} times")
else:
    s = ours[0]
    need(f"nvmf_get_subsystems {nqn}", s, "serial_number", "model_number", "max_namespaces",
         "min_cntlid", "max_cntlid", "namespaces")
    each(f"{nqn} listen_addresses", s.get("listen_addresses"), *ADDRESS)
    each(f"{nqn} namespaces", s.get("namespaces"), "nsid", "bdev_name", "name", "uuid")

ctrlrs = each("nvmf_subsystem_get_controllers",
              call("nvmf_subsystem_get_controllers", nqn=nqn),
              "cntlid", "hostnqn", "hostid", "num_io_qpairs")
if not any(c.get("hostnqn") == hostnqn for c in ctrlrs):
    problems.append(f"nvmf_subsystem_get_controllers: no controller of {hostnqn}")

for q in each("nvmf_subsystem_get_qpairs", call("nvmf_subsystem_get_qpairs", nqn=nqn),
              "cntlid", "qid", "state", "listen_address"):
    need("nvmf_subsystem_get_qpairs listen_address", q.get("listen_address"), *ADDRESS)

for listener in each("nvmf_subsystem_get_listeners",
                     call("nvmf_subsystem_get_listeners", nqn=nqn), "address"):
    need("nvmf_subsystem_get_listeners address", listener.get("address"), *ADDRESS)

stats = call("nvmf_get_stats")
if need("nvmf_get_stats", stats, "tick_rate", "poll_groups"):
    groups = each("nvmf_get_stats poll_groups", stats["poll_groups"], "name", "admin_qpairs",
                  "io_qpairs", "current_admin_qpairs", "current_io_qpairs", "pending_bdev_io",
                  "completed_nvme_io", "transports")
    for g in groups:
        for t in each("nvmf_get_stats transports", g.get("transports"), "trtype"):
            each("nvmf_get_stats devices", t.get("devices", []), "name", "polls", "completions",
                 "requests", "total_send_wrs", "send_doorbell_updates", "total_recv_wrs",
                 "recv_doorbell_updates")
    if groups and sum(g.get("current_io_qpairs", 0) for g in groups) == 0:
        problems.append("nvmf_get_stats: no I/O qpair counted while the host is connected")

iostat = call("bdev_get_iostat")
if need("bdev_get_iostat", iostat, "tick_rate", "ticks", "bdevs"):
    rows = each("bdev_get_iostat bdevs", iostat["bdevs"], "name", "bytes_read", "num_read_ops",
                "bytes_written", "num_write_ops", "read_latency_ticks", "write_latency_ticks")
    written = [b for b in rows if b.get("name") == written_bdev]
    if not written or written[0].get("num_write_ops", 0) == 0:
        problems.append(f"bdev_get_iostat: no writes counted on {written_bdev}")

threads = call("thread_get_stats")
if need("thread_get_stats", threads, "tick_rate", "threads"):
    each("thread_get_stats threads", threads["threads"], "name", "id", "busy", "idle")
reactors = call("framework_get_reactors")
if need("framework_get_reactors", reactors, "tick_rate", "reactors"):
    each("framework_get_reactors reactors", reactors["reactors"], "lcore", "busy", "idle",
         "lw_threads")

each("framework_get_subsystems", call("framework_get_subsystems"), "subsystem", "depends_on")
for name in ("bdev", "nvmf"):
    each(f"framework_get_config {name}", call("framework_get_config", name=name), "method")

for p in problems:
    print(f"getter: {p}", file=sys.stderr)
sys.exit(1 if problems else 0)
