/* Strangers: the attacks of a local user of another uid and of anybody who
 * can reach a port, each performed against the real code.
 *  - the store proves nothing to a connection that has not proven first,
 *    shows it no secret id, and wrong proofs wait ever longer for their
 *    close;
 *  - a flood of silent connections costs the store at most its cap, and a
 *    member is served meanwhile; stopping the store waits for members only;
 *  - the per-user key file is private (0600), shared by concurrent first
 *    users, and refused when others may read it, when another user owns
 *    it or when it is a link;
 *  - another uid can neither read the key nor join the store with the
 *    secret that public values give, and the shared-memory listener refuses
 *    it at accept, while silent sockets of our own never delay a member.
 *  - a peer in another pid namespace is never taken for this process, nor
 *    signalled by its pid.
 * The other-uid and namespace cases need root (to become another uid, to
 * unshare a pid namespace); elsewhere they say why they skip. */
#include <check.h>
#include <stddef.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bootstrap/admit.h"
#include "bootstrap/auth.h"
#include "bootstrap/bootstrap.h"
#include "bootstrap/sock.h"
#include "bootstrap/store.h"
#include "braid_transport.h"
#include "clock.h"
#include "proc_id.h"
#include "harness.h"
#include "transports/shm/shm.h"
#include "transports/tcp/tcp.h"

#define STRANGER_UID 54321 /* no such user needed: setuid() takes any number */

static const uint8_t secret[BRAID_SECRET_BYTES] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};

static int start_server(braid_store_server **server)
{
    int fd, port;
    ck_assert_int_eq(braid__sock_listen("127.0.0.1", 0, &fd, &port), BRAID_OK);
    ck_assert_int_eq(braid__store_server_start(fd, secret, server), BRAID_OK);
    return port;
}

static int raw_connect(int port)
{
    braid_sockaddr a;
    int fd;
    if (braid__sock_resolve("127.0.0.1", port, &a) != BRAID_OK ||
        braid__sock_connect(&a, braid__now_ms() + 5000, "test", &fd) != BRAID_OK)
        return -1;
    return fd;
}

/* Bytes readable within ms: -1 for a close (EOF or reset), else the count. */
static ssize_t read_within(int fd, void *buf, size_t cap, int ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, ms) <= 0)
        return 0;
    ssize_t n = recv(fd, buf, cap, MSG_DONTWAIT);
    return n > 0 ? n : -1;
}

static int become_stranger(void)
{
    return setgroups(0, NULL) != 0 || setgid(STRANGER_UID) != 0 || setuid(STRANGER_UID) != 0 ? -1 : 0;
}

/* ---- the store ------------------------------------------------------------ */

/* Send hello h (a fresh nonce drawn here) and read and decode the
 * acceptor's hello into a (raw bytes in in). */
static void swap_hellos(int fd, braid_hello *h, uint8_t in[BRAID_HELLO_BYTES], braid_hello *a)
{
    ck_assert_int_eq(braid__random_bytes(h->nonce, sizeof(h->nonce)), BRAID_OK);
    uint8_t out[BRAID_HELLO_BYTES];
    braid__hello_encode(h, out);
    ck_assert_int_eq(send(fd, out, sizeof(out), MSG_NOSIGNAL), (ssize_t)sizeof(out));
    size_t got = 0;
    while (got < BRAID_HELLO_BYTES) {
        ssize_t n = read_within(fd, in + got, BRAID_HELLO_BYTES - got, 5000);
        ck_assert_int_gt(n, 0);
        got += (size_t)n;
    }
    ck_assert_int_eq(braid__hello_decode(in, BRAID_HELLO_BYTES, a), BRAID_OK);
}

/* One guess at the store: hello, then a wrong proof. The store's hello must
 * carry no proof, nothing may follow until we prove, and the wrong proof
 * gets no answer but a close. Returns ms from our proof to the close. */
static int64_t guess_as(int port, uint8_t role, uint8_t peer_role)
{
    int fd = raw_connect(port);
    ck_assert_int_ge(fd, 0);
    braid_hello h = {.version = BRAID_WIRE_VERSION, .role = role, .rank = 1, .target = 0, .nsocks = 1}, a;
    uint8_t in[256];
    swap_hellos(fd, &h, in, &a);
    ck_assert_int_eq(a.role, peer_role);
    /* No proof of the store's follows its hello: nothing to test guesses on. */
    ck_assert_int_eq(read_within(fd, in, sizeof(in), 200), 0);
    uint8_t mac[BRAID_MAC_BYTES] = {0};
    int64_t t0 = braid__now_ms();
    ck_assert_int_eq(send(fd, mac, sizeof(mac), MSG_NOSIGNAL), (ssize_t)sizeof(mac));
    ssize_t n = read_within(fd, in, sizeof(in), 20000);
    int64_t waited = braid__now_ms() - t0;
    ck_assert_msg(n == -1, "the store answered a wrong proof with %zd bytes", n);
    close(fd);
    return waited;
}

