/* The job secret of braid_pg_init_env: BRAID_JOB_SECRET when set, else
 * derived from the user's key file and the launch variables, else (no key
 * file possible) from the launch variables alone, with a warning.
 *
 * The key file holds 32 random bytes (64 hex digits) that only its owner
 * can read. Every host of a job reads the same file through the usual
 * shared home, so ranks agree on the key without passing it around, and
 * another user, who sees the launch variables but not the file, cannot
 * compute the secret. The launcher's job id is mixed in, so two jobs of
 * one user on the same MASTER_ADDR and port differ. */
#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "auth.h"
#include "bootstrap.h"
#include "log.h"
#include "param.h"
#include "status.h"

#define KEY_BYTES 32
#define KEY_HEX (2 * KEY_BYTES)
#define KEY_FILE_DEFAULT "/.config/braid/job.key"

static const char *const job_id_vars[] = {"TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "OMPI_MCA_ess_base_jobid",
                                          "PMIX_NAMESPACE", NULL};

static int hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Exactly 2 * n hex digits into out. 0 on success. */
static int hex_decode(const char *text, size_t len, uint8_t *out, size_t n)
{
    if (len != 2 * n)
        return -1;
    for (size_t i = 0; i < n; i++) {
        int hi = hex_value(text[2 * i]), lo = hex_value(text[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return -1;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

/* "braid-...|host|port|id1|id2|...": the public part of every derivation.
 * The world size is left out on purpose: the handshake compares it in the
 * open and names it when it differs. */
static void public_text(const char *label, const braid_rendezvous *rv, char *text, size_t cap)
{
    int n = snprintf(text, cap, "%s|%s|%d", label, rv->host, rv->port);
    for (const char *const *p = job_id_vars; *p && n > 0 && (size_t)n < cap; p++) {
        const char *v = braid__param_str(*p);
        n += snprintf(text + n, cap - (size_t)n, "|%s", v ? v : "");
    }
}

/* The launcher's job id as the hellos show it: the first one set, cut to
 * the field and to printable characters. */
static void job_id_text(char out[BRAID_JOB_ID_BYTES + 1])
{
    const char *v = NULL;
    for (const char *const *p = job_id_vars; *p && !v; p++)
        v = braid__param_str(*p);
    size_t n = 0;
    for (; v && v[n] && n < BRAID_JOB_ID_BYTES; n++)
        out[n] = v[n] >= 0x20 && v[n] < 0x7f ? v[n] : '?';
    out[n] = '\0';
}

braid_status braid__key_file_path(char *path, size_t cap)
{
    const char *set = braid__param_str("BRAID_KEY_FILE");
    if (set) {
        if (snprintf(path, cap, "%s", set) >= (int)cap)
            return braid__error(BRAID_ERR_INVALID_ARG, "BRAID_KEY_FILE is longer than %zu bytes", cap - 1);
        return BRAID_OK;
    }
    const char *home = braid__param_str("HOME");
    if (!home || !*home) {
        struct passwd *pw = getpwuid(geteuid());
        home = pw ? pw->pw_dir : NULL;
    }
    if (!home || !*home)
        return braid__error(BRAID_ERR_INVALID_ARG, "no home directory (HOME unset, no passwd entry)");
    struct stat st;
    if (stat(home, &st) != 0 || !S_ISDIR(st.st_mode))
        return braid__error(BRAID_ERR_INVALID_ARG, "home directory %s does not exist", home);
    if (snprintf(path, cap, "%s%s", home, KEY_FILE_DEFAULT) >= (int)cap)
        return braid__error(BRAID_ERR_INVALID_ARG, "home directory path too long");
    return BRAID_OK;
}

/* Read the key from an open file after checking that only we can read it. */
static braid_status key_read_fd(int fd, const char *path, uint8_t key[KEY_BYTES])
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return braid__error(BRAID_ERR_SYSTEM, "%s: fstat: %m", path);
    if (!S_ISREG(st.st_mode))
        return braid__error(BRAID_ERR_INVALID_ARG, "%s is not a regular file", path);
    if (st.st_uid != geteuid())
        return braid__error(BRAID_ERR_INVALID_ARG, "%s is owned by uid %u, not by this user (uid %u)", path,
                            (unsigned)st.st_uid, (unsigned)geteuid());
    if (st.st_mode & 077)
        return braid__error(BRAID_ERR_INVALID_ARG, "%s has mode %04o: other users may read it (chmod 600 it)", path,
                            (unsigned)(st.st_mode & 07777));
    char text[KEY_HEX + 2];
    ssize_t n;
    do {
        n = pread(fd, text, sizeof(text), 0);
    } while (n < 0 && errno == EINTR);
    if (n < 0)
        return braid__error(BRAID_ERR_SYSTEM, "%s: read: %m", path);
    size_t len = (size_t)n;
    if (len > 0 && text[len - 1] == '\n')
        len--;
    int bad = hex_decode(text, len, key, KEY_BYTES);
    OPENSSL_cleanse(text, sizeof(text));
    if (bad)
        return braid__error(BRAID_ERR_INVALID_ARG, "%s does not hold %d hex digits (remove it to make a new one)",
                            path, KEY_HEX);
    return BRAID_OK;
}

/* A directory above the key file (dir) that exists must be this user's
 * or root's, and writable by no one else (a sticky one, like /tmp,
 * excepted: others may add entries there but not replace ours). Else
 * another user could put a file of theirs, or a directory they own, where
 * braid looks for the key. */
static braid_status check_dir(const char *dir, const char *path)
{
    struct stat st;
    if (stat(dir, &st) != 0) {
        if (errno == ENOENT)
            return BRAID_OK; /* made later, mode 0700 */
        return braid__error(BRAID_ERR_INVALID_ARG, "%s, above the key file %s: %m", dir, path);
    }
    int others_write = (st.st_mode & 002) || ((st.st_mode & 020) && st.st_gid != getegid());
    if (!S_ISDIR(st.st_mode))
        return braid__error(BRAID_ERR_INVALID_ARG, "%s, above the key file %s, is not a directory", dir, path);
    if (st.st_uid != geteuid() && st.st_uid != 0)
        return braid__error(BRAID_ERR_INVALID_ARG,
                            "%s, above the key file %s, is owned by uid %u, not by this user (uid %u) or root", dir,
                            path, (unsigned)st.st_uid, (unsigned)geteuid());
    if (others_write && !(st.st_mode & S_ISVTX))
        return braid__error(BRAID_ERR_INVALID_ARG,
                            "%s, above the key file %s, has mode %04o: other users may replace what is in it", dir,
                            path, (unsigned)(st.st_mode & 07777));
    return BRAID_OK;
}

/* check_dir for every directory above path, up to "/" for an absolute
 * path and to the working directory for a relative one. */
static braid_status check_parents(const char *path)
{
    char dir[4096];
    if (snprintf(dir, sizeof(dir), "%s", path) >= (int)sizeof(dir))
        return braid__error(BRAID_ERR_INVALID_ARG, "%s: path too long", path);
    for (;;) {
        char *p = strrchr(dir, '/');
        if (!p)
            return check_dir(".", path);
        if (p == dir) {
            p[1] = '\0';
            return check_dir(dir, path);
        }
        *p = '\0';
        BRAID_CHECK(check_dir(dir, path));
    }
}

/* mkdir -p for the directories above path, mode 0700 for those made here. */
static braid_status make_parents(const char *path)
{
    char dir[4096];
    if (snprintf(dir, sizeof(dir), "%s", path) >= (int)sizeof(dir))
        return braid__error(BRAID_ERR_INVALID_ARG, "%s: path too long", path);
    for (char *p = dir + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(dir, 0700) != 0 && errno != EEXIST)
            return braid__error(BRAID_ERR_SYSTEM, "cannot create %s: %m", dir);
        *p = '/';
    }
    return BRAID_OK;
}

/* Write a new key to a private temporary file, then link it into place.
 * link(), unlike rename(), fails when the name exists: when ranks (or the
 * hosts of a shared home) create the key at once, one wins and the others
 * read its key instead of replacing it under a rank that already used it. */
static braid_status key_create(const char *path, uint8_t key[KEY_BYTES])
{
    BRAID_CHECK(make_parents(path));
    uint8_t nonce[8];
    BRAID_CHECK(braid__random_bytes(nonce, sizeof(nonce)));
    char tmp[4200];
    snprintf(tmp, sizeof(tmp), "%s.tmp.%ld.%02x%02x%02x%02x", path, (long)getpid(), nonce[0], nonce[1], nonce[2],
             nonce[3]);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return braid__error(BRAID_ERR_SYSTEM, "cannot create %s: %m", tmp);
    braid_status st = braid__random_bytes(key, KEY_BYTES);
    char text[KEY_HEX + 1];
    for (int i = 0; i < KEY_BYTES; i++)
        snprintf(text + 2 * i, 3, "%02x", key[i]);
    text[KEY_HEX] = '\n';
    if (st == BRAID_OK && (fchmod(fd, 0600) != 0 || write(fd, text, sizeof(text)) != (ssize_t)sizeof(text) ||
                           fsync(fd) != 0))
        st = braid__error(BRAID_ERR_SYSTEM, "cannot write %s: %m", tmp);
    OPENSSL_cleanse(text, sizeof(text));
    close(fd);
    if (st == BRAID_OK && link(tmp, path) != 0) {
        if (errno == EEXIST) {
            st = BRAID_ERR_AUTH; /* not an error: read the winner's key */
        } else {
            st = braid__error(BRAID_ERR_SYSTEM, "cannot link %s to %s: %m", tmp, path);
        }
    }
    unlink(tmp);
    if (st == BRAID_OK)
        BRAID_INFO("made the braid key file %s (mode 0600)", path);
    return st;
}

/* Open the key file for reading without ever blocking: O_NONBLOCK, so a
 * FIFO at the path fails the regular-file check instead of waiting for a
 * writer. */
static int key_open(const char *path)
{
    return open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
}

braid_status braid__key_load(const char *path, uint8_t key[KEY_BYTES])
{
    BRAID_CHECK(check_parents(path));
    for (int attempt = 0; attempt < 2; attempt++) {
        int fd = key_open(path);
        if (fd >= 0) {
            braid_status st = key_read_fd(fd, path, key);
            close(fd);
            return st;
        }
        if (errno == ELOOP)
            return braid__error(BRAID_ERR_INVALID_ARG, "%s is a symbolic link: refused", path);
        if (errno != ENOENT) /* there, but not for us to read: someone else's */
            return braid__error(BRAID_ERR_INVALID_ARG, "cannot open %s: %m", path);
        braid_status st = key_create(path, key);
        /* A directory another user made between the check and the
         * creation fails the creation: that is a refusal, not a key that
         * cannot be made. */
        if (st != BRAID_OK && st != BRAID_ERR_AUTH)
            BRAID_CHECK(check_parents(path));
        if (st != BRAID_ERR_AUTH)
            return st;
    }
    return braid__error(BRAID_ERR_SYSTEM, "%s appeared and vanished while being made", path);
}

int braid__claim_key(const uint8_t *key, uint8_t out[BRAID_SECRET_BYTES])
{
    static const char label[] = "braid-mismatch-claim-v1";
    uint8_t own[KEY_BYTES], digest[SHA256_DIGEST_LENGTH];
    if (!key) {
        char path[4096];
        const char *set = braid__param_str("BRAID_KEY_FILE");
        if (set && strcmp(set, "none") == 0)
            return 0;
        if (braid__key_file_path(path, sizeof(path)) != BRAID_OK) {
            braid__error_clear();
            return 0;
        }
        if (check_parents(path) != BRAID_OK) {
            braid__error_clear();
            return 0;
        }
        int fd = key_open(path);
        if (fd < 0)
            return 0;
        braid_status st = key_read_fd(fd, path, own);
        close(fd);
        if (st != BRAID_OK) {
            braid__error_clear();
            return 0;
        }
        key = own;
    }
    unsigned int len = 0;
    uint8_t *ok = HMAC(EVP_sha256(), key, KEY_BYTES, (const unsigned char *)label, sizeof(label) - 1, digest, &len);
    OPENSSL_cleanse(own, sizeof(own));
    if (!ok || len != sizeof(digest))
        return 0;
    memcpy(out, digest, BRAID_SECRET_BYTES);
    OPENSSL_cleanse(digest, sizeof(digest));
    return 1;
}

braid_status braid__job_secret_env(int rank, braid_rendezvous *rv)
{
    job_id_text(rv->job_id);
    rv->has_claim_key = 0;
    const char *secret_hex = braid__param_str("BRAID_JOB_SECRET");
    if (secret_hex) {
        if (hex_decode(secret_hex, strlen(secret_hex), rv->secret, BRAID_SECRET_BYTES) != 0)
            return braid__error(BRAID_ERR_INVALID_ARG, "BRAID_JOB_SECRET must be %d hex digits",
                                2 * BRAID_SECRET_BYTES);
        rv->secret_source = BRAID_SECRET_ENV;
        rv->has_claim_key = braid__claim_key(NULL, rv->claim_key);
        return BRAID_OK;
    }

    char text[512], path[4096], why[512];
    uint8_t digest[SHA256_DIGEST_LENGTH];
    const char *set = braid__param_str("BRAID_KEY_FILE");
    braid_status st;
    if (set && strcmp(set, "none") == 0) {
        st = braid__error_quiet(BRAID_ERR_INVALID_ARG, "BRAID_KEY_FILE=none");
    } else {
        st = braid__key_file_path(path, sizeof(path));
        uint8_t key[KEY_BYTES];
        int have_path = st == BRAID_OK;
        if (have_path)
            st = braid__key_load(path, key);
        if (st == BRAID_OK) {
            public_text("braid-job-secret-v2", rv, text, sizeof(text));
            unsigned int len = 0;
            uint8_t *ok = HMAC(EVP_sha256(), key, KEY_BYTES, (const unsigned char *)text, strlen(text), digest, &len);
            rv->has_claim_key = braid__claim_key(key, rv->claim_key);
            OPENSSL_cleanse(key, sizeof(key));
            if (ok && len == sizeof(digest)) {
                memcpy(rv->secret, digest, BRAID_SECRET_BYTES);
                OPENSSL_cleanse(digest, sizeof(digest));
                rv->secret_source = BRAID_SECRET_KEY_FILE;
                return BRAID_OK;
            }
            st = braid__error_quiet(BRAID_ERR_SYSTEM, "HMAC-SHA256 failed in libcrypto");
        }
        /* A key file that is there but refused (another user's, a link, a
         * FIFO, unsafe directories above it) may be planted to push the
         * job onto the public secret: fail instead. Only a key that cannot
         * be made at all falls back. */
        if (have_path && st == BRAID_ERR_INVALID_ARG)
            return braid__error(BRAID_ERR_AUTH,
                                "rank %d: refusing the key file: %s. Remove or fix it, point BRAID_KEY_FILE at a "
                                "file of your own, or set BRAID_JOB_SECRET (or BRAID_KEY_FILE=none to accept a "
                                "secret from public values)",
                                rank, braid__error_detail());
    }
    /* The cause without its status name, to quote. */
    snprintf(why, sizeof(why), "%s", braid__error_detail());
    /* No key: a secret from public values still keeps strays and stale jobs
     * out, but not another user (docs/RELIABILITY.md). */
    BRAID_WARN("rank %d: the job secret derives from public values only (MASTER_ADDR, port, launcher job id): "
               "another user who can reach the job can compute it and join; no key file (%s). Fix: let braid keep "
               "~/.config/braid/job.key (mode 0600, in a home the job's hosts share), point BRAID_KEY_FILE at such "
               "a file, or set BRAID_JOB_SECRET to 32 random hex digits on every rank",
               rank, why);
    public_text("braid-env-secret-v2", rv, text, sizeof(text));
    SHA256((const unsigned char *)text, strlen(text), digest);
    memcpy(rv->secret, digest, BRAID_SECRET_BYTES);
    rv->secret_source = BRAID_SECRET_PUBLIC;
    braid__error_clear();
    return BRAID_OK;
}
