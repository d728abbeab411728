"""llft-gateway: the TCP front door of a group whose members run on several
hosts (`llft-run --join`)."""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys
import time
from pathlib import Path

from llft import rundir
from llft.auth import generate_key_file
from llft.cli.cluster_options import add_network_options, network_settings, run_until_signal
from llft.cli.common import LOG_LEVELS, Parser, UsageError, fail, reader_may_stop, setup_logging
from llft.cluster.datagrams import GatewayDatagrams, parse_port_map
from llft.cluster.gateway import ClusterGateway
from llft.cluster.gateway_outgoing import GatewayOutgoing
from llft.cluster.naming import gateway_group_name, group_id
from llft.ordering.group import open_gateway

PROG = "llft-gateway"
log = logging.getLogger("llft.gateway")

DESCRIPTION = """\
Serve TCP clients on PORT for the replica group NAME, whose members were
started on their hosts with `llft-run --group NAME --join -- PROGRAM ...`.
Each client connection becomes a virtual connection to the group: its bytes
go to every member, the primary's replies come back, once.  Runs until
Ctrl-C or SIGTERM; `llft-status --run-dir DIR` shows its connections and
dropped datagrams."""


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog=PROG, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--group", metavar="NAME", help="the group to serve (as given to llft-run --group)")
    p.add_argument("--port", type=int, metavar="PORT", help="TCP port for clients")
    p.add_argument("--program-port", type=int, metavar="PORT",
                   help="the port the program listens on, if not PORT (several gateways may serve one group's "
                        "TCP port at once, each on a port of its own)")
    p.add_argument("--udp-port", action="append", default=[], metavar="[PROG:]PUBLIC",
                   help="also serve UDP clients on PUBLIC for the program's UDP port PROG (default PUBLIC); "
                        "repeatable")
    p.add_argument("--outgoing", action="store_true",
                   help="make the program's outgoing connections (its connect()s), and send its datagrams from "
                        "UDP sockets it never bound (a resolver's), on the group's behalf; "
                        "where several gateways offer to, the group's primary picks one")
    p.add_argument("--host", default="0.0.0.0", metavar="ADDR", help="address to listen on (default all)")
    p.add_argument("--run-dir", type=Path, metavar="DIR",
                   help="where the log and state go (default ./llft-runs/gateway-NAME-TIME-PID)")
    p.add_argument("--make-key", metavar="FILE", help="write a new group key to FILE (mode 0600) and exit")
    p.add_argument("--log-level", choices=LOG_LEVELS, default="warning")
    add_network_options(p)
    return p


def parse(argv) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    if args.make_key:
        return args
    if not args.group:
        raise UsageError("--group NAME is required")
    if args.port is None or not 0 < args.port < 65536:
        raise UsageError("--port PORT (1-65535) is required")
    args.program_port = args.program_port or args.port
    if not 0 < args.program_port < 65536:
        raise UsageError(f"--program-port {args.program_port}: out of range")
    try:
        args.udp_ports = [parse_port_map(s) for s in args.udp_port]
    except ValueError as e:
        raise UsageError(f"--udp-port {e}") from None
    args.key = network_settings(args)
    return args


class GatewayProcess:
    def __init__(self, args, run_dir: Path):
        self.args, self.run_dir = args, run_dir
        self.stop = asyncio.Event()
        self.gateway: ClusterGateway | None = None

    async def run(self) -> int:
        a = self.args
        loop = asyncio.get_running_loop()
        server_gid = group_id(a.group)
        gid = group_id(gateway_group_name(a.group, a.port, f"{socket.gethostname()}/{os.getpid()}"))
        if gid == server_gid:
            gid ^= 0x8000
        ep = await open_gateway("llft", gid, server_gid, a.group_port, a.interface, loop, a.key)
        self.gid = gid
        self.gateway = ClusterGateway(ep, server_gid, a.program_port)
        try:
            server = await self.gateway.serve(a.host, a.port)
        except OSError as e:
            raise UsageError(f"cannot listen on {a.host} port {a.port}: {e.strerror}") from None
        if a.udp_ports:
            self.gateway.udp = GatewayDatagrams(ep, server_gid, a.udp_ports)
            try:
                await self.gateway.udp.serve(a.host)
            except OSError as e:
                server.close()
                raise UsageError(e.strerror) from None
        if a.outgoing:
            self.gateway.outgoing = GatewayOutgoing(self.gateway)
            await self.gateway.outgoing.start()
        log.warning("serving clients of group %s (id %d) on %s port %d", a.group, server_gid, a.host, a.port)
        try:
            while not self.stop.is_set():
                self.write_state("running")
                try:
                    await asyncio.wait_for(self.stop.wait(), 1.0)
                except asyncio.TimeoutError:
                    pass
        finally:
            server.close()
            if self.gateway.udp is not None:
                self.gateway.udp.close()
            if self.gateway.outgoing is not None:
                self.gateway.outgoing.close()
            await self.gateway.close()
            self.write_state("finished")
            ep.close()
        return 0

    def write_state(self, phase: str):
        g = self.gateway
        rundir.write_state(self.run_dir, {
            "group": self.args.group, "group_id": self.gid, "phase": phase, "controller_pid": os.getpid(),
            "argv": sys.argv, "members": [], "replicas": [], "updated": time.time(),
            "gateway": dict(g.stats, failovers=0, errors=[], udp=g.udp.stats if g.udp else {},
                            outgoing=g.outgoing.stats if g.outgoing else {}),
            "messaging": g.ep.stats(),
        })


@reader_may_stop
def main(argv=None) -> int:
    try:
        args = parse(sys.argv[1:] if argv is None else argv)
        if args.make_key:
            generate_key_file(args.make_key)
            print(f"{PROG}: wrote a new group key to {args.make_key}")
            return 0
        run_dir = rundir.prepare(args.run_dir or rundir.default_run_dir(f"gateway-{args.group}"), 0)
    except (UsageError, rundir.RunDirError) as e:
        return fail(PROG, str(e))
    except OSError as e:
        return fail(PROG, f"cannot write {args.make_key}: {e.strerror}")
    setup_logging(args.log_level, run_dir / "llft.log")
    proc = GatewayProcess(args, run_dir)
    try:
        return run_until_signal(proc.run, lambda sig: proc.stop.set())
    except UsageError as e:
        return fail(PROG, str(e), 1)


if __name__ == "__main__":
    sys.exit(main())