static int64_t one_guess(int port)
{
    return guess_as(port, BRAID_ROLE_STORE_CLIENT, BRAID_ROLE_STORE_SERVER);
}

START_TEST(store_no_oracle_growing_delay)
{
    braid_store_server *srv;
    int port = start_server(&srv);
    int64_t d1 = one_guess(port);
    int64_t d2 = one_guess(port);
    int64_t d3 = one_guess(port);
    /* 100, 200, 400 ms (minus poll granularity); a member meanwhile is
     * served at once: the delay falls on wrong proofs, not on the address. */
    ck_assert_msg(d1 >= 90 && d2 >= 190 && d3 >= 390, "delays %lld %lld %lld ms", (long long)d1, (long long)d2,
                  (long long)d3);
    int64_t t0 = braid__now_ms();
    braid_store *c;
    ck_assert_int_eq(braid__store_connect("127.0.0.1", port, secret, 1, 5000, 0, &c), BRAID_OK);
    ck_assert_int_eq(braid__store_set(c, "k", "v", 1), BRAID_OK);
    ck_assert_int_lt(braid__now_ms() - t0, 1000);
    braid__store_close(c);
    braid__store_server_stop(srv);
}
END_TEST

/* A job's store states its parameters in its hello, but no secret id: a
 * stranger who connects (here with a hello of its own and nothing more)
 * gets nothing derived from the secret to test guesses against offline. */
START_TEST(store_hello_shows_no_secret_id)
{
    int fd0, port;
    ck_assert_int_eq(braid__sock_listen("127.0.0.1", 0, &fd0, &port), BRAID_OK);
    braid_job_params job = {.size = 3, .source = BRAID_SECRET_ENV, .secret_id = braid__secret_id(secret)};
    ck_assert_uint_ne(job.secret_id, 0);
    braid_store_server *srv;
    ck_assert_int_eq(braid__store_server_start_job(fd0, secret, &job, &srv), BRAID_OK);
    int fd = raw_connect(port);
    ck_assert_int_ge(fd, 0);
    braid_hello h = {.version = BRAID_WIRE_VERSION, .role = BRAID_ROLE_STORE_CLIENT, .rank = 1, .nsocks = 1,
                     .job = {.size = 3, .source = BRAID_SECRET_ENV, .secret_id = 12345}},
                a;
    uint8_t in[BRAID_HELLO_BYTES];
    swap_hellos(fd, &h, in, &a);
    ck_assert_int_eq(a.role, BRAID_ROLE_STORE_SERVER);
    ck_assert_uint_eq(a.job.size, 3);
    ck_assert_uint_eq(a.job.source, BRAID_SECRET_ENV);
    ck_assert_uint_eq(a.job.secret_id, 0);
    /* Every other byte of the hello is the store's nonce or a stated
     * parameter: the id field is all zero on the wire. */
    ck_assert_int_eq(in[52] | in[53] | in[54] | in[55], 0);
    close(fd);
    braid__store_server_stop(srv);
}
END_TEST

START_TEST(store_flood_capped)
{
    enum { FLOOD = 400 };
    braid_store_server *srv;
    int port = start_server(&srv);
    int fds[FLOOD];
    for (int i = 0; i < FLOOD; i++) {
        fds[i] = raw_connect(port);
        ck_assert_int_ge(fds[i], 0);
    }
    /* A member is served while the flood stands. */
    int64_t t0 = braid__now_ms();
    braid_store *c;
    ck_assert_int_eq(braid__store_connect("127.0.0.1", port, secret, 1, 5000, 0, &c), BRAID_OK);
    ck_assert_int_eq(braid__store_set(c, "k", "v", 1), BRAID_OK);
    int64_t member_ms = braid__now_ms() - t0;
    /* All but the cap's worth were dropped, long before the handshake limit. */
    int dropped = 0;
    int64_t deadline = braid__now_ms() + 5000;
    while (dropped < FLOOD - BRAID_ADMIT_PER_SOURCE && braid__now_ms() < deadline) {
        dropped = 0;
        for (int i = 0; i < FLOOD; i++) {
            char b;
            ssize_t n = recv(fds[i], &b, 1, MSG_DONTWAIT | MSG_PEEK);
            dropped += n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
        }
        usleep(20000);
    }
    ck_assert_int_ge(dropped, FLOOD - BRAID_ADMIT_PER_SOURCE);
    ck_assert_int_le(dropped, FLOOD);
    ck_assert_msg(member_ms < 2000, "member served after %lld ms", (long long)member_ms);
    for (int i = 0; i < FLOOD; i++)
        close(fds[i]);
    braid__store_close(c);
    braid__store_server_stop(srv);
}
END_TEST

