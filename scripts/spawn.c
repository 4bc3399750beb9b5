/* How a helper per replica could start a command: each way of starting `/bin/sh -c CMD` and
 * reaping it, from one small single-threaded process (a helper's shape), interleaved: each
 * round runs every way once, in a random order. Prints per way: median and p10-p90 of the wall
 * time from the start to the reap (ms), and the mean CPU (user + system, ms) of the process and
 * its reaped children per start, as measured by getrusage.
 *   posix_spawn     the floor: glibc's posix_spawn (a vfork-like clone), no cgroup
 *   fork            fork + execve
 *   fork+cgroup     a cgroup made per start (mkdir), the child joins it (cgroup.procs) before
 *                   its execve, removed (rmdir) after the reap: how a run's guard does it today
 *   clone3+new      clone3(CLONE_INTO_CGROUP) into a cgroup made per start, removed after
 *   clone3+pool     clone3(CLONE_INTO_CGROUP) into a cgroup made once and reused (empty again
 *                   once its command is reaped)
 *   vfork3+pool     clone3(CLONE_VM | CLONE_VFORK | CLONE_INTO_CGROUP) into the pooled cgroup:
 *                   the child shares the parent's memory until its execve (no page tables copied)
 * Usage: spawn ROUNDS CGROUP_PARENT CMD [MIB]
 *   CGROUP_PARENT: a writable cgroup v2 directory (the cgroups are made inside it)
 *   MIB: memory the process touches before it starts anything (a helper's heap), default 0
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/sched.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

enum { POSIX_SPAWN, FORK, FORK_CGROUP, CLONE3_NEW, CLONE3_POOL, VFORK3_POOL, WAYS };
static const char *names[WAYS] = {"posix_spawn", "fork", "fork+cgroup", "clone3+new",
                                  "clone3+pool", "vfork3+pool"};

static char *argv_sh[4];
static const char *parent_dir;
static int pool_fd = -1;
static unsigned long made = 0;

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static double cpu_ms(void) {
    struct rusage s, c;
    getrusage(RUSAGE_SELF, &s);
    getrusage(RUSAGE_CHILDREN, &c);
    return (s.ru_utime.tv_sec + c.ru_utime.tv_sec + s.ru_stime.tv_sec + c.ru_stime.tv_sec) * 1e3 +
           (s.ru_utime.tv_usec + c.ru_utime.tv_usec + s.ru_stime.tv_usec + c.ru_stime.tv_usec) / 1e3;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void die(const char *what) {
    perror(what);
    exit(2);
}

static long clone3(struct clone_args *args) {
    return syscall(SYS_clone3, args, sizeof *args);
}

static void new_cgroup(char *path, size_t len) {
    snprintf(path, len, "%s/spawn-%d-%lu", parent_dir, getpid(), made++);
    if (mkdir(path, 0755) != 0) die(path);
}

static void wait_for(pid_t pid) {
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) die("waitpid");
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "spawn: the command failed (status %d)\n", status);
        exit(2);
    }
}

/* The child of the clone3 ways: straight to the command. */
static void exec_child(void) {
    execve(argv_sh[0], argv_sh, environ);
    _exit(127);
}

/* A child that shares the parent's memory runs on a stack of its own until its execve: the
 * clone3 call is made here in assembly, so that the child never returns into a frame of the
 * parent's (the parent's stack is left as it was while it waits). x86-64 only. */
static char vfork_stack[64 * 1024] __attribute__((aligned(16)));

static void __attribute__((noreturn, used)) vfork_child(void) {
    exec_child();
    _exit(127);
}

static long clone3_vfork(struct clone_args *args) {
    register long rax __asm__("rax") = SYS_clone3;
    register long rdi __asm__("rdi") = (long)args;
    register long rsi __asm__("rsi") = (long)sizeof *args;
    __asm__ volatile("syscall\n\t"
                     "test %%rax, %%rax\n\t"
                     "jnz 1f\n\t"
                     "call vfork_child\n\t"
                     "1:\n\t"
                     : "+r"(rax)
                     : "r"(rdi), "r"(rsi)
                     : "rcx", "r11", "memory");
    return rax;
}

