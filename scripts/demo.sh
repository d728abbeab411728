#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh) and shows what llft does: a program
# that races threads on locks, clocks and random numbers gives different
# results on every run, but under llft every replica computes the primary's.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
RACE=examples/bin/race
export PATH="$PWD/.venv/bin:$PATH"

echo
echo "== examples/race on its own, three times: the lock order and the values differ every run"
for i in 1 2 3; do "$RACE" 4 2000 | grep -E '^(order|digest)=' | tr '\n' ' '; echo; done

echo
echo "== the same program as a group of 3 replicas: llft-run --replicas 3 -- $RACE 4 2000"
RUN_DIR=$(mktemp -d /tmp/llft-demo.XXXXXX)
llft-run --replicas 3 --run-dir "$RUN_DIR" --log-level info -- "$RACE" 4 2000
for k in 0 1 2; do
    printf 'replica %s: ' "$k"; grep -E '^(order|digest)=' "$RUN_DIR/replica-$k/stdout" | tr '\n' ' '; echo
done

echo
echo "== llft-status --run-dir $RUN_DIR"
llft-status --run-dir "$RUN_DIR"

echo
echo "== a backup made to diverge (RACE_DIVERGE_REPLICA=1): llft detects it and says where"
RACE_DIVERGE_REPLICA=1 llft-run --replicas 3 --run-dir "$RUN_DIR/diverge" -- "$RACE" 4 2000 || echo "(llft-run exited with status $?)"