/* A stranger's connection does not hold rank 0's store at destroy. */
START_TEST(store_stop_ignores_strangers)
{
    braid_store_server *srv;
    int port = start_server(&srv);
    int stranger = raw_connect(port);
    ck_assert_int_ge(stranger, 0);
    braid_store *c;
    ck_assert_int_eq(braid__store_connect("127.0.0.1", port, secret, 1, 5000, 0, &c), BRAID_OK);
    ck_assert_int_eq(braid__store_set(c, "k", "v", 1), BRAID_OK);
    braid__store_close(c);
    int64_t t0 = braid__now_ms();
    braid__store_server_stop_drained(srv, 5000);
    ck_assert_int_lt(braid__now_ms() - t0, 2000);
    close(stranger);
}
END_TEST

/* ---- the TCP listener ----------------------------------------------------- */

static braid_transport_ctx tcp_ctx(int rank)
{
    braid_transport_ctx ctx;
    memset(&ctx, 0, sizeof(ctx));
    ctx.rank = rank;
    ctx.size = 2;
    memcpy(ctx.secret, secret, sizeof(ctx.secret));
    ctx.pg_tag = 0x5eed;
    ctx.timeout_ms = 20000;
    ctx.nsocks = 1;
    snprintf(ctx.bind_ip, sizeof(ctx.bind_ip), "127.0.0.1");
    return ctx;
}

static int addr_port(const char *addr)
{
    const char *colon = strrchr(addr, ':');
    ck_assert_ptr_nonnull(colon);
    return atoi(colon + 1);
}

/* The same attacks on a rank's TCP listener: no proof before ours, growing
 * delays on wrong ones, a flood capped, and a member connected through it. */
START_TEST(tcp_listener_strangers)
{
    enum { FLOOD = 300 };
    braid_transport_ctx c0 = tcp_ctx(0), c1 = tcp_ctx(1);
    braid_listener *l;
    char addr[BRAID_ADDR_MAX] = {0};
    ck_assert_int_eq(braid__tcp_ops.listen(&c0, &l, addr), BRAID_OK);
    int port = addr_port(addr);
    int64_t d1 = guess_as(port, BRAID_ROLE_TCP_CONNECT, BRAID_ROLE_TCP_ACCEPT);
    int64_t d2 = guess_as(port, BRAID_ROLE_TCP_CONNECT, BRAID_ROLE_TCP_ACCEPT);
    ck_assert_msg(d1 >= 90 && d2 >= 190, "delays %lld %lld ms", (long long)d1, (long long)d2);
    int fds[FLOOD];
    for (int i = 0; i < FLOOD; i++)
        ck_assert_int_ge(fds[i] = raw_connect(port), 0);
    int64_t t0 = braid__now_ms();
    braid_conn *dialled, *accepted;
    ck_assert_int_eq(braid__tcp_ops.connect(&c1, 0, addr, 5000, &dialled), BRAID_OK);
    ck_assert_int_eq(braid__tcp_ops.accept(l, 1, 5000, &accepted), BRAID_OK);
    int64_t member_ms = braid__now_ms() - t0;
    int dropped = 0;
    int64_t deadline = braid__now_ms() + 5000;
    while (dropped < FLOOD - 2 * BRAID_ADMIT_PER_SOURCE && braid__now_ms() < deadline) {
        dropped = 0;
        for (int i = 0; i < FLOOD; i++) {
            char b;
            ssize_t n = recv(fds[i], &b, 1, MSG_DONTWAIT | MSG_PEEK);
            dropped += n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
        }
        usleep(20000);
    }
    /* The cap here is 32 plus two sockets per member (2 ranks, 1 socket). */
    ck_assert_int_ge(dropped, FLOOD - 2 * BRAID_ADMIT_PER_SOURCE);
    ck_assert_msg(member_ms < 2000, "member connected after %lld ms", (long long)member_ms);
    for (int i = 0; i < FLOOD; i++)
        close(fds[i]);
    dialled->ops->close(dialled);
    accepted->ops->close(accepted);
    l->ops->close_listener(l);
}
END_TEST

/* ---- the key file --------------------------------------------------------- */

static char tmpdir[64];

