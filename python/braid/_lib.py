"""Locating and loading libbraid.so, and the C prototypes used through ctypes.

No compiled extension: the binding only needs the shared library, found in
this order:

1. ``BRAID_LIBRARY`` (a path to the .so);
2. next to this package (``braid/libbraid.so*``), for a copied install;
3. a meson build directory of the source tree this package sits in
   (``<repo>/build*/libbraid.so*``);
4. the library ``pip install ./python`` found through pkg-config when it
   installed this package (``braid/_install.py``);
5. the one pkg-config's ``braid.pc`` points to now (``PKG_CONFIG_PATH``);
6. the system's library path (``libbraid.so.0``).
"""

import ctypes
import ctypes.util
import glob
import os
import struct
import subprocess

# Values of the C enums in braid.h: part of the ABI.
BRAID_OK = 0
STATUS_NAMES = (
    "BRAID_OK",
    "BRAID_ERR_INVALID_ARG",
    "BRAID_ERR_SYSTEM",
    "BRAID_ERR_TIMEOUT",
    "BRAID_ERR_PEER",
    "BRAID_ERR_MISMATCH",
    "BRAID_ERR_AUTH",
    "BRAID_ERR_UNSUPPORTED",
    "BRAID_ERR_CUDA",
    "BRAID_ERR_ABORTED",
    "BRAID_ERR_INTERNAL",
    "BRAID_ERR_NO_MEMORY",
    "BRAID_ERR_CORRUPT",
)
DTYPES = {
    "float32": 0,
    "float64": 1,
    "float16": 2,
    "bfloat16": 3,
    "int8": 4,
    "uint8": 5,
    "int32": 6,
    "int64": 7,
    "uint32": 8,
    "uint64": 9,
}
# struct format of one element, for scalars (bfloat16: see scalar_bytes).
_STRUCT = {0: "<f", 1: "<d", 2: "<e", 4: "<b", 5: "<B", 6: "<i", 7: "<q", 8: "<I", 9: "<Q"}
OPS = {"sum": 0, "prod": 1, "min": 2, "max": 3, "avg": 4}
UNIQUE_ID_BYTES = 128


def scalar_bytes(value, dtype):
    """One element of braid dtype `dtype` holding value, as bytes (for the
    *_mulsum calls). Integers must fit the type; floats round to nearest
    even."""
    if dtype == DTYPES["bfloat16"]:
        bits = struct.unpack("<I", struct.pack("<f", float(value)))[0]
        if (bits & 0x7FFFFFFF) > 0x7F800000:
            return struct.pack("<H", 0x7FC0)
        return struct.pack("<H", ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF)
    fmt = _STRUCT[dtype]
    return struct.pack(fmt, float(value) if fmt[1] in "fde" else int(value))


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * UNIQUE_ID_BYTES)]


class Config(ctypes.Structure):
    """braid_config; zero fields take the BRAID_* environment or defaults."""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("timeout_ms", ctypes.c_int),
        ("nsocks", ctypes.c_int),
        ("chunk_bytes", ctypes.c_size_t),
        ("algo", ctypes.c_int),
        ("transports", ctypes.c_char_p),
        ("socket_ifname", ctypes.c_char_p),
        ("checksum", ctypes.c_int),
        ("init_timeout_ms", ctypes.c_int),
    ]


class CallStats(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("calls", ctypes.c_uint64),
        ("failed", ctypes.c_uint64),
        ("bytes", ctypes.c_uint64),
        ("total_ns", ctypes.c_uint64),
        ("max_ns", ctypes.c_uint64),
    ]


class TransportStats(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("peers", ctypes.c_int), ("bytes_sent", ctypes.c_uint64)]


class Stats(ctypes.Structure):
    """braid_stats (BRAID_STATS_MAX_KINDS 16, BRAID_STATS_MAX_TRANSPORTS 8)."""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("nkinds", ctypes.c_int),
        ("kinds", CallStats * 16),
        ("ntransports", ctypes.c_int),
        ("transports", TransportStats * 8),
    ]


def pkg_config_library():
    """Path of the libbraid.so.0 that braid.pc describes, or None: the first
    -L directory of ``pkg-config --libs braid`` holding it (an installed
    braid.pc gives its libdir; a build tree's uninstalled one its build
    directory)."""
    dirs = []
    for args in (["--libs-only-L"], ["--variable=libdir"]):
        try:
            out = subprocess.run(
                ["pkg-config"] + args + ["braid"], capture_output=True, text=True, check=True, timeout=30
            ).stdout
        except (OSError, subprocess.SubprocessError):
            return None
        dirs += [w[2:] if w.startswith("-L") else w for w in out.split()]
    for d in dirs:
        path = os.path.join(d, "libbraid.so.0")
        if os.path.exists(path):
            return path
    return None


