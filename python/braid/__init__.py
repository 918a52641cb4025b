"""Python binding of braid (ctypes over libbraid.so; no compiled extension).

    import braid
    pg = braid.ProcessGroup()                 # torchrun / mpirun / srun env
    pg.allreduce(grad, op="avg")              # numpy array or CPU torch tensor, in place
    pg.broadcast(weights, root=0)
    work = pg.allreduce(buf, async_op=True); work.wait()

Without a launcher, rank 0 makes an id and hands its bytes to the others:

    uid = braid.unique_id()                   # bytes, treat as a credential
    pg = braid.ProcessGroup(rank=r, size=n, unique_id=uid)

Every failure raises BraidError, whose message names the rank, the
operation and the cause (braid_last_error()).
"""

import ctypes
import struct

from . import _lib

__all__ = ["BraidError", "ProcessGroup", "Work", "unique_id", "library_path", "version"]

_LIB, _LIB_PATH = _lib.load()
library_path = _LIB_PATH


class BraidError(RuntimeError):
    """A braid call failed; .status is the braid_status name."""

    def __init__(self, status, message):
        self.status = status
        super().__init__(message)


def _check(status, what):
    if status != _lib.BRAID_OK:
        name = _lib.STATUS_NAMES[status] if 0 <= status < len(_lib.STATUS_NAMES) else "status %d" % status
        detail = _LIB.braid_last_error().decode(errors="replace")
        raise BraidError(name, "%s: %s" % (what, detail or name))


