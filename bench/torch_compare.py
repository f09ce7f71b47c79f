#!/usr/bin/env python3
"""The tapegrad benchmark workloads in PyTorch, side by side with tapegrad.

Runs each workload of `tapegrad bench` (tiny, chain, mlp, elementwise, rnn,
conv, deep; docs/benchmarks.md) in PyTorch with the same shapes, losses and
measurement (forward, forward+backward and SGD train step; median, min and
max of 20 samples after 3 warm-up rounds, variants interleaved, each
sample enough iterations to last a few ms), then the same in libtorch,
PyTorch's C++ API, where it is installed (below), then runs
`tapegrad bench --json` in the same invocation with the same thread count
and prints all three with tapegrad/PyTorch and tapegrad/libtorch ratios
(below 1: tapegrad is faster).

libtorch: bench/torch_cpp.cpp holds the same workloads and measurement with
torch::nn modules and torch::optim::SGD, so the C++ column is PyTorch's
kernels and autograd engine without the Python interpreter. Where the
Debian package libtorch-dev is installed (its header
/usr/include/torch/csrc/api/include/torch/torch.h) and a C++ compiler is
found (CXX, default g++), it is built once, about a minute, into
build/torch_cpp/torch_cpp of this source tree:
  $CXX -O2 -std=c++17 -D_GLIBCXX_USE_CXX11_ABI=1
       -isystem /usr/include/torch/csrc/api/include bench/torch_cpp.cpp
       -o build/torch_cpp/torch_cpp -ltorch -ltorch_cpu -lc10 -lpthread
and rebuilt when the .cpp is newer or that command changes (CXX). It runs
after the Python side, with the same environment and --threads, and its
figures go to the JSON as "libtorch" and "ratios_libtorch". Where the
header is missing, or the build or the run fails, a line says so and the
column is left out (exit status unchanged); --no-cpp leaves it out.

Threads: PyTorch 1.13 needs both its own count (torch.set_num_threads) and
OpenBLAS's, which is read from the environment when torch is imported, so
OMP_NUM_THREADS, OPENBLAS_NUM_THREADS and MKL_NUM_THREADS are set to
--threads before the import (overriding what the caller set), and
OMP_WAIT_POLICY to PASSIVE unless the caller set it (why: at the import); tapegrad
gets the same environment and --threads. OPENBLAS_CORETYPE and the like
pass through unchanged.

It also compares the tensor memory peak of one forward+backward:
tapegrad's tg_mem_peak_bytes above what was live before (the JSON's
mem_peak_fwd_bwd_bytes; the parameters' gradients are written into their
set's flat gradient buffer, allocated before), and PyTorch's from its
profiler with profile_memory=True, each op's own allocations at its start
and each free at its end, summed in time order (the running maximum), with
its gradients kept between steps and zeroed in place (1.13's default
zero_grad, whose .grad tensors likewise exist before the step): the
"PyTorch" column. The "grads dropped" column is PyTorch's peak when the
step starts from zero_grad(set_to_none=True) and allocates every gradient
(on deep it gives the 65 MiB the higher-order issue quoted).

With --rounds N (N > 1) it runs the three sides N times, each round in a
rotating order (PyTorch, libtorch, tapegrad; then libtorch first; then
tapegrad first), prints the first round's table as above and then, per
workload and variant, each round's tapegrad/PyTorch and tapegrad/libtorch
ratio with their median and range (the JSON's "rounds"). This machine's
speed moves by 20-30% from one phase to the next, and a side that runs
once runs in one phase: the ratios of alternating rounds are the figure
to quote.

With --hvp it compares Hessian-vector products instead: on mlp and
elementwise, PyTorch's double backward (torch.autograd.grad of the loss
with create_graph=True, then torch.autograd.grad of <g, v>) against
`tapegrad bench hvp`, each side as a ratio to its own fwd+bwd and in ms
(libtorch has no part in it).

glibc malloc: unless --default-malloc, MALLOC_MMAP_THRESHOLD_ and
MALLOC_TRIM_THRESHOLD_ are raised (the script re-executes itself with them)
so that PyTorch's large temporaries are not given back to the kernel and
faulted in again every step; see MALLOC_TUNING below.

Usage: /usr/bin/python3 bench/torch_compare.py [TAPEGRAD] [--threads N]
           [--quick] [-w WORKLOAD ...] [--json FILE] [--hvp] [--cpp | --no-cpp]
           [--default-malloc] [--rounds N]
TAPEGRAD is the tapegrad binary (default build/tools/tapegrad). Exits 0
with a message, doing nothing, where PyTorch is not installed.
"""
import argparse
import json
import math
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

