"""cffi build script for llft._dataplane: the controller's native data plane
(native/dataplane.c), the byte path of client connections on one host.  It
is linked with libcrypto (SHA-256) and loaded only by the controller, never
into the replicated program."""
from pathlib import Path

from cffi import FFI

HEADER = Path(__file__).resolve().parent.parent / "native" / "dataplane.h"

ffibuilder = FFI()
# The header is the one declaration of the API: cffi reads it without the
# preprocessor lines (cffi drops the comments itself).
ffibuilder.cdef("\n".join(line for line in HEADER.read_text().splitlines() if not line.startswith("#")))
ffibuilder.set_source(
    "llft._dataplane",
    '#include "dataplane.h"\n',
    sources=["native/dataplane.c", "native/dataplane_bytes.c", "native/dataplane_client.c",
             "native/dataplane_legs.c", "native/dataplane_clone.c", "native/dataplane_replicas.c", "native/idmap.c"],
    include_dirs=["native"],
    libraries=["crypto", "pthread"],
    extra_compile_args=["-O2", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Werror"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
