#!/usr/bin/env bash
# spdk-clients: SPDK's own JSON-RPC clients from PyPI (`spdk-rpc` = rpc.py, and `spdk-cli`), every
# release in its own venv (tests/lab/spdk-clients installs them on the host), drive nvmf-tgt
# through a whole admin cycle while the Linux host is connected:
#   - bdevs (malloc, null, aio on ext4), the RDMA transport with rpc.py's full default
#     parameter set, two subsystems, listeners, an allow list, namespaces;
#   - the Linux host connects; namespaces added and removed live appear and disappear on it;
#   - every *_get_* answer read back through SPDK's Python client, with SPDK's layout
#     (spdk-check-getters.py), and `spdk-cli ls`;
#   - save_config, spdk_kill_instance, a restart from the saved file (-c) gives the same config
#     and the data written to the file namespace before is read back; load_config into a fresh
#     target gives the same config again.
# Arguments: RELEASES... (default: 25.5 25.9 26.1 26.5 26.9).
source "$(dirname "${BASH_SOURCE[0]}")/../guest-lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/../nvmf-lib.sh"
lab_init spdk-clients

releases=${*:-25.5 25.9 26.1 26.5 26.9}
clients=${NVMF_LAB_CACHE:-/var/lib/nvmf-lab}/spdk-clients
checker=$LAB_REPO/tests/lab/spdk-check-getters.py
port=4420
MiB=1048576
lab_rxe_up
lab_nvme_host_up
hostnqn=$(cat /etc/nvme/hostnqn)
mnt=$(lab_mount_tmp_ext4 200)

# nvme_nsids NQN: the NSIDs the host sees under NQN, sorted, on one line.
nvme_nsids() {
    local d
    for d in $(lab_nvme_dev "$1" 2>/dev/null); do cat "/sys/block/$(basename "$d")/nsid"; done |
        sort -n | tr '\n' ' ' | sed 's/ $//'
}
wait_nsids() { # NQN "NSIDS" WHAT
    local i
    for i in $(seq 1 60); do
        [[ $(nvme_nsids "$1") == "$2" ]] && return 0
        sleep 0.5
    done
    lab_fail "$3: the host sees NSIDs '$(nvme_nsids "$1")', expected '$2'"
}