WORKLOADS = ["tiny", "chain", "mlp", "elementwise", "rnn", "conv", "deep"]
VARIANTS = ["forward", "fwd_bwd", "train_step"]


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tapegrad", nargs="?", default="build/tools/tapegrad",
                    help="the tapegrad binary (default: build/tools/tapegrad)")
    ap.add_argument("--threads", type=int, default=1,
                    help="threads for both sides (default 1)")
    ap.add_argument("--quick", action="store_true",
                    help="5 samples after 1 warm-up: a smoke run, not a measurement")
    ap.add_argument("-w", "--workload", action="append", choices=WORKLOADS,
                    help="run only this workload (repeatable; default: all)")
    ap.add_argument("--json", metavar="FILE",
                    help="write both sides' figures and the ratios to FILE")
    ap.add_argument("--hvp", action="store_true",
                    help="compare Hessian-vector products (mlp, elementwise) instead")
    ap.add_argument("--show-tapegrad", action="store_true",
                    help="also print tapegrad's own report")
    cpp = ap.add_mutually_exclusive_group()
    cpp.add_argument("--cpp", dest="cpp", action="store_true", default=None,
                     help="also run the workloads in libtorch, the C++ API "
                          "(the default where libtorch-dev is installed)")
    cpp.add_argument("--no-cpp", dest="cpp", action="store_false",
                     help="leave the libtorch column out")
    ap.add_argument("--default-malloc", action="store_true",
                    help="leave glibc malloc's thresholds as they are (see MALLOC_TUNING)")
    ap.add_argument("--rounds", type=int, default=1, metavar="N",
                    help="run libtorch and tapegrad N times, alternating which goes first, "
                         "and give each tapegrad/libtorch ratio as the median and range of "
                         "the N rounds' ratios (default 1)")
    a = ap.parse_args()
    if a.threads < 1:
        ap.error("--threads must be >= 1")
    if a.rounds < 1:
        ap.error("--rounds must be >= 1")
    return a


ARGS = parse_args()
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(ARGS.threads)
# Debian's PyTorch runs its own kernels on OpenMP (libgomp) and its GEMMs on
# the pthreads OpenBLAS: with more than one thread, OpenMP's workers spin
# after each parallel region and take the cores from OpenBLAS's threads
# (deep at 2 threads: 420 ms instead of 190). Passive waiting is PyTorch's
# best setting here, so it is the default unless the caller chose one.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# PyTorch allocates its large temporaries with glibc malloc, which by
# default gives each one back to the kernel when it is freed and faults it
# in again on the next step: conv fwd+bwd then measured 1.4 to 40 ms from
# one run to the next on this VM, elementwise alike. Raising the mmap and
# trim thresholds keeps the memory in the process, as a long-running
# trainer would (and as the PyTorch figures were taken). glibc
# reads them at start-up, so the script runs itself again with them set.
# tapegrad allocates through jemalloc and is not affected.
MALLOC_TUNING = {"MALLOC_MMAP_THRESHOLD_": "268435456", "MALLOC_TRIM_THRESHOLD_": "1073741824"}
if not ARGS.default_malloc and any(k not in os.environ for k in MALLOC_TUNING):
    for k, v in MALLOC_TUNING.items():
        os.environ.setdefault(k, v)
    os.execv(sys.executable, [sys.executable] + sys.argv)

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:  # the whole comparison needs PyTorch
    print("torch_compare: PyTorch is not available (%s); skipping" % e)
    sys.exit(0)


# ---- workloads: each returns (parameters, loss function)
def wl_tiny(g):
    m = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(),
                      nn.Linear(16, 1))
    x = torch.tensor([[0.5, -1.25]])
    y = torch.tensor([[0.75]])
    return list(m.parameters()), lambda: F.mse_loss(m(x), y)


def wl_chain(g):
    x = nn.Parameter(torch.tensor([0.5]))

    def f():
        t = x
        for _ in range(100):
            t = torch.tanh(t)
        return t  # one element: backward needs no seed
    return [x], f


