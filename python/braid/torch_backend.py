"""braid as a torch.distributed backend: ``init_process_group("braid")``.

    import torch.distributed as dist
    import braid.torch_backend              # registers the backend "braid"
    dist.init_process_group("braid")        # under torchrun, or with rank,
                                            # world_size and init_method/store

Every group torch makes on this backend, ``dist.new_group(...)`` included,
is a braid group of its own. It meets through the store torch hands the
backend: the group's rank 0 makes a braid unique id and publishes it there,
the others read it. Nothing else needs configuring: braid's store listens on
an ephemeral port that the id names. torch's ``timeout`` is braid's timeout
(BRAID_TIMEOUT_MS) and its init timeout.

Written in Python, as a subclass of torch's ProcessGroup: torch calls it
from C++ too (DDP's reducer, buffer broadcasts), it builds on any torch with
no compiler, and each call costs one ctypes call into libbraid plus the
bookkeeping below (docs/PERFORMANCE.md gives the figures).

A synchronous call from torch.distributed's own functions runs braid's
blocking path and returns a finished Work. Otherwise ``wait()`` waits for
braid's work on the calling thread and raises the call's error, and
``get_future()`` completes when braid's work does, through the group's
helper thread (no thread per call; python/braid/_completer.py). Sends and
receives on host memory wait in an implicit batch until the group's next
other call or a wait for one of them (see ``_issue``). A CUDA call is
queued on the tensor's current stream; its Future is complete at once and
carries the stream's events, so ``wait()`` makes the caller's current
stream wait, as with NCCL (not yet run on a GPU).

What differs from gloo is in python/README.md. Anything braid cannot do
raises at once, naming the call and the reason.
"""

import collections
import ctypes
import inspect
import sys
import threading
import weakref

import torch
import torch.distributed as dist

from . import BraidError, ProcessGroup as _Group, Work as _Work, _LIB, _lib, unique_id
from ._completer import Completer, Pending

__all__ = ["BACKEND", "BraidProcessGroup", "stats", "trace_dump"]

BACKEND = "braid"
_UID_KEY = "braid/unique_id"
_INT_MAX = 2**31 - 1
_U8 = _lib.DTYPES["uint8"]
# torch dtypes braid reduces, one to one (torch.uint32/uint64 exist from
# torch 2.3 on).
_DTYPE = {getattr(torch, n): code for n, code in _lib.DTYPES.items() if hasattr(torch, n)}
# torch's ReduceOp -> braid's op, keyed by its RedOpType (hashable on
# every torch; a ReduceOp made with a factor carries its type in .op).
_OP_CODES = {getattr(getattr(dist.ReduceOp, name), "op", getattr(dist.ReduceOp, name)): _lib.OPS[ours]
             for name, ours in (("SUM", "sum"), ("PRODUCT", "prod"), ("MIN", "min"), ("MAX", "max"), ("AVG", "avg"))}
# Works handed to C++ (DDP's reducer, buffer broadcasts) are used at once
# there; a Work whose Python object is gone falls back to torch's base
# class, whose wait() never returns. The group keeps this many of its
# latest Works alive.
_KEEP_WORKS = 8192


def _unsupported(what, why):
    return BraidError("BRAID_ERR_UNSUPPORTED", "braid: %s: %s" % (what, why))


def _invalid(what, why):
    return BraidError("BRAID_ERR_INVALID_ARG", "braid: %s: %s" % (what, why))


def _raise_status(status, what):
    name = _lib.STATUS_NAMES[status] if 0 <= status < len(_lib.STATUS_NAMES) else "status %d" % status
    detail = _LIB.braid_last_error().decode(errors="replace")
    raise BraidError(name, "%s: %s" % (what, detail or name))


class _no_device:
    """The context of a host call (torch.cuda.device's place)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _check_status(status, what):
    if status != _lib.BRAID_OK:
        _raise_status(status, what)


def _bytes(t):
    """t's elements as a flat uint8 view (t contiguous)."""
    return t.reshape(-1).view(torch.uint8)


def _unflatten(flat, outs, n):
    """Copy rank r's n bytes of flat (a gather's uint8 buffer) into outs[r]."""
    for r, o in enumerate(outs):
        _bytes(o).copy_(flat[r * n:(r + 1) * n])


