#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh) and runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/pytest "$@"
