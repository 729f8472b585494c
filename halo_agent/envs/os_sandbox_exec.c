/* halo-sandbox-exec: the os sandbox's entry point, a static binary (no loader, no library from anywhere).

   halo-sandbox-exec spawn [OPTIONS] -- PROGRAM ARGS...      host side: cgroups, rlimits, a new keyring, exec
   halo-sandbox-exec run   [OPTIONS] -- PROGRAM ARGS...      a command in the sandbox of holder --pid
   halo-sandbox-exec eval  [OPTIONS] -- PROGRAM ARGS...      an evaluation: the same, in a trusted root
   halo-sandbox-exec init                                     PID 1 of a sandbox: reaps orphans, runs nothing

   OPTIONS: --pid N (the sandbox's PID 1), --cgroup FILE (a cgroup.procs to join, repeatable),
   --rlimit cpu,as,fsize,nproc, --keep-caps HEX (the capabilities a command keeps),
   --bind NAME and --link NAME=TARGET (eval: the tool folders of the trusted root).

   Everything that runs inside the sandbox is entered here, in this order, before any file of the
   sandbox is executed or mapped: the cgroups joined and a new anonymous session keyring (on the host's
   side), the namespaces of the holder entered (user first), its root taken, for an evaluation a
   private mount namespace whose root is built from trusted parts, a fork (into the PID namespace),
   rlimits, the seccomp filter, the capability bounding set and capability sets reduced, and only
   then execve of the program (given by absolute path). A static binary has no dynamic loader: no
   /etc/ld.so.preload, ld.so.cache or /lib64 of the sandbox is read while it holds capabilities.
   Any failure: a line on stderr and exit status 125. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/audit.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_ITEMS 32
#define EVAL_ROOT "/sys" /* a mount point of the sandbox (it cannot be moved); covered in the evaluation's own namespace */

static void die(const char *what) {
    dprintf(2, "halo-sandbox-exec: %s: %s\n", what, strerror(errno));
    _exit(125);
}

static void usage(const char *why) {
    dprintf(2, "halo-sandbox-exec: %s\n", why);
    _exit(125);
}

/* ------------------------------------------------------------------------------------------ seccomp */
/* Refused with EPERM: the kernel keyring (keys are the host's business), and calls no task needs that
   widen the kernel's surface or reshape the sandbox (each also needs a capability a command lacks). */
static const int DENIED[] = {
#ifdef SYS_keyctl
    SYS_keyctl,
#endif
#ifdef SYS_add_key
    SYS_add_key,
#endif
#ifdef SYS_request_key
    SYS_request_key,
#endif
#ifdef SYS_bpf
    SYS_bpf,
#endif
#ifdef SYS_perf_event_open
    SYS_perf_event_open,
#endif
#ifdef SYS_userfaultfd
    SYS_userfaultfd,
#endif
#ifdef SYS_kexec_load
    SYS_kexec_load,
#endif
#ifdef SYS_kexec_file_load
    SYS_kexec_file_load,
#endif
#ifdef SYS_init_module
    SYS_init_module,
#endif
#ifdef SYS_finit_module
    SYS_finit_module,
#endif
#ifdef SYS_delete_module
    SYS_delete_module,
#endif
#ifdef SYS_acct
    SYS_acct,
#endif
#ifdef SYS_swapon
    SYS_swapon,
#endif
#ifdef SYS_swapoff
    SYS_swapoff,
#endif
#ifdef SYS_reboot
    SYS_reboot,
#endif
#ifdef SYS_io_uring_setup
    SYS_io_uring_setup,
#endif
#ifdef SYS_io_uring_enter
    SYS_io_uring_enter,
#endif
#ifdef SYS_io_uring_register
    SYS_io_uring_register,
#endif
#ifdef SYS_open_by_handle_at
    SYS_open_by_handle_at,
#endif
#ifdef SYS_unshare
    SYS_unshare,
#endif
#ifdef SYS_setns
    SYS_setns,
#endif
#ifdef SYS_pivot_root
    SYS_pivot_root,
#endif
#ifdef SYS_open_tree
    SYS_open_tree,
#endif
#ifdef SYS_move_mount
    SYS_move_mount,
#endif
#ifdef SYS_fsopen
    SYS_fsopen,
#endif
#ifdef SYS_fsmount
    SYS_fsmount,
#endif
#ifdef SYS_fspick
    SYS_fspick,
#endif
#ifdef SYS_mount_setattr
    SYS_mount_setattr,
#endif
};
#define N_DENIED (sizeof(DENIED) / sizeof(DENIED[0]))

