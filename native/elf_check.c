/* Whether the preload library could reach the program an exec would
 * start: the same judgement as llft/program_kind.py makes before the
 * first image, made again at each exec.  A statically linked image never
 * loads the library; a Go image makes its system calls itself.  Either
 * would run unrecorded at every replica, its primary serving clients
 * around the gateway.  Raw system calls only: this runs inside execve's
 * wrapper. */
#include "shim.h"

#include <elf.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static long pread_all(int fd, void *buf, size_t n, off_t off)
{
    return syscall(SYS_pread64, fd, buf, n, off);
}

/* 1 if names (NUL-separated) holds one of Go's section names. */
static int has_go_section(const char *names, size_t n)
{
    static const char *const go[] = {".go.buildinfo", ".note.go.buildid", ".gopclntab"};
    for (size_t i = 0; i < n; i += strnlen(names + i, n - i) + 1)
        for (size_t k = 0; k < sizeof go / sizeof go[0]; k++)
            if (strncmp(names + i, go[k], n - i) == 0)
                return 1;
    return 0;
}

static const char *judge_fd(int fd)
{
    Elf64_Ehdr eh;
    char head[2];
    if (pread_all(fd, head, 2, 0) == 2 && head[0] == '#' && head[1] == '!')
        return NULL; /* a script: its interpreter's exec is judged when it comes */
    if (pread_all(fd, &eh, sizeof eh, 0) != (long)sizeof eh || memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 ||
        eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_phentsize != sizeof(Elf64_Phdr))
        return NULL;
    int dynamic = 0;
    for (unsigned i = 0; i < eh.e_phnum; i++) {
        Elf64_Phdr ph;
        if (pread_all(fd, &ph, sizeof ph, (off_t)(eh.e_phoff + i * sizeof ph)) != (long)sizeof ph)
            return NULL;
        if (ph.p_type == PT_INTERP)
            dynamic = 1;
    }
    if (eh.e_shentsize == sizeof(Elf64_Shdr) && eh.e_shstrndx < eh.e_shnum) {
        Elf64_Shdr names;
        char buf[4096];
        if (pread_all(fd, &names, sizeof names, (off_t)(eh.e_shoff + eh.e_shstrndx * sizeof names)) ==
            (long)sizeof names) {
            size_t n = names.sh_size < sizeof buf ? names.sh_size : sizeof buf;
            long got = pread_all(fd, buf, n, (off_t)names.sh_offset);
            if (got > 0 && has_go_section(buf, (size_t)got))
                return "a Go program: Go's runtime makes its system calls itself, not through the C library "
                       "llft's preload library interposes on";
        }
    }
    if (!dynamic)
        return "statically linked: without a dynamic loader the preload library never loads into it";
    return NULL;
}

/* The file execvp would run for name: name itself when it holds a '/',
 * else the first executable one on PATH.  Into buf; 0 or -1. */
static int find_on_path(const char *name, char *buf, size_t cap)
{
    if (strchr(name, '/')) {
        if (strlen(name) >= cap)
            return -1;
        strcpy(buf, name);
        return 0;
    }
    const char *path = getenv("PATH");
    if (!path)
        path = "/usr/local/bin:/usr/bin:/bin";
    size_t nlen = strlen(name);
    for (const char *p = path; *p;) {
        const char *end = strchr(p, ':');
        size_t dlen = end ? (size_t)(end - p) : strlen(p);
        if (dlen + 1 + nlen < cap) {
            memcpy(buf, dlen ? p : ".", dlen ? dlen : 1);
            size_t at = dlen ? dlen : 1;
            buf[at] = '/';
            memcpy(buf + at + 1, name, nlen + 1);
            if (syscall(SYS_faccessat, AT_FDCWD, buf, X_OK) == 0)
                return 0;
        }
        if (!end)
            break;
        p = end + 1;
    }
    return -1;
}

const char *llft_exec_unreachable(const char *name, int search, int fd)
{
    if (fd >= 0)
        return judge_fd(fd);
    char path[4096];
    if (search ? find_on_path(name, path, sizeof path) != 0 : strlen(name) >= sizeof path)
        return NULL; /* the exec fails as it would have */
    if (!search)
        strcpy(path, name);
    int f = (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
    if (f < 0)
        return NULL;
    const char *why = judge_fd(f);
    syscall(SYS_close, f);
    return why;
}
