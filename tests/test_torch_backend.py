#!/usr/bin/env python3
"""torch.distributed on the backend "braid" against gloo in the same job.

Each rank is a subprocess. Modes:

- collectives at 2, 3 and 4 ranks: the default group is "braid" and a gloo
  group spans the same ranks. Every collective torch routes to a backend
  runs on both with the same inputs and the results must be equal
  bit for bit (inputs are small integers, exact in every dtype, so no sum
  order can round differently). Where gloo lacks the call, op or dtype
  (reduce_scatter, AVG, ...) the reference is computed locally with braid's
  documented arithmetic (integers wrap, AVG divides once and truncates
  integers). Also: subgroups, async calls whose Futures complete with
  then() chains, object collectives, calls braid refuses (each must raise
  at once naming the reason), and destroy_process_group leaving no braid
  thread behind;
- explicit: init_process_group with an explicit TCPStore, rank and size;
- torchrun: two ranks started by torch.distributed.run (env://);
- killed: 3 ranks, rank 2 exits during a loop of all-reduces; each
  survivor's call must raise within the timeout, naming rank 2;
- ddp: a conv net with BatchNorm trained with DDP on "braid" and on gloo
  from the same weights and data: parameters equal bit for bit at 2 ranks,
  within float rounding (1e-5) at 3; then DDP's own fp16 compression and
  PowerSGD hooks on "braid" against the same hooks on gloo.

TORCH_BACKEND_CASES=mode,...,mode:ranks picks cases (collectives:2 is
the collectives at 2 ranks). BRAID_TORCH_TEST_DEVICE=cuda runs every mode on CUDA tensors (torch 2's
default device; gloo's CUDA support is partial, so more calls compare with
the local reference), as the GPU check does.

Exit 77 (skip) when torch, its gloo backend or libbraid is missing.
"""

import datetime
import os
import re
import subprocess
import sys
import time

from free_ports import free_ports  # tests/ is sys.path[0]
from rank_procs import collect

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.environ.get("BRAID_PYTHONPATH", os.path.join(os.path.dirname(HERE), "python")))
TIMEOUT_S = 20
# BRAID_TORCH_TEST_DEVICE=cuda runs the same checks on CUDA tensors (torch
# 2.x's default device; each rank on GPU rank % count).
DEVICE = os.environ.get("BRAID_TORCH_TEST_DEVICE", "cpu")


def rank_timeout():
    return int(os.environ.get("TEST_RANK_TIMEOUT", "300"))


# ---- helpers a rank uses ------------------------------------------------

def use_device(rank):
    """Make DEVICE the default for the tensors this rank makes."""
    if DEVICE == "cpu":
        return
    import torch

    torch.cuda.set_device(rank % torch.cuda.device_count())
    torch.set_default_device("cuda")


def init(rank, size, port):
    import torch.distributed as dist

    use_device(rank)

    import braid.torch_backend  # noqa: F401  registers "braid"

    dist.init_process_group("braid", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=TIMEOUT_S))
    return dist.new_group(backend="gloo")


def value(torch, rank, shape, dtype, op="sum"):
    """Rank `rank`'s input: small integers, exact in every dtype; in
    [-2, 2] for products (non-negative where the dtype is unsigned)."""
    n = 1
    for s in shape:
        n *= s
    i = torch.arange(n, dtype=torch.int64)
    unsigned = dtype in (torch.uint8, torch.bool)
    if op == "prod":
        v = (i * 7 + rank * 3) % 5 - (0 if unsigned else 2)
        v = v.clamp(min=0) if unsigned else v
    else:
        v = (i * 7 + rank * 13) % 11 - (0 if unsigned else 5)
    if dtype == torch.bool:
        return (v % 2 == 1).reshape(shape)
    return v.to(dtype).reshape(shape)


def reduce_local(torch, xs, op):
    """braid's result for op over the ranks' inputs xs (in rank order)."""
    acc = xs[0].clone()
    for x in xs[1:]:
        if op in ("sum", "avg"):
            acc += x
        elif op == "prod":
            acc *= x
        elif op == "min":
            acc = torch.minimum(acc, x)
        else:
            acc = torch.maximum(acc, x)
    if op == "avg":
        n = len(xs)
        acc = torch.div(acc, n, rounding_mode="trunc") if not acc.is_floating_point() else acc / n
    return acc


