#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh) and shows what llft does: a program
# that races threads on locks, clocks and random numbers gives different
# results on every run, but under llft every replica computes the primary's;
# then the main job: a replicated key-value server whose primary is killed
# under load, with no client disconnected and nothing acknowledged lost.
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

echo
PORT=$(.venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
echo "== the main job: a multi-threaded key-value server, replicated: llft-run --replicas 3 -- examples/bin/kv_server $PORT"
echo "   (clients use port $PORT, the port the server binds, as without llft; its primary is killed mid-run)"
llft-run --replicas 3 --run-dir "$RUN_DIR/kv" -- examples/bin/kv_server "$PORT" &
GROUP=$!
trap 'kill $GROUP 2>/dev/null || true' EXIT
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.1; done
.venv/bin/python scripts/demo_clients.py "$PORT" "$RUN_DIR/kv"
sleep 1.2   # the state file is rewritten every second
echo
echo "== llft-status: view 2, the old primary failed, and every live replica sent the same bytes"
llft-status --run-dir "$RUN_DIR/kv"
exec 3<>"/dev/tcp/127.0.0.1/$PORT"; echo SHUTDOWN >&3; read -r BYE <&3; exec 3<&-
wait $GROUP && echo "(the server answered SHUTDOWN with $BYE; llft-run exited with the new primary's status, 0)"
