#!/usr/bin/python3
"""Golden values for tapegrad's losses and recurrent cells, from PyTorch.

Run with Debian's python3-torch:  /usr/bin/python3 tools/torch_layers_golden.py [OUT]
(default OUT: tests/golden_layers/layers.txt). Every case is float64. Format,
one record per line, whitespace separated, values written with repr():
  case NAME
  tensor NAME DTYPE NDIM DIM... VALUES...      (an input)
  param NAME VALUE                             (a scalar option)
  value NAME NDIM DIM... VALUES...             (an expected output)
  grad NAME VALUES...                          (d sum(outputs) / d input NAME)
Inputs named weight or pos_weight (loss weights) get no gradient.
"""
import sys
import torch
import torch.nn.functional as F

torch.manual_seed(1234)
torch.set_default_dtype(torch.float64)
out = []
CONSTANT = ("weight", "pos_weight")  # class / positive weights: inputs without gradients


def emit_tensor(kind, name, t):
    t = t.detach()
    vals = " ".join(repr(float(v)) if t.dtype != torch.int64 else str(int(v)) for v in t.flatten())
    dt = "i64" if t.dtype == torch.int64 else "f64"
    dims = " ".join(str(d) for d in t.shape)
    if kind == "tensor":
        out.append(f"tensor {name} {dt} {t.dim()} {dims} {vals}")
    else:
        out.append(f"value {name} {t.dim()} {dims} {vals}")


def case(name, inputs, params, fn):
    """inputs: dict name -> tensor (f64 ones get gradients); fn returns a list of outputs."""
    out.append(f"case {name}")
    leaves = {}
    for k, v in inputs.items():
        if v.dtype == torch.float64 and k not in CONSTANT:
            v = v.clone().requires_grad_(True)
        leaves[k] = v
        emit_tensor("tensor", k, v)
    for k, v in params.items():
        out.append(f"param {k} {v!r}")
    outs = fn(leaves, params)
    total = sum(o.sum() for o in outs)
    total.backward()
    for i, o in enumerate(outs):
        emit_tensor("value", f"out{i}", o)
    for k, v in leaves.items():
        if v.dtype == torch.float64 and k not in CONSTANT:
            out.append(f"grad {k} " + " ".join(repr(float(g)) for g in v.grad.flatten()))


N, C = 6, 5
logits = torch.randn(N, C) * 2
targets = torch.randint(0, C, (N,))
weight = torch.rand(C) + 0.5
case("cross_entropy_plain", {"logits": logits, "targets": targets}, {},
     lambda a, p: [F.cross_entropy(a["logits"], a["targets"])])
case("cross_entropy_smoothing", {"logits": logits, "targets": targets}, {"smoothing": 0.1},
     lambda a, p: [F.cross_entropy(a["logits"], a["targets"], label_smoothing=p["smoothing"])])
case("cross_entropy_weight", {"logits": logits, "targets": targets, "weight": weight}, {},
     lambda a, p: [F.cross_entropy(a["logits"], a["targets"], weight=a["weight"])])
case("cross_entropy_weight_smoothing", {"logits": logits, "targets": targets, "weight": weight},
     {"smoothing": 0.2},
     lambda a, p: [F.cross_entropy(a["logits"], a["targets"], weight=a["weight"],
                                   label_smoothing=p["smoothing"])])
logp = F.log_softmax(torch.randn(N, C), dim=1)
case("nll_weight", {"logp": logp, "targets": targets, "weight": weight}, {},
     lambda a, p: [F.nll_loss(a["logp"], a["targets"], weight=a["weight"])])
x = torch.randn(4, 3) * 3
y = torch.rand(4, 3)
case("bce_with_logits", {"x": x, "y": y}, {},
     lambda a, p: [F.binary_cross_entropy_with_logits(a["x"], a["y"])])
case("bce_with_logits_pos_weight", {"x": x, "y": y, "pos_weight": torch.rand(3) + 0.5}, {},
     lambda a, p: [F.binary_cross_entropy_with_logits(a["x"], a["y"], pos_weight=a["pos_weight"])])
case("huber", {"pred": torch.randn(5, 4) * 2, "target": torch.randn(5, 4)}, {"delta": 0.7},
     lambda a, p: [F.huber_loss(a["pred"], a["target"], delta=p["delta"])])
case("mse", {"pred": torch.randn(5, 4), "target": torch.randn(5, 4)}, {},
     lambda a, p: [F.mse_loss(a["pred"], a["target"])])

B, D, H = 3, 4, 5
inp = {"x": torch.randn(B, D), "h": torch.randn(B, H), "weight_ih": torch.randn(H, D) * 0.5,
       "weight_hh": torch.randn(H, H) * 0.5, "bias_ih": torch.randn(H) * 0.1,
       "bias_hh": torch.randn(H) * 0.1}
case("rnn_cell", inp, {},
     lambda a, p: [torch.tanh(a["x"] @ a["weight_ih"].T + a["bias_ih"] + a["h"] @ a["weight_hh"].T
                              + a["bias_hh"])])
lin = {"x": torch.randn(B, D), "h": torch.randn(B, H), "c": torch.randn(B, H),
       "weight_ih": torch.randn(4 * H, D) * 0.5, "weight_hh": torch.randn(4 * H, H) * 0.5,
       "bias_ih": torch.randn(4 * H) * 0.1, "bias_hh": torch.randn(4 * H) * 0.1}


def lstm(a, p):
    cell = torch.nn.LSTMCell(D, H)
    with torch.no_grad():
        for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            getattr(cell, k).copy_(a[k])
    # Functional form so gradients reach the inputs of the case.
    h2, c2 = torch._VF.lstm_cell(a["x"], (a["h"], a["c"]), a["weight_ih"], a["weight_hh"],
                                 a["bias_ih"], a["bias_hh"])
    return [h2, c2]


case("lstm_cell", lin, {}, lstm)

path = sys.argv[1] if len(sys.argv) > 1 else "tests/golden_layers/layers.txt"
with open(path, "w") as f:
    f.write(f"# made by tools/torch_layers_golden.py with torch {torch.__version__}\n")
    f.write("\n".join(out) + "\n")
print(f"wrote {len(out)} records to {path}")
