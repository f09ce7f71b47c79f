#!/usr/bin/python3
"""Golden optimizer trajectories from PyTorch, for tests/test_optim.c.

Each configuration trains a linear layer, pred = x @ W.T + b, with the mean
squared error against fixed targets y, for 10 steps of one torch.optim
optimizer, all in float64, and writes tests/golden_optim/<name>.txt:

    optim <name>
    opts kind <sgd|adam|adamw|rmsprop> lr <v> weight_decay <v> ... (key value pairs)
    tensor <x|y|W|b> f64 <ndim> <dims...>
    <values, row-major, one line>
    ... (x, y, then the initial W and b)
    step <k> loss <loss before the update of step k>
    W <values after step k>
    b <values after step k>
    ... (k = 1..10)

Doubles are Python repr() (shortest round-trip); strtod reads them back
exactly. Every option key of tg_optim_opts is written, with PyTorch's value.
Usage: /usr/bin/python3 tools/torch_optim_golden.py tests/golden_optim
(Debian 12: apt-get install python3-torch python3-numpy). Rerunning with the
same torch build reproduces the files byte for byte.
"""
import os
import sys
import zlib

import torch

STEPS = 10

# name: (kind, options as tg_optim_opts fields)
CONFIGS = {
    "adam": ("adam", dict(lr=0.05)),
    "adam_l2_amsgrad": ("adam", dict(lr=0.05, weight_decay=0.1, amsgrad=True)),
    "adamw": ("adamw", dict(lr=0.05, weight_decay=0.1)),
    "adamw_amsgrad": ("adamw", dict(lr=0.02, weight_decay=0.5, amsgrad=True,
                                    beta1=0.8, beta2=0.99, eps=1e-6)),
    "sgd_nesterov_wd": ("sgd", dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
    "sgd_momentum_dampening": ("sgd", dict(lr=0.1, momentum=0.9, dampening=0.5)),
    "rmsprop": ("rmsprop", dict(lr=0.01)),
    "rmsprop_centered_momentum": ("rmsprop", dict(lr=0.01, alpha=0.9, momentum=0.5,
                                                  centered=True, weight_decay=0.01)),
}

DEFAULTS = dict(lr=1e-3, weight_decay=0.0, momentum=0.0, dampening=0.0, nesterov=False,
                beta1=0.9, beta2=0.999, eps=1e-8, amsgrad=False, alpha=0.99, centered=False)
KIND_DEFAULTS = {"adamw": dict(weight_decay=1e-2), "rmsprop": dict(lr=1e-2)}
KEYS = ["lr", "weight_decay", "momentum", "dampening", "nesterov", "beta1", "beta2", "eps",
        "amsgrad", "alpha", "centered"]


def make_optimizer(kind, o, params):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=o["lr"], momentum=o["momentum"],
                               dampening=o["dampening"], weight_decay=o["weight_decay"],
                               nesterov=o["nesterov"], foreach=False)
    if kind in ("adam", "adamw"):
        cls = torch.optim.Adam if kind == "adam" else torch.optim.AdamW
        return cls(params, lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"],
                   weight_decay=o["weight_decay"], amsgrad=o["amsgrad"], foreach=False)
    if kind == "rmsprop":
        return torch.optim.RMSprop(params, lr=o["lr"], alpha=o["alpha"], eps=o["eps"],
                                   weight_decay=o["weight_decay"], momentum=o["momentum"],
                                   centered=o["centered"], foreach=False)
    raise ValueError(kind)


def values(t):
    return " ".join(repr(float(v)) for v in t.detach().reshape(-1).tolist())


def tensor_block(name, t):
    dims = " ".join(str(d) for d in t.shape)
    return f"tensor {name} f64 {t.dim()} {dims}\n{values(t)}\n"


def run(name, kind, opts):
    o = dict(DEFAULTS)
    o.update(KIND_DEFAULTS.get(kind, {}))
    o.update(opts)
    torch.manual_seed(20240612 ^ zlib.crc32(name.encode()))
    x = torch.randn(8, 4, dtype=torch.float64)
    y = torch.randn(8, 3, dtype=torch.float64)
    W = (0.5 * torch.randn(3, 4, dtype=torch.float64)).requires_grad_()
    b = (0.5 * torch.randn(3, dtype=torch.float64)).requires_grad_()
    out = [f"optim {name}\n"]
    pairs = " ".join(f"{k} {int(o[k]) if isinstance(o[k], bool) else repr(float(o[k]))}"
                     for k in KEYS)
    out.append(f"opts kind {kind} {pairs}\n")
    for n, t in (("x", x), ("y", y), ("W", W), ("b", b)):
        out.append(tensor_block(n, t))
    opt = make_optimizer(kind, o, [W, b])
    for step in range(1, STEPS + 1):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(x @ W.T + b, y)
        loss.backward()
        opt.step()
        out.append(f"step {step} loss {repr(loss.item())}\n")
        out.append(f"W {values(W)}\nb {values(b)}\n")
    return "".join(out)


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else "tests/golden_optim"
    os.makedirs(outdir, exist_ok=True)
    for name, (kind, opts) in CONFIGS.items():
        with open(os.path.join(outdir, name + ".txt"), "w") as f:
            f.write(run(name, kind, opts))
    print(f"wrote {len(CONFIGS)} files to {outdir} (torch {torch.__version__})")


if __name__ == "__main__":
    main()