def _nbytes(t):
    return t.numel() * t.element_size()


class _FanOut:
    """Completes several Futures with one braid work (a coalesced batch)."""

    def __init__(self, futs):
        self._futs = futs

    def set_result(self, results):
        for fut, result in zip(self._futs, results):
            fut.set_result(result)

    def set_exception(self, e):
        for fut in self._futs:
            fut.set_exception(e)


class _Failed:
    """A braid work that failed before it was issued."""

    def __init__(self, error):
        self._error = error

    def wait(self):
        raise self._error

    def is_completed(self):
        return True


class _Discard:
    """Where a CUDA call's braid work ends: its Future was completed when
    the call was queued, and a failure shows in the group's next call."""

    def set_result(self, result):
        pass

    def set_exception(self, e):
        pass


class _BraidWork(dist.Work):
    """torch's Work for one call (or one batch). wait() waits for braid's
    work on the calling thread and raises the call's error (torch's Work
    made from a Future drops it); get_future() hands the call to the
    group's Completer."""

    def __init__(self, fut, pending=None, completer=None):
        super().__init__()
        self._fut, self._pending, self._completer = fut, pending, completer
        self._asked = False
        self._flusher = None  # issues the implicit batch this call waits in

    def _issued(self):
        if self._pending is None and self._flusher is not None:
            self._flusher()

    def _attach(self, pending, completer):
        self._pending, self._completer = pending, completer
        if self._asked:  # its Future was asked for while the batch was open
            completer.submit(pending)

    def wait(self, timeout=None):
        self._issued()
        if self._pending is None and not self._fut.done():
            raise _invalid("wait", "the call is in a batch that has not ended (_end_coalescing): it has not run")
        if self._pending is not None:
            self._pending.settle()
        self._fut.wait()  # raises the call's error
        return True

    def get_future(self):
        self._issued()
        if not self._asked:
            self._asked = True
            if self._pending is not None:
                self._completer.submit(self._pending)
        return self._fut

    def is_completed(self):
        self._issued()
        if self._pending is not None and not self._pending.settle_if_done():
            return False
        return self._fut.done()

    def is_success(self):
        if not self.is_completed():
            return False
        return self.exception() is None

    def exception(self):
        try:
            self._fut.value()
        except Exception as e:
            return e
        return None

    def result(self):
        self.wait()
        return self._fut.value()

    def synchronize(self):
        pass


class _DoneWork(dist.Work):
    """The Work of a call that ran to completion before it was returned (a
    synchronous call from torch.distributed's own function, which waits for
    it at once): its Future is made only if asked for."""

    def __init__(self, result):
        super().__init__()
        self._result = result

    def wait(self, timeout=None):
        return True

    def get_future(self):
        fut = torch.futures.Future()
        fut.set_result(self._result)
        return fut

    def is_completed(self):
        return True

    def is_success(self):
        return True

    def exception(self):
        return None

    def result(self):
        return self._result

    def synchronize(self):
        pass


