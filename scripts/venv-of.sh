#!/bin/sh
# Installs the llft of another checkout into a venv of its own, for
# side-by-side benchmarks (bench/versus.py):
#     git worktree add /tmp/old COMMIT
#     scripts/venv-of.sh /tmp/old /tmp/oldvenv
# The venv is a copy of this checkout's .venv (the same dependencies, no
# network needed) whose scripts are pointed at the copy: a copied venv's
# scripts still name the original's python, and `pip install` through them
# would replace the llft of the original instead.
set -eu
src=$(cd "$1" && pwd)
dest=$2
here=$(cd "$(dirname "$0")/.." && pwd)
[ -x "$here/.venv/bin/python" ] || { echo "venv-of: $here/.venv is missing: run scripts/setup.sh" >&2; exit 2; }
rm -rf "$dest"
cp -a "$here/.venv" "$dest"
dest=$(cd "$dest" && pwd)
for f in "$dest"/bin/*; do
    [ -f "$f" ] && [ ! -L "$f" ] || continue
    if head -c 2 "$f" | grep -q '^#!'; then
        sed -i "1s|^#!$here/.venv/bin/|#!$dest/bin/|" "$f"
    fi
done
sed -i "s|$here/.venv|$dest|g" "$dest/pyvenv.cfg" "$dest/bin/activate" 2>/dev/null || true
(cd "$src" && "$dest/bin/python" -m pip install -q .)
where=$(cd / && "$dest/bin/python" -c 'import llft; print(llft.__file__)')
case "$where" in
    "$dest"/*) echo "venv-of: $src installed in $dest" ;;
    *) echo "venv-of: llft in $dest resolves to $where, not the copy" >&2; exit 1 ;;
esac