def wl_mlp(g):
    m = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                      nn.Linear(512, 10))
    x = torch.rand(128, 784, generator=g)
    y = torch.randint(0, 10, (128,), generator=g)
    return list(m.parameters()), lambda: F.cross_entropy(m(x), y)


def wl_elementwise(g):
    x = nn.Parameter(torch.rand(1 << 20, generator=g) * 4 - 2)
    return [x], lambda: (torch.tanh(x * x + 1) * torch.sigmoid(x)).sum()


def wl_rnn(g):
    V, H, T, B = 64, 128, 64, 32
    cell = nn.RNNCell(V, H)
    out = nn.Linear(H, V)
    tok = torch.randint(0, V, (T + 1, B), generator=g)
    xs = F.one_hot(tok[:T], V).float()  # (T, B, V)
    h0 = torch.zeros(B, H)

    def f():
        h, loss = h0, None
        for t in range(T):
            h = cell(xs[t], h)
            l = F.cross_entropy(out(h), tok[t + 1])
            loss = l if loss is None else loss + l
        return loss / T
    return list(cell.parameters()) + list(out.parameters()), f


def wl_conv(g):
    conv = nn.Conv2d(1, 16, 3)
    fc = nn.Linear(16 * 26 * 26, 10)
    x = torch.rand(64, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (64,), generator=g)

    def f():
        h = F.relu(conv(x)).reshape(64, -1)
        return F.cross_entropy(fc(h), y)
    return list(conv.parameters()) + list(fc.parameters()), f


def wl_deep(g):
    layers = []
    for _ in range(16):
        lin = nn.Linear(1024, 1024)
        nn.init.kaiming_normal_(lin.weight, mode="fan_in", nonlinearity="relu")
        nn.init.zeros_(lin.bias)
        layers += [lin, nn.ReLU()]
    m = nn.Sequential(*layers)
    x = torch.randn(256, 1024, generator=g)
    return list(m.parameters()), lambda: m(x).mean()


BUILDERS = {"tiny": wl_tiny, "chain": wl_chain, "mlp": wl_mlp,
            "elementwise": wl_elementwise, "rnn": wl_rnn, "conv": wl_conv,
            "deep": wl_deep}


# ---- measurement, as bench/suite.c does it
def stat(v):
    v = sorted(v)
    n = len(v)
    med = v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])
    return {"median": med, "min": v[0], "max": v[-1]}


def run_torch(name, quick):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    params, f = BUILDERS[name](g)
    opt = torch.optim.SGD(params, lr=1e-3)

    def fwd():
        loss = f()
        return loss

    def fwd_bwd():
        opt.zero_grad(set_to_none=True)  # as tapegrad's tg_grad_zero per leaf
        loss = f()
        loss.backward()

    def fwd_bwd_kept():
        opt.zero_grad(set_to_none=False)  # zeroed in place: .grad exists
        loss = f()
        loss.backward()

    def train():
        opt.zero_grad()  # 1.13's default zeroes in place, as tg_optim_zero_grad
        loss = f()
        loss.backward()
        opt.step()

    # check: finite loss and gradient norm, identical over two runs
    norms = []
    for _ in range(2):
        fwd_bwd()
        norms.append(math.sqrt(sum(float((p.grad.double() ** 2).sum())
                                   for p in params if p.grad is not None)))
    loss = float(f())
    if not (math.isfinite(loss) and math.isfinite(norms[0])):
        raise RuntimeError("%s: loss %g, gradient norm %g" % (name, loss, norms[0]))
    fns = [fwd, fwd_bwd, train]
    runs, warm = (5, 1) if quick else (20, 3)
    target = 1e-3 if quick else 4e-3
    t0 = time.perf_counter()
    fwd_bwd()
    one = time.perf_counter() - t0
    reps = 1
    if one < target:
        t0 = time.perf_counter()
        for _ in range(3):
            fwd_bwd()
        reps = math.ceil(target / max((time.perf_counter() - t0) / 3, 1e-9))
    times = [[] for _ in fns]
    for r in range(warm + runs):
        for k, fn in enumerate(fns):
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            dt = (time.perf_counter() - t0) * 1e3 / reps
            if r >= warm:
                times[k].append(dt)
    res = {v: stat(t) for v, t in zip(VARIANTS, times)}
    res.update({"runs": runs, "warmup": warm, "iterations_per_sample": reps,
                "loss": loss, "grad_norm": norms[0], "repeatable": norms[0] == norms[1],
                "mem_peak_fwd_bwd_bytes": torch_peak(fwd_bwd_kept),  # after train(): .grad kept
                "mem_peak_fwd_bwd_dropped_bytes": torch_peak(fwd_bwd)})
    return res


