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

import torch

__all__ = ["allreduce_hook", "fp16_compress_hook", "bf16_compress_hook"]


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