def torch_op(dist, op):
    return {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
            "max": dist.ReduceOp.MAX, "avg": dist.ReduceOp.AVG}[op]


class Checker:
    """Runs a call on braid and on gloo (or the local reference where gloo
    refuses it) and requires equal results."""

    def __init__(self, torch, dist, gloo, rank, size):
        self.torch, self.dist, self.gloo, self.rank, self.size = torch, dist, gloo, rank, size
        self.count = 0
        self.by_gloo = 0

    def same(self, name, fn, local=None):
        """fn(group) -> list of result tensors; local() -> the reference
        where gloo raises."""
        got = fn(None)
        try:
            want = fn(self.gloo)
            self.by_gloo += 1
        except RuntimeError as e:
            if local is None:
                raise AssertionError("%s: gloo refused it (%s) and there is no local reference" % (name, e))
            want = local()
        assert len(got) == len(want), "%s: %d results, want %d" % (name, len(got), len(want))
        for k, (g, w) in enumerate(zip(got, want)):
            assert g.dtype == w.dtype and g.shape == w.shape, "%s[%d]: %s %s, want %s %s" % (
                name, k, g.dtype, tuple(g.shape), w.dtype, tuple(w.shape))
            assert self.torch.equal(g, w), "%s[%d] on rank %d:\n got %s\nwant %s" % (name, k, self.rank, g, w)
        self.count += 1

    def raises(self, name, fn, text):
        t0 = time.monotonic()
        try:
            fn()
        except (RuntimeError, ValueError) as e:
            assert text.lower() in str(e).lower(), "%s: error %r does not mention %r" % (name, str(e), text)
        else:
            raise AssertionError("%s: no error; want one mentioning %r" % (name, text))
        assert time.monotonic() - t0 < 5, "%s: took %.1f s to raise" % (name, time.monotonic() - t0)


def check_all_reduce(c, torch, dist):
    dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32,
              torch.int64]
    for dtype in dtypes:
        for op in ("sum", "prod", "min", "max", "avg"):
            for count in (1, 1000):
                def fn(group, dtype=dtype, op=op, count=count):
                    t = value(torch, c.rank, (count,), dtype, op)
                    dist.all_reduce(t, op=torch_op(dist, op), group=group)
                    return [t]

                def local(dtype=dtype, op=op, count=count):
                    return [reduce_local(torch, [value(torch, r, (count,), dtype, op) for r in range(c.size)], op)]
                c.same("all_reduce %s %s x%d" % (dtype, op, count), fn, local)
    # complex: torch hands the backend a real view (SUM and AVG)
    for op in ("sum", "avg"):
        def fn(group, op=op):
            t = torch.complex(value(torch, c.rank, (64,), torch.float32), value(torch, c.rank + 1, (64,), torch.float32))
            dist.all_reduce(t, op=torch_op(dist, op), group=group)
            return [t]

        def local(op=op):
            re = reduce_local(torch, [value(torch, r, (64,), torch.float32) for r in range(c.size)], op)
            im = reduce_local(torch, [value(torch, r + 1, (64,), torch.float32) for r in range(c.size)], op)
            return [torch.complex(re, im)]
        c.same("all_reduce complex64 %s" % op, fn, local)

    def coalesced(group):
        ts = [value(torch, c.rank, (n,), torch.float32) for n in (3, 1000, 17)]
        dist.all_reduce_coalesced(ts, group=group)
        return ts
    c.same("all_reduce_coalesced", coalesced,
           lambda: [reduce_local(torch, [value(torch, r, (n,), torch.float32) for r in range(c.size)], "sum")
                    for n in (3, 1000, 17)])


