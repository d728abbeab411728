#!/usr/bin/env bash
# Sets up everything llft needs on a Debian bookworm machine, idempotently:
# system packages, a virtualenv in .venv with llft installed (which builds
# native/), and the example programs.  Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(build-essential python3-dev python3-venv libffi-dev iproute2 nftables iptables
              libssl-dev redis-server redis-tools memcached libmemcached-tools procps
              default-jre-headless    # Java for PySpark (python -m bench analyze)
              default-jdk-headless    # javac: a JVM server under --serialize (tests/test_serialize.py)
              webhook                 # a Go server: llft must refuse it (tests/test_unreplicable.py)
              lighttpd                # sizes its fd budget by fd numbers (tests/test_private_files.py)
              nginx-light apache2-bin # fork workers to serve: refused (tests/test_processes.py)
              dnsmasq-base            # UDP and TCP in the foreground; forks per TCP query with -k
              nodejs)                 # V8's threads share memory outside locks: --serialize (tests/test_serialize.py)

missing=()
for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    echo "setup: installing ${missing[*]}"
    # No packaged service starts while they install (policy-rc.d, as
    # container images do): several want port 80, the tests want none.
    policy=/usr/sbin/policy-rc.d
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
        $SUDO chmod +x "$policy"
        trap '$SUDO rm -f "$policy"' EXIT
    fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    # The packaged services must not hold the ports the tests use.
    for svc in redis-server memcached webhook lighttpd nginx; do
        $SUDO systemctl disable --now "$svc" >/dev/null 2>&1 || $SUDO service "$svc" stop >/dev/null 2>&1 || true
    done
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q ".[test,bench,checkpoint]"
# CRIU 4.2 for checkpoints (scripts/build-criu.sh; bookworm's does not work
# on this kernel).  Nothing depends on it yet: a failed build is a warning.
if ./scripts/build-criu.sh && /opt/criu/sbin/criu check >/dev/null 2>&1; then
    site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo /opt/criu/lib/python > "$site/pycriu.pth"     # pycriu, built from the same tarball as criu
else
    echo "setup: warning: CRIU 4.2 could not be built or does not pass 'criu check'" >&2
fi
make -s -C examples
echo "setup: ready (.venv/bin/llft-run)"