def torch_peak(step):
    """Bytes of tensor memory step() holds at its peak above its start, from
    the profiler's memory events: an op's own allocations (self) counted at
    its start, a free (the "[memory]" events, negative) at its end."""
    from torch.autograd import profiler
    with profiler.profile(profile_memory=True) as prof:
        step()
    ev = []
    for e in prof.function_events:
        b = e.cpu_memory_usage if e.name == "[memory]" else e.self_cpu_memory_usage
        if b:
            ev.append((e.time_range.start if b > 0 else e.time_range.end, b))
    ev.sort()
    cur = peak = 0
    for _, b in ev:
        cur += b
        peak = max(peak, cur)
    return peak


def run_tool(cmd):
    """Runs the tapegrad command cmd in this environment; its output, which is
    printed when it fails (or with --show-tapegrad)."""
    p = subprocess.run(cmd, env=os.environ.copy(), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, universal_newlines=True)
    if ARGS.show_tapegrad or p.returncode:
        sys.stdout.write(p.stdout)
    if p.returncode:
        raise RuntimeError("%s exited with %d" % (" ".join(cmd), p.returncode))
    return p.stdout


def run_tapegrad(names, quick, threads):
    fd, path = tempfile.mkstemp(suffix=".json", prefix="tapegrad-bench-")
    os.close(fd)
    cmd = [ARGS.tapegrad, "bench"] + names + ["--threads", str(threads), "--json", path]
    if quick:
        cmd.append("--quick")
    try:
        run_tool(cmd)
        with open(path) as fh:
            return json.load(fh), " ".join(cmd)
    finally:
        os.unlink(path)


# ---- libtorch, PyTorch's C++ API: bench/torch_cpp.cpp
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CPP_SRC = os.path.join(ROOT, "bench", "torch_cpp.cpp")
CPP_BIN = os.path.join(ROOT, "build", "torch_cpp", "torch_cpp")
TORCH_API_INCLUDE = "/usr/include/torch/csrc/api/include"


def cpp_driver():
    """The libtorch driver's path, built first where it is missing, older than
    its source or built by another command; None, with a line saying why,
    where it cannot be had."""
    if not os.path.exists(os.path.join(TORCH_API_INCLUDE, "torch", "torch.h")):
        print("libtorch C++ API not installed (Debian package libtorch-dev); "
              "the C++ column is left out")
        return None
    cxx = shlex.split(os.environ.get("CXX") or "g++")
    if not cxx or not shutil.which(cxx[0]):
        print("torch_compare: no C++ compiler (CXX=%s not found); the C++ column is left out"
              % (os.environ.get("CXX") or "g++"), file=sys.stderr)
        return None
    tmp = "%s.tmp%d" % (CPP_BIN, os.getpid())

    def command(out):  # Debian's libtorch has the C++11 string ABI (its TorchConfig.cmake)
        return cxx + ["-O2", "-std=c++17", "-D_GLIBCXX_USE_CXX11_ABI=1",
                      "-isystem", TORCH_API_INCLUDE, CPP_SRC, "-o", out,
                      "-ltorch", "-ltorch_cpu", "-lc10", "-lpthread"]
    stamp = CPP_BIN + ".cmd"  # the command that built CPP_BIN
    want = " ".join(shlex.quote(a) for a in command(CPP_BIN))
    try:
        with open(stamp) as fh:
            fresh = (fh.read().strip() == want and
                     os.path.getmtime(CPP_BIN) >= os.path.getmtime(CPP_SRC))
    except OSError:
        fresh = False
    if fresh:
        return CPP_BIN
    print("torch_compare: building the libtorch driver (about a minute): %s" % want,
          file=sys.stderr)
    sys.stderr.flush()
    try:
        os.makedirs(os.path.dirname(CPP_BIN), exist_ok=True)
        p = subprocess.run(command(tmp), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           universal_newlines=True)
        if p.returncode == 0:
            os.replace(tmp, CPP_BIN)
            with open(stamp, "w") as fh:
                fh.write(want + "\n")
            return CPP_BIN
        err = "exit status %d\n%s" % (p.returncode, "\n".join(p.stdout.splitlines()[-30:]))
    except OSError as e:
        err = str(e)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    print("torch_compare: building the libtorch driver failed: %s\n"
          "torch_compare: the C++ column is left out" % err.rstrip(), file=sys.stderr)
    return None