def check_movement(c, torch, dist):
    size, rank = c.size, c.rank
    for dtype in (torch.float32, torch.int16, torch.bool, torch.complex64, torch.bfloat16):
        for root in range(size):
            def bcast(group, dtype=dtype, root=root):
                t = value(torch, rank, (33,), torch.float32).to(dtype)
                dist.broadcast(t, src=root, group=group)
                return [t]
            c.same("broadcast %s from %d" % (dtype, root), bcast,
                   lambda dtype=dtype, root=root: [value(torch, root, (33,), torch.float32).to(dtype)])

        def gather_all(group, dtype=dtype):
            outs = [torch.empty(5, dtype=dtype) for _ in range(size)]
            dist.all_gather(outs, value(torch, rank, (5,), torch.float32).to(dtype), group=group)
            return outs
        c.same("all_gather %s" % dtype, gather_all,
               lambda dtype=dtype: [value(torch, r, (5,), torch.float32).to(dtype) for r in range(size)])

    def into_tensor(group):
        out = torch.empty(size * 6, dtype=torch.int32)
        dist.all_gather_into_tensor(out, value(torch, rank, (6,), torch.int32), group=group)
        return [out]
    c.same("all_gather_into_tensor", into_tensor,
           lambda: [torch.cat([value(torch, r, (6,), torch.int32) for r in range(size)])])

    def to_all(group):
        outs = [torch.empty(4) for _ in range(size)]
        dist.all_to_all(outs, [value(torch, rank * size + p, (4,), torch.float32) for p in range(size)], group=group)
        return outs
    c.same("all_to_all", to_all, lambda: [value(torch, p * size + rank, (4,), torch.float32) for p in range(size)])

    def single_even(group):
        out = torch.empty(size * 3, 2)
        dist.all_to_all_single(out, value(torch, rank, (size * 3, 2), torch.float32), group=group)
        return [out]

    def single_even_local():
        return [torch.cat([value(torch, p, (size * 3, 2), torch.float32)[rank * 3:(rank + 1) * 3]
                           for p in range(size)])]
    c.same("all_to_all_single even", single_even, single_even_local)

    def rows(src, dst):  # rows rank src sends rank dst: 0..3, a zero among them
        return (src + 2 * dst) % 4

    def single_uneven(group):
        ins = [rows(rank, p) for p in range(size)]
        outs = [rows(p, rank) for p in range(size)]
        inp = value(torch, rank, (sum(ins), 3), torch.int64)
        out = torch.full((sum(outs), 3), -1, dtype=torch.int64)
        dist.all_to_all_single(out, inp, output_split_sizes=outs, input_split_sizes=ins, group=group)
        return [out]

    def single_uneven_local():
        parts = []
        for p in range(size):
            before = sum(rows(p, q) for q in range(rank))
            parts.append(value(torch, p, (sum(rows(p, q) for q in range(size)), 3), torch.int64)
                         [before:before + rows(p, rank)])
        return [torch.cat(parts)]
    c.same("all_to_all_single uneven", single_uneven, single_uneven_local)

    for root in (0, size - 1):
        def gather(group, root=root):
            t = value(torch, rank, (7,), torch.float64)
            outs = [torch.empty(7, dtype=torch.float64) for _ in range(size)] if rank == root else None
            dist.gather(t, outs, dst=root, group=group)
            return outs if rank == root else [t]
        c.same("gather to %d" % root, gather,
               lambda root=root: [value(torch, r, (7,), torch.float64) for r in range(size)] if rank == root
               else [value(torch, rank, (7,), torch.float64)])

        def scatter(group, root=root):
            out = torch.empty(9, dtype=torch.int32)
            ins = [value(torch, 10 + p, (9,), torch.int32) for p in range(size)] if rank == root else None
            dist.scatter(out, ins, src=root, group=group)
            return [out]
        c.same("scatter from %d" % root, scatter, lambda: [value(torch, 10 + rank, (9,), torch.int32)])


