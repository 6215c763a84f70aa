#!/usr/bin/env bash
# Builds the fio ioengine `nvmf`: <target dir>/release/libnvmf_fio_engine.so (build/release/
# in this workspace), from the GPL shim fio/engine/nvmf_fio.c and the Rust static library of
# the crate nvmf-fio.
#
#   fio/build-engine.sh            # prints nothing on success; the .so path with -v
#   fio --ioengine=external:build/release/libnvmf_fio_engine.so --thread=1 --filename='...'
#
# What it does (each step is skipped when already done):
# 1. Debian packages: fio, build-essential, dpkg-dev, and the dev packages fio's configure
#    looks for (libaio, numa, rdmacm, ibverbs, nbd, zlib). Needs root to install.
# 2. The source of the installed fio version (`apt-get source`; adds a deb-src entry for the
#    Debian archive if there is none) unpacked in $NVMF_FIO_SRC_CACHE, configured as Debian
#    configures it: that gives fio's headers with the struct layouts of /usr/bin/fio.
# 3. `cargo build --release -p nvmf-fio` (the static library).
# 4. Compiles the shim and links it with the static library, then dlopens the result in fio
#    with every symbol bound (LD_BIND_NOW) to prove it loads.
#
# Environment: NVMF_FIO_SRC_CACHE (default /var/cache/nvmf-fio-src), CARGO_TARGET_DIR,
# CC (default cc).
set -Eeuo pipefail

verbose=0
[[ ${1:-} == -v ]] && verbose=1

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
cache=${NVMF_FIO_SRC_CACHE:-/var/cache/nvmf-fio-src}
target_dir=${CARGO_TARGET_DIR:-$repo/build}
out=$target_dir/release/libnvmf_fio_engine.so
log=$(mktemp /tmp/nvmf-fio-build.XXXXXX.log)
trap 'rm -f "$log"' EXIT

die() {
    echo "build-engine: $*" >&2
    if [[ -s $log ]]; then
        echo "build-engine: last output:" >&2
        tail -n 30 "$log" >&2
    fi
    exit 1
}

# Runs a step quietly; its output is shown only if it fails.
quiet() {
    "$@" >>"$log" 2>&1 || die "failed: $*"
}

# ------------------------------------------------------------------ packages --
packages=(fio build-essential dpkg-dev pkg-config libaio-dev libnuma-dev librdmacm-dev
    libibverbs-dev libnbd-dev zlib1g-dev)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
    ((EUID == 0)) || die "missing packages (run as root to install them): ${missing[*]}"
    quiet apt-get update -qq
    DEBIAN_FRONTEND=noninteractive quiet apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# ---------------------------------------------------------------- fio source --