/* clone3(CLONE_INTO_CGROUP) into the cgroup open as `fd`, and the reap. */
static void start_into(int fd) {
    struct clone_args args;
    memset(&args, 0, sizeof args);
    args.exit_signal = SIGCHLD;
    args.flags = CLONE_INTO_CGROUP;
    args.cgroup = (uint64_t)fd;
    pid_t pid = clone3(&args);
    if (pid < 0) die("clone3");
    if (pid == 0) exec_child();
    wait_for(pid);
}

static void start(int way) {
    char path[512];
    pid_t pid;
    struct clone_args args;
    memset(&args, 0, sizeof args);
    args.exit_signal = SIGCHLD;
    switch (way) {
    case POSIX_SPAWN:
        if (posix_spawn(&pid, argv_sh[0], NULL, NULL, argv_sh, environ) != 0) die("posix_spawn");
        wait_for(pid);
        return;
    case FORK:
        pid = fork();
        if (pid < 0) die("fork");
        if (pid == 0) exec_child();
        wait_for(pid);
        return;
    case FORK_CGROUP: {
        new_cgroup(path, sizeof path);
        char procs[600];
        snprintf(procs, sizeof procs, "%s/cgroup.procs", path);
        pid = fork();
        if (pid < 0) die("fork");
        if (pid == 0) {
            int fd = open(procs, O_WRONLY | O_CLOEXEC);
            if (fd < 0 || write(fd, "0", 1) != 1) _exit(126);
            exec_child();
        }
        wait_for(pid);
        if (rmdir(path) != 0) die("rmdir");
        return;
    }
    case CLONE3_NEW: {
        new_cgroup(path, sizeof path);
        int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0) die(path);
        start_into(fd);
        close(fd);
        if (rmdir(path) != 0) die("rmdir");
        return;
    }
    case CLONE3_POOL:
        start_into(pool_fd);
        return;
    case VFORK3_POOL:
        args.flags = CLONE_VM | CLONE_VFORK | CLONE_INTO_CGROUP;
        args.cgroup = (uint64_t)pool_fd;
        args.stack = (uint64_t)(uintptr_t)vfork_stack;
        args.stack_size = sizeof vfork_stack;
        pid = clone3_vfork(&args);
        if (pid < 0) {
            errno = -pid;
            die("clone3 (vfork)");
        }
        wait_for(pid);
        return;
    }
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: spawn ROUNDS CGROUP_PARENT CMD [MIB]\n");
        return 2;
    }
    int rounds = atoi(argv[1]);
    parent_dir = argv[2];
    argv_sh[0] = "/bin/sh";
    argv_sh[1] = "-c";
    argv_sh[2] = argv[3];
    argv_sh[3] = NULL;
    size_t mib = argc > 4 ? (size_t)atol(argv[4]) : 0;
    if (mib) {
        char *heap = malloc(mib << 20);
        if (!heap) die("malloc");
        memset(heap, 1, mib << 20);
    }
    char pool[512];
    new_cgroup(pool, sizeof pool);
    pool_fd = open(pool, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (pool_fd < 0) die(pool);
    double *wall[WAYS], *cpu[WAYS];
    for (int w = 0; w < WAYS; w++) {
        wall[w] = calloc(rounds, sizeof(double));
        cpu[w] = calloc(rounds, sizeof(double));
    }
    srand((unsigned)time(NULL) ^ getpid());
    for (int r = 0; r < rounds; r++) {
        int order[WAYS];
        for (int w = 0; w < WAYS; w++) order[w] = w;
        for (int w = WAYS - 1; w > 0; w--) {
            int j = rand() % (w + 1), x = order[w];
            order[w] = order[j];
            order[j] = x;
        }
        for (int k = 0; k < WAYS; k++) {
            int w = order[k];
            double c0 = cpu_ms(), t0 = now_ms();
            start(w);
            wall[w][r] = now_ms() - t0;
            cpu[w][r] = cpu_ms() - c0;
        }
    }
    close(pool_fd);
    rmdir(pool);
    for (int w = 0; w < WAYS; w++) {
        qsort(wall[w], rounds, sizeof(double), cmp);
        double sum = 0;
        for (int r = 0; r < rounds; r++) sum += cpu[w][r];
        printf("%.3f %.3f %.3f %.3f %s\n", wall[w][rounds / 2], wall[w][rounds / 10],
               wall[w][rounds * 9 / 10], sum / rounds, names[w]);
    }
    return 0;
}
