"""Options shared by `llft-run --join` and `llft-gateway`: where the group's
traffic goes and the secret that authenticates it."""
from __future__ import annotations

import argparse
import asyncio
import signal

from llft.auth import KeyFileError, load_key
from llft.cli.common import UsageError
from llft.transport import DEFAULT_PORT, new_event_loop


def add_network_options(p: argparse.ArgumentParser):
    g = p.add_argument_group("groups across hosts (messaging protocol over UDP multicast)")
    g.add_argument("--key-file", metavar="FILE",
                   help="the group's shared secret (hex, mode 0600); every member and gateway of the group "
                        "needs the same one; make one with: llft-gateway --make-key FILE")
    g.add_argument("--interface", metavar="IP", default="0.0.0.0",
                   help="address of the interface the group's multicast traffic uses (default: by route)")
    g.add_argument("--group-port", type=int, default=DEFAULT_PORT, metavar="PORT",
                   help=f"UDP port of the group's traffic, the same on every host (default {DEFAULT_PORT})")


def network_settings(args) -> bytes:
    """The key, checked; UsageError with a one-line reason."""
    if not args.key_file:
        raise UsageError("a group across hosts needs --key-file FILE, the same secret on every host "
                         "(make one with: llft-gateway --make-key FILE)")
    if not 0 < args.group_port < 65536:
        raise UsageError(f"--group-port {args.group_port}: out of range")
    try:
        return load_key(args.key_file)
    except KeyFileError as e:
        raise UsageError(str(e)) from None


def run_until_signal(make_coro, on_signal) -> int:
    """Runs the coroutine on a fresh (uv)loop; SIGINT/SIGTERM call on_signal(sig)."""
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        return loop.run_until_complete(make_coro())
    finally:
        loop.close()
