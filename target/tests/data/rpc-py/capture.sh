#!/bin/bash
# Records what SPDK's rpc.py of one release sends for the requests the tests replay:
#   capture.sh RELEASE_DIR OUT.jsonl
# RELEASE_DIR is a venv with PyPI's `spdk` package installed (its bin/spdk-rpc is used).
set -eu
venv=$1 out=$2
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d)
sock=$dir/sock
rm -f "$out"
python3 "$here/record-server.py" "$sock" "$out" &
server=$!
trap 'kill $server; rm -rf "$dir"' EXIT
for _ in $(seq 50); do [ -S "$sock" ] && break; sleep 0.1; done
rpc() { "$venv/bin/spdk-rpc" -s "$sock" "$@" > /dev/null; }
nqn=nqn.2016-06.io.spdk:cnode1
rpc nvmf_create_transport -t RDMA
rpc nvmf_create_subsystem $nqn
rpc nvmf_subsystem_add_listener $nqn -t rdma -f ipv4 -a 10.0.0.1 -s 4420
rpc nvmf_subsystem_add_ns $nqn Malloc0
rpc nvmf_subsystem_add_host $nqn nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555
rpc bdev_malloc_create -b Malloc0 64 512
rpc bdev_null_create Null0 64 512
rpc bdev_aio_create /tmp/f Aio0 512
rpc framework_get_config bdev
rpc bdev_get_bdevs
rpc nvmf_get_subsystems
rpc save_config