static void make_tmpdir(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/braid-key-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void remove_tree(const char *dir)
{
    char cmd[160];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

START_TEST(key_file_private_and_shared)
{
    enum { USERS = 6 };
    make_tmpdir();
    char path[128];
    snprintf(path, sizeof(path), "%s/home/.config/braid/job.key", tmpdir);
    /* Concurrent first users (ranks of one host) all end up with one key. */
    int pipefd[2];
    ck_assert_int_eq(pipe(pipefd), 0);
    pid_t pids[USERS];
    for (int i = 0; i < USERS; i++) {
        pids[i] = fork();
        ck_assert_int_ge(pids[i], 0);
        if (pids[i] == 0) {
            uint8_t key[32];
            if (braid__key_load(path, key) != BRAID_OK)
                _exit(1);
            _exit(write(pipefd[1], key, sizeof(key)) == (ssize_t)sizeof(key) ? 0 : 2);
        }
    }
    close(pipefd[1]);
    for (int i = 0; i < USERS; i++)
        ck_assert_int_eq(harness_wait_child(pids[i], 30), 0);
    uint8_t keys[USERS][32], again[32];
    for (int i = 0; i < USERS; i++)
        ck_assert_int_eq(read(pipefd[0], keys[i], 32), 32);
    close(pipefd[0]);
    for (int i = 1; i < USERS; i++)
        ck_assert_int_eq(memcmp(keys[0], keys[i], 32), 0);
    ck_assert_int_eq(braid__key_load(path, again), BRAID_OK);
    ck_assert_int_eq(memcmp(keys[0], again, 32), 0);
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_int_eq(st.st_mode & 07777, 0600);
    ck_assert_int_eq(st.st_size, 65);
    char dir[128];
    snprintf(dir, sizeof(dir), "%s/home/.config/braid", tmpdir);
    ck_assert_int_eq(stat(dir, &st), 0);
    ck_assert_int_eq(st.st_mode & 0777, 0700);
    /* No temporary files are left beside it. */
    char cmd[200];
    snprintf(cmd, sizeof(cmd), "test $(ls -A '%s' | wc -l) -eq 1", dir);
    ck_assert_int_eq(system(cmd), 0);
    remove_tree(tmpdir);
}
END_TEST

START_TEST(key_file_refused)
{
    make_tmpdir();
    char path[128], link_path[128];
    uint8_t key[32];
    snprintf(path, sizeof(path), "%s/job.key", tmpdir);
    ck_assert_int_eq(braid__key_load(path, key), BRAID_OK);
    ck_assert_int_eq(chmod(path, 0640), 0);
    ck_assert_int_eq(braid__key_load(path, key), BRAID_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(braid_last_error(), "mode 0640"));
    ck_assert_int_eq(chmod(path, 0600), 0);
    snprintf(link_path, sizeof(link_path), "%s/link.key", tmpdir);
    ck_assert_int_eq(symlink(path, link_path), 0);
    ck_assert_int_eq(braid__key_load(link_path, key), BRAID_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(braid_last_error(), "symbolic link"));
    if (geteuid() == 0) {
        /* A key planted by another user is not ours to trust. */
        ck_assert_int_eq(chown(path, STRANGER_UID, STRANGER_UID), 0);
        ck_assert_int_eq(braid__key_load(path, key), BRAID_ERR_INVALID_ARG);
        ck_assert_ptr_nonnull(strstr(braid_last_error(), "owned by uid 54321"));
    } else {
        fprintf(stderr, "key_file_refused: other-owner case skipped: not root, cannot chown\n");
    }
    remove_tree(tmpdir);
}
END_TEST

/* The launch variables of a torchrun job on this host. */
static void set_job_env(const char *key_file)
{
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", "29400", 1);
    setenv("RANK", "1", 1);
    setenv("WORLD_SIZE", "2", 1);
    setenv("TORCHELASTIC_RUN_ID", "job-7", 1);
    unsetenv("BRAID_JOB_SECRET");
    setenv("BRAID_KEY_FILE", key_file, 1);
}

/* The job's start with key_file: it must fail, naming why, within a second,
 * and never fall back to the public secret. */
static void expect_refused_start(const char *key_file, const char *why)
{
    set_job_env(key_file);
    braid_rendezvous rv;
    int rank, size;
    int64_t t0 = braid__now_ms();
    braid_status st = braid__env_rendezvous(&rank, &size, &rv);
    int64_t took = braid__now_ms() - t0;
    ck_assert_msg(st == BRAID_ERR_AUTH, "%s: start gave %s (%s), want BRAID_ERR_AUTH", key_file,
                  braid_status_string(st), braid_last_error());
    ck_assert_msg(strstr(braid_last_error(), "refusing the key file") && strstr(braid_last_error(), why),
                  "message \"%s\" lacks \"%s\"", braid_last_error(), why);
    ck_assert_msg(took < 1000, "refusing took %lld ms", (long long)took);
}

/* A FIFO at the key's path (a shared directory, HOME=/tmp): refused at
 * once, never a wait for a writer, even with BRAID_JOB_SECRET unset. */
START_TEST(key_file_fifo)
{
    make_tmpdir();
    char path[128];
    snprintf(path, sizeof(path), "%s/job.key", tmpdir);
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    uint8_t key[32];
    ck_assert_int_eq(braid__key_load(path, key), BRAID_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(braid_last_error(), "not a regular file"));
    expect_refused_start(path, "not a regular file");
    /* With BRAID_JOB_SECRET set the key file is only read for the
     * mismatch claim: the FIFO leaves that out, at once. */
    setenv("BRAID_JOB_SECRET", "00112233445566778899aabbccddeeff", 1);
    braid_rendezvous rv;
    int rank, size;
    int64_t t0 = braid__now_ms();
    ck_assert_int_eq(braid__env_rendezvous(&rank, &size, &rv), BRAID_OK);
    ck_assert_int_lt(braid__now_ms() - t0, 1000);
    ck_assert_int_eq(rv.secret_source, BRAID_SECRET_ENV);
    ck_assert_int_eq(rv.has_claim_key, 0);
    unsetenv("BRAID_JOB_SECRET");
    remove_tree(tmpdir);
}
END_TEST

/* Directories above the key that others may write (no sticky bit) or
 * that another user owns: refused, so nobody can plant a key or a
 * directory of theirs on the path. */
START_TEST(key_file_unsafe_parents)
{
    make_tmpdir();
    char dir[128], path[160];
    uint8_t key[32];
    snprintf(dir, sizeof(dir), "%s/shared", tmpdir);
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    ck_assert_int_eq(chmod(dir, 0777), 0);
    snprintf(path, sizeof(path), "%s/.config/braid/job.key", dir);
    ck_assert_int_eq(braid__key_load(path, key), BRAID_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(braid_last_error(), "other users may replace"));
    expect_refused_start(path, "mode 0777");
    /* Sticky, as /tmp is: others may add entries but not replace ours. */
    ck_assert_int_eq(chmod(dir, 01777), 0);
    ck_assert_int_eq(braid__key_load(path, key), BRAID_OK);
    /* Relative paths: checked up to the working directory. */
    ck_assert_int_eq(chdir(dir), 0);
    ck_assert_int_eq(braid__key_load("rel/sub/job.key", key), BRAID_OK);
    ck_assert_int_eq(braid__key_load("bare.key", key), BRAID_OK);
    ck_assert_int_eq(chmod(dir, 0777), 0);
    ck_assert_int_eq(braid__key_load("bare.key", key), BRAID_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(braid_last_error(), "., above the key file bare.key, has mode 0777"));
    ck_assert_int_eq(braid__key_load("rel/sub/job.key", key), BRAID_ERR_INVALID_ARG);
    ck_assert_int_eq(chmod(dir, 01777), 0);
    ck_assert_int_eq(chdir("/"), 0);
    if (geteuid() == 0) {
        /* ~/.config made first by another user (HOME in a shared place). */
        char theirs[160], planted[200];
        snprintf(theirs, sizeof(theirs), "%s/other", dir);
        ck_assert_int_eq(mkdir(theirs, 0700), 0);
        ck_assert_int_eq(chown(theirs, STRANGER_UID, STRANGER_UID), 0);
        snprintf(planted, sizeof(planted), "%s/braid/job.key", theirs);
        ck_assert_int_eq(braid__key_load(planted, key), BRAID_ERR_INVALID_ARG);
        ck_assert_ptr_nonnull(strstr(braid_last_error(), "owned by uid 54321"));
        expect_refused_start(planted, "owned by uid 54321");
    } else {
        fprintf(stderr, "key_file_unsafe_parents: other-owner case skipped: not root, cannot chown\n");
    }
    remove_tree(tmpdir);
}
END_TEST

/* A key file another user planted at the path is an error at start, not a
 * silent fall back to the public secret (which that user could compute). */
START_TEST(key_file_planted_fails_start)
{
    if (geteuid() != 0) {
        fprintf(stderr, "key_file_planted_fails_start skipped: needs root to plant another uid's file\n");
        return;
    }
    make_tmpdir();
    char path[128];
    snprintf(path, sizeof(path), "%s/job.key", tmpdir);
    uint8_t key[32];
    ck_assert_int_eq(braid__key_load(path, key), BRAID_OK);
    ck_assert_int_eq(chown(path, STRANGER_UID, STRANGER_UID), 0);
    expect_refused_start(path, "owned by uid 54321");
    /* The explicit way out still works. */
    setenv("BRAID_KEY_FILE", "none", 1);
    braid_rendezvous rv;
    int rank, size;
    ck_assert_int_eq(braid__env_rendezvous(&rank, &size, &rv), BRAID_OK);
    ck_assert_int_eq(rv.secret_source, BRAID_SECRET_PUBLIC);
    remove_tree(tmpdir);
}
END_TEST

/* The attack of issue 20: another user finds the store, computes the secret
 * from the launch variables and joins. With the key file it cannot: the
 * key is unreadable to it, and the public secret fails the handshake. */
START_TEST(other_uid_cannot_join_store)
{
    if (geteuid() != 0) {
        fprintf(stderr, "other_uid_cannot_join_store skipped: needs root to become another uid\n");
        return;
    }
    make_tmpdir();
    char path[128];
    snprintf(path, sizeof(path), "%s/job.key", tmpdir);
    ck_assert_int_eq(chmod(tmpdir, 0755), 0); /* the stranger may list the directory, not read the key */
    set_job_env(path);
    braid_rendezvous rv;
    int rank, size;
    ck_assert_int_eq(braid__env_rendezvous(&rank, &size, &rv), BRAID_OK);
    ck_assert_int_eq(rv.secret_source, BRAID_SECRET_KEY_FILE);
    int gate[2];
    ck_assert_int_eq(pipe(gate), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(gate[1]);
        if (become_stranger() != 0)
            _exit(10);
        uint8_t key[32];
        if (braid__key_load(path, key) == BRAID_OK)
            _exit(11); /* read the key */
        setenv("BRAID_KEY_FILE", "none", 1);
        braid_rendezvous pub;
        int r, s;
        if (braid__env_rendezvous(&r, &s, &pub) != BRAID_OK || pub.secret_source != BRAID_SECRET_PUBLIC)
            _exit(12);
        int port;
        if (read(gate[0], &port, sizeof(port)) != (ssize_t)sizeof(port))
            _exit(13);
        braid_store *c;
        braid_status st = braid__store_connect("127.0.0.1", port, pub.secret, 1, 3000, 0, &c);
        if (st == BRAID_OK)
            _exit(14); /* joined */
        _exit(st == BRAID_ERR_AUTH || st == BRAID_ERR_MISMATCH ? 0 : 15);
    }
    close(gate[0]);
    int fd, port;
    ck_assert_int_eq(braid__sock_listen("127.0.0.1", 0, &fd, &port), BRAID_OK);
    braid_store_server *srv;
    ck_assert_int_eq(braid__store_server_start(fd, rv.secret, &srv), BRAID_OK);
    ck_assert_int_eq(write(gate[1], &port, sizeof(port)), (ssize_t)sizeof(port));
    ck_assert_int_eq(harness_wait_child(pid, 30), 0);
    close(gate[1]);
    braid_store *c;
    ck_assert_int_eq(braid__store_connect("127.0.0.1", port, rv.secret, 1, 5000, 0, &c), BRAID_OK);
    braid__store_close(c);
    braid__store_server_stop(srv);
    remove_tree(tmpdir);
}
END_TEST

/* ---- the shared-memory listener ------------------------------------------- */

static braid_transport_ctx shm_ctx(int rank)
{
    braid_transport_ctx ctx;
    memset(&ctx, 0, sizeof(ctx));
    ctx.rank = rank;
    ctx.size = 2;
    memcpy(ctx.secret, secret, sizeof(ctx.secret));
    ctx.pg_tag = 0x5eed;
    ctx.timeout_ms = 20000;
    ctx.nsocks = 1;
    return ctx;
}

static int unix_connect(const char *addr)
{
    const char *name = addr + strlen("unix:@");
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path + 1, name, strlen(name));
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(name));
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, len) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

