"""Builds llft: the LD_PRELOAD interposition library (native/ -> llft/libllft.so)
the cffi module llft._native that gives Python the same ring and codec, and
llft._dataplane, the controller's native data plane (native/dataplane.c)."""
import os

from setuptools import setup
from setuptools.command.build_ext import build_ext

# The preload library: every native/*.c except the controller-only helpers
# (spawn.c, dataplane.c).
PRELOAD_SOURCES = [
    "native/core.c",
    "native/record.c",
    "native/replay.c",
    "native/replay_queues.c",
    "native/replay_end.c",
    "native/turnstile.c",
    "native/wait_order.c",
    "native/objtable.c",
    "native/ring.c",
    "native/wrap_time.c",
    "native/wrap_thread.c",
    "native/python_gil.c",
    "native/wrap_dlsym.c",
    "native/wrap_lock.c",
    "native/wrap_random.c",
    "native/wrap_open.c",
    "native/wrap_exec.c",
    "native/wrap_fork.c",
    "native/elf_check.c",
    "native/fdtable.c",
    "native/channel.c",
    "native/wrap_fd.c",
    "native/wrap_socket.c",
    "native/listeners.c",
    "native/wrap_connect.c",
    "native/wrap_udp.c",
    "native/wrap_io.c",
    "native/wrap_poll.c",
    "native/wrap_process.c",
    "native/serialize.c",
    "native/wrap_syscall.c",
    "native/daemon_fork.c",
    "native/fork_stream.c",
    "native/replica_lease.c",
    "native/blocked_threads.c",
    "native/wrap_wait.c",
    "native/fd_passing.c",
    "native/wrap_signal.c",
    "native/quiesce.c",
    "native/demote.c",
]
# -Dsyscall=llft_raw_syscall: the library exports syscall() to see the
# program's own raw calls (wrap_syscall.c); its own go straight to the kernel.
PRELOAD_CFLAGS = ["-O2", "-g", "-fPIC", "-fvisibility=hidden", "-D_GNU_SOURCE", "-Dsyscall=llft_raw_syscall",
                  "-Wall", "-Wextra", "-Wno-unused-parameter", "-Werror"]


class BuildExtWithPreload(build_ext):
    """Also links native/ into llft/libllft.so, a plain shared library with no
    Python in it: it is loaded into the replicated program, not into Python."""

    def run(self):
        super().run()
        self.build_preload()

    def build_preload(self):
        from setuptools._distutils.ccompiler import new_compiler
        from setuptools._distutils.sysconfig import customize_compiler

        cc = new_compiler()
        customize_compiler(cc)
        cc.compiler_so = [a for a in cc.compiler_so if a not in ("-O3", "-DNDEBUG")]
        tmp = os.path.join(self.build_temp, "preload")
        objects = cc.compile(PRELOAD_SOURCES, output_dir=tmp, extra_preargs=PRELOAD_CFLAGS,
                             depends=["native/llft_abi.h", "native/ring.h", "native/shim.h", "native/fdtable.h", "native/atomics.h",
                                      "native/listeners.h", "native/channel.h", "native/replay_queues.h"])
        out_dir = "llft" if self.inplace else os.path.join(self.build_lib, "llft")
        cc.link_shared_object(objects, os.path.join(out_dir, "libllft.so"),
                              libraries=["dl", "pthread"], extra_postargs=["-Wl,-z,now"])


setup(
    cffi_modules=["llft/_native_build.py:ffibuilder", "llft/_dataplane_build.py:ffibuilder"],
    cmdclass={"build_ext": BuildExtWithPreload},
)