class BraidProcessGroup(dist.ProcessGroup):
    """One braid group behind a torch ProcessGroup. Made by torch through
    the registered factory; its methods are torch's backend interface."""

    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)
        ms = int(timeout.total_seconds() * 1000) if timeout is not None else 0
        ms = max(1, min(ms, _INT_MAX)) if ms > 0 else 0
        if rank == 0:
            uid = unique_id()
            store.set(_UID_KEY, uid)
        else:
            uid = store.get(_UID_KEY)
        self._group = _Group(rank=rank, size=size, unique_id=uid, timeout_ms=ms, init_timeout_ms=ms)
        self._h = self._group._handle()
        self._completer = Completer("braid-pg%d" % rank)
        self._lock = threading.Lock()
        self._batch = None  # between _start_coalescing and _end_coalescing
        self._open_p2p = []  # the implicit batch of sends and receives (see _issue)
        self._closed = False
        self._works = collections.deque(maxlen=_KEEP_WORKS)
        _live.add(self)

    # ---- torch's bookkeeping -------------------------------------------

    def getBackendName(self):
        return BACKEND

    def stats(self):
        """braid's counters for this group: calls, bytes and times per kind
        of call, bytes sent per transport (braid.ProcessGroup.stats)."""
        return self._group.stats()

    def trace_dump(self, path=None):
        """Write braid's flight recorder for this group
        (braid.ProcessGroup.trace_dump)."""
        self._group.trace_dump(path)

    def _get_backend_name(self):
        return BACKEND

    def name(self):
        return BACKEND

    # ---- checks --------------------------------------------------------

    def _tensor(self, t, what):
        if not isinstance(t, torch.Tensor):
            raise _invalid(what, "expected a tensor, got %s" % type(t).__name__)
        if t.device.type not in ("cpu", "cuda"):
            raise _unsupported(what, "tensors on %s (braid takes cpu and cuda)" % t.device)
        if not t.is_contiguous():
            raise _invalid(what, "the tensor is not contiguous")
        return t

    def _one(self, tensors, what):
        if len(tensors) != 1:
            raise _unsupported(what, "%d tensors in one call (braid takes one per process)" % len(tensors))
        return self._tensor(tensors[0], what)

    def _same(self, tensors, like, what, count=None):
        for t in tensors:
            self._tensor(t, what)
            if t.dtype != like.dtype or t.device != like.device:
                raise _invalid(what, "tensors of %s on %s among %s on %s" % (t.dtype, t.device, like.dtype, like.device))
            if count is not None and t.numel() != count:
                raise _invalid(what, "a tensor of %d elements where %d are expected" % (t.numel(), count))

    def _reduce_dtype(self, t, what):
        code = _DTYPE.get(t.dtype)
        if code is None:
            names = ", ".join(sorted(str(d).replace("torch.", "") for d in _DTYPE))
            raise _unsupported(what, "braid does not reduce %s tensors (it reduces %s)" % (t.dtype, names))
        return code

    def _op(self, op, what, t):
        """(braid op, pre-multiply scalar bytes or None) for torch's op."""
        code = _OP_CODES.get(getattr(op, "op", op))
        if code is not None:
            return code, None
        if op == dist.ReduceOp.PREMUL_SUM:
            factor = _premul_factor(op)
            if factor is None:
                raise _unsupported(what, "PREMUL_SUM: this torch does not show a backend written in Python its "
                                   "factor; multiply the tensor and use SUM")
            return None, _lib.scalar_bytes(factor, self._reduce_dtype(t, what))
        raise _unsupported(what, "op %s (braid has SUM, PRODUCT, MIN, MAX, AVG and PREMUL_SUM)" % _op_name(op))

    def _root(self, root, what):
        if not 0 <= root < self.size():
            raise _invalid(what, "rank %d is not in this group of %d" % (root, self.size()))
        return root

    def _tag(self, tag, what):
        if tag:
            raise _unsupported(what, "tag %d: braid matches sends and receives between two ranks in call order, "
                               "without tags (use tag 0)" % tag)

    # ---- issuing -------------------------------------------------------

    def _issue(self, what, device, call, keep, finish, p2p=False):
        """Issue call(work_pointer) (one braid call on device's current
        stream), or record it in the open batch; return torch's Work.

        Sends and receives on host memory outside a batch wait in an
        implicit one until the group's next other call, a wait for one of
        them, or a blocking send or receive: then they run as one braid
        group, progressed together. braid runs a group's calls one after
        another, so an isend issued on its own would hold up the irecv
        behind it until the peer received, and a ring of isend/irecv pairs
        (or torch 2's batch_isend_irecv on CPU, which issues them one by
        one) would never finish."""
        cuda = device.type == "cuda"
        waits = not cuda and _caller_waits()
        with self._lock:
            if self._closed:
                raise _invalid(what, "the process group was destroyed")
            batch = self._batch
            if batch is None and not cuda and not p2p and waits:
                # The common synchronous call: run it, nothing to set up.
                if self._open_p2p:
                    self._flush_p2p_locked()
                _check_status(call(None), what)
                return _DoneWork(finish())
            fut = torch.futures.Future(devices=[device]) if cuda else torch.futures.Future()
            if batch is not None:  # an explicit batch (_start_coalescing)
                with torch.cuda.device(device) if cuda else _no_device():
                    _check_status(call(None), what)
                work = self._work(fut)
                batch.append((fut, finish, keep, cuda, work))
                return work
            if p2p and not cuda:  # the implicit batch of sends and receives
                work = self._work(fut)
                work._flusher = self._flush_p2p
                self._open_p2p.append((call, fut, finish, keep, work))
                if not waits:
                    return work
                self._flush_p2p_locked()
            else:
                if self._open_p2p:
                    self._flush_p2p_locked()
                h = ctypes.c_void_p()
                with torch.cuda.device(device) if cuda else _no_device():
                    _check_status(call(ctypes.byref(h)), what)
        if p2p and not cuda:
            work.wait()
            return work
        work = _Work(h, keep, what)
        if cuda:
            # Stream-ordered: the result is in place for later work on the
            # stream, and the Future records that point; braid's work is
            # left to the Completer (a failure shows in the next call).
            fut.set_result(finish())
            self._completer.submit(Pending(work, _Discard(), _none))
            return self._work(fut)
        return self._work(fut, Pending(work, fut, finish))

    def _flush_p2p(self):
        with self._lock:
            self._flush_p2p_locked()

    def _flush_p2p_locked(self):
        """Issue the implicit batch of sends and receives as one group."""
        batch, self._open_p2p = self._open_p2p, []
        if not batch:
            return
        what = "rank %d: a batch of %d sends and receives" % (self.rank(), len(batch))
        futs, keep = [b[1] for b in batch], [b[3] for b in batch]
        h = ctypes.c_void_p()
        try:
            with _BraidBatch(self._h, what, ctypes.byref(h)) as group:
                for b in batch:
                    group.check(b[0](None))
        except BraidError as e:
            if h.value:  # what was recorded before the failure still runs
                self._completer.submit(Pending(_Work(h, keep, what), _Discard(), _none))
            # Settled by a waiter or the Completer, not here: completing a
            # Future runs its callbacks, and this thread holds the lock.
            pending = Pending(_Failed(e), _FanOut(futs), _none)
        else:
            pending = Pending(_Work(h, keep, what), _FanOut(futs), lambda: [b[2]() for b in batch])
        for b in batch:
            b[4]._attach(pending, self._completer)

    def _work(self, fut, pending=None):
        w = _BraidWork(fut, pending, self._completer)
        self._works.append(w)
        return w

    def _grouped(self, what, device, calls, keep, finish):
        """Run calls (each issues one braid call with work=None) as one
        braid group: one Work for all."""
        def call(work):
            with _BraidBatch(self._h, what, work) as group:
                for c in calls:
                    group.check(c(None))
            return _lib.BRAID_OK
        return self._issue(what, device, call, keep, finish)

    def _start_coalescing(self, *args):
        with self._lock:
            if self._batch is not None:
                raise _invalid("coalescing", "a batch is already open")
            self._flush_p2p_locked()
            status = _LIB.braid_group_start(self._h)
            if status != _lib.BRAID_OK:
                _raise_status(status, "rank %d: start of a batch" % self.rank())
            self._batch = []

    def _end_coalescing(self, *args):
        with self._lock:
            batch, self._batch = self._batch, None
            if batch is None:
                raise _invalid("coalescing", "no batch is open")
            h = ctypes.c_void_p()
            status = _LIB.braid_group_end(self._h, ctypes.byref(h))
        futs = [b[0] for b in batch]
        if status != _lib.BRAID_OK:
            e = BraidError(_lib.STATUS_NAMES[status], "rank %d: a batch of %d calls: %s"
                           % (self.rank(), len(batch), _LIB.braid_last_error().decode(errors="replace")))
            _FanOut(futs).set_exception(e)
            raise e
        work = _Work(h, [b[2] for b in batch], "a batch of %d calls" % len(batch))
        if any(b[3] for b in batch):
            _FanOut(futs).set_result([b[1]() for b in batch])
            self._completer.submit(Pending(work, _Discard(), _none))
            pending = None
        else:
            pending = Pending(work, _FanOut(futs), lambda: [b[1]() for b in batch])
            for b in batch:
                b[4]._attach(pending, self._completer)
        if not futs:
            done = torch.futures.Future()
            done.set_result([])
            return self._work(done)
        return self._work(torch.futures.collect_all(futs), pending)

    # ---- collectives ---------------------------------------------------

    def allreduce(self, tensors, opts=None):
        what = "all_reduce"
        t = self._one(tensors, what)
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        return self._issue(what, t.device, self._allreduce_call(t, op, what), [t], lambda: [t])

    def _allreduce_call(self, t, op, what):
        dtype = self._reduce_dtype(t, what)
        code, scalar = self._op(op, what, t)
        stream = _stream(t)
        p = t.data_ptr()
        if scalar is not None:
            return lambda w: _LIB.braid_allreduce_mulsum(self._h, p, p, t.numel(), dtype, scalar, stream, w)
        return lambda w: _LIB.braid_allreduce(self._h, p, p, t.numel(), dtype, code, stream, w)

    def allreduce_coalesced(self, tensors, opts=None):
        what = "all_reduce_coalesced"
        if not tensors:
            raise _invalid(what, "no tensors")
        self._same(tensors, tensors[0], what)
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        calls = [self._allreduce_call(t, op, what) for t in tensors]
        return self._grouped(what, tensors[0].device, calls, list(tensors), lambda: list(tensors))

    def broadcast(self, tensors, opts=None):
        what = "broadcast"
        t = self._one(tensors, what)
        root = self._root(opts.rootRank if opts is not None else 0, what)
        stream, p, n = _stream(t), t.data_ptr(), _nbytes(t)
        call = lambda w: _LIB.braid_broadcast(self._h, p, n, _U8, root, stream, w)  # noqa: E731
        return self._issue(what, t.device, call, [t], lambda: [t])

    def reduce(self, tensors, opts=None):
        what = "reduce"
        t = self._one(tensors, what)
        root = self._root(opts.rootRank if opts is not None else 0, what)
        dtype = self._reduce_dtype(t, what)
        code, scalar = self._op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM, what, t)
        stream, p = _stream(t), t.data_ptr()
        if scalar is not None:
            call = lambda w: _LIB.braid_reduce_mulsum(self._h, p, p, t.numel(), dtype, scalar, root, stream, w)  # noqa: E731
        else:
            call = lambda w: _LIB.braid_reduce(self._h, p, p, t.numel(), dtype, code, root, stream, w)  # noqa: E731
        return self._issue(what, t.device, call, [t], lambda: [t])

    def allgather(self, output_tensors, input_tensors, opts=None):
        what = "all_gather"
        t = self._one(input_tensors, what)
        outs = self._outputs(output_tensors, what)
        self._same(outs, t, what, t.numel())
        flat = torch.empty(self.size() * _nbytes(t), dtype=torch.uint8, device=t.device)
        n, stream = _nbytes(t), _stream(t)
        call = lambda w: _LIB.braid_allgather(self._h, t.data_ptr(), flat.data_ptr(), n, _U8, stream, w)  # noqa: E731

        def finish():
            _unflatten(flat, outs, n)
            return [outs]
        return self._issue(what, t.device, call, [t, flat, outs], finish)

    def _outputs(self, lists, what):
        if len(lists) != 1 or len(lists[0]) != self.size():
            raise _invalid(what, "expected one list of %d tensors" % self.size())
        return list(lists[0])

    def _allgather_base(self, output, input, opts=None):
        what = "all_gather_into_tensor"
        self._tensor(input, what)
        self._tensor(output, what)
        self._same([output], input, what, input.numel() * self.size())
        n, stream = _nbytes(input), _stream(input)
        call = lambda w: _LIB.braid_allgather(self._h, input.data_ptr(), output.data_ptr(), n, _U8, stream, w)  # noqa: E731
        return self._issue(what, input.device, call, [input, output], lambda: [output])

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        what = "all_gather_into_tensor_coalesced"
        calls = []
        for o, i in zip(outputs, inputs):
            self._same([o], i, what, i.numel() * self.size())
            calls.append(lambda w, o=o, i=i: _LIB.braid_allgather(self._h, i.data_ptr(), o.data_ptr(), _nbytes(i),
                                                                  _U8, _stream(i), w))
        return self._grouped(what, inputs[0].device, calls, [outputs, inputs], lambda: list(outputs))

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        what = "reduce_scatter"
        out = self._one(output_tensors, what)
        ins = self._outputs(input_tensors, what)
        self._same(ins, out, what, out.numel())
        flat = torch.cat([i.reshape(-1) for i in ins])
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        call = self._reduce_scatter_call(flat, out, op, what)
        return self._issue(what, out.device, call, [flat, out], lambda: [out])

    def _reduce_scatter_call(self, src, out, op, what):
        dtype = self._reduce_dtype(out, what)
        code, scalar = self._op(op, what, out)
        stream, n = _stream(out), out.numel()
        if scalar is not None:
            return lambda w: _LIB.braid_reduce_scatter_mulsum(self._h, src.data_ptr(), out.data_ptr(), n, dtype,
                                                              scalar, stream, w)
        return lambda w: _LIB.braid_reduce_scatter(self._h, src.data_ptr(), out.data_ptr(), n, dtype, code, stream, w)

    def _reduce_scatter_base(self, output, input, opts=None):
        what = "reduce_scatter_tensor"
        self._tensor(input, what)
        self._tensor(output, what)
        self._same([input], output, what, output.numel() * self.size())
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        call = self._reduce_scatter_call(input, output, op, what)
        return self._issue(what, output.device, call, [input, output], lambda: [output])

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        what = "reduce_scatter_tensor_coalesced"
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        calls = []
        for o, i in zip(outputs, inputs):
            self._same([i], o, what, o.numel() * self.size())
            calls.append(self._reduce_scatter_call(i, o, op, what))
        return self._grouped(what, outputs[0].device, calls, [outputs, inputs], lambda: list(outputs))

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        what = "all_to_all_single"
        self._tensor(input, what)
        self._tensor(output, what)
        self._same([output], input, what)
        size = self.size()
        if not output_split_sizes and not input_split_sizes:
            if input.numel() % size or output.numel() != input.numel():
                raise _invalid(what, "%d input and %d output elements do not split evenly over %d ranks"
                               % (input.numel(), output.numel(), size))
            n, stream = _nbytes(input) // size, _stream(input)
            call = lambda w: _LIB.braid_alltoall(self._h, input.data_ptr(), output.data_ptr(), n, _U8, stream, w)  # noqa: E731
            return self._issue(what, input.device, call, [input, output], lambda: [output])
        sends = _splits(input, input_split_sizes, size, what)
        recvs = _splits(output, output_split_sizes, size, what)
        return self._exchange(what, input, sends, output, recvs)

    def _exchange(self, what, inputs, sends, outputs, recvs):
        """A batch of sends and receives: sends[p], recvs[p] are (pointer,
        bytes) for rank p; inputs and outputs are the tensor or tensors
        they lie in (the result is outputs)."""
        like = inputs[0] if isinstance(inputs, list) else inputs
        stream = _stream(like)
        calls = []
        for p in range(self.size()):
            calls.append(lambda w, p=p: _LIB.braid_send(self._h, sends[p][0], sends[p][1], _U8, p, stream, w))
            calls.append(lambda w, p=p: _LIB.braid_recv(self._h, recvs[p][0], recvs[p][1], _U8, p, stream, w))
        result = outputs if isinstance(outputs, list) else [outputs]
        return self._grouped(what, like.device, calls, [inputs, outputs], lambda: result)

    def alltoall(self, output_tensors, input_tensors, opts=None):
        what = "all_to_all"
        if len(output_tensors) != self.size() or len(input_tensors) != self.size():
            raise _invalid(what, "expected %d input and %d output tensors" % (self.size(), self.size()))
        like = self._tensor(input_tensors[0], what)
        self._same(list(input_tensors) + list(output_tensors), like, what)
        sends = [(t.data_ptr(), _nbytes(t)) for t in input_tensors]
        recvs = [(t.data_ptr(), _nbytes(t)) for t in output_tensors]
        return self._exchange(what, list(input_tensors), sends, list(output_tensors), recvs)

    def gather(self, output_tensors, input_tensors, opts=None):
        what = "gather"
        t = self._one(input_tensors, what)
        root = self._root(opts.rootRank if opts is not None else 0, what)
        n, stream = _nbytes(t), _stream(t)
        outs, flat = [], None
        if self.rank() == root:
            outs = self._outputs(output_tensors, what)
            self._same(outs, t, what, t.numel())
            flat = torch.empty(self.size() * n, dtype=torch.uint8, device=t.device)
        elif output_tensors and any(len(o) for o in output_tensors):
            raise _invalid(what, "output tensors on rank %d, which is not the root %d" % (self.rank(), root))
        dst = flat.data_ptr() if flat is not None else None
        call = lambda w: _LIB.braid_gather(self._h, t.data_ptr(), dst, n, _U8, root, stream, w)  # noqa: E731

        def finish():
            _unflatten(flat, outs, n)
            return [outs] if outs else []
        return self._issue(what, t.device, call, [t, flat, outs], finish)

    def scatter(self, output_tensors, input_tensors, opts=None):
        what = "scatter"
        out = self._one(output_tensors, what)
        root = self._root(opts.rootRank if opts is not None else 0, what)
        n, stream = _nbytes(out), _stream(out)
        flat = None
        if self.rank() == root:
            ins = self._outputs(input_tensors, what)
            self._same(ins, out, what, out.numel())
            flat = torch.cat([_bytes(i) for i in ins])
        elif input_tensors and any(len(i) for i in input_tensors):
            raise _invalid(what, "input tensors on rank %d, which is not the root %d" % (self.rank(), root))
        src = flat.data_ptr() if flat is not None else None
        call = lambda w: _LIB.braid_scatter(self._h, src, out.data_ptr(), n, _U8, root, stream, w)  # noqa: E731
        return self._issue(what, out.device, call, [flat, out], lambda: [out])

    def barrier(self, opts=None):
        what = "barrier"
        t = torch.zeros(1, dtype=torch.uint8)
        call = lambda w: _LIB.braid_allreduce(self._h, t.data_ptr(), t.data_ptr(), 1, _U8, _lib.OPS["max"], None, w)  # noqa: E731
        return self._issue(what, t.device, call, [t], lambda: [t])

    def send(self, tensors, dst, tag=0):
        return self._p2p(_LIB.braid_send, tensors, dst, tag, "send to rank %d" % dst)

    def recv(self, tensors, src, tag=0):
        return self._p2p(_LIB.braid_recv, tensors, src, tag, "recv from rank %d" % src)

    def _p2p(self, fn, tensors, peer, tag, what):
        t = self._one(tensors, what)
        self._tag(tag, what)
        self._root(peer, what)
        n, stream = _nbytes(t), _stream(t)
        call = lambda w: fn(self._h, t.data_ptr(), n, _U8, peer, stream, w)  # noqa: E731
        return self._issue(what, t.device, call, [t], lambda: [t], p2p=True)

    def recv_anysource(self, tensors, tag=0):
        raise _unsupported("recv from any source", "braid receives from a named rank (give src)")

    def monitored_barrier(self, *args, **kwargs):
        raise _unsupported("monitored_barrier", "use barrier(); a rank that stops answering fails it within "
                           "braid's timeout, naming the rank")

    # ---- life ----------------------------------------------------------

    def abort(self):
        """Make every pending and later call fail at once; then close."""
        if not self._closed:
            _LIB.braid_pg_abort(self._h)
        self.shutdown()

    def shutdown(self):
        """Wait for what was issued (within braid's timeout), stop the
        group's thread and destroy the braid group."""
        with self._lock:
            if self._closed:
                return
            self._flush_p2p_locked()
            self._closed = True
        self._completer.stop()
        self._group.destroy()
        _live.discard(self)

    def __del__(self):
        try:
            self.shutdown()
        except Exception:  # interpreter teardown: nothing left to tell
            pass