/* Silent connections of another user (refused at accept) and of our own
 * (left waiting) while rank 1 dials rank 0: it is served at once. */
START_TEST(shm_strangers_never_delay)
{
    int as_root = geteuid() == 0;
    if (!as_root)
        fprintf(stderr, "shm_strangers_never_delay: other-uid part skipped: needs root to become another uid\n");
    int gate[2], verdict[2];
    ck_assert_int_eq(pipe(gate), 0);
    ck_assert_int_eq(pipe(verdict), 0);
    pid_t pid = -1;
    if (as_root) {
        pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
            close(gate[1]);
            close(verdict[0]);
            if (become_stranger() != 0)
                _exit(10);
            char addr[BRAID_ADDR_MAX];
            if (read(gate[0], addr, sizeof(addr)) != (ssize_t)sizeof(addr))
                _exit(11);
            int fds[3];
            for (int i = 0; i < 3; i++)
                if ((fds[i] = unix_connect(addr)) < 0)
                    _exit(12);
            /* Each is closed by the listener at once, before any byte. */
            int closed = 0;
            for (int i = 0; i < 3; i++) {
                char b;
                closed += read_within(fds[i], &b, 1, 5000) == -1;
            }
            char c = (char)closed;
            _exit(write(verdict[1], &c, 1) == 1 ? 0 : 13);
        }
    }
    close(gate[0]);
    close(verdict[1]);
    braid_transport_ctx c0 = shm_ctx(0), c1 = shm_ctx(1);
    braid_listener *l;
    char addr[BRAID_ADDR_MAX] = {0};
    ck_assert_int_eq(braid__shm_ops.listen(&c0, &l, addr), BRAID_OK);
    if (as_root) {
        ck_assert_int_eq(write(gate[1], addr, sizeof(addr)), (ssize_t)sizeof(addr));
        char closed = 0;
        ck_assert_int_eq(read(verdict[0], &closed, 1), 1);
        ck_assert_int_eq(closed, 3);
        ck_assert_int_eq(harness_wait_child(pid, 30), 0);
    }
    int own[3];
    for (int i = 0; i < 3; i++)
        ck_assert_int_ge(own[i] = unix_connect(addr), 0);
    int64_t t0 = braid__now_ms();
    braid_conn *dialled, *accepted;
    ck_assert_int_eq(braid__shm_ops.connect(&c1, 0, addr, 5000, &dialled), BRAID_OK);
    ck_assert_int_eq(braid__shm_ops.accept(l, 1, 5000, &accepted), BRAID_OK);
    int64_t took = braid__now_ms() - t0;
    ck_assert_msg(took < 2000, "a member waited %lld ms behind silent sockets", (long long)took);
    dialled->ops->close(dialled);
    accepted->ops->close(accepted);
    for (int i = 0; i < 3; i++)
        close(own[i]);
    l->ops->close_listener(l);
    close(gate[1]);
    close(verdict[0]);
}
END_TEST

