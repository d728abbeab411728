#!/usr/bin/env bash
# Builds and installs CRIU 4.2 (binary in /opt/criu/sbin/criu, its Python
# binding pycriu beside it in /opt/criu/lib/python), idempotently.
# Bookworm's own criu (3.17) fails `criu check` on this kernel, and 4.1
# cannot dump inet sockets on kernels >= 6.16 (../shared/notes/criu.md):
# 4.2 or later is built from the upstream tarball of Debian's source
# package in sid, fetched through a private apt configuration that leaves
# the system's apt sources untouched (apt checks the tarball against the
# signed index), against bookworm's -dev packages.
set -euo pipefail

PREFIX=${CRIU_PREFIX:-/opt/criu}
MIN_VERSION=4.2
BUILD_DEPS=(build-essential pkg-config xz-utils protobuf-c-compiler protobuf-compiler libprotobuf-c-dev
            libprotobuf-dev libnl-3-dev libnet1-dev libbsd-dev libcap-dev libgnutls28-dev libnftables-dev
            uuid-dev python3-protobuf nftables)

# The version a criu binary says it is, or nothing.
version_of() { "$1" --version 2>/dev/null | sed -n 's/^Version: *//p'; }
new_enough() { [ -n "$1" ] && [ "$(printf '%s\n' "$MIN_VERSION" "$1" | sort -V | head -1)" = "$MIN_VERSION" ]; }

if new_enough "$(version_of "$PREFIX/sbin/criu")" && [ -f "$PREFIX/lib/python/pycriu/__init__.py" ]; then
    exit 0
fi

SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
missing=()
for p in "${BUILD_DEPS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "build-criu: installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# A private apt: sid's sources index only, its own state and cache.
mkdir -p "$work/apt/etc/sources.list.d" "$work/apt/etc/preferences.d" "$work/apt/state/lists/partial" \
         "$work/apt/cache/archives/partial"
cat > "$work/apt/etc/sources.list" <<EOF
deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian sid main
EOF
APT=(apt-get -q -o "Dir::Etc=$work/apt/etc" -o "Dir::State=$work/apt/state" -o "Dir::Cache=$work/apt/cache"
     -o "Dir::Etc::sourcelist=$work/apt/etc/sources.list" -o "Dir::Etc::sourceparts=$work/apt/etc/sources.list.d"
     -o "APT::Get::Only-Source=true" -o "APT::Sandbox::User=root")
echo "build-criu: fetching criu's source from Debian sid"
"${APT[@]}" update >/dev/null
(cd "$work" && "${APT[@]}" source --tar-only criu >/dev/null)
tar -C "$work" -xf "$work"/criu_*.orig.tar.*
src=$(find "$work" -maxdepth 1 -type d -name "criu-*" | head -1)
echo "build-criu: building in $src (about a minute)"
# (The tarball is no git checkout: its Makefile's `git describe` complains.)
make -s -C "$src" -j"$(nproc)" PREFIX="$PREFIX" PYTHON=/usr/bin/python3 criu lib 2>&1 >/dev/null \
    | { grep -v "not a git repository" || true; } >&2
$SUDO make -s -C "$src" PREFIX="$PREFIX" PYTHON=/usr/bin/python3 install-criu >/dev/null
$SUDO mkdir -p "$PREFIX/lib/python"
$SUDO rm -rf "$PREFIX/lib/python/pycriu"
$SUDO cp -r "$src/lib/pycriu" "$PREFIX/lib/python/pycriu"
built=$(version_of "$PREFIX/sbin/criu")
new_enough "$built" || { echo "build-criu: built criu $built, older than $MIN_VERSION" >&2; exit 1; }
echo "build-criu: criu $built in $PREFIX/sbin/criu"