def check_reductions(c, torch, dist):
    size, rank = c.size, c.rank
    for root in (0, size - 1):
        for op in ("sum", "max"):
            def red(group, root=root, op=op):
                t = value(torch, rank, (100,), torch.float32)
                dist.reduce(t, dst=root, op=torch_op(dist, op), group=group)
                return [t] if rank == root else []
            c.same("reduce %s to %d" % (op, root), red,
                   lambda root=root, op=op: [reduce_local(torch, [value(torch, r, (100,), torch.float32)
                                                                  for r in range(size)], op)] if rank == root else [])
    for dtype in (torch.float32, torch.int32, torch.bfloat16):
        for op in ("sum", "min", "avg"):
            def rs(group, dtype=dtype, op=op):
                out = torch.empty(10, dtype=dtype)
                ins = [value(torch, rank * size + p, (10,), dtype) for p in range(size)]
                dist.reduce_scatter(out, ins, op=torch_op(dist, op), group=group)
                return [out]
            c.same("reduce_scatter %s %s" % (dtype, op), rs,
                   lambda dtype=dtype, op=op: [reduce_local(torch, [value(torch, r * size + rank, (10,), dtype)
                                                                    for r in range(size)], op)])

    def rs_tensor(group):
        out = torch.empty(8, dtype=torch.float64)
        dist.reduce_scatter_tensor(out, value(torch, rank, (8 * size,), torch.float64), group=group)
        return [out]
    c.same("reduce_scatter_tensor", rs_tensor,
           lambda: [reduce_local(torch, [value(torch, r, (8 * size,), torch.float64) for r in range(size)],
                                 "sum")[rank * 8:(rank + 1) * 8]])


def check_p2p(c, torch, dist):
    size, rank = c.size, c.rank
    nxt, prv = (rank + 1) % size, (rank - 1) % size

    def ring(group):
        t = value(torch, rank, (1000,), torch.float32)
        r = torch.empty(1000)
        if rank % 2 == 0:
            dist.send(t, dst=nxt, group=group)
            dist.recv(r, src=prv, group=group)
        else:
            dist.recv(r, src=prv, group=group)
            dist.send(t, dst=nxt, group=group)
        return [r]
    c.same("send/recv ring", ring, lambda: [value(torch, prv, (1000,), torch.float32)])

    # Every rank sends before it receives: a message larger than any
    # transport buffers (16 MiB) must not wait for the receive queued
    # behind the send.
    for n in (50000, 4 << 20):
        def iring(group, n=n):
            t = value(torch, rank, (n,), torch.float32)
            r = torch.empty(n)
            works = [dist.isend(t, dst=nxt, group=group), dist.irecv(r, src=prv, group=group)]
            for w in works:
                w.wait()
            return [r]
        c.same("isend/irecv ring of %d floats" % n, iring, lambda n=n: [value(torch, prv, (n,), torch.float32)])

    def swap(group):  # with one peer, both sending first; then a blocking send and recv
        peer = rank ^ 1
        if peer >= size:
            return []
        t, r = value(torch, rank, (4 << 20,), torch.float32), torch.empty(4 << 20)
        w = dist.isend(t, dst=peer, group=group)
        dist.recv(r, src=peer, group=group)
        w.wait()
        return [r]
    c.same("isend then recv with one peer", swap,
           lambda: [value(torch, rank ^ 1, (4 << 20,), torch.float32)] if rank ^ 1 < size else [])

    def batch(group):
        t1, t2 = value(torch, rank, (300000,), torch.float32), value(torch, rank + 5, (7,), torch.int64)
        r1, r2 = torch.empty(300000), torch.empty(7, dtype=torch.int64)
        ops = [dist.P2POp(dist.isend, t1, nxt, group), dist.P2POp(dist.irecv, r1, prv, group),
               dist.P2POp(dist.isend, t2, prv, group), dist.P2POp(dist.irecv, r2, nxt, group)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        return [r1, r2]
    c.same("batch_isend_irecv", batch,
           lambda: [value(torch, prv, (300000,), torch.float32), value(torch, nxt + 5, (7,), torch.int64)])

    def barrier(group):
        dist.barrier(group=group)
        return []
    c.same("barrier", barrier)

    # A call of an open batch has not run: waiting for it raises at once.
    pg = dist.distributed_c10d._get_default_group()
    t, r = value(torch, rank, (10,), torch.float32), torch.empty(10)
    pg._start_coalescing()
    works = [dist.isend(t, dst=nxt), dist.irecv(r, src=prv)]
    c.raises("wait inside a batch", works[0].wait, "has not ended")
    fut = works[1].get_future()
    pg._end_coalescing(works)
    assert torch.equal(fut.wait()[0], value(torch, prv, (10,), torch.float32)), "batch asked for its Future early"
    works[0].wait()


def check_objects(c, torch, dist):
    size, rank = c.size, c.rank

    def objs(group):
        out = [None] * size
        dist.all_gather_object(out, {"rank": rank, "name": "r%d" % rank, "xs": list(range(rank))}, group=group)
        lst = [("hello", rank), None] if rank == 1 else [None, None]
        dist.broadcast_object_list(lst, src=1, group=group)
        assert out == [{"rank": r, "name": "r%d" % r, "xs": list(range(r))} for r in range(size)], out
        assert lst == [("hello", 1), None], lst
        return []
    c.same("all_gather_object, broadcast_object_list", objs)


def check_refused(c, torch, dist):
    t = torch.ones(4)
    c.raises("BAND", lambda: dist.all_reduce(t.int(), op=dist.ReduceOp.BAND), "BAND")
    c.raises("bool all_reduce", lambda: dist.all_reduce(torch.ones(4, dtype=torch.bool)), "torch.bool")
    c.raises("int16 all_reduce", lambda: dist.all_reduce(torch.ones(4, dtype=torch.int16)), "torch.int16")
    c.raises("recv from any source", lambda: dist.recv(t), "any source")
    c.raises("tag", lambda: dist.send(t, dst=(c.rank + 1) % c.size, tag=3), "tag 3")
    c.raises("not contiguous", lambda: dist.all_reduce(torch.ones(4, 4).t()), "contiguous")
    premul = getattr(dist, "_make_nccl_premul_sum", None) or getattr(torch._C._distributed_c10d,
                                                                     "_make_nccl_premul_sum", None)
    if premul is not None:
        t = value(torch, c.rank, (10,), torch.float32)
        try:
            dist.all_reduce(t, op=premul(2.0))
        except RuntimeError as e:
            assert "PREMUL_SUM" in str(e), "PREMUL_SUM refused without saying why: %s" % e
        else:
            want = reduce_local(torch, [value(torch, r, (10,), torch.float32) * 2 for r in range(c.size)], "sum")
            assert torch.equal(t, want), "PREMUL_SUM: %s, want %s" % (t, want)
    # The group is still usable after calls it refused.
    t = torch.ones(3)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((3,), float(c.size))), t


