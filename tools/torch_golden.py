#!/usr/bin/python3
"""Generate PyTorch golden gradients for tapegrad's composite-graph tests.

Usage: /usr/bin/python3 tools/torch_golden.py [OUTDIR]   (default tests/golden)

Every graph below is built in float64 with torch from inputs drawn with a
fixed seed (torch.manual_seed, one seed per graph derived from its name, so
adding or reordering graphs leaves the others unchanged). Each graph ends in
a scalar loss; torch's autograd gives the gradient of every f64 input and a
Hessian-vector product: with create_graph=True the gradient g is itself
differentiated, hvp = d<g, v>/dinputs for a direction v (one random tensor per
f64 input, drawn after the inputs, so the inputs do not depend on it). One
text file per graph, <name>.txt, is written into OUTDIR:

    graph <name>
    input <name> <f64|i64> <ndim> <dim0> ... <dimN-1>
    <all values, row-major, space separated, on one line>
    ... more inputs ...
    loss <value>
    grad <input name>
    <values on one line>
    ... one grad per f64 input, in input order ...
    dir <input name>
    <values on one line>
    ... one direction per f64 input ...
    hvp <input name>
    <values on one line>
    ... one Hessian-vector product per f64 input ...

Doubles are written with repr(), the shortest string that round-trips.
Only ops that tapegrad has (include/tapegrad/ops.h), with its semantics, are
used; tests/test_golden.c builds the same graphs with the C API. Keep the two
in sync: a graph here needs a build_<name> function and an entry in the
GOLDEN_GRAPHS list there.
"""

import os
import sys
import zlib

import torch
import torch.nn.functional as F

BASE_SEED = 20240611
DT = torch.float64


# ---- input helpers (all use the global torch generator seeded per graph)

def randn(*shape, scale=1.0):
    return torch.randn(*shape, dtype=DT) * scale


def positive(*shape, lo=0.5, hi=2.0):
    return torch.rand(*shape, dtype=DT) * (hi - lo) + lo


def distinct(*shape, scale=0.25):
    """Values with no ties anywhere (for max_dim): a shuffled grid plus a
    small jitter that cannot make two values equal."""
    n = 1
    for s in shape:
        n *= s
    perm = torch.randperm(n).to(DT)
    jitter = torch.rand(n, dtype=DT) * 0.1
    return ((perm + jitter) * scale - n * scale / 2).reshape(*shape)


def targets(n, classes):
    """n class indices in [0, classes), every class present when n allows."""
    t = torch.arange(n, dtype=torch.int64) % classes
    return t[torch.randperm(n)]


GRAPHS = []


# Each graph is (name, make_inputs, loss_fn). make_inputs returns a list of
# (name, tensor); loss_fn maps the tensors (in that order) to a 0-d loss.

def G(name, make_inputs, loss_fn):
    GRAPHS.append((name, make_inputs, loss_fn))


# 1. Two-layer MLP, relu, cross-entropy over i64 targets.
G("mlp_cross_entropy",
  lambda: [("x", randn(6, 5)), ("W1", randn(5, 8, scale=0.5)),
           ("b1", randn(8, scale=0.1)), ("W2", randn(8, 4, scale=0.5)),
           ("b2", randn(4, scale=0.1)), ("target", targets(6, 4))],
  lambda x, W1, b1, W2, b2, t:
      F.cross_entropy(torch.relu(x @ W1 + b1) @ W2 + b2, t))

# 2. Two-layer MLP, tanh, mse against an f64 target (which gets a grad too).
G("mlp_tanh_mse",
  lambda: [("x", randn(5, 3)), ("W1", randn(3, 6, scale=0.5)),
           ("b1", randn(1, 6, scale=0.1)), ("W2", randn(6, 2, scale=0.5)),
           ("b2", randn(2, scale=0.1)), ("y", randn(5, 2))],
  lambda x, W1, b1, W2, b2, y:
      F.mse_loss(torch.tanh(x @ W1 + b1) @ W2 + b2, y))

# 3. softmax then log, weighted sum.
G("softmax_then_log",
  lambda: [("x", randn(3, 5)), ("w", randn(3, 5))],
  lambda x, w: (torch.log(torch.softmax(x, 1)) * w).sum())

# 4. log_softmax over the last dim (given as -1), then mean.
G("log_softmax_mean",
  lambda: [("x", randn(4, 6, scale=2.0))],
  lambda x: torch.log_softmax(x, -1).mean())

# 5. log_softmax over dim 0, weighted, mean.
G("log_softmax_dim0_weighted_mean",
  lambda: [("x", randn(5, 3)), ("w", randn(5, 3))],
  lambda x, w: (torch.log_softmax(x, 0) * w).mean())