class _BraidBatch:
    """braid_group_start .. braid_group_end around the calls of one Work."""

    def __init__(self, h, what, work):
        self._h, self._what, self._work = h, what, work
        self._failed = None

    def __enter__(self):
        status = _LIB.braid_group_start(self._h)
        if status != _lib.BRAID_OK:
            _raise_status(status, self._what)
        return self

    def check(self, status):
        if status != _lib.BRAID_OK and self._failed is None:
            self._failed = (status, _LIB.braid_last_error().decode(errors="replace"))
        if self._failed:
            raise BraidError(_lib.STATUS_NAMES[self._failed[0]], "%s: %s" % (self._what, self._failed[1]))

    def __exit__(self, kind, value, tb):
        status = _LIB.braid_group_end(self._h, self._work)
        if kind is None and status != _lib.BRAID_OK:
            _raise_status(status, self._what)
        return False


def _none():
    return None


_C10D = dist.distributed_c10d.__file__


def _caller_waits():
    """True when the call came from torch.distributed's own function with
    async_op=False: it waits for the Work as soon as it has it, so braid
    may run the call to completion at once (inline on an idle group, no
    thread hand-off: the latency of a blocking braid call). Anything else
    (async_op=True, C++ callers such as DDP's reducer) gets a work handle."""
    try:
        f = sys._getframe(3)
    except ValueError:  # a shallow stack: called from C++ (DDP's reducer)
        return False
    for _ in range(3):
        if f is None:
            return False
        if f.f_code.co_filename == _C10D:
            return f.f_locals.get("async_op", True) is False
        f = f.f_back
    return False