def _installed():
    try:
        from . import _install  # written by setup.py
    except ImportError:
        return []
    return [_install.LIBRARY] if _install.LIBRARY and os.path.exists(_install.LIBRARY) else []


def _candidates():
    env = os.environ.get("BRAID_LIBRARY")
    if env:
        # An explicit choice is final: falling back silently would hide a
        # typo behind whatever other copy happens to be around.
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    found = sorted(glob.glob(os.path.join(here, "libbraid.so*")))
    root = os.path.dirname(os.path.dirname(here))  # <repo>/python/braid -> <repo>
    found += sorted(glob.glob(os.path.join(root, "build*", "libbraid.so")))
    found += _installed()
    pc = pkg_config_library()
    found += [pc] if pc else []
    system = ctypes.util.find_library("braid")
    found += [system] if system else []
    found.append("libbraid.so.0")
    return found


def _declare(lib):
    c = ctypes
    vp, sz, i, st = c.c_void_p, c.c_size_t, c.c_int, c.c_int
    protos = {
        "braid_status_string": (c.c_char_p, [st]),
        "braid_last_error": (c.c_char_p, []),
        "braid_version": (i, []),
        "braid_unique_id": (st, [c.POINTER(UniqueId)]),
        "braid_pg_init": (st, [c.POINTER(vp), i, i, c.POINTER(UniqueId), c.POINTER(Config)]),
        "braid_pg_init_env": (st, [c.POINTER(vp), c.POINTER(Config)]),
        "braid_pg_abort": (st, [vp]),
        "braid_pg_destroy": (st, [vp]),
        "braid_pg_rank": (i, [vp]),
        "braid_pg_size": (i, [vp]),
        "braid_allreduce": (st, [vp, vp, vp, sz, i, i, vp, c.POINTER(vp)]),
        "braid_broadcast": (st, [vp, vp, sz, i, i, vp, c.POINTER(vp)]),
        "braid_allreduce_mulsum": (st, [vp, vp, vp, sz, i, c.c_char_p, vp, c.POINTER(vp)]),
        "braid_reduce": (st, [vp, vp, vp, sz, i, i, i, vp, c.POINTER(vp)]),
        "braid_allgather": (st, [vp, vp, vp, sz, i, vp, c.POINTER(vp)]),
        "braid_reduce_scatter": (st, [vp, vp, vp, sz, i, i, vp, c.POINTER(vp)]),
        "braid_reduce_mulsum": (st, [vp, vp, vp, sz, i, c.c_char_p, i, vp, c.POINTER(vp)]),
        "braid_reduce_scatter_mulsum": (st, [vp, vp, vp, sz, i, c.c_char_p, vp, c.POINTER(vp)]),
        "braid_send": (st, [vp, vp, sz, i, i, vp, c.POINTER(vp)]),
        "braid_recv": (st, [vp, vp, sz, i, i, vp, c.POINTER(vp)]),
        "braid_alltoall": (st, [vp, vp, vp, sz, i, vp, c.POINTER(vp)]),
        "braid_gather": (st, [vp, vp, vp, sz, i, i, vp, c.POINTER(vp)]),
        "braid_scatter": (st, [vp, vp, vp, sz, i, i, vp, c.POINTER(vp)]),
        "braid_group_start": (st, [vp]),
        "braid_group_end": (st, [vp, c.POINTER(vp)]),
        "braid_pg_error": (st, [vp]),
        "braid_pg_stats": (st, [vp, c.POINTER(Stats)]),
        "braid_pg_trace_dump": (st, [vp, c.c_char_p]),
        "braid_wait": (st, [vp, i]),
        "braid_test": (st, [vp, c.POINTER(i)]),
        "braid_work_free": (None, [vp]),
    }
    for name, (res, args) in protos.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    return lib


def load():
    """Load libbraid, raising OSError that lists every place tried."""
    tried = []
    for path in _candidates():
        try:
            return _declare(ctypes.CDLL(path)), path
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
    raise OSError(
        "braid: cannot load libbraid.so; set BRAID_LIBRARY to its path. Tried: " + "; ".join(tried)
    )