# 6. softmax chain: softmax over dim 0 feeding a softmax over dim 1.
G("softmax_chain",
  lambda: [("x", randn(4, 3)), ("w", randn(4, 3))],
  lambda x, w: (torch.softmax(torch.softmax(x, 0) * w, 1) * w).sum())

# 7. Row vectors ((5) and (1,5)) broadcast against a matrix.
G("broadcast_row_plus_matrix",
  lambda: [("M", randn(4, 5)), ("r", randn(5)), ("r2", randn(1, 5))],
  lambda M, r, r2: (torch.sigmoid(M + r) * (r2 - M)).sum())

# 8. Column vector times a matrix.
G("broadcast_col_mul_matrix",
  lambda: [("c", randn(4, 1)), ("M", randn(4, 3))],
  lambda c, M: (torch.tanh(c * M) - c).sum())

# 9. (1,1)-shaped tensors broadcast against a matrix.
G("broadcast_scalar_shaped",
  lambda: [("M", randn(3, 4)), ("s", randn(1, 1)), ("t", randn(1, 1))],
  lambda M, s, t: ((M * s) / (t * t + 1.0)).sum() + (torch.exp(M) * t).mean())

# 10. Outer broadcast (3,1) op (1,4) -> (3,4).
G("broadcast_outer",
  lambda: [("a", randn(3, 1)), ("b", randn(1, 4))],
  lambda a, b: (torch.tanh(a - b) * (a * b)).sum())

# 11. 3-d broadcast: (2,1,4) * (3,1) + (1,3,4) -> (2,3,4).
G("broadcast_3d",
  lambda: [("a", randn(2, 1, 4)), ("b", randn(3, 1)), ("c", randn(1, 3, 4))],
  lambda a, b, c: ((torch.tanh(a * b) + c) ** 2.0).mean())

# 12. The same weight in two matmuls.
G("shared_weight_two_matmuls",
  lambda: [("x", randn(3, 4)), ("W", randn(4, 4, scale=0.5))],
  lambda x, W: (torch.tanh(x @ W) @ W).sum())

# 13. x in both operands of mul.
G("shared_input_mul_self",
  lambda: [("x", randn(3, 4)), ("y", randn(3, 4))],
  lambda x, y: (x * x * y + x).sum())

# 14. Division and pow_scalar (integer, negative and fractional exponents).
G("div_pow_scalar",
  lambda: [("a", randn(3, 4)), ("b", positive(3, 4))],
  lambda a, b: ((a / b) ** 3.0).sum() + ((b ** -1.5) * a).sum()
      + (b ** 0.5).mean())

# 15. tanh -> sigmoid, times exp.
G("tanh_sigmoid_exp_chain",
  lambda: [("x", randn(3, 4))],
  lambda x: (torch.sigmoid(torch.tanh(x)) * torch.exp(x * 0.5)).sum())

# 16. exp -> +1 -> log -> sqrt (softplus under a sqrt), mean.
G("exp_log_sqrt_chain",
  lambda: [("x", randn(3, 4))],
  lambda x: torch.sqrt(torch.log(torch.exp(x) + 1.0)).mean())

# 17. log and sqrt in a quotient, negated.
G("log_sqrt_div_neg",
  lambda: [("x", positive(2, 5)), ("y", randn(2, 5))],
  lambda x, y: (-(torch.log(x) / torch.sqrt(y * y + 1.0))).sum())

# 18. sum over a dim with keepdim, broadcast back.
G("sum_dims_keepdim",
  lambda: [("x", randn(2, 3, 4))],
  lambda x: torch.sigmoid(x - x.sum(dim=[1], keepdim=True)).sum())

# 19. sum over two dims without keepdim.
G("sum_dims_no_keepdim",
  lambda: [("x", randn(2, 3, 4)), ("w", randn(3))],
  lambda x, w: ((x.sum(dim=[0, 2]) ** 2.0) * w).sum())

# 20. mean over dims with and without keepdim (negative dim too).
G("mean_dims_keepdim_and_not",
  lambda: [("x", randn(3, 4, 2))],
  lambda x: (torch.tanh(x - x.mean(dim=[-1], keepdim=True)) * x).sum()
      + (x.mean(dim=[0, 1]) * x.mean(dim=[0, 1])).sum())

# 21. max along a dim (values), no ties.
G("max_dim_values",
  lambda: [("x", distinct(4, 5)), ("w", randn(4))],
  lambda x, w: (torch.max(x, 1).values * w).sum())