fio_deb_version=$(dpkg-query -W -f='${Version}' fio) # e.g. 3.33-3
fio_version=${fio_deb_version%-*}                    # 3.33
fio_version=${fio_version#*:}
[[ $(fio --version) == "fio-$fio_version" ]] ||
    die "fio --version says $(fio --version), the package is $fio_deb_version: which fio is this?"
src=$cache/fio-$fio_version
configure_args=(--disable-native --prefix=/usr --enable-libnbd)
stamp=$src/.nvmf-configured

# deb-src entries for every Debian `deb` source, if apt knows no source for fio.
add_deb_src() {
    local f=/etc/apt/sources.list.d/nvmf-fio-deb-src.sources
    ((EUID == 0)) || die "no deb-src entry for fio (run as root to add $f)"
    {
        local s
        for s in /etc/apt/sources.list.d/*.sources; do
            [[ -f $s && $s != "$f" ]] || continue
            # deb822 stanzas (paragraphs): the ones of type deb, as deb-src.
            awk 'BEGIN { RS = "" }
                 {
                     n = split($0, l, "\n"); deb = 0
                     for (i = 1; i <= n; i++)
                         if (l[i] ~ /^Types:/) {
                             m = split(l[i], t, /[ \t]+/)
                             for (j = 2; j <= m; j++) if (t[j] == "deb") deb = 1
                         }
                     if (!deb) next
                     for (i = 1; i <= n; i++) print (l[i] ~ /^Types:/ ? "Types: deb-src" : l[i])
                     print ""
                 }' "$s"
        done
        if [[ -f /etc/apt/sources.list ]]; then
            # One-line entries, converted to deb822.
            awk '$1 == "deb" {
                     i = 2
                     if ($2 ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
                     printf "Types: deb-src\nURIs: %s\nSuites: %s\nComponents:", $i, $(i + 1)
                     for (j = i + 2; j <= NF; j++) printf " %s", $j
                     printf "\n\n"
                 }' /etc/apt/sources.list
        fi
    } >"$f.tmp"
    grep -q 'Types: deb-src' "$f.tmp" || {
        rm -f "$f.tmp"
        die "found no Debian 'deb' source to derive a deb-src entry from"
    }
    mv "$f.tmp" "$f"
    quiet apt-get update -qq
}

if [[ ! -f $stamp || $(cat "$stamp") != "${configure_args[*]}" ]]; then
    if [[ ! -f $src/fio.h ]]; then
        apt-cache showsrc fio 2>/dev/null | grep -qx "Version: $fio_deb_version" || add_deb_src
        apt-cache showsrc fio 2>/dev/null | grep -qx "Version: $fio_deb_version" ||
            die "apt has no source package fio=$fio_deb_version"
        mkdir -p "$cache"
        tmp=$(mktemp -d "$cache/.get.XXXXXX")
        (cd "$tmp" && quiet apt-get source -qq --download-only "fio=$fio_deb_version")
        (cd "$tmp" && quiet dpkg-source -x ./*.dsc "fio-$fio_version")
        rm -rf "$src"
        mv "$tmp/fio-$fio_version" "$src"
        rm -rf "$tmp"
    fi
    (cd "$src" && quiet ./configure "${configure_args[@]}")
    echo "${configure_args[*]}" >"$stamp"
fi
# The options that change the layout of struct io_u / thread_data must match Debian's build.
for c in CONFIG_LIBAIO CONFIG_POSIXAIO CONFIG_RDMA CONFIG_LIBNUMA; do
    grep -qx "#define $c" "$src/config-host.h" ||
        die "$src/config-host.h lacks $c: its struct layouts would not match /usr/bin/fio"
done

# ---------------------------------------------------------------- Rust side --
(cd "$repo" && quiet cargo build --release -q -p nvmf-fio)
staticlib=$target_dir/release/libnvmf_fio.a
[[ -f $staticlib ]] || die "cargo built no $staticlib"

# --------------------------------------------------------------------- link --
mkdir -p "$(dirname "$out")"
# fio's own build flags that matter for its headers (Makefile: CPPFLAGS, DEBUGFLAGS).
cppflags=(-D_GNU_SOURCE -D_LARGEFILE_SOURCE -D_FILE_OFFSET_BITS=64 -DFIO_INTERNAL -DFIO_INC_DEBUG
    -include "$src/config-host.h" -I"$src" -I"$repo/fio/engine")
# --exclude-libs: the Rust library's symbols stay inside; only the shim's are exported.
quiet "${CC:-cc}" -std=gnu11 -O2 -g -fPIC -shared -Wall -Wno-unused-parameter \
    "${cppflags[@]}" -o "$out.tmp" "$repo/fio/engine/nvmf_fio.c" "$staticlib" \
    -Wl,--exclude-libs,ALL -Wl,--as-needed \
    -libverbs -lrdmacm -lpthread -ldl -lm -lrt -lutil -lgcc_s -lc
# Loads in fio with every symbol resolved now (a missing one fails here, not mid-run).
LD_BIND_NOW=1 fio --enghelp="$out.tmp" >>"$log" 2>&1 ||
    die "fio cannot load the engine (see above)"
grep -q nvmf_io_timeout "$log" || die "fio loaded the engine but shows none of its options"
mv "$out.tmp" "$out"
((verbose)) && echo "$out"
exit 0