/* A process of our own keeps up to 100 silent connections open on rank 0's
 * shared-memory listener, closing the oldest and opening another as fast as
 * it can, while ranks 1 to 4 dial in turn. Each connection is made on both
 * sides or on neither: every dial that succeeds is accepted, and a message
 * crosses it. */
#define SHM_FLOOD_HELD 100
#define SHM_FLOOD_RANKS 5

static void shm_flooder(const char *addr)
{
    int fds[SHM_FLOOD_HELD];
    for (int i = 0; i < SHM_FLOOD_HELD; i++)
        fds[i] = -1;
    for (long n = 0;; n++) {
        int *slot = &fds[n % SHM_FLOOD_HELD];
        if (*slot >= 0)
            close(*slot);
        *slot = unix_connect(addr);
    }
}

static void exchange_one(braid_conn *a, braid_conn *b, int value)
{
    int got = -1;
    braid_req sr, rr;
    ck_assert_int_eq(b->ops->irecv(b, &rr, &got, sizeof(got)), BRAID_OK);
    ck_assert_int_eq(a->ops->isend(a, &sr, &value, sizeof(value)), BRAID_OK);
    int sd = 0, rd = 0;
    int64_t until = braid__now_ms() + 5000;
    while ((!sd || !rd) && braid__now_ms() < until) {
        if (!sd)
            ck_assert_int_eq(a->ops->test(&sr, &sd), BRAID_OK);
        if (!rd)
            ck_assert_int_eq(b->ops->test(&rr, &rd), BRAID_OK);
    }
    ck_assert_msg(sd && rd && got == value, "message %d: sent %d, received %d (got %d)", value, sd, rd, got);
}