def _stream(t):
    return torch.cuda.current_stream(t.device).cuda_stream if t.device.type == "cuda" else None


def _splits(t, sizes, size, what):
    """(pointer, bytes) per rank of t cut along dim 0 by sizes (empty: even)."""
    rows = t.shape[0] if t.dim() else 1
    row_bytes = _nbytes(t) // rows if rows else 0
    if not sizes:
        if rows % size:
            raise _invalid(what, "%d rows do not split evenly over %d ranks" % (rows, size))
        sizes = [rows // size] * size
    if len(sizes) != size or sum(sizes) != rows or min(sizes) < 0:
        raise _invalid(what, "split sizes %s do not cut %d rows into %d parts" % (list(sizes), rows, size))
    out, at = [], t.data_ptr()
    for s in sizes:
        out.append((at, s * row_bytes))
        at += s * row_bytes
    return out


def _op_name(op):
    for name in ("BAND", "BOR", "BXOR", "PREMUL_SUM"):
        if hasattr(dist.ReduceOp, name) and op == getattr(dist.ReduceOp, name):
            return name
    return str(op)


def _premul_factor(op):
    """PREMUL_SUM's factor where this torch shows it to Python, else None."""
    try:
        state = op.__getstate__()
    except Exception:
        return None
    for v in state if isinstance(state, tuple) else (state,):
        if isinstance(v, float):
            return v
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            return float(v.item())
    return None


# Groups still open at exit are shut down before the interpreter goes.
_live = weakref.WeakSet()


def _shutdown_all():
    for pg in list(_live):
        try:
            pg.shutdown()
        except Exception:
            pass


def _braid_group(group, what):
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if not isinstance(pg, BraidProcessGroup):
        raise _invalid(what, "the group is a %s group, not braid's" % type(pg).__name__)
    return pg


def stats(group=None):
    """braid's counters for a group of the backend "braid" (the default
    group when None): see BraidProcessGroup.stats."""
    return _braid_group(group, "stats").stats()


def trace_dump(group=None, path=None):
    """Write braid's flight recorder of a group of the backend "braid" (the
    default group when None): see BraidProcessGroup.trace_dump."""
    _braid_group(group, "trace_dump").trace_dump(path)


def _create(store, rank, size, timeout):
    return BraidProcessGroup(store, rank, size, timeout)


def _register():
    if BACKEND.upper() in dist.Backend._plugins:
        return
    params = inspect.signature(dist.Backend.register_backend).parameters
    if "devices" in params:
        dist.Backend.register_backend(BACKEND, _create, devices=["cpu", "cuda"])
    else:
        dist.Backend.register_backend(BACKEND, _create)


import atexit  # noqa: E402

atexit.register(_shutdown_all)
_register()