# 22. max along a dim with keepdim, subtracted (x used twice).
G("max_dim_keepdim_sub",
  lambda: [("x", distinct(3, 4, 2))],
  lambda x: torch.exp(x - torch.max(x, 1, keepdim=True).values).sum())

# 23. Transposed left operand of a matmul.
G("transpose_lhs_matmul",
  lambda: [("A", randn(4, 3)), ("B", randn(4, 5))],
  lambda A, B: torch.tanh(A.transpose(0, 1) @ B).sum())

# 24. Transposed right operand of a matmul.
G("transpose_rhs_matmul",
  lambda: [("X", randn(3, 4)), ("Y", randn(5, 4))],
  lambda X, Y: torch.sigmoid(X @ Y.transpose(0, 1)).sum())

# 25. Gram matrix of an interior result: h^T h.
G("gram_of_interior",
  lambda: [("X", randn(3, 4)), ("W", randn(4, 2))],
  lambda X, W: torch.tanh((X @ W).transpose(0, 1) @ (X @ W)).mean())

# 26. 3-d permute then batched matmul.
G("permute_matmul",
  lambda: [("x", randn(2, 3, 4)), ("W", randn(3, 5))],
  lambda x, W: ((x.permute(0, 2, 1) @ W) ** 2.0).mean())

# 27. permute, contiguous, reshape, matmul.
G("permute_contiguous_reshape_matmul",
  lambda: [("x", randn(2, 3, 4)), ("W", randn(6, 2))],
  lambda x, W: torch.tanh(
      x.permute(2, 0, 1).contiguous().reshape(4, 6) @ W).sum())

# 28. Batched matmul (2,3,4) @ (4,5).
G("batched_matmul_3d_2d",
  lambda: [("a", randn(2, 3, 4)), ("b", randn(4, 5))],
  lambda a, b: torch.tanh(a @ b).sum())

# 29. Batched matmul (2,1,3,4) @ (3,4,2) -> (2,3,3,2).
G("batched_matmul_4d_3d_broadcast",
  lambda: [("a", randn(2, 1, 3, 4)), ("b", randn(3, 4, 2))],
  lambda a, b: torch.sigmoid(a @ b).sum())

# 30. Batched matmul (1,3,4) @ (2,4,2) -> (2,3,2).
G("batched_matmul_3d_3d_broadcast",
  lambda: [("a", randn(1, 3, 4)), ("b", randn(2, 4, 2))],
  lambda a, b: ((a @ b) * (a @ b)).mean())

# 31. Reshape chain (with -1) around a matmul, ending in an outer product.
G("reshape_chain",
  lambda: [("x", randn(2, 6)), ("W", randn(4, 3))],
  lambda x, W: (torch.tanh((x.reshape(3, 4) @ W).reshape(-1)).reshape(9, 1)
                * (x.reshape(3, 4) @ W).reshape(1, 9)).sum())

# 32. mse_loss of a prediction against an f64 target.
G("mse_loss_sigmoid",
  lambda: [("p", randn(4, 3)), ("y", randn(4, 3))],
  lambda p, y: F.mse_loss(torch.sigmoid(p) * 2.0, y))

# 33. Scalar add and mul.
G("scalar_add_mul",
  lambda: [("x", randn(3, 4))],
  lambda x: (((x * 2.5) + -0.75) * x).sum() + ((x + 3.0) * -0.5).mean())

# 34. expand then sum_to (sum_to_size).
G("expand_sum_to",
  lambda: [("x", randn(3, 1)), ("y", randn(2, 3, 4))],
  lambda x, y: ((x.expand(2, 3, 4) * y).sum_to_size(3, 1) ** 2.0).sum())


# 35. MLP with tanh and a softmax/cross-entropy head (second order through
# the cross-entropy's softmax and both tanh layers).
G("mlp_tanh_cross_entropy",
  lambda: [("x", randn(6, 4)), ("W1", randn(4, 5, scale=0.5)),
           ("b1", randn(5, scale=0.1)), ("W2", randn(5, 5, scale=0.5)),
           ("b2", randn(5, scale=0.1)), ("W3", randn(5, 3, scale=0.5)),
           ("target", targets(6, 3))],
  lambda x, W1, b1, W2, b2, W3, t:
      F.cross_entropy(torch.tanh(torch.tanh(x @ W1 + b1) @ W2 + b2) @ W3, t))