START_TEST(shm_flood_own_uid)
{
    braid_transport_ctx c0 = shm_ctx(0);
    c0.size = SHM_FLOOD_RANKS;
    braid_listener *l;
    char addr[BRAID_ADDR_MAX] = {0};
    ck_assert_int_eq(braid__shm_ops.listen(&c0, &l, addr), BRAID_OK);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        alarm(60);
        shm_flooder(addr);
    }
    usleep(100000); /* the flood stands before the first member dials */
    for (int r = 1; r < SHM_FLOOD_RANKS; r++) {
        braid_transport_ctx cr = shm_ctx(r);
        cr.size = SHM_FLOOD_RANKS;
        braid_conn *dialled, *accepted;
        int64_t t0 = braid__now_ms();
        braid_status st = braid__shm_ops.connect(&cr, 0, addr, 20000, &dialled);
        ck_assert_msg(st == BRAID_OK, "rank %d could not dial rank 0: %s", r, braid_last_error());
        st = braid__shm_ops.accept(l, r, 20000, &accepted);
        ck_assert_msg(st == BRAID_OK, "rank %d dialled, but rank 0 did not accept it: %s", r, braid_last_error());
        ck_assert_msg(braid__now_ms() - t0 < 15000, "rank %d took %lld ms", r, (long long)(braid__now_ms() - t0));
        exchange_one(dialled, accepted, r);
        exchange_one(accepted, dialled, -r);
        dialled->ops->close(dialled);
        accepted->ops->close(accepted);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    l->ops->close_listener(l);
}
END_TEST