#if defined(__x86_64__)
#define AUDIT_ARCH_NATIVE AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define AUDIT_ARCH_NATIVE AUDIT_ARCH_AARCH64
#else
#error "halo-sandbox-exec knows the seccomp architecture of x86_64 and aarch64 only"
#endif

static void install_seccomp(void) {
    struct sock_filter filter[8 + 2 * N_DENIED];
    size_t n = 0;
    filter[n++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch));
    filter[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_NATIVE, 1, 0);
    filter[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS); /* another ABI (i386) */
    filter[n++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
#if defined(__x86_64__)
    filter[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000, 0, 1); /* the x32 ABI */
    filter[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM);
#endif
    for (size_t i = 0; i < N_DENIED; i++) {
        filter[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)DENIED[i], 0, 1);
        filter[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM);
    }
    filter[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    struct sock_fprog prog = {.len = (unsigned short)n, .filter = filter};
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0)) die("seccomp");
}

/* ------------------------------------------------------------------------------------- capabilities */
static void drop_capabilities(unsigned long long keep) {
    for (int cap = 0; cap < 64; cap++) {
        if (keep & (1ULL << cap)) continue;
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) && errno != EINVAL) die("drop from the bounding set");
    }
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) && errno != EINVAL) die("clear ambient capabilities");
    struct __user_cap_header_struct header = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct data[2];
    memset(data, 0, sizeof(data));
    for (int i = 0; i < 2; i++) {
        unsigned mask = (unsigned)(keep >> (32 * i));
        data[i].effective = data[i].permitted = mask;
        data[i].inheritable = 0;
    }
    if (syscall(SYS_capset, &header, data)) die("capset");
}

/* ----------------------------------------------------------------------------------- trusted root */
static void path_join(char *out, size_t size, const char *a, const char *b) {
    if ((size_t)snprintf(out, size, "%s/%s", a, b) >= size) usage("path too long");
}