def check_subgroups(c, torch, dist):
    size, rank = c.size, c.rank
    members = [0, size - 1] if size >= 3 else [1]
    sub = dist.new_group(members)
    gsub = dist.new_group(members, backend="gloo")
    evens = dist.new_group(list(range(0, size, 2)))
    if rank in members:
        for group in (sub, gsub):
            t = value(torch, rank, (100,), torch.float32)
            dist.all_reduce(t, group=group)
            assert torch.equal(t, reduce_local(torch, [value(torch, r, (100,), torch.float32) for r in members],
                                               "sum")), "subgroup %s all_reduce: %s" % (members, t)
            b = value(torch, rank, (5,), torch.int64)
            dist.broadcast(b, src=members[-1], group=group)
            assert torch.equal(b, value(torch, members[-1], (5,), torch.int64)), b
        assert dist.get_world_size(sub) == len(members)
    if rank % 2 == 0:
        t = torch.full((4,), float(rank))
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=evens)
        assert torch.equal(t, torch.full((4,), float((size - 1) // 2 * 2))), t
    c.count += 1
    return [sub, gsub, evens]


def check_async(c, torch, dist):
    n = 4 << 20
    ts = [torch.full((n,), float(c.rank + k)) for k in range(4)]
    works, pending = [], 0
    for t in ts:
        w = dist.all_reduce(t, async_op=True)
        pending += not w.is_completed()
        works.append(w)
    doubled = [w.get_future().then(lambda f: f.value()[0] * 2) for w in works]
    for k, f in enumerate(doubled):
        want = float(sum(r + k for r in range(c.size)))
        assert torch.equal(f.wait(), torch.full((n,), 2 * want)), "then() of async all_reduce %d" % k
        assert torch.equal(ts[k], torch.full((n,), want)), "async all_reduce %d" % k
    assert all(w.is_completed() for w in works)
    # A CUDA call is complete for torch once queued on its stream.
    assert pending > 0 or DEVICE != "cpu", "every async all_reduce of 16 MiB was complete when its call returned"
    c.count += 1


def check_stats(torch, dist, size):
    """The backend shows braid's counters for its groups."""
    import braid.torch_backend

    before = braid.torch_backend.stats()
    dist.all_reduce(torch.ones(1000))
    after = braid.torch_backend.stats()
    b, a = before["calls"]["allreduce"], after["calls"]["allreduce"]
    assert a["calls"] == b["calls"] + 1 and a["bytes"] == b["bytes"] + 4000, (b, a)
    assert a["total_ns"] > b["total_ns"] and a["max_ns"] > 0 and a["failed"] == 0, (b, a)
    for name in ("broadcast", "allgather", "alltoall", "group"):
        assert after["calls"][name]["calls"] > 0, "no %s counted: %s" % (name, sorted(after["calls"]))
    peers = sum(t["peers"] for t in after["transports"].values())
    sent = sum(t["bytes_sent"] for t in after["transports"].values())
    assert peers == size - 1 and sent > 0, after["transports"]
    # The flight recorder, asked for.
    import tempfile

    with tempfile.NamedTemporaryFile("r", suffix=".txt") as f:
        braid.torch_backend.trace_dump(path=f.name)
        text = f.read()
    rank = dist.get_rank()
    assert ("# braid flight recorder: rank %d of %d," % (rank, size)) in text, text[:300]
    assert "# reason: asked for (braid_pg_trace_dump)" in text and " allreduce " in text, text[:600]


def braid_threads():
    import threading

    names = [t.name for t in threading.enumerate() if t.name.startswith("braid")]
    for task in os.listdir("/proc/self/task"):
        try:
            with open("/proc/self/task/%s/comm" % task) as f:
                comm = f.read().strip()
        except OSError:
            continue
        if comm.startswith("braid"):
            names.append(comm)
    return names


def w_collectives(rank, size, port):
    import gc

    import torch
    import torch.distributed as dist

    gloo = init(rank, size, port)
    c = Checker(torch, dist, gloo, rank, size)
    check_all_reduce(c, torch, dist)
    check_movement(c, torch, dist)
    check_reductions(c, torch, dist)
    check_p2p(c, torch, dist)
    check_objects(c, torch, dist)
    groups = check_subgroups(c, torch, dist)
    check_async(c, torch, dist)
    check_refused(c, torch, dist)
    check_stats(torch, dist, size)
    assert braid_threads(), "no braid thread while groups exist"
    del groups, gloo
    dist.destroy_process_group()
    gc.collect()
    left = braid_threads()
    assert not left, "threads left after destroy_process_group: %s" % left
    print("rank %d: %d checks, %d against gloo" % (rank, c.count, c.by_gloo))


def w_explicit(rank, size, port):
    import torch
    import torch.distributed as dist

    import braid.torch_backend  # noqa: F401

    use_device(rank)
    store = dist.TCPStore("127.0.0.1", port, size, rank == 0, timeout=datetime.timedelta(seconds=TIMEOUT_S))
    dist.init_process_group("braid", store=store, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=TIMEOUT_S))
    assert dist.get_backend() == "braid", dist.get_backend()
    t = torch.full((10,), float(rank + 1))
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    assert torch.equal(t, torch.full((10,), (size + 1) / 2.0)), t
    dist.destroy_process_group()


def w_torchrun():
    import torch
    import torch.distributed as dist

    import braid.torch_backend  # noqa: F401

    use_device(int(os.environ["RANK"]))
    dist.init_process_group("braid", timeout=datetime.timedelta(seconds=TIMEOUT_S))
    rank, size = dist.get_rank(), dist.get_world_size()
    assert size == int(os.environ["WORLD_SIZE"]) and rank == int(os.environ["RANK"])
    t = torch.full((10,), float(rank))
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((10,), float(size * (size - 1) // 2))), t
    dist.destroy_process_group()


def w_killed(rank, size, port):
    import torch
    import torch.distributed as dist

    init(rank, size, port)
    t = torch.ones(1 << 18)
    for i in range(1000000):
        if rank == 2 and i == 20:
            os._exit(0)
        t0 = time.monotonic()
        try:
            dist.all_reduce(t)
        except RuntimeError as e:
            took = time.monotonic() - t0
            assert i >= 20, "failed before rank 2 left: %s" % e
            assert re.search(r"\b(rank|peer) 2\b", str(e)), "the error does not name rank 2: %s" % e
            assert took < TIMEOUT_S + 5, "took %.1f s to fail" % took
            print("rank %d: all_reduce #%d raised after %.2f s: %s" % (rank, i, took, e))
            sys.stdout.flush()
            dist.group.WORLD.abort()  # the backend's abort: nothing of braid's stays
            left = braid_threads()
            assert not left, "threads left after abort: %s" % left
            os._exit(0)
    raise AssertionError("no call failed")


def ddp_model(torch, seed):
    torch.manual_seed(seed)
    nn = torch.nn
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1),
                         nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(32, 5))


def ddp_train(torch, dist, rank, group, hook=None, hook_state=None, steps=5):
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = ddp_model(torch, 1234)
    cuda = DEVICE != "cpu"
    ddp = DDP(model, process_group=group, bucket_cap_mb=0.01,
              device_ids=[torch.cuda.current_device()] if cuda else None)
    if hook is not None:
        ddp.register_comm_hook(hook_state if hook_state is not None else group, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(steps):
        x = torch.randn(6, 3, 8, 8, generator=gen, device="cpu").to(torch.empty(0).device)
        y = torch.randint(0, 5, (6,), generator=gen, device="cpu").to(x.device)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()] + [b.clone() for b in model.buffers()]


def w_ddp(rank, size, port):
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook as powersgd

    gloo = init(rank, size, port)
    braid_group = dist.group.WORLD

    def compare(name, a, b, tol):
        worst = max(float((x.double() - y.double()).abs().max()) for x, y in zip(a, b))
        if tol == 0:
            assert all(torch.equal(x, y) for x, y in zip(a, b)), "%s: differs from gloo by %g" % (name, worst)
        else:
            assert worst <= tol, "%s: differs from gloo by %g (limit %g)" % (name, worst, tol)
        print("rank %d: %s: max |braid - gloo| = %g" % (rank, name, worst))

    exact = 0 if size == 2 else 1e-5
    compare("DDP", ddp_train(torch, dist, rank, braid_group), ddp_train(torch, dist, rank, gloo), exact)
    compare("DDP fp16_compress_hook", ddp_train(torch, dist, rank, braid_group, default_hooks.fp16_compress_hook),
            ddp_train(torch, dist, rank, gloo, default_hooks.fp16_compress_hook), 0 if size == 2 else 1e-3)

    def psgd(group):
        state = powersgd.PowerSGDState(process_group=group, matrix_approximation_rank=1, start_powerSGD_iter=2,
                                       min_compression_rate=0.5, random_seed=7)
        return ddp_train(torch, dist, rank, group, powersgd.powerSGD_hook, state)
    mine = psgd(braid_group)
    compare("DDP powerSGD_hook", mine, psgd(gloo), 1e-4)
    nparams = len(list(ddp_model(torch, 0).parameters()))

    def same_on_every_rank(name, params):
        # parameters only: buffers are each rank's own since the last forward
        for p in params[:nparams]:
            q = p.clone()
            dist.broadcast(q, src=0)
            assert torch.equal(p, q), "ranks disagree after %s" % name
    same_on_every_rank("PowerSGD", mine)
    # bf16 compression: gloo here may lack bfloat16 sums, so against braid's
    # own float32 run, within bfloat16's rounding of each step's gradients.
    bf16 = getattr(default_hooks, "bf16_compress_hook", None)
    try:
        got = ddp_train(torch, dist, rank, braid_group, bf16) if bf16 is not None else None
    except TypeError as e:  # torch 1.13's DDP takes it only with CUDA and NCCL
        print("rank %d: DDP bf16_compress_hook: not run, torch refuses it here: %s" % (rank, e))
        got = None
    if got is not None:
        same_on_every_rank("bf16_compress_hook", got)
        plain = ddp_train(torch, dist, rank, braid_group)
        worst = max(float((x.double() - y.double()).abs().max()) for x, y in zip(got[:nparams], plain[:nparams]))
        assert 0 < worst <= 2e-2, "bf16_compress_hook: %g from float32 (want a difference, at most 2e-2)" % worst
        print("rank %d: DDP bf16_compress_hook: max |bf16 - f32| = %g" % (rank, worst))
    dist.destroy_process_group()


def worker(mode, rank, size, port):
    import faulthandler

    faulthandler.dump_traceback_later(rank_timeout() - 10, exit=True)
    if mode == "torchrun":
        return w_torchrun()
    {"collectives": w_collectives, "explicit": w_explicit, "killed": w_killed, "ddp": w_ddp}[mode](rank, size, port)


# ---- driver -------------------------------------------------------------

class _Done:
    """A process already waited for, as communicate() sees it."""

    def __init__(self, proc, text):
        self.returncode, self._text = proc.returncode, text

    def communicate(self, timeout=None):
        return self._text, None

    def kill(self):
        pass


def run(mode, size):
    port = free_ports(1)
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    t0 = time.monotonic()
    if mode == "torchrun":
        cmds = [[sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", str(size),
                 "--master_addr", "127.0.0.1", "--master_port", str(port), os.path.abspath(__file__),
                 "--worker", mode, "0", str(size), str(port)]]
    else:
        cmds = [[sys.executable, os.path.abspath(__file__), "--worker", mode, str(r), str(size), str(port)]
                for r in range(size)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
             for cmd in cmds]
    if mode == "torchrun":
        text, _ = procs[0].communicate(timeout=rank_timeout())
        if procs[0].returncode != 0 and "object has no attribute 'get'" in text and "to_map" in text:
            # Debian's torch 1.13 launcher fails under Python 3.11 before it
            # starts a rank (its redirect flags parse to None): start the
            # ranks with the environment torchrun gives them instead.
            print("note: this torchrun cannot start processes here (%s); the ranks get torchrun's environment"
                  % text.strip().splitlines()[-1])
            cmds = []
            for r in range(size):
                env_r = dict(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), LOCAL_RANK=str(r),
                             WORLD_SIZE=str(size), LOCAL_WORLD_SIZE=str(size), GROUP_RANK="0",
                             TORCHELASTIC_RUN_ID="none")
                cmds.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", mode, str(r),
                                              str(size), str(port)], stdout=subprocess.PIPE,
                                             stderr=subprocess.STDOUT, text=True, env=env_r))
            procs = cmds
        else:
            procs = [_Done(procs[0], text)]
    texts, failed = collect(procs, rank_timeout())
    if failed:
        raise AssertionError("%s at %d ranks failed:\n%s" % (mode, size, "\n".join(failed)))
    lines = [ln for t in texts for ln in t.splitlines() if ln.startswith("rank ")]
    print("PASS %s at %d ranks (%.1f s)%s" % (mode, size, time.monotonic() - t0,
                                               "".join("\n    " + ln for ln in lines)))
    sys.stdout.flush()


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        mode, rank, size, port = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
        worker(mode, rank, size, port)
        sys.stdout.flush()
        os._exit(0)  # torch 1.13 can hang freeing gloo groups at exit
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        print("SKIP: torch is not importable by %s (%s); install Debian's python3-torch" % (sys.executable, e))
        return SKIP
    if not dist.is_available() or not dist.is_gloo_available():
        print("SKIP: this torch build has no torch.distributed gloo backend")
        return SKIP
    try:
        import braid
    except OSError as e:
        if os.environ.get("BRAID_LIBRARY"):
            print("FAIL: %s" % e)
            return 1
        print("SKIP: %s" % e)
        return SKIP
    if DEVICE != "cpu" and not (torch.cuda.is_available() and hasattr(torch, "set_default_device")):
        print("SKIP: BRAID_TORCH_TEST_DEVICE=%s needs CUDA and torch 2 (this is torch %s, CUDA %s)"
              % (DEVICE, torch.__version__, "available" if torch.cuda.is_available() else "unavailable"))
        return SKIP
    print("torch %s, libbraid %s, %s tensors" % (torch.__version__, braid.library_path, DEVICE))
    only = os.environ.get("TORCH_BACKEND_CASES")
    cases = [("collectives", 2), ("collectives", 3), ("collectives", 4), ("explicit", 2), ("torchrun", 2),
             ("killed", 3), ("ddp", 2), ("ddp", 3)]
    for mode, size in cases:
        if only and mode not in only.split(",") and "%s:%d" % (mode, size) not in only.split(","):
            continue
        run(mode, size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
