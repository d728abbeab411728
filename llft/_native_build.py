"""cffi build script for llft._native: the ring and OrderInfo codec of
native/ring.c, seen from Python (the controller and the tests)."""
from cffi import FFI

ffibuilder = FFI()
ffibuilder.cdef("""
    #define LLFT_ABI_VERSION ...
    #define LLFT_REC_SIZE ...
    #define LLFT_DATA_BYTES ...
    #define LLFT_MAX_GROUP ...
    #define LLFT_NCLOCKS ...
    #define LLFT_CTL_BYTES ...
    #define LLFT_RING_HDR ...
    #define LLFT_EXIT_DIVERGED ...
    #define LLFT_EXIT_NOSTREAM ...
    #define LLFT_EXIT_UNREACHABLE ...
    #define LLFT_REC_OK ...
    #define LLFT_REC_PENDING ...
    #define LLFT_REC_CORRUPT ...
    #define LLFT_REC_BADFIELD ...
    enum llft_role { LLFT_ROLE_OFF, LLFT_ROLE_PRIMARY, LLFT_ROLE_BACKUP, LLFT_ROLE_COPY, LLFT_ROLE_DEMOTING, ... };
    enum llft_op { LLFT_OP_NONE, LLFT_OP_DATA, LLFT_OP_END, LLFT_OP_PROMOTE, LLFT_OP_MAX, ... };

    typedef struct {
        uint64_t seq; uint32_t check; uint16_t op; uint16_t nslots;
        uint32_t tid; uint32_t tn; uint64_t obj; uint64_t turn;
        int64_t ret; int32_t err; uint32_t aux; int64_t val;
    } llft_rec_t;
    typedef struct {
        uint64_t seq; uint32_t check; uint16_t op; uint16_t len; uint8_t bytes[48];
    } llft_data_t;
    typedef struct { uint64_t capacity; uint64_t head; uint64_t tail; uint32_t closed; ...; } llft_ring_t;
    typedef struct {
        uint64_t conn_id; uint16_t family; uint16_t port; uint32_t _pad; uint8_t addr[16];
    } llft_conn_header_t;
    typedef struct {
        uint64_t conn_id; uint16_t family; uint16_t port; uint32_t flags; uint8_t addr[16];
    } llft_connect_request_t;
    typedef struct {
        uint64_t conn_id; int32_t err; uint16_t family; uint16_t port; uint8_t addr[16];
    } llft_connect_reply_t;
    #define LLFT_CONNECT_ASK ...
    #define LLFT_LISTENER_ANY_PORT ...
    #define LLFT_MAX_LISTENERS ...
    typedef struct { uint32_t state; uint16_t port; uint16_t family; uint32_t type; uint32_t gen; uint8_t addr[16]; } llft_listener_t;
    typedef struct {
        uint32_t kind; uint16_t port; uint16_t family; uint32_t type; uint8_t addr[16]; uint32_t _pad;
    } llft_channel_msg_t;
    enum llft_channel_kind { LLFT_CHAN_LISTEN, LLFT_CHAN_DGRAM, LLFT_CHAN_CONNECT, LLFT_CHAN_STREAM, LLFT_CHAN_INBOX,
                             LLFT_CHAN_PORT, ... };
    #define LLFT_EPHEMERAL_FIRST ...
    #define LLFT_EPHEMERAL_COUNT ...
    #define LLFT_EPHEMERAL_OWN ...
    typedef struct {
        uint32_t role; int32_t attached_pid; uint32_t replica; uint64_t records; uint64_t threads;
        uint32_t quiesce; uint32_t stopping; uint64_t q_census;
        uint32_t stall_timeout_ms; uint32_t end_grace_ms; uint64_t promoted_ns;
        int64_t clock_offset_ns[16]; int64_t clock_last_ns[16];
        uint32_t diverged; uint32_t div_tid; uint32_t div_tn; uint16_t div_want_op; uint16_t div_got_op;
        char div_text[512];
        uint32_t nlisteners;
        llft_listener_t listeners[16];
        uint32_t stopped_for_good;
        char div_where[1536];
        uint32_t refused;
        uint32_t serial_steals;
        char div_before[768];
        uint64_t stream_id; uint64_t parent_stream; uint32_t forks; uint32_t fork_mode; int32_t waited_for;
        char shared_memory[96];
        ...;
    } llft_ctl_t;
    enum llft_fork_mode { LLFT_FORKS_UNRECORDED, LLFT_FORKS_REPLICATED, ... };
    #define LLFT_CHILD_SLOTS ...

    uint64_t llft_shm_bytes(uint64_t slots);
    int llft_shm_format(void *base, uint64_t mapped, uint64_t slots, uint32_t role, uint32_t replica);
    int llft_shm_check(const void *base, uint64_t mapped);
    llft_ctl_t *llft_shm_ctl(void *base);
    llft_ring_t *llft_shm_ring(void *base);

    uint32_t llft_rec_check(const void *slot);
    void llft_rec_seal(void *slot);
    int llft_rec_validate(const void *slot, uint64_t expected_seq);
    int llft_rec_check_fields(const void *slot);
    long llft_count_groups(const void *slots, long n);
    long llft_scan_accepts(const void *slots, long n, uint64_t *ids, long max);
    int llft_op_valid(int op);
    const char *llft_op_name(int op);
    uint32_t llft_data_slots(uint64_t nbytes);

    uint64_t llft_ring_reserve(llft_ring_t *r, uint32_t n, uint64_t *cached_tail);
    void *llft_ring_slot(llft_ring_t *r, uint64_t pos);
    void llft_ring_commit(void *slot, uint64_t pos);
    long llft_ring_write(llft_ring_t *r, const void *slots, long n, int timeout_ms);
    int llft_ring_write_end(llft_ring_t *r, int status, int timeout_ms);
    int llft_ring_write_control(llft_ring_t *r, int op, int ret, int timeout_ms);
    long llft_ring_read(llft_ring_t *r, void *out, long max_slots);
    int llft_ring_wait_data(llft_ring_t *r, int timeout_ms);
    void llft_ring_wake(llft_ring_t *r);
    uint64_t llft_ring_head(const llft_ring_t *r);
    uint64_t llft_ring_tail(const llft_ring_t *r);
    int llft_listeners_read(const llft_ctl_t *c, uint32_t type, llft_listener_t *out, int max);
    int llft_listener_publish(llft_ctl_t *c, uint16_t port, uint16_t family, uint32_t type, const char *name);
    void llft_listener_close(llft_ctl_t *c, uint16_t port, uint16_t family, uint32_t socktype);

    int llft_disable_aslr(void);
    int llft_die_with_parent(int parent);
    int llft_private_files(const char *plan);
    int llft_become_subreaper(void);
    int llft_ignore_census_signals(void);
    int llft_quiesce_hold(llft_ctl_t *c, int pid, int timeout_ms, int *threads);
    void llft_quiesce_release(llft_ctl_t *c);
""")
ffibuilder.set_source(
    "llft._native",
    '#include "ring.h"\n#include "listeners.h"\nint llft_disable_aslr(void);\nint llft_die_with_parent(int parent);\n'
    'int llft_private_files(const char *plan);\nint llft_become_subreaper(void);\n'
    'int llft_ignore_census_signals(void);\n'
    'int llft_quiesce_hold(llft_ctl_t *c, int pid, int timeout_ms, int *threads);\n'
    'void llft_quiesce_release(llft_ctl_t *c);\n',
    sources=["native/ring.c", "native/spawn.c", "native/listeners.c", "native/private_files.c",
             "native/quiesce_hold.c"],
    include_dirs=["native"],
    extra_compile_args=["-O2", "-D_GNU_SOURCE"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
