"""PyTorch DDP communication hooks that all-reduce gradient buckets with braid.

    import braid, braid.torch_hook
    model = torch.nn.parallel.DistributedDataParallel(net)   # any backend, e.g. gloo
    pg = braid.ProcessGroup()                                  # same launcher env
    model.register_comm_hook(pg, braid.torch_hook.allreduce_hook)

DDP still needs a torch process group of its own (it broadcasts the initial
parameters and buffers through it); the hook moves only the gradient
traffic onto braid. The braid group must span the same ranks in the same
order. CPU tensors only.
"""

import queue
import threading

import torch

__all__ = ["allreduce_hook", "allreduce_hook_async", "fp16_compress_hook", "bf16_compress_hook"]


def _bucket_tensor(bucket):
    # GradBucket.buffer() since torch 1.10; get_tensor() before that.
    return bucket.buffer() if hasattr(bucket, "buffer") else bucket.get_tensor()


def _completed(tensor):
    fut = torch.futures.Future()
    fut.set_result(tensor)
    return fut


def allreduce_hook(state, bucket):
    """Average bucket.buffer() over the braid group in place and return a
    completed Future holding it (what DDP copies back into the grads).

    The all-reduce runs to completion before returning: DDP calls hooks
    from its autograd hooks as buckets fill, and braid's ctypes calls drop
    the GIL, so backward of other buckets is not held up by Python."""
    tensor = _bucket_tensor(bucket)
    state.allreduce(tensor, op="avg")
    return _completed(tensor)


class _Completer:
    """One thread per process group that waits for braid works in issue
    order (the order braid completes them in) and completes their Futures,
    so the hook can return at once and backward runs on meanwhile."""

    def __init__(self):
        self._q = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="braid-hook", daemon=True)
        self._thread.start()

    def submit(self, work, fut, tensor):
        self._q.put((work, fut, tensor))

    def _run(self):
        while True:
            work, fut, tensor = self._q.get()
            try:
                work.wait()  # drops the GIL while braid works
            except Exception as e:  # hand the BraidError to whoever waits on fut
                fut.set_exception(e)
            else:
                fut.set_result(tensor)


_completers = {}
_completers_lock = threading.Lock()


def _completer(state):
    with _completers_lock:
        c = _completers.get(id(state))
        if c is None:
            c = _completers[id(state)] = _Completer()
        return c


def allreduce_hook_async(state, bucket):
    """Like allreduce_hook, but returns a pending Future: the all-reduce
    runs on braid's progress thread while autograd computes the next
    buckets, and a helper thread completes the Future when it is done."""
    tensor = _bucket_tensor(bucket)
    work = state.allreduce(tensor, op="avg", async_op=True)
    fut = torch.futures.Future()
    _completer(state).submit(work, fut, tensor)
    return fut


def _compressed_hook(state, bucket, dtype):
    tensor = _bucket_tensor(bucket)
    wire = tensor.to(dtype)
    state.allreduce(wire, op="avg")
    tensor.copy_(wire)
    return _completed(tensor)


def fp16_compress_hook(state, bucket):
    """Like allreduce_hook, with the bucket sent and averaged as float16
    (braid's counterpart of torch's default_hooks.fp16_compress_hook)."""
    return _compressed_hook(state, bucket, torch.float16)


def bf16_compress_hook(state, bucket):
    """Like allreduce_hook, with the bucket sent and averaged as bfloat16."""
    return _compressed_hook(state, bucket, torch.bfloat16)
