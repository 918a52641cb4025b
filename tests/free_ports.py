"""Free loopback ports for tests that start launcher-style jobs.

Ports are picked below the kernel's ephemeral range, so that no connect()
or bind(0) elsewhere (gloo's pair listeners, other tests' clients) can take
one between this check and the rank's own bind.
"""
import random
import socket


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _free(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def free_ports(n):
    """A port P with P+1 .. P+n-1 free too."""
    lo, hi = 10000, _ephemeral_low() - n
    if hi - lo < 1000:  # a machine with a wide ephemeral range
        lo, hi = 1025, 10000 - n
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(lo, hi)
        if all(_free(port + i) for i in range(n)):
            return port
    raise RuntimeError("no %d adjacent free ports on 127.0.0.1 in %d..%d" % (n, lo, hi + n))
