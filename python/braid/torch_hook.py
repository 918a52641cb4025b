"""PyTorch DDP communication hooks that all-reduce gradient buckets with braid.

    import braid, braid.torch_hook
    model = torch.nn.parallel.DistributedDataParallel(net)   # any backend, e.g. gloo
    pg = braid.ProcessGroup()                                  # same launcher env
    model.register_comm_hook(pg, braid.torch_hook.allreduce_hook)

DDP still needs a torch process group of its own (it broadcasts the initial
parameters and buffers through it); the hook moves only the gradient
traffic onto braid. The braid group must span the same ranks in the same
order. CPU tensors only.

The hooks are asynchronous: each starts braid's all-reduce of the bucket
and returns a pending torch.futures.Future at once, so autograd goes on
computing the next buckets' gradients while braid's progress thread moves
this one (DDP waits for every Future at the end of backward). A helper
thread per process group waits for the braid works in issue order (the
order braid completes them in) and completes their Futures. The
``*_blocking`` twins run the all-reduce to completion inside the hook and
return a completed Future, for comparison or debugging.
"""

import threading

import torch

from ._completer import Completer, Pending

__all__ = [
    "allreduce_hook",
    "allreduce_hook_blocking",
    "allreduce_hook_async",
    "fp16_compress_hook",
    "fp16_compress_hook_blocking",
    "bf16_compress_hook",
    "bf16_compress_hook_blocking",
]


def _bucket_tensor(bucket):
    # GradBucket.buffer() since torch 1.10; get_tensor() before that.
    return bucket.buffer() if hasattr(bucket, "buffer") else bucket.get_tensor()


def _completed(tensor):
    fut = torch.futures.Future()
    fut.set_result(tensor)
    return fut


_completers_lock = threading.Lock()


def _completer(state):
    """The process group's completer, made on first use and kept on it."""
    with _completers_lock:
        c = getattr(state, "_braid_hook_completer", None)
        if c is None:
            c = Completer("braid-hook")
            state._braid_hook_completer = c
        return c


def _start(state, tensor, op, finish):
    work = state.allreduce(tensor, op=op, async_op=True)
    fut = torch.futures.Future()
    _completer(state).submit(Pending(work, fut, finish))
    return fut


def allreduce_hook(state, bucket):
    """Average bucket.buffer() over the braid group in place; returns a
    pending Future that completes with it (what DDP copies back into the
    grads) once braid is done."""
    tensor = _bucket_tensor(bucket)
    return _start(state, tensor, "avg", lambda: tensor)


# The asynchronous hook under its earlier name.
allreduce_hook_async = allreduce_hook


def allreduce_hook_blocking(state, bucket):
    """allreduce_hook that finishes the all-reduce before returning (a
    completed Future): no overlap with the rest of backward."""
    tensor = _bucket_tensor(bucket)
    state.allreduce(tensor, op="avg")
    return _completed(tensor)


def _compress(state, tensor, dtype):
    # Divide by the group size in float32 before the cast and all-reduce
    # with SUM: the sum is then the average, and no partial sum exceeds the
    # largest gradient by more than its rounding, where an average taken on
    # the wire would first add the ranks' values up in float16 and can pass
    # its 65504. torch's fp16_compress_hook also divides first (after its
    # cast). DDP overwrites the bucket with the Future's value, so dividing
    # it in place is safe.
    return tensor.div_(state.size).to(dtype)


def _compressed_hook(state, bucket, dtype, blocking):
    tensor = _bucket_tensor(bucket)
    wire = _compress(state, tensor, dtype)

    def finish():
        tensor.copy_(wire)
        return tensor

    if blocking:
        state.allreduce(wire, op="sum")
        return _completed(finish())
    return _start(state, wire, "sum", finish)


def fp16_compress_hook(state, bucket):
    """Like allreduce_hook, with the bucket sent and summed as float16
    after dividing by the group size (braid's counterpart of torch's
    default_hooks.fp16_compress_hook)."""
    return _compressed_hook(state, bucket, torch.float16, blocking=False)


def fp16_compress_hook_blocking(state, bucket):
    """fp16_compress_hook that finishes before returning."""
    return _compressed_hook(state, bucket, torch.float16, blocking=True)


def bf16_compress_hook(state, bucket):
    """Like fp16_compress_hook, with bfloat16 on the wire."""
    return _compressed_hook(state, bucket, torch.bfloat16, blocking=False)


def bf16_compress_hook_blocking(state, bucket):
    """bf16_compress_hook that finishes before returning."""
    return _compressed_hook(state, bucket, torch.bfloat16, blocking=True)