/* ---- pid namespaces ------------------------------------------------------ */

/* A rank in another pid namespace (another container on the host) may
 * publish a pid that is ours, or that names some other process here (both
 * may be pid 1). Device collectives and cuda_ipc take a published pid as
 * this process, or signal and watch it, only when the pid namespaces
 * agree. The child is made pid 1 of a new namespace (root only; else the
 * namespace part skips saying why). */
START_TEST(pid_namespace_identity)
{
    struct stat st;
    ck_assert_int_eq(stat("/proc/self/ns/pid", &st), 0);
    uint32_t ns = braid__pidns_self();
    ck_assert_uint_eq(ns, (uint32_t)st.st_ino);
    ck_assert(braid__is_this_process((uint32_t)getpid(), ns));
    /* Our pid from another namespace is another process. */
    ck_assert(!braid__is_this_process((uint32_t)getpid(), ns + 1));
    ck_assert(!braid__pid_is_ours(ns + 1));
    if (geteuid() != 0) {
        fprintf(stderr, "pid_namespace_identity: namespace part skipped: needs root to unshare a pid namespace\n");
        return;
    }
    int p[2];
    ck_assert_int_eq(pipe(p), 0);
    pid_t child = fork();
    ck_assert_int_ge(child, 0);
    if (child == 0) {
        if (unshare(CLONE_NEWPID) != 0)
            _exit(10);
        pid_t inner = fork(); /* pid 1 of the new namespace */
        if (inner == 0) {
            uint32_t rec[2] = {(uint32_t)getpid(), braid__pidns_self()};
            _exit(write(p[1], rec, sizeof(rec)) == (ssize_t)sizeof(rec) ? 0 : 11);
        }
        int status;
        _exit(inner > 0 && waitpid(inner, &status, 0) == inner && WIFEXITED(status) ? WEXITSTATUS(status) : 12);
    }
    close(p[1]);
    uint32_t rec[2] = {0, 0};
    ck_assert_int_eq(read(p[0], rec, sizeof(rec)), (ssize_t)sizeof(rec));
    close(p[0]);
    ck_assert_int_eq(harness_wait_child(child, 30), 0);
    ck_assert_uint_eq(rec[0], 1);
    ck_assert_uint_ne(rec[1], ns);
    ck_assert_uint_ne(rec[1], 0);
    /* Its pid 1 is not our init, nor us were we pid 1. */
    ck_assert(!braid__pid_is_ours(rec[1]));
    ck_assert(!braid__is_this_process(rec[0], rec[1]));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("strangers");
    TCase *store = tcase_create("store");
    tcase_set_timeout(store, 60);
    tcase_add_test(store, store_no_oracle_growing_delay);
    tcase_add_test(store, store_flood_capped);
    tcase_add_test(store, store_hello_shows_no_secret_id);
    tcase_add_test(store, pid_namespace_identity);
    tcase_add_test(store, shm_flood_own_uid);
    tcase_add_test(store, store_stop_ignores_strangers);
    tcase_add_test(store, tcp_listener_strangers);
    suite_add_tcase(s, store);
    TCase *key = tcase_create("key");
    tcase_set_timeout(key, 60);
    tcase_add_test(key, key_file_private_and_shared);
    tcase_add_test(key, key_file_refused);
    tcase_add_test(key, key_file_fifo);
    tcase_add_test(key, key_file_unsafe_parents);
    tcase_add_test(key, key_file_planted_fails_start);
    tcase_add_test(key, other_uid_cannot_join_store);
    suite_add_tcase(s, key);
    TCase *shm = tcase_create("shm");
    tcase_set_timeout(shm, 60);
    tcase_add_test(shm, shm_strangers_never_delay);
    suite_add_tcase(s, shm);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