static void bind(const char *source, const char *target, int is_dir) {
    if (is_dir) {
        if (mkdir(target, 0755) && errno != EEXIST) die(target);
    } else {
        int fd = open(target, O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
        if (fd < 0) die(target);
        close(fd);
    }
    if (mount(source, target, NULL, MS_BIND | MS_REC, NULL)) die(source);
}

static int listed(const char *name, char **names, int count) {
    for (int i = 0; i < count; i++) {
        size_t len = strcspn(names[i], "=");
        if (strlen(name) == len && strncmp(name, names[i], len) == 0) return 1;
    }
    return 0;
}

/* The evaluation's root, in a mount namespace of its own: the tool folders (the host's, read-only) and
   their links as the root template has them, the sandbox's /proc, a /dev of the genuine device nodes
   only, and every other entry of the sandbox's root (its data: /etc, /root, /home, /srv, /tmp, ...)
   bound at its place. Whatever the sandbox made of /bin, /lib64, /usr or /dev, the evaluation's
   programs and their loader come from the host. */
static void enter_trusted_root(char **binds, int n_binds, char **links, int n_links) {
    static const char *reserved[] = {"proc", "sys", "dev", ".", ".."};
    static const struct { const char *name; unsigned major, minor; } devices[] = {
        {"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0}};
    char target[4096], source[4096];
    if (unshare(CLONE_NEWNS)) die("unshare the mount namespace");
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL)) die("make the mounts private");
    if (mount("halo-eval", EVAL_ROOT, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=64k")) die("mount the trusted root");
    DIR *root = opendir("/");
    if (!root) die("open the sandbox's root");
    struct dirent *entry;
    while ((entry = readdir(root))) {
        const char *name = entry->d_name;
        int skip = listed(name, binds, n_binds) || listed(name, links, n_links);
        for (size_t i = 0; i < sizeof(reserved) / sizeof(reserved[0]); i++) skip |= strcmp(name, reserved[i]) == 0;
        if (skip) continue;
        struct stat st;
        if (fstatat(dirfd(root), name, &st, AT_SYMLINK_NOFOLLOW)) continue;
        path_join(target, sizeof(target), EVAL_ROOT, name);
        path_join(source, sizeof(source), "", name);
        if (S_ISLNK(st.st_mode)) {
            char link[4096];
            ssize_t len = readlinkat(dirfd(root), name, link, sizeof(link) - 1);
            if (len < 0) continue;
            link[len] = 0;
            if (symlink(link, target)) die(target);
        } else if (S_ISDIR(st.st_mode) || S_ISREG(st.st_mode)) {
            bind(source, target, S_ISDIR(st.st_mode));
        }
    }
    closedir(root);
    for (int i = 0; i < n_binds; i++) {
        path_join(target, sizeof(target), EVAL_ROOT, binds[i]);
        path_join(source, sizeof(source), "", binds[i]);
        bind(source, target, 1);
    }
    for (int i = 0; i < n_links; i++) {
        char *eq = strchr(links[i], '=');
        if (!eq) usage("--link takes NAME=TARGET");
        *eq = 0;
        path_join(target, sizeof(target), EVAL_ROOT, links[i]);
        if (symlink(eq + 1, target)) die(target);
    }
    bind("/proc", EVAL_ROOT "/proc", 1);
    if (mkdir(EVAL_ROOT "/dev", 0755) || mount("halo-eval-dev", EVAL_ROOT "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755,size=4k"))
        die("mount the trusted /dev");
    for (size_t i = 0; i < sizeof(devices) / sizeof(devices[0]); i++) {
        struct stat st;
        path_join(source, sizeof(source), "/dev", devices[i].name);
        /* a device node a command cannot forge (no CAP_MKNOD): only the host's, bound at the start */
        if (stat(source, &st) || !S_ISCHR(st.st_mode) || st.st_rdev != makedev(devices[i].major, devices[i].minor)) continue;
        path_join(target, sizeof(target), EVAL_ROOT "/dev", devices[i].name);
        bind(source, target, 0);
    }
    static const char *fd_links[][2] = {{"fd", "/proc/self/fd"}, {"stdin", "/proc/self/fd/0"}, {"stdout", "/proc/self/fd/1"},
                                        {"stderr", "/proc/self/fd/2"}};
    for (size_t i = 0; i < sizeof(fd_links) / sizeof(fd_links[0]); i++) {
        path_join(target, sizeof(target), EVAL_ROOT "/dev", fd_links[i][0]);
        if (symlink(fd_links[i][1], target)) die(target);
    }
    if (mount(NULL, EVAL_ROOT, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL)) die("make the trusted root read-only");
    if (chdir(EVAL_ROOT) || chroot(".") || chdir("/")) die("enter the trusted root");
}

/* -------------------------------------------------------------------------------------------- main */
static void set_limit(int resource, unsigned long long value) {
    struct rlimit limit = {.rlim_cur = value, .rlim_max = value};
    if (setrlimit(resource, &limit)) die("setrlimit");
}

static void join_cgroup(const char *procs) {
    int fd = open(procs, O_WRONLY | O_CLOEXEC);
    if (fd < 0) die(procs);
    if (dprintf(fd, "%d\n", getpid()) < 0) die(procs);
    close(fd);
}

static void enter_namespaces(int pid) {
    static const struct { const char *name; int type; } ns[] = {
        {"user", CLONE_NEWUSER}, {"ipc", CLONE_NEWIPC}, {"uts", CLONE_NEWUTS}, {"net", CLONE_NEWNET},
        {"pid", CLONE_NEWPID}, {"mnt", CLONE_NEWNS}};
    int fds[6];
    char path[64];
    for (int i = 0; i < 6; i++) {
        snprintf(path, sizeof(path), "/proc/%d/ns/%s", pid, ns[i].name);
        if ((fds[i] = open(path, O_RDONLY | O_CLOEXEC)) < 0) die(path);
    }
    snprintf(path, sizeof(path), "/proc/%d/root", pid);
    int root = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (root < 0) die(path);
    for (int i = 0; i < 6; i++) {
        if (setns(fds[i], ns[i].type)) die(ns[i].name);
        close(fds[i]);
        /* root of the user namespace (the host's root has no id in it) */
        if (i == 0 && (setgroups(0, NULL) || setresgid(0, 0, 0) || setresuid(0, 0, 0))) die("become root inside");
    }
    if (fchdir(root) || chroot(".") || chdir("/")) die("enter the sandbox's root");
    close(root);
}

static void on_child(int signal_number) { (void)signal_number; }

/* PID 1 of a sandbox: reap every child (orphans are reparented here) and never execute anything. */
__attribute__((noreturn)) static void init(void) {
    sigset_t blocked, none;
    sigemptyset(&blocked);
    sigaddset(&blocked, SIGCHLD);
    sigemptyset(&none);
    signal(SIGTERM, SIG_IGN);
    signal(SIGINT, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    struct sigaction action = {.sa_handler = on_child};
    sigaction(SIGCHLD, &action, NULL);
    sigprocmask(SIG_BLOCK, &blocked, NULL); /* a SIGCHLD between the reaping and the wait stays pending */
    for (;;) {
        while (waitpid(-1, NULL, WNOHANG) > 0) {
        }
        sigsuspend(&none);
    }
}

int main(int argc, char **argv) {
    if (argc < 2) usage("usage: halo-sandbox-exec spawn|run|eval [OPTIONS] -- PROGRAM ARGS...");
    const char *mode = argv[1];
    if (strcmp(mode, "init") == 0) init();
    int spawn = strcmp(mode, "spawn") == 0, eval = strcmp(mode, "eval") == 0;
    if (!spawn && !eval && strcmp(mode, "run") != 0) usage("the mode is spawn, run or eval");
    int pid = 0, n_cgroups = 0, n_binds = 0, n_links = 0, has_limits = 0, i = 2;
    char *cgroups[MAX_ITEMS], *binds[MAX_ITEMS], *links[MAX_ITEMS];
    unsigned long long keep = 0, limits[4] = {0};
    for (; i < argc && strcmp(argv[i], "--") != 0; i += 2) {
        if (i + 1 >= argc) usage("an option without its value");
        const char *option = argv[i], *value = argv[i + 1];
        if (strcmp(option, "--pid") == 0) pid = atoi(value);
        else if (strcmp(option, "--keep-caps") == 0) keep = strtoull(value, NULL, 16);
        else if (strcmp(option, "--rlimit") == 0) {
            has_limits = sscanf(value, "%llu,%llu,%llu,%llu", &limits[0], &limits[1], &limits[2], &limits[3]) == 4;
            if (!has_limits) usage("--rlimit takes cpu,as,fsize,nproc");
        } else if (n_cgroups < MAX_ITEMS && strcmp(option, "--cgroup") == 0) cgroups[n_cgroups++] = argv[i + 1];
        else if (n_binds < MAX_ITEMS && strcmp(option, "--bind") == 0) binds[n_binds++] = argv[i + 1];
        else if (n_links < MAX_ITEMS && strcmp(option, "--link") == 0) links[n_links++] = argv[i + 1];
        else usage("unknown option");
    }
    if (i + 1 >= argc) usage("no program after --");
    char **program = argv + i + 1;
    if (program[0][0] != '/') usage("the program must be an absolute path");

    for (int c = 0; c < n_cgroups; c++) join_cgroup(cgroups[c]);
    /* A new anonymous session keyring: no key of the server's is reachable from here on. */
    /* (Where the host itself refuses keyctl, as a container's seccomp profile may, no key is reachable anyway.) */
    if (syscall(SYS_keyctl, 1 /* KEYCTL_JOIN_SESSION_KEYRING */, NULL) < 0 && errno != ENOSYS && errno != EPERM && errno != EACCES)
        die("join a new session keyring");
    if (spawn) {
        execv(program[0], program);
        die(program[0]);
    }
    if (pid <= 0) usage("run and eval need --pid");
    enter_namespaces(pid);
    if (eval) enter_trusted_root(binds, n_binds, links, n_links);
    /* The PID namespace holds the children made from now on: the program runs in a child; this
       process (outside the namespace, nothing of the sandbox loaded) waits and passes its status on. */
    pid_t child = fork();
    if (child < 0) die("fork");
    if (child > 0) {
        int status;
        while (waitpid(child, &status, 0) < 0)
            if (errno != EINTR) die("wait");
        _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
    }
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)) die("pdeathsig");
    if (has_limits) {
        set_limit(RLIMIT_CPU, limits[0]);
        set_limit(RLIMIT_AS, limits[1]);
        set_limit(RLIMIT_FSIZE, limits[2]);
        set_limit(RLIMIT_NPROC, limits[3]);
    }
    install_seccomp();
    drop_capabilities(keep);
    execve(program[0], program, environ);
    die(program[0]);
}