# SPDK's Python starts slowly under TCG (several seconds per spdk-rpc), so most steps send a
# script: rpc.py reads one command a line from stdin when it is given none, and runs them
# through one client in order (stopping at the first error). Snapshots for the comparisons are
# read with nvmf-rpc, which is fast; every change goes through SPDK's client.
for release in $releases; do
    venv=$clients/$release
    [[ -x $venv/bin/spdk-rpc ]] ||
        lab_fail "SPDK $release's clients are not installed in $venv: run tests/lab/spdk-clients on the host"
    tag=${release//./}
    nqn=nqn.2016-06.io.spdk:spdk-rpc-$tag
    nqn2=nqn.2016-06.io.spdk:spdk-rpc-$tag-closed
    aio_file=$mnt/aio-$tag.img
    # A third subsystem with what high availability needs: ANA reporting with a listener
    # state and a namespace moved to another group, a masked namespace shown to this host,
    # persistent reservations with a ptpl_file, and a discovery referral.
    nqn3=nqn.2016-06.io.spdk:spdk-rpc-$tag-ha
    ptpl_file=$mnt/ptpl-$tag.json
    rpc() { lab_t 120 "$venv/bin/spdk-rpc" -s "$NVMF_RPC_SOCK" "$@"; }
    snapshot() { # NAME: the bdev and nvmf config as the target reports it now
        local s
        for s in bdev nvmf; do nvmf_rpc framework_get_config "$s" >"$LAB_STATE/$1-$tag-$s.json"; done
    }
    same_as_before() { # NAME WHAT
        local s
        for s in bdev nvmf; do
            diff -u "$LAB_STATE/before-$tag-$s.json" "$LAB_STATE/$1-$tag-$s.json" >&2 ||
                lab_fail "$release: framework_get_config $s differs $2"
        done
    }
    lab_log "== SPDK $release: $("$venv/bin/python" -c 'import importlib.metadata as m; print("spdk", m.version("spdk"))')"

    nvmf_tgt_start -m 0x1
    lab_t 30 truncate -s 32M "$aio_file"
    setup_log=$LAB_OUT/spdk-rpc-setup-$tag.txt
    printf '%s\n' \
        "bdev_malloc_create -b Malloc0 32 4096" \
        "bdev_malloc_create -b Malloc1 16 512" \
        "bdev_null_create Null0 64 4096" \
        "bdev_aio_create $aio_file Aio0 4096" \
        "bdev_split_create Aio0 2" \
        "nvmf_create_transport -t RDMA" \
        "nvmf_create_subsystem $nqn -a -s SPDK$(printf '%016d' "$tag") -d 'spdk-rpc $release' -m 8" \
        "nvmf_create_subsystem $nqn2 -s SPDK00000000000002" \
        "nvmf_subsystem_add_listener $nqn -t rdma -f ipv4 -a $LAB_ADDR0 -s $port" \
        "nvmf_subsystem_add_listener $nqn2 -t rdma -f ipv4 -a $LAB_ADDR0 -s $port" \
        "nvmf_subsystem_add_ns $nqn Malloc0" \
        "nvmf_subsystem_add_ns -n 7 $nqn2 Aio0p1" \
        "nvmf_subsystem_add_host $nqn2 $hostnqn" \
        "bdev_malloc_create -b Malloc2 8 4096" \
        "bdev_null_create Null1 8 4096" \
        "nvmf_create_subsystem $nqn3 -a -r -s SPDK00000000000003" \
        "nvmf_subsystem_add_listener $nqn3 -t rdma -f ipv4 -a $LAB_ADDR0 -s $port" \
        "nvmf_subsystem_add_ns -p $ptpl_file $nqn3 Malloc2" \
        "nvmf_subsystem_add_ns -i $nqn3 Null1" \
        "nvmf_ns_add_host $nqn3 2 $hostnqn" \
        "nvmf_subsystem_set_ns_ana_group $nqn3 2 1" \
        "nvmf_subsystem_listener_set_ana_state $nqn3 -n non_optimized -t rdma -a $LAB_ADDR0 -s $port -f ipv4" \
        "nvmf_discovery_add_referral -t rdma -a 10.0.0.9 -s 4420 -f ipv4" \
        "nvmf_get_transports" \
        "nvmf_get_subsystems" | rpc >"$setup_log" 2>&1 ||
        { cat "$setup_log" >&2; lab_fail "$release: the set-up script failed"; }
    # rpc.py's script mode reports a failed call on stdout and exits 1; make sure nothing slipped.
    ! grep -q "^Exception:" "$setup_log" || { cat "$setup_log" >&2; lab_fail "$release: set-up"; }

    # The Linux host on both subsystems; data on the file namespace to find after the restart.
    lab_nvme_connect "$nqn" "$LAB_ADDR0" "$port" >/dev/null
    wait_nsids "$nqn" "1" "$release: first namespace"
    aio_dev=$(lab_nvme_connect "$nqn2" "$LAB_ADDR0" "$port")
    lab_t 30 head -c $MiB /dev/urandom >"$LAB_STATE/aio-$tag.bin"
    lab_t 60 dd if="$LAB_STATE/aio-$tag.bin" of="$aio_dev" bs=64k oflag=direct status=none ||
        lab_fail "$release: write to the file namespace"
    # The namespace is the file's second half (Aio0p1, a split part): the data sits 16 MiB
    # in, and the first half (Aio0p0) is untouched.
    lab_t 30 dd if="$aio_file" of="$LAB_STATE/in-file-$tag.bin" bs=1M skip=16 count=1 status=none
    cmp -s "$LAB_STATE/aio-$tag.bin" "$LAB_STATE/in-file-$tag.bin" ||
        lab_fail "$release: the split part's data is not at its offset in the file"
    cmp -s -n $((16 * MiB)) "$aio_file" /dev/zero ||
        lab_fail "$release: writing the second split part changed the first"

    # Namespaces added and removed live; releases with rpc.py's batch mode (26.x: one JSON-RPC
    # batch request for the whole script) send the two additions as one batch.
    batch=()
    grep -q "batch-mode" "$venv"/lib/python3*/site-packages/spdk/spdk_rpc.py && batch=(--batch-mode)
    printf '%s\n' "nvmf_subsystem_add_ns $nqn Null0" "nvmf_subsystem_add_ns -n 5 $nqn Malloc1" |
        rpc "${batch[@]}" >/dev/null || lab_fail "$release: live nvmf_subsystem_add_ns ${batch[*]}"
    wait_nsids "$nqn" "1 2 5" "$release: namespaces added live"
    rpc nvmf_subsystem_remove_ns "$nqn" 2 >/dev/null || lab_fail "$release: live nvmf_subsystem_remove_ns"
    wait_nsids "$nqn" "1 5" "$release: namespace removed live"
    lab_log "$release: namespaces added and removed live: the host sees $(nvme_nsids "$nqn")"
    # rpc.py grows a namespace's null bdev (8 -> 16 MiB); it may grow, in use, not shrink.
    rpc bdev_null_resize Null1 16 >/dev/null || lab_fail "$release: bdev_null_resize"
    [[ $(nvmf_rpc bdev_get_bdevs -b Null1) == *'"num_blocks": 4096'* ]] ||
        lab_fail "$release: Null1 did not grow to 4096 blocks"
    if rpc bdev_null_resize Null1 4 >/dev/null 2>&1; then
        lab_fail "$release: a namespace's null bdev shrank"
    fi

    # Every getter through SPDK's Python client, then spdk-cli's tree.
    lab_t 180 "$venv/bin/python" "$checker" "$NVMF_RPC_SOCK" "$nqn2" "$hostnqn" Aio0p1 ||
        lab_fail "$release: a *_get_* answer lacks SPDK's layout (above)"
    ls_out=$LAB_OUT/spdk-cli-ls-$tag.txt
    # spdk-cli (configshell) keeps its history and log under $HOME/.scripts: the guest's /root
    # is read-only.
    mkdir -p "$LAB_STATE/home"
    HOME=$LAB_STATE/home lab_t 180 "$venv/bin/spdk-cli" -s "$NVMF_RPC_SOCK" ls >"$ls_out" 2>&1 ||
        { cat "$ls_out" >&2; lab_fail "$release: spdk-cli ls"; }
    for want in "$nqn" "$nqn2" Malloc0 Malloc1 Null0 Aio0 Aio0p1; do
        grep -qwF "$want" "$ls_out" || { cat "$ls_out" >&2; lab_fail "$release: spdk-cli ls does not show $want"; }
    done
    lab_log "$release: getters in SPDK's layout; spdk-cli ls shows both subsystems and the bdevs, the split part among them"

    # save_config, then stop through spdk_kill_instance.
    rpc save_config >"$LAB_STATE/saved-$tag.json" || lab_fail "$release: save_config"
    snapshot before
    lab_t 60 nvme disconnect-all >/dev/null 2>&1 || true
    rpc spdk_kill_instance SIGTERM >/dev/null || lab_fail "$release: spdk_kill_instance SIGTERM"
    lab_wait_until 30 "nvmf-tgt to exit after spdk_kill_instance" sh -c "! kill -0 $NVMF_TGT_PID" ||
        lab_fail "$release: nvmf-tgt still running after spdk_kill_instance"
    wait "$NVMF_TGT_PID" 2>/dev/null || true
    NVMF_TGT_PID=

    # Restart from the saved file: the same config, and the host reads its data back.
    nvmf_tgt_start -m 0x1 -c "$LAB_STATE/saved-$tag.json"
    snapshot restarted
    same_as_before restarted "after a restart from save_config"
    aio_dev=$(lab_nvme_connect "$nqn2" "$LAB_ADDR0" "$port")
    lab_t 60 dd if="$aio_dev" of="$LAB_STATE/back-$tag.bin" bs=64k count=16 iflag=direct status=none
    cmp -s "$LAB_STATE/aio-$tag.bin" "$LAB_STATE/back-$tag.bin" ||
        lab_fail "$release: the file namespace's data differs after the restart"
    lab_nvme_disconnect "$nqn2"
    nvmf_tgt_stop

    # load_config into a fresh target.
    nvmf_tgt_start -m 0x1
    rpc load_config <"$LAB_STATE/saved-$tag.json" || lab_fail "$release: load_config"
    snapshot loaded
    same_as_before loaded "after load_config"
    lab_nvme_connect "$nqn" "$LAB_ADDR0" "$port" >/dev/null
    wait_nsids "$nqn" "1 5" "$release: namespaces after load_config"
    lab_nvme_disconnect "$nqn"
    nvmf_tgt_stop
    rm -f "$aio_file" "$ptpl_file"
    lab_log "$release: PASS (admin cycle, getters, spdk-cli ls, save_config, restart, load_config)"
done
lab_pass "SPDK's spdk-rpc and spdk-cli ($releases) drive nvmf-tgt through a whole admin cycle with the Linux host connected"