def run_cpp(binary, names, quick, threads):
    """Runs the libtorch driver in this environment: (its results per workload,
    the command, its first line), or None where it gave none (its output is
    printed then, and whenever it fails)."""
    fd, path = tempfile.mkstemp(suffix=".json", prefix="torch-cpp-")
    os.close(fd)
    cmd = [binary, "--threads", str(threads), "--json", path]
    for n in names:
        cmd += ["-w", n]
    if quick:
        cmd.append("--quick")
    try:
        p = subprocess.run(cmd, env=os.environ.copy(), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, universal_newlines=True)
        if p.returncode:
            sys.stderr.write(p.stdout)
            print("torch_compare: %s exited with %d" % (" ".join(cmd), p.returncode),
                  file=sys.stderr)
        with open(path) as fh:
            text = fh.read()
        if not text.strip():
            raise ValueError("it wrote none")
        return json.loads(text), " ".join(cmd), (p.stdout.splitlines() or [""])[0]
    except (OSError, ValueError) as e:
        print("torch_compare: the libtorch driver gave no results (%s); "
              "the C++ column is left out" % e, file=sys.stderr)
        return None
    finally:
        os.unlink(path)


def run_torch_hvp(name, quick):
    """Median fwd+bwd and HVP ms of workload name, interleaved rounds."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    params, f = BUILDERS[name](g)
    vs = [torch.rand(p.shape, generator=g, dtype=p.dtype) * 2 - 1 for p in params]

    def fwd_bwd():
        for p in params:
            p.grad = None
        f().backward()

    def hvp():
        gr = torch.autograd.grad(f(), params, create_graph=True, allow_unused=True)
        s = sum((gi * vi).sum() for gi, vi in zip(gr, vs) if gi is not None)
        return torch.autograd.grad(s, params, allow_unused=True)

    hv = hvp()
    norm = math.sqrt(sum(float((h.double() ** 2).sum()) for h in hv if h is not None))
    runs, warm = (3, 1) if quick else (11, 1)
    fns, reps = [fwd_bwd, hvp], []
    for fn in fns:
        t0 = time.perf_counter()
        fn()
        one = time.perf_counter() - t0
        reps.append(max(1, math.ceil((1e-3 if quick else 2e-2) / max(one, 1e-9))))
    times = [[], []]
    for r in range(warm + runs):
        for k, fn in enumerate(fns):
            t0 = time.perf_counter()
            for _ in range(reps[k]):
                fn()
            if r >= warm:
                times[k].append((time.perf_counter() - t0) * 1e3 / reps[k])
    ratios = sorted(b / a for a, b in zip(times[0], times[1]))
    return {"fwd_bwd": stat(times[0]), "hvp": stat(times[1]),
            "ratio": ratios[len(ratios) // 2], "hv_norm": norm}


def main_hvp():
    names = [n for n in ("mlp", "elementwise") if not ARGS.workload or n in ARGS.workload]
    if ARGS.cpp:
        print("torch_compare: --hvp has no libtorch side; the C++ column is left out")
    torch.set_num_threads(ARGS.threads)
    print("PyTorch %s, %d threads: HVP = grad(<grad(loss, create_graph=True), v>)"
          % (torch.__version__, ARGS.threads))
    pt = {n: run_torch_hvp(n, ARGS.quick) for n in names}
    cmd = [ARGS.tapegrad, "bench", "hvp", "--threads", str(ARGS.threads)]
    if ARGS.quick:
        cmd.append("--quick")
    tg = {}
    for line in run_tool(cmd).splitlines():
        f = line.split()
        if len(f) == 6 and f[0] in names:
            tg[f[0]] = {"fwd_bwd": float(f[1]), "hvp": float(f[2]),
                        "ratio": float(f[3].rstrip("x"))}
    print("%-12s | %9s %9s %7s | %9s %9s %7s | %s" % (
        "workload", "tg f+b", "tg hvp", "hvp/f+b", "torch f+b", "torch hvp", "hvp/f+b",
        "tg hvp / torch hvp"))
    out = {"threads": ARGS.threads, "torch": pt, "tapegrad": tg, "command": " ".join(cmd)}
    for n in names:
        if n not in tg:
            print("%-12s | tapegrad gave no row" % n)
            continue
        a, b = tg[n], pt[n]
        print("%-12s | %9.4g %9.4g %6.2fx | %9.4g %9.4g %6.2fx | %.3f" % (
            n, a["fwd_bwd"], a["hvp"], a["ratio"], b["fwd_bwd"]["median"], b["hvp"]["median"],
            b["ratio"], a["hvp"] / b["hvp"]["median"]))
    if ARGS.json:
        with open(ARGS.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


def main():
    if ARGS.hvp:
        return main_hvp()
    names = ARGS.workload or WORKLOADS
    names = [n for n in WORKLOADS if n in names]
    if not os.access(ARGS.tapegrad, os.X_OK):
        print("torch_compare: no tapegrad binary at %s (build first, or pass its path)"
              % ARGS.tapegrad, file=sys.stderr)
        return 2
    torch.set_num_threads(ARGS.threads)
    print("PyTorch %s, torch threads %d, OMP/OPENBLAS/MKL_NUM_THREADS=%d, OMP_WAIT_POLICY=%s, "
          "OPENBLAS_CORETYPE=%s" % (torch.__version__, torch.get_num_threads(), ARGS.threads,
                                    os.environ["OMP_WAIT_POLICY"],
                                    os.environ.get("OPENBLAS_CORETYPE", "unset")))
    try:
        with open("/proc/loadavg") as fh:
            print("load average at start: %s" % fh.read().split()[0])
    except OSError:
        pass
    # built before any timing: the build keeps the cores busy for a minute
    cpp_bin = cpp_driver() if ARGS.cpp is not False else None
    if ARGS.quick:
        print("QUICK RUN: 5 samples after 1 warm-up; a smoke run, not a measurement")
    sys.stdout.flush()
    rounds = []  # each: (pt, cpp, tg, cmd), the sides run in a rotating order
    for r in range(ARGS.rounds):
        side = {}
        order = ["py", "cpp", "tg"]
        order = order[r % 3:] + order[:r % 3]
        for k in order:
            if k == "py":
                side[k] = {n: run_torch(n, ARGS.quick) for n in names}
            elif k == "cpp":
                side[k] = run_cpp(cpp_bin, names, ARGS.quick, ARGS.threads) if cpp_bin else None
            else:
                side[k] = run_tapegrad(names, ARGS.quick, ARGS.threads)
            sys.stdout.flush()
        rounds.append((side["py"], side["cpp"], side["tg"][0], side["tg"][1]))
    pt, cpp, tg, cmd = rounds[0]
    cw = {}
    if cpp:
        cw = cpp[0]
        print("libtorch: %s (%s)" % (cpp[1], cpp[2]))
        for n in names:  # same seeds, init and kernels: the losses should agree
            c = cw.get(n, {})
            if "loss" in c and not math.isclose(c["loss"], pt[n]["loss"], rel_tol=1e-4):
                print("note: %s: libtorch's loss %.6g differs from PyTorch's %.6g"
                      % (n, c["loss"], pt[n]["loss"]))
        sys.stdout.flush()
    print("tapegrad: %s (%s, OpenBLAS core %s, %d threads)" % (
        cmd, tg["cpu"], tg["openblas_core"], tg["openblas_threads"]))
    tgw = {w["name"]: w for w in tg["workloads"]}

    if cpp:
        print("\nms per iteration (medians; min-max in the JSON); tg/py = tapegrad / PyTorch "
              "(Python), tg/cpp = tapegrad / libtorch (C++); below 1 tapegrad is faster")
    else:
        print("\nms per iteration (medians; min-max in the JSON); ratio = tapegrad / PyTorch, "
              "below 1 tapegrad is faster")
    head = "%-12s" % "workload"
    for v in ("forward", "fwd+bwd", "train"):
        if cpp:
            head += " | %9s %9s %6s %9s %6s" % ("tg " + v, "torch", "tg/py", "libtorch", "tg/cpp")
        else:
            head += " | %9s %9s %6s" % ("tg " + v, "torch", "ratio")
    print(head)
    out = {"threads": ARGS.threads, "quick": ARGS.quick, "torch_version": torch.__version__,
           "omp_wait_policy": os.environ["OMP_WAIT_POLICY"],
           "tapegrad_command": cmd, "tapegrad": tg, "torch": pt, "ratios": {},
           "libtorch_command": cpp[1] if cpp else None, "libtorch": cw or None,
           "ratios_libtorch": {}}
    for n in names:
        w = tgw.get(n)
        line = "%-12s" % n
        if not w or not w.get("ok"):
            print(line + " | tapegrad failed: %s" % (w or {}).get("error", "missing"))
            continue
        ratios, cratios = {}, {}
        for v in VARIANTS:
            a, b = w[v]["median"], pt[n][v]["median"]
            ratios[v] = a / b
            line += " | %9.4g %9.4g %6.3f" % (a, b, a / b)
            if cpp:
                c = cw.get(n, {}).get(v)
                if c:
                    cratios[v] = a / c["median"]
                    line += " %9.4g %6.3f" % (c["median"], a / c["median"])
                else:  # the driver failed on this workload (its error above)
                    line += " %9s %6s" % ("-", "-")
        out["ratios"][n] = ratios
        if cratios:
            out["ratios_libtorch"][n] = cratios
        print(line)
    print("\ntensor memory peak of one forward+backward, MB (ratio = tapegrad / PyTorch;"
          " PyTorch's gradients kept and zeroed in place, as tapegrad's parameter sets"
          " keep theirs; last column: PyTorch's with its gradients dropped before)")
    print("%-12s %9s %9s %6s %13s" % ("workload", "tapegrad", "PyTorch", "ratio", "grads dropped"))
    for n in names:
        w = tgw.get(n)
        if not w or not w.get("ok"):
            continue
        a, b = w["mem_peak_fwd_bwd_bytes"], pt[n]["mem_peak_fwd_bwd_bytes"]
        d = pt[n]["mem_peak_fwd_bwd_dropped_bytes"]
        out["ratios"].setdefault(n, {})["mem_peak_fwd_bwd"] = a / b if b else None
        print("%-12s %9.3f %9.3f %6s %13.3f" % (n, a / 1e6, b / 1e6,
                                               "%.3f" % (a / b) if b else "-", d / 1e6))
    if ARGS.rounds > 1:
        out["rounds"] = round_ratios(names, rounds)
    if ARGS.json:
        with open(ARGS.json, "w") as fh:
            json.dump(out, fh, indent=1)
        print("wrote %s" % ARGS.json)
    return 0


def round_ratios(names, rounds):
    """Prints and returns, per workload and variant, the tapegrad / PyTorch and
    tapegrad / libtorch ratio of each round (both sides' medians in that
    round), with their median and range."""
    print("\nratios over %d rounds (each round runs PyTorch, libtorch and tapegrad in "
          "turn, the first of them rotating): median (min-max), then each round's" % len(rounds))
    tgw = [{x["name"]: x for x in tg["workloads"]} for _, _, tg, _ in rounds]
    res = {}
    for n in names:
        res[n] = {}
        for v in VARIANTS:
            for key, label in (("py", "tg/py"), ("cpp", "tg/cpp")):
                rs = []
                for (pt, cpp, _, _), ws in zip(rounds, tgw):
                    w = ws.get(n)
                    if not w or not w.get("ok"):
                        continue
                    other = pt[n][v] if key == "py" else (cpp[0].get(n, {}).get(v) if cpp else None)
                    if other:
                        rs.append(w[v]["median"] / other["median"])
                if not rs:
                    continue
                res[n].setdefault(v, {})[key] = rs
                print("%-12s %-10s %-6s %.3f (%.3f-%.3f)  %s" % (
                    n, v, label, statistics.median(rs), min(rs), max(rs),
                    " ".join("%.3f" % x for x in rs)))
    return res


if __name__ == "__main__":
    sys.exit(main())
