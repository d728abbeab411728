"""Programs llft cannot replicate are refused in one line that names why,
and nothing of theirs is served unreplicated: a statically linked server
(no dynamic loader, so no preload library), a Go server (Debian's
webhook: Go's runtime makes its system calls itself), either one started
through a shell that execs it, and a C server that makes its socket calls
with the syscall instruction (as Go does), which only shows once it runs:
its primary holds the real port, and llft-run stops the group."""
from __future__ import annotations

import shutil
import socket
import subprocess

import pytest

from conftest import tool
from serving import free_port


def llft_run(tmp_path, *argv, timeout=60):
    return subprocess.run([tool("llft-run"), "--replicas", "3", "--run-dir", str(tmp_path / "rd"), "--", *argv],
                          capture_output=True, text=True, timeout=timeout)


def refused_at_start(p):
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert p.stderr.count("\n") == 1 and "cannot replicate it" in p.stderr, p.stderr


def test_statically_linked_server_is_refused_at_start(examples, tmp_path):
    p = llft_run(tmp_path, examples / "static_echo_server", str(free_port()))
    refused_at_start(p)
    assert "statically linked" in p.stderr


@pytest.mark.skipif(not shutil.which("webhook"), reason="webhook not installed (scripts/setup.sh installs it)")
def test_go_server_is_refused_at_start(tmp_path):
    p = llft_run(tmp_path, "webhook", "-port", str(free_port()))
    refused_at_start(p)
    assert "is a Go program" in p.stderr


@pytest.mark.parametrize("image", ["static_echo_server", "webhook"])
def test_a_shell_that_execs_an_unreachable_image_is_stopped_there(image, examples, tmp_path):
    path = examples / image if image.startswith("static") else shutil.which(image)
    if path is None:
        pytest.skip(f"{image} not installed (scripts/setup.sh installs it)")
    port = free_port()
    args = f"{port}" if image.startswith("static") else f"-port {port}"
    p = llft_run(tmp_path, "/bin/sh", "-c", f"echo starting; exec {path} {args}")
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert f"cannot replicate the program: the program execs {path}" in p.stderr, p.stderr
    assert (tmp_path / "rd" / "replica-0" / "stdout").read_text() == "starting\n"
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_server_making_raw_socket_calls_is_stopped_once_it_listens(examples, tmp_path):
    port = free_port()
    p = llft_run(tmp_path, examples / "raw_syscall_server", str(port))
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert f"replica 0 (pid" in p.stderr and f"holds TCP 127.0.0.1:{port} itself" in p.stderr, p.stderr
    assert "the group was stopped" in p.stderr
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