# 36. One head of scaled dot-product self-attention with a residual, a
# layer norm and a weighted readout.
G("attention_head",
  lambda: [("x", randn(4, 6)), ("Wq", randn(6, 3, scale=0.5)),
           ("Wk", randn(6, 3, scale=0.5)), ("Wv", randn(6, 3, scale=0.5)),
           ("Wo", randn(3, 6, scale=0.5)), ("gamma", positive(6)),
           ("beta", randn(6, scale=0.1)), ("w", randn(4, 6))],
  lambda x, Wq, Wk, Wv, Wo, gamma, beta, w: (F.layer_norm(
      x + (torch.softmax((x @ Wq) @ (x @ Wk).transpose(0, 1) * (3 ** -0.5), -1)
           @ (x @ Wv)) @ Wo, (6,), gamma, beta, 1e-5) * w).sum())

# 37. An Elman RNN unrolled three steps, h = tanh(x_t Wx + h Wh + b) from
# h0, read out by cross-entropy at the last step.
def _rnn(x, h0, Wx, Wh, b, Wo, t):
    h = h0
    for step in range(x.shape[0]):
        xt = x.narrow(0, step, 1).reshape(x.shape[1], x.shape[2])
        h = torch.tanh(xt @ Wx + h @ Wh + b)
    return F.cross_entropy(h @ Wo, t)


G("rnn_unrolled",
  lambda: [("x", randn(3, 4, 3)), ("h0", randn(4, 5, scale=0.5)),
           ("Wx", randn(3, 5, scale=0.5)), ("Wh", randn(5, 5, scale=0.4)),
           ("b", randn(5, scale=0.1)), ("Wo", randn(5, 3, scale=0.5)),
           ("target", targets(4, 3))],
  _rnn)

# 38. Smooth pointwise maps in a chain (gelu, silu, softplus, sin, cos):
# each one's second derivative enters the HVP.
G("smooth_maps_chain",
  lambda: [("x", randn(3, 5)), ("y", randn(3, 5))],
  lambda x, y: (F.gelu(x) * F.silu(y) + F.softplus(x * y)
                + torch.sin(x) * torch.cos(y)).sum())


# ---- writing

def fmt_values(t):
    flat = t.detach().reshape(-1).tolist()
    if t.dtype == torch.int64:
        return " ".join(str(int(v)) for v in flat)
    return " ".join(repr(float(v)) for v in flat)


def dtype_name(t):
    if t.dtype == torch.float64:
        return "f64"
    if t.dtype == torch.int64:
        return "i64"
    raise ValueError("unsupported dtype %s" % t.dtype)


def run_graph(name, make_inputs, loss_fn):
    torch.manual_seed(BASE_SEED ^ zlib.crc32(name.encode()))
    inputs = make_inputs()
    tensors = []
    for _, t in inputs:
        t = t.detach().clone()
        if t.dtype == DT:
            t.requires_grad_(True)
        tensors.append(t)
    loss = loss_fn(*tensors)
    assert loss.dim() == 0 and loss.dtype == DT, name
    wrt = [t for t in tensors if t.dtype == DT]
    grads = torch.autograd.grad(loss, wrt, create_graph=True)
    dirs = [randn(*t.shape) for t in wrt]
    inner = sum((g * v).sum() for g, v in zip(grads, dirs))
    hvps = torch.autograd.grad(inner, wrt, allow_unused=True) \
        if inner.requires_grad else [None] * len(wrt)
    hvps = [torch.zeros_like(t) if h is None else h for t, h in zip(wrt, hvps)]
    lines = ["graph " + name]
    for (iname, _), t in zip(inputs, tensors):
        lines.append("input %s %s %d%s" % (
            iname, dtype_name(t), t.dim(),
            "".join(" %d" % s for s in t.shape)))
        lines.append(fmt_values(t))
    lines.append("loss " + repr(float(loss.item())))
    f64_names = [iname for (iname, _), t in zip(inputs, tensors) if t.dtype == DT]
    for tag, values in (("grad", grads), ("dir", dirs), ("hvp", hvps)):
        for iname, t in zip(f64_names, values):
            lines.append(tag + " " + iname)
            lines.append(fmt_values(t))
    return "\n".join(lines) + "\n"


def main(argv):
    outdir = argv[1] if len(argv) > 1 else os.path.join("tests", "golden")
    os.makedirs(outdir, exist_ok=True)
    names = [g[0] for g in GRAPHS]
    assert len(names) == len(set(names)), "duplicate graph names"
    torch.set_default_dtype(DT)
    for name, make_inputs, loss_fn in GRAPHS:
        text = run_graph(name, make_inputs, loss_fn)
        with open(os.path.join(outdir, name + ".txt"), "w") as f:
            f.write(text)
    print("torch %s: wrote %d graphs to %s" % (torch.__version__, len(GRAPHS),
                                               outdir))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