def version():
    """Library version as (major, minor, patch)."""
    v = _LIB.braid_version()
    return (v // 10000, v // 100 % 100, v % 100)


def unique_id():
    """A fresh rendezvous id (bytes). Rank 0's process makes it and serves
    the store, so create it in the process that becomes rank 0 (or in a
    parent that forks the ranks)."""
    uid = _lib.UniqueId()
    _check(_LIB.braid_unique_id(ctypes.byref(uid)), "unique_id")
    # bytes(uid.internal) would stop at the first NUL of the id.
    return ctypes.string_at(ctypes.addressof(uid), _lib.UNIQUE_ID_BYTES)


def _buffer_of(buf):
    """(pointer, element count, braid dtype, owner) of a contiguous host
    buffer: a numpy array or a CPU torch tensor."""
    if hasattr(buf, "data_ptr") and hasattr(buf, "is_contiguous"):  # torch.Tensor
        if buf.device.type != "cpu":
            raise BraidError("BRAID_ERR_UNSUPPORTED", "braid: tensor on %s; the binding takes CPU tensors" % buf.device)
        if not buf.is_contiguous():
            raise BraidError("BRAID_ERR_INVALID_ARG", "braid: tensor is not contiguous (call .contiguous())")
        name = str(buf.dtype).replace("torch.", "")
        if name not in _lib.DTYPES:
            raise BraidError("BRAID_ERR_INVALID_ARG", "braid: unsupported tensor dtype %s" % buf.dtype)
        return buf.data_ptr(), buf.numel(), _lib.DTYPES[name], buf
    if hasattr(buf, "__array_interface__"):  # numpy.ndarray and friends
        if not buf.flags["C_CONTIGUOUS"]:
            raise BraidError("BRAID_ERR_INVALID_ARG", "braid: array is not C-contiguous (use numpy.ascontiguousarray)")
        if not buf.flags["WRITEABLE"]:
            raise BraidError("BRAID_ERR_INVALID_ARG", "braid: array is read-only; collectives work in place")
        name = buf.dtype.name
        if name not in _lib.DTYPES:
            raise BraidError("BRAID_ERR_INVALID_ARG", "braid: unsupported array dtype %s" % buf.dtype)
        return buf.ctypes.data, buf.size, _lib.DTYPES[name], buf
    raise BraidError("BRAID_ERR_INVALID_ARG", "braid: expected a numpy array or a torch tensor, got %s" % type(buf))


class Work:
    """Handle of an asynchronous collective. Keeps its buffer alive until
    the collective is done."""

    def __init__(self, handle, owner, what):
        self._h = handle
        self._owner = owner
        self._what = what
        self._status = None

    def wait(self, timeout_ms=-1):
        """Block until done (-1: the group's timeout); raises on failure.
        The GIL is released while waiting (ctypes drops it for the call)."""
        if self._status is None:
            st = _LIB.braid_wait(self._h, int(timeout_ms))
            if st == _lib.STATUS_NAMES.index("BRAID_ERR_TIMEOUT"):
                _check(st, self._what)  # still running: keep the handle
            self._status = st
            self._release()
        _check(self._status, self._what)
        return self._owner

    def is_completed(self):
        if self._status is not None:
            return True
        done = ctypes.c_int(0)
        st = _LIB.braid_test(self._h, ctypes.byref(done))
        if done.value:
            self._status = st
            self._release()
        return bool(done.value)

    def _release(self):
        if self._h:
            _LIB.braid_work_free(self._h)
            self._h = None

    def __del__(self):
        # A handle freed before completion still completes (braid.h), but
        # its buffer must outlive it: wait rather than free memory under it.
        if getattr(self, "_h", None) and self._status is None:
            _LIB.braid_wait(self._h, -1)
            self._release()


class ProcessGroup:
    """A braid process group.

    ProcessGroup()                                  -> from the launcher environment
    ProcessGroup(rank=r, size=n, unique_id=uid)     -> from unique_id() bytes
    timeout_ms / nsocks / chunk_bytes / init_timeout_ms override the BRAID_*
    environment.
    """

    def __init__(self, rank=None, size=None, unique_id=None, timeout_ms=0, nsocks=0, chunk_bytes=0,
                 init_timeout_ms=0):
        cfg = _lib.Config(ctypes.sizeof(_lib.Config), int(timeout_ms), int(nsocks), int(chunk_bytes), 0, None, None, 0,
                          int(init_timeout_ms))
        handle = ctypes.c_void_p()
        if unique_id is None:
            if rank is not None or size is not None:
                raise BraidError("BRAID_ERR_INVALID_ARG", "braid: rank and size need a unique_id")
            _check(_LIB.braid_pg_init_env(ctypes.byref(handle), ctypes.byref(cfg)), "ProcessGroup from environment")
        else:
            if rank is None or size is None:
                raise BraidError("BRAID_ERR_INVALID_ARG", "braid: a unique_id needs rank and size")
            uid_bytes = bytes(unique_id)
            if len(uid_bytes) != _lib.UNIQUE_ID_BYTES:
                raise BraidError(
                    "BRAID_ERR_INVALID_ARG",
                    "braid: unique_id must be %d bytes, got %d" % (_lib.UNIQUE_ID_BYTES, len(uid_bytes)),
                )
            uid = _lib.UniqueId()
            ctypes.memmove(ctypes.byref(uid), uid_bytes, _lib.UNIQUE_ID_BYTES)
            _check(
                _LIB.braid_pg_init(ctypes.byref(handle), int(rank), int(size), ctypes.byref(uid), ctypes.byref(cfg)),
                "ProcessGroup(rank=%d, size=%d)" % (rank, size),
            )
        self._h = handle

    @property
    def rank(self):
        return _LIB.braid_pg_rank(self._handle())

    @property
    def size(self):
        return _LIB.braid_pg_size(self._handle())

    def _handle(self):
        if not self._h:
            raise BraidError("BRAID_ERR_INVALID_ARG", "braid: process group already destroyed")
        return self._h

    def allreduce(self, buf, op="sum", async_op=False):
        """All-reduce buf in place across the group. op: sum, prod, min,
        max or avg. Returns buf, or a Work when async_op."""
        if op not in _lib.OPS:
            raise BraidError("BRAID_ERR_INVALID_ARG", "braid: unknown op %r (one of %s)" % (op, ", ".join(_lib.OPS)))
        ptr, count, dtype, owner = _buffer_of(buf)
        what = "allreduce(%d elements, op=%s)" % (count, op)
        if not async_op:
            _check(_LIB.braid_allreduce(self._handle(), ptr, ptr, count, dtype, _lib.OPS[op], None, None), what)
            return buf
        work = ctypes.c_void_p()
        _check(_LIB.braid_allreduce(self._handle(), ptr, ptr, count, dtype, _lib.OPS[op], None, ctypes.byref(work)),
               what)
        return Work(work, owner, what)

    def allreduce_mulsum(self, buf, scalar, async_op=False):
        """Pre-multiplied sum in place: buf becomes the sum over ranks of
        each rank's buf * scalar (its own scalar, converted to buf's
        dtype). Returns buf, or a Work when async_op."""
        ptr, count, dtype, owner = _buffer_of(buf)
        try:
            raw = _lib.scalar_bytes(scalar, dtype)
        except (struct.error, ValueError, TypeError, OverflowError) as e:
            raise BraidError("BRAID_ERR_INVALID_ARG", "braid: scalar %r does not fit the buffer's dtype: %s" % (scalar, e))
        what = "allreduce_mulsum(%d elements, scalar=%r)" % (count, scalar)
        if not async_op:
            _check(_LIB.braid_allreduce_mulsum(self._handle(), ptr, ptr, count, dtype, raw, None, None), what)
            return buf
        work = ctypes.c_void_p()
        _check(_LIB.braid_allreduce_mulsum(self._handle(), ptr, ptr, count, dtype, raw, None, ctypes.byref(work)),
               what)
        return Work(work, owner, what)

    def broadcast(self, buf, root=0, async_op=False):
        """Broadcast buf from root to every rank, in place."""
        ptr, count, dtype, owner = _buffer_of(buf)
        what = "broadcast(%d elements, root=%d)" % (count, root)
        if not async_op:
            _check(_LIB.braid_broadcast(self._handle(), ptr, count, dtype, int(root), None, None), what)
            return buf
        work = ctypes.c_void_p()
        _check(_LIB.braid_broadcast(self._handle(), ptr, count, dtype, int(root), None, ctypes.byref(work)), what)
        return Work(work, owner, what)

    def stats(self):
        """The group's counters since it was made (braid_pg_stats):
        {"calls": {kind: {"calls", "failed", "bytes", "total_ns", "max_ns"}},
         "transports": {name: {"peers", "bytes_sent"}}}, kinds with calls
        only. bytes is count times element size summed over calls; a call
        still running is not counted yet."""
        s = _lib.Stats()
        s.size = ctypes.sizeof(_lib.Stats)
        _check(_LIB.braid_pg_stats(self._handle(), ctypes.byref(s)), "stats")
        calls = {}
        for k in s.kinds[: s.nkinds]:
            calls[k.name.decode()] = {f: getattr(k, f) for f in ("calls", "failed", "bytes", "total_ns", "max_ns")}
        transports = {t.name.decode(): {"peers": t.peers, "bytes_sent": t.bytes_sent}
                      for t in s.transports[: s.ntransports]}
        return {"calls": calls, "transports": transports}

    def trace_dump(self, path=None):
        """Write the group's flight recorder (its last BRAID_TRACE_BUFFER
        calls) to path, or into BRAID_TRACE_DIR, or to stderr
        (braid_pg_trace_dump); scripts/braid-trace-merge reads the files."""
        _check(_LIB.braid_pg_trace_dump(self._handle(), path.encode() if path else None), "trace_dump")

    def abort(self):
        """Make every pending and future call on the group fail fast."""
        _LIB.braid_pg_abort(self._handle())

    def destroy(self):
        if self._h:
            _LIB.braid_pg_destroy(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()

    def __del__(self):
        if getattr(self, "_h", None):
            self.destroy()
