"""Clients whose every answer can be checked: each client works on a
counter of its own (or, for the line servers, on the server's one global
counter), one request at a time, and keeps what it was answered.

An operation is acknowledged when its reply arrives; an acknowledged
operation must have been applied exactly once, in order.  Every client
also reads the group's clock now and then, which must never go back."""
from __future__ import annotations

import socket


class ProtocolError(Exception):
    """The server answered something this protocol never answers."""


class Connection:
    def __init__(self, host: str, port: int, timeout: float):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.f = self.sock.makefile("rwb")

    def ask(self, line: bytes) -> bytes:
        self.f.write(line)
        self.f.flush()
        reply = self.f.readline()
        if not reply:
            raise ConnectionError("the server closed the connection")
        return reply

    def close(self):
        try:
            self.f.close()
            self.sock.close()
        except OSError:
            pass


class LineProtocol:
    """examples/lineproto.h: "<text>" -> "<n> <text>" with n the server's
    global count; "TIME" -> "TIME sec.usec"."""
    name = "line"
    global_count = True

    def __init__(self, client: int):
        self.client = client

    def op(self, conn: Connection, k: int) -> int:
        text = f"c{self.client}-{k}"
        reply = conn.ask(text.encode() + b"\n").decode().rstrip("\n")
        count, _, echoed = reply.partition(" ")
        if echoed != text or not count.isdigit():
            raise ProtocolError(f"asked {text!r}, answered {reply!r}")
        return int(count)

    def clock(self, conn: Connection) -> float:
        reply = conn.ask(b"TIME\n").decode().split()
        if len(reply) != 2 or reply[0] != "TIME":
            raise ProtocolError(f"TIME answered {reply!r}")
        return float(reply[1])

    def shutdown(self, conn: Connection):
        conn.ask(b"SHUTDOWN\n")


class KvProtocol(LineProtocol):
    """examples/kv_server.c: "INCR key" -> "VALUE n"."""
    name = "kv"
    global_count = False

    def op(self, conn: Connection, k: int) -> int:
        reply = conn.ask(f"INCR nemesis-{self.client}\n".encode()).decode().split()
        if len(reply) != 2 or reply[0] != "VALUE":
            raise ProtocolError(f"INCR answered {reply!r}")
        return int(reply[1])


def _resp(*args: str) -> bytes:
    return b"".join([f"*{len(args)}\r\n".encode()] + [f"${len(a)}\r\n{a}\r\n".encode() for a in args])


class RedisProtocol:
    name = "redis"
    global_count = False

    def __init__(self, client: int):
        self.client = client

    def _reply(self, conn: Connection):
        line = conn.f.readline()
        if not line:
            raise ConnectionError("the server closed the connection")
        kind, rest = line[:1], line[1:].rstrip(b"\r\n")
        if kind == b":":
            return int(rest)
        if kind in (b"+", b"-"):
            return rest.decode()
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else conn.f.read(n + 2)[:-2].decode()
        if kind == b"*":
            return [self._reply(conn) for _ in range(int(rest))]
        raise ProtocolError(f"answered {line!r}")

    def _ask(self, conn: Connection, *args: str):
        conn.f.write(_resp(*args))
        conn.f.flush()
        return self._reply(conn)

    def op(self, conn: Connection, k: int) -> int:
        v = self._ask(conn, "INCR", f"nemesis-{self.client}")
        if not isinstance(v, int):
            raise ProtocolError(f"INCR answered {v!r}")
        return v

    def clock(self, conn: Connection) -> float:
        v = self._ask(conn, "TIME")
        if not isinstance(v, list) or len(v) != 2:
            raise ProtocolError(f"TIME answered {v!r}")
        return int(v[0]) + int(v[1]) / 1e6

    def shutdown(self, conn: Connection):
        conn.f.write(_resp("SHUTDOWN", "NOSAVE"))
        conn.f.flush()


class MemcachedProtocol:
    """memcached's text protocol; the clock is not exposed (stats' time is
    in whole seconds): none is read."""
    name = "memcached"
    global_count = False

    def __init__(self, client: int):
        self.client = client
        self.started = False

    def op(self, conn: Connection, k: int) -> int:
        key = f"nemesis-{self.client}"
        if not self.started:
            conn.f.write(f"add {key} 0 0 1\r\n0\r\n".encode())
            conn.f.flush()
            reply = conn.f.readline()
            if reply not in (b"STORED\r\n", b"NOT_STORED\r\n"):
                raise ProtocolError(f"add answered {reply!r}")
            self.started = True
        reply = conn.ask(f"incr {key} 1\r\n".encode()).strip()
        if not reply.isdigit():
            raise ProtocolError(f"incr answered {reply!r}")
        return int(reply)

    clock = None

    def shutdown(self, conn: Connection):
        conn.f.write(b"shutdown\r\n")
        conn.f.flush()


class HttpProtocol:
    """llft/nemesis/http_counter.py: GET /incr/NAME -> "<n>", GET /time ->
    "<sec.usec>", over one keep-alive connection per client."""
    name = "http"
    global_count = False

    def __init__(self, client: int):
        self.client = client

    def _get(self, conn: Connection, path: str) -> str:
        conn.f.write(f"GET {path} HTTP/1.1\r\nHost: nemesis\r\n\r\n".encode())
        conn.f.flush()
        status = conn.f.readline().split()
        if not status:
            raise ConnectionError("the server closed the connection")
        length = 0
        while (line := conn.f.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        body = conn.f.read(length).decode()
        if len(status) < 2 or status[1] != b"200":
            raise ProtocolError(f"GET {path}: {status!r} {body!r}")
        return body

    def op(self, conn: Connection, k: int) -> int:
        body = self._get(conn, f"/incr/{self.client}")
        if not body.strip().isdigit():
            raise ProtocolError(f"/incr answered {body!r}")
        return int(body)

    def clock(self, conn: Connection) -> float:
        return float(self._get(conn, "/time"))

    def shutdown(self, conn: Connection):
        conn.f.write(b"GET /shutdown HTTP/1.1\r\nHost: nemesis\r\n\r\n")
        conn.f.flush()


PROTOCOLS = {p.name: p for p in (LineProtocol, KvProtocol, RedisProtocol, MemcachedProtocol, HttpProtocol)}
