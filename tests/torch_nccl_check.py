#!/usr/bin/env python3
"""PyTorch's own NCCL backend running on braid's libnccl.so.2 (GPU check).

usage: torch_nccl_check.py LIBNCCL [--steps N] [--timeout S]

LIBNCCL is braid's libnccl.so.2 (build-dir/src/nccl/libnccl.so.2, or the
installed lib/<multiarch>/braid-nccl/libnccl.so.2). Needs torch with CUDA
and one GPU; both ranks share GPU 0. Steps, each in fresh processes:

1. `import torch` with LIBNCCL preloaded, and the process maps braid's
   library and no other libnccl;
2. torch.distributed, backend "nccl", 2 ranks (LD_PRELOAD=LIBNCCL):
   all_reduce, broadcast, all_gather, reduce_scatter, all_to_all and
   barrier on CUDA tensors, each result checked exactly;
3. a DDP training loop (3-layer MLP, SGD, N steps, default 30) on backend
   "nccl" through braid, then the same loop on backend "gloo" (no preload).
   Both ranks must end with identical parameters within a run, and the
   nccl run's final parameters must match gloo's: max |difference| <= 1e-5
   (with two ranks both average each gradient element as one f32 sum and an
   exact halving, so the runs agree to a few ulps of float noise at most).
   Prints ms/step of both.

Exit 0 when every step passed, 1 on a failure, 77 when torch, CUDA or a
GPU is missing. Self-contained: no braid Python package needed.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from free_ports import free_ports  # tests/ is sys.path[0]

SKIP = 77
WORLD = 2
TOLERANCE = 1e-5


def free_port():
    return free_ports(1)


def nccl_libs_mapped():
    """Paths of every libnccl mapped into this process."""
    paths = set()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6 and "libnccl" in os.path.basename(parts[5]):
                paths.add(os.path.realpath(parts[5]))
    return sorted(paths)


# ---- worker side --------------------------------------------------------

def check_mapping(lib):
    """braid's library is mapped, and the process's nccl* symbols resolve to
    it (torch may also map the nvidia-nccl wheel's copy by path; preloaded
    symbols still come first in the global scope)."""
    import ctypes

    mapped = nccl_libs_mapped()
    want = os.path.realpath(lib)
    if want not in mapped:
        raise SystemExit("braid's %s is not mapped (libnccl mapped: %s)" % (want, mapped))
    f = ctypes.CDLL(None).ncclGetErrorString
    f.restype = ctypes.c_char_p
    if b"braid" not in f(3):  # ncclInternalError's text names braid
        raise SystemExit("ncclGetErrorString resolves to another libnccl (mapped: %s)" % mapped)
    others = [m for m in mapped if m != want]
    if others and os.environ.get("RANK", "0") == "0":
        print("note: also mapped, not used: %s" % ", ".join(others))


def worker_import(lib):
    import torch  # noqa: F401  (the check is that this works)

    check_mapping(lib)
    print("import torch %s with braid preloaded: ok (NCCL %s)" % (torch.__version__,
                                                                   ".".join(map(str, torch.cuda.nccl.version()))))


def worker_collectives(lib):
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    torch.cuda.set_device(0)
    dev = torch.device("cuda", 0)
    dist.init_process_group("nccl", rank=rank, world_size=WORLD)
    check_mapping(lib)
    n = WORLD

    x = torch.arange(1000, dtype=torch.float32, device=dev) + rank
    dist.all_reduce(x)
    want = sum(torch.arange(1000, dtype=torch.float32) + r for r in range(n))
    assert torch.equal(x.cpu(), want), "all_reduce"

    b = torch.full((777,), float(rank + 5), device=dev)
    dist.broadcast(b, src=1)
    assert torch.equal(b.cpu(), torch.full((777,), 6.0)), "broadcast"

    parts = [torch.empty(300, dtype=torch.int64, device=dev) for _ in range(n)]
    dist.all_gather(parts, torch.arange(300, device=dev) * 10 + rank)
    for r in range(n):
        assert torch.equal(parts[r].cpu(), torch.arange(300) * 10 + r), "all_gather block %d" % r

    inp = torch.arange(n * 256, dtype=torch.float32, device=dev) * (rank + 1)
    out = torch.empty(256, dtype=torch.float32, device=dev)
    dist.reduce_scatter_tensor(out, inp)
    full = torch.arange(n * 256, dtype=torch.float32) * sum(r + 1 for r in range(n))
    assert torch.equal(out.cpu(), full[rank * 256:(rank + 1) * 256]), "reduce_scatter"

    send = torch.arange(n * 128, dtype=torch.int32, device=dev) + 1000 * rank
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    for src in range(n):
        want = torch.arange(rank * 128, (rank + 1) * 128, dtype=torch.int32) + 1000 * src
        assert torch.equal(recv[src * 128:(src + 1) * 128].cpu(), want), "all_to_all block from %d" % src

    dist.barrier()
    torch.cuda.synchronize()
    dist.destroy_process_group()
    print("rank %d: all_reduce broadcast all_gather reduce_scatter all_to_all barrier: ok" % rank)


def worker_ddp(lib, backend, steps, outdir):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = int(os.environ["RANK"])
    torch.cuda.set_device(0)
    dev = torch.device("cuda", 0)
    dist.init_process_group(backend, rank=rank, world_size=WORLD)
    if backend == "nccl":
        check_mapping(lib)
    torch.manual_seed(1234)  # same initial weights on both ranks (DDP also broadcasts them)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 10)).to(dev)
    ddp = DDP(model, device_ids=[0])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(99 + rank)  # each rank its own shard
    data = [(torch.randn(32, 64, generator=gen), torch.randint(0, 10, (32,), generator=gen)) for _ in range(steps)]
    data = [(x.to(dev), y.to(dev)) for x, y in data]
    loss_fn = torch.nn.CrossEntropyLoss()
    times = []
    losses = []
    for x, y in data:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(ddp(x), y)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    params = torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()])
    torch.save(params, os.path.join(outdir, "%s_rank%d.pt" % (backend, rank)))
    steady = sorted(times[2:] if len(times) > 4 else times)  # first steps include warm-up
    with open(os.path.join(outdir, "%s_rank%d.json" % (backend, rank)), "w") as f:
        json.dump({"ms_per_step": 1000 * steady[len(steady) // 2], "ms_mean": 1000 * sum(steady) / len(steady),
                   "loss_first": losses[0], "loss_last": losses[-1]}, f)
    dist.destroy_process_group()


# ---- driver side ----------------------------------------------------------

def run_ranks(args, mode, extra, preload, timeout):
    port = free_port()
    procs = []
    for rank in range(WORLD):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCH_NCCL_ASYNC_ERROR_HANDLING="1")
        env.setdefault("BRAID_TIMEOUT_MS", "60000")
        if preload:
            env["LD_PRELOAD"] = args.lib
        else:
            env.pop("LD_PRELOAD", None)
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), args.lib, "--worker", mode] + extra,
                                      env=env))
    deadline = time.monotonic() + timeout
    ok = True
    for rank, p in enumerate(procs):
        try:
            rc = p.wait(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print("FAIL: %s rank %d: no result in %d s" % (mode, rank, timeout))
            for q in procs:
                q.kill()
            return False
        if rc != 0:
            print("FAIL: %s rank %d exited %d" % (mode, rank, rc))
            ok = False
    return ok


def driver(args):
    try:
        import torch
    except ImportError:
        print("SKIP: torch is not installed")
        return SKIP
    if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
        print("SKIP: torch sees no CUDA device")
        return SKIP
    if not os.path.isfile(args.lib):
        print("FAIL: %s does not exist" % args.lib)
        return 1
    failed = []

    env = dict(os.environ, LD_PRELOAD=args.lib)
    r = subprocess.run([sys.executable, os.path.abspath(__file__), args.lib, "--worker", "import"], env=env,
                       timeout=args.timeout)
    if r.returncode != 0:
        print("FAIL: import torch with braid preloaded (exit %d)" % r.returncode)
        return 1  # nothing else can work

    if not run_ranks(args, "collectives", [], True, args.timeout):
        failed.append("collectives")

    with tempfile.TemporaryDirectory() as out:
        extra = ["--steps", str(args.steps), "--out", out]
        runs = {}
        for backend, preload in (("nccl", True), ("gloo", False)):
            if run_ranks(args, "ddp-" + backend, extra, preload, args.timeout):
                runs[backend] = [torch.load(os.path.join(out, "%s_rank%d.pt" % (backend, r))) for r in range(WORLD)]
                stats = [json.load(open(os.path.join(out, "%s_rank%d.json" % (backend, r)))) for r in range(WORLD)]
                ms = max(s["ms_per_step"] for s in stats)
                label = "nccl (braid)" if backend == "nccl" else "gloo"
                print("DDP %d steps on %s: %.2f ms/step (median after warm-up, slower rank), loss %.4f -> %.4f"
                      % (args.steps, label, ms, stats[0]["loss_first"], stats[0]["loss_last"]))
                if not torch.equal(runs[backend][0], runs[backend][1]):
                    print("FAIL: %s: the ranks' final parameters differ (max %g)"
                          % (backend, (runs[backend][0] - runs[backend][1]).abs().max().item()))
                    failed.append("ddp-%s-ranks" % backend)
            else:
                failed.append("ddp-" + backend)
        if "nccl" in runs and "gloo" in runs:
            diff = (runs["nccl"][0] - runs["gloo"][0]).abs().max().item()
            verdict = "ok" if diff <= TOLERANCE else "FAIL"
            print("DDP final parameters, braid nccl vs gloo: max |difference| %.3g (tolerance %g): %s"
                  % (diff, TOLERANCE, verdict))
            if diff > TOLERANCE:
                failed.append("ddp-compare")
    print("torch_nccl_check: %s" % ("FAILED: " + ", ".join(failed) if failed else "all passed"))
    return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("lib", help="braid's libnccl.so.2")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--timeout", type=int, default=240, help="seconds per step (each run of 2 ranks)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.lib = os.path.abspath(args.lib)
    if args.worker == "import":
        worker_import(args.lib)
    elif args.worker == "collectives":
        worker_collectives(args.lib)
    elif args.worker and args.worker.startswith("ddp-"):
        worker_ddp(args.lib, args.worker[4:], args.steps, args.out)
    else:
        sys.exit(driver(args))


if __name__ == "__main__":
    main()
