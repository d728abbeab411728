"""cffi build script for llft._dataplane: the controller's native data plane
(native/dataplane.c), the byte path of client connections on one host.  It
is linked with libcrypto (SHA-256) and loaded only by the controller, never
into the replicated program."""
from cffi import FFI

ffibuilder = FFI()
ffibuilder.cdef("""
    typedef struct llft_dp llft_dp_t;
    typedef struct {
        uint64_t connections; uint64_t bytes_in; uint64_t bytes_out; uint64_t open_clients;
    } llft_dp_stats_t;

    llft_dp_t *llft_dp_new(const char *input_dir, uint64_t queue_limit);
    int llft_dp_start(llft_dp_t *dp);
    void llft_dp_stop(llft_dp_t *dp);
    void llft_dp_free(llft_dp_t *dp);
    int llft_dp_add_replica(llft_dp_t *dp, int pid, int pidfd, const char *log_dir);
    void llft_dp_remove_replica(llft_dp_t *dp, int slot);
    void llft_dp_set_primary(llft_dp_t *dp, int slot);
    int llft_dp_open_conn(llft_dp_t *dp, uint64_t conn_id, int client_fd);
    int llft_dp_attach(llft_dp_t *dp, int slot, uint64_t conn_id, int fd);
    long llft_dp_summary(llft_dp_t *dp, int slot, char *out, long cap);
    int llft_dp_open_legs(llft_dp_t *dp, int slot);
    void llft_dp_close_clients(llft_dp_t *dp);
    void llft_dp_stats(llft_dp_t *dp, llft_dp_stats_t *out);
""")
ffibuilder.set_source(
    "llft._dataplane",
    '#include "dataplane.h"\n',
    sources=["native/dataplane.c"],
    include_dirs=["native"],
    libraries=["crypto", "pthread"],
    extra_compile_args=["-O2", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Werror"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
