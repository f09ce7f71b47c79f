// torch_cpp.cpp: the tapegrad benchmark workloads in libtorch, PyTorch's C++
// API, for bench/torch_compare.py's third column.
//
// The same seven workloads as torch_compare.py (tiny, chain, mlp, elementwise,
// rnn, conv, deep): same shapes, losses and initialisation (torch::nn's
// default init, which is PyTorch's, with the global seed 0 and the data drawn
// from a CPU generator seeded 0: the losses equal the Python side's), and the
// same measurement: forward, forward+backward and an SGD (lr 1e-3) train
// step, interleaved within each round, 20 samples after 3 warm-up rounds
// (--quick: 5 after 1), each sample repeating the step enough times to last
// 4 ms (--quick: 1 ms); median, min and max in ms per iteration; a check that
// the loss and the gradient norm are finite and that the norm is identical
// over two runs. As on the Python
// side, the forward variant builds the autograd graph (grad mode on),
// fwd_bwd drops the gradients (undefined) before each step and the train step
// zeroes them in place (torch::optim::Optimizer::zero_grad in 1.13).
//
// torch_compare.py builds it once into build/torch_cpp/torch_cpp, where the
// Debian package libtorch-dev is installed, with
//   g++ -O2 -std=c++17 -D_GLIBCXX_USE_CXX11_ABI=1
//       -isystem /usr/include/torch/csrc/api/include bench/torch_cpp.cpp
//       -o build/torch_cpp/torch_cpp -ltorch -ltorch_cpu -lc10 -lpthread
// (CXX overrides g++), and runs it in the environment it gives PyTorch:
//   torch_cpp [--threads N] [--quick] [-w NAME ...] [--json FILE]
// The JSON is {workload: {forward: {median, min, max}, fwd_bwd: {...},
// train_step: {...}, runs, warmup, iterations_per_sample, loss, grad_norm,
// repeatable}}, or {workload: {error}} for a workload that failed (exit 1).

#include <torch/torch.h>
#include <torch/version.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace F = torch::nn::functional;
namespace nn = torch::nn;

namespace {

const char *const kWorkloads[] = {"tiny", "chain", "mlp", "elementwise", "rnn", "conv", "deep"};

// A workload: the tensors SGD updates and the loss as a closure, which keeps
// the modules and the data alive (mutable: a module holder's forward is not
// const).
struct Workload {
  std::vector<torch::Tensor> params;
  std::function<torch::Tensor()> loss;
};

std::vector<torch::Tensor> concat(std::vector<torch::Tensor> a,
                                  const std::vector<torch::Tensor> &b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// ---- the workloads, as torch_compare.py's wl_* functions
// Modules draw their initial values from the global generator as they are
// built, so each is built in its own statement, in the Python order (the
// arguments of one call are evaluated in no set order).
Workload wl_tiny(at::Generator &) {
  nn::Linear l1(2, 16), l2(16, 16), l3(16, 1);
  nn::Sequential m(l1, nn::Tanh(), l2, nn::Tanh(), l3);
  torch::Tensor x = torch::tensor({0.5f, -1.25f}).reshape({1, 2});
  torch::Tensor y = torch::tensor({0.75f}).reshape({1, 1});
  return {m->parameters(), [=]() mutable { return F::mse_loss(m->forward(x), y); }};
}

Workload wl_chain(at::Generator &) {
  torch::Tensor x = torch::tensor({0.5f}).requires_grad_(true);
  return {{x}, [=]() mutable {
            torch::Tensor t = x;
            for (int i = 0; i < 100; i++)
              t = torch::tanh(t);
            return t;  // one element: backward needs no seed
          }};
}

Workload wl_mlp(at::Generator &g) {
  nn::Linear l1(784, 512), l2(512, 512), l3(512, 10);
  nn::Sequential m(l1, nn::ReLU(), l2, nn::ReLU(), l3);
  torch::Tensor x = torch::rand({128, 784}, g);
  torch::Tensor y = torch::randint(0, 10, {128}, g, torch::kLong);
  return {m->parameters(), [=]() mutable { return F::cross_entropy(m->forward(x), y); }};
}

Workload wl_elementwise(at::Generator &g) {
  torch::Tensor x = (torch::rand({1 << 20}, g) * 4 - 2).requires_grad_(true);
  return {{x}, [=]() mutable { return (torch::tanh(x * x + 1) * torch::sigmoid(x)).sum(); }};
}

Workload wl_rnn(at::Generator &g) {
  const int64_t V = 64, H = 128, T = 64, B = 32;
  nn::RNNCell cell(nn::RNNCellOptions(V, H));
  nn::Linear out(H, V);
  torch::Tensor tok = torch::randint(0, V, {T + 1, B}, g, torch::kLong);
  torch::Tensor xs = torch::one_hot(tok.slice(0, 0, T), V).to(torch::kFloat);  // (T, B, V)
  torch::Tensor h0 = torch::zeros({B, H});
  return {concat(cell->parameters(), out->parameters()), [=]() mutable {
            torch::Tensor h = h0, loss;
            for (int64_t t = 0; t < T; t++) {
              h = cell->forward(xs[t], h);
              torch::Tensor l = F::cross_entropy(out->forward(h), tok[t + 1]);
              loss = loss.defined() ? loss + l : l;
            }
            return loss / T;
          }};
}

Workload wl_conv(at::Generator &g) {
  nn::Conv2d conv(nn::Conv2dOptions(1, 16, 3));
  nn::Linear fc(16 * 26 * 26, 10);
  torch::Tensor x = torch::rand({64, 1, 28, 28}, g);
  torch::Tensor y = torch::randint(0, 10, {64}, g, torch::kLong);
  return {concat(conv->parameters(), fc->parameters()), [=]() mutable {
            torch::Tensor h = torch::relu(conv->forward(x)).reshape({64, -1});
            return F::cross_entropy(fc->forward(h), y);
          }};
}

Workload wl_deep(at::Generator &g) {
  nn::Sequential m;
  for (int i = 0; i < 16; i++) {
    nn::Linear lin(1024, 1024);
    nn::init::kaiming_normal_(lin->weight, 0, torch::kFanIn, torch::kReLU);
    nn::init::zeros_(lin->bias);
    m->push_back(lin);
    m->push_back(nn::ReLU());
  }
  torch::Tensor x = torch::randn({256, 1024}, g);
  return {m->parameters(), [=]() mutable { return m->forward(x).mean(); }};
}

Workload build(const std::string &name, at::Generator &g) {
  if (name == "tiny") return wl_tiny(g);
  if (name == "chain") return wl_chain(g);
  if (name == "mlp") return wl_mlp(g);
  if (name == "elementwise") return wl_elementwise(g);
  if (name == "rnn") return wl_rnn(g);
  if (name == "conv") return wl_conv(g);
  return wl_deep(g);
}

// ---- measurement, as torch_compare.py's run_torch
struct Stat {
  double median, min, max;
};

Stat stat(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  double med = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  return {med, v.front(), v.back()};
}

double now_s() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

struct Result {
  Stat variant[3];  // forward, fwd_bwd, train_step
  int runs, warmup;
  long reps;
  double loss, grad_norm;
  bool repeatable;
};

Result run(const std::string &name, bool quick) {
  torch::manual_seed(0);
  at::Generator g = at::detail::createCPUGenerator(0);
  Workload w = build(name, g);
  torch::optim::SGD opt(w.params, torch::optim::SGDOptions(1e-3));

  auto fwd = [&] { torch::Tensor loss = w.loss(); };
  auto fwd_bwd = [&] {
    for (auto &p : w.params)  // zero_grad(set_to_none=True): no gradient at all
      p.mutable_grad() = torch::Tensor();
    w.loss().backward();
  };
  auto train = [&] {
    opt.zero_grad();  // 1.13 zeroes the gradients in place
    w.loss().backward();
    opt.step();
  };

  // check: finite loss and gradient norm, identical over two runs
  double norms[2];
  for (double &norm : norms) {
    fwd_bwd();
    torch::NoGradGuard no_grad;
    double sum = 0;
    for (auto &p : w.params)
      if (p.grad().defined())
        sum += p.grad().to(torch::kDouble).pow(2).sum().item<double>();
    norm = std::sqrt(sum);
  }
  double loss = w.loss().item<double>();
  if (!std::isfinite(loss) || !std::isfinite(norms[0])) {
    char msg[200];
    snprintf(msg, sizeof msg, "%s: loss %g, gradient norm %g", name.c_str(), loss, norms[0]);
    throw std::runtime_error(msg);
  }

  const std::function<void()> fns[3] = {fwd, fwd_bwd, train};
  const int runs = quick ? 5 : 20, warm = quick ? 1 : 3;
  const double target = quick ? 1e-3 : 4e-3;
  double t0 = now_s();
  fwd_bwd();
  double one = now_s() - t0;
  long reps = 1;
  if (one < target) {
    t0 = now_s();
    for (int i = 0; i < 3; i++)
      fwd_bwd();
    reps = (long)std::ceil(target / std::max((now_s() - t0) / 3, 1e-9));
  }
  std::vector<double> times[3];
  for (int r = 0; r < warm + runs; r++)
    for (int k = 0; k < 3; k++) {
      t0 = now_s();
      for (long i = 0; i < reps; i++)
        fns[k]();
      double dt = (now_s() - t0) * 1e3 / reps;
      if (r >= warm)
        times[k].push_back(dt);
    }
  Result res;
  for (int k = 0; k < 3; k++)
    res.variant[k] = stat(times[k]);
  res.runs = runs;
  res.warmup = warm;
  res.reps = reps;
  res.loss = loss;
  res.grad_norm = norms[0];
  res.repeatable = norms[0] == norms[1];
  return res;
}

// ---- JSON output, numbers written as Python's json module reads them
std::string num(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  char buf[32];
  snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

std::string quote(const std::string &s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += (char)c;
    } else if (c < 0x20) {
      char buf[8];
      snprintf(buf, sizeof buf, "\\u%04x", c);
      o += buf;
    } else {
      o += (char)c;
    }
  }
  return o + "\"";
}

std::string result_json(const Result &r) {
  static const char *const names[3] = {"forward", "fwd_bwd", "train_step"};
  std::string o = "{";
  for (int k = 0; k < 3; k++) {
    const Stat &s = r.variant[k];
    o += quote(names[k]) + ": {\"median\": " + num(s.median) + ", \"min\": " + num(s.min) +
         ", \"max\": " + num(s.max) + "}, ";
  }
  o += "\"runs\": " + std::to_string(r.runs) + ", \"warmup\": " + std::to_string(r.warmup) +
       ", \"iterations_per_sample\": " + std::to_string(r.reps) + ", \"loss\": " + num(r.loss) +
       ", \"grad_norm\": " + num(r.grad_norm) +
       ", \"repeatable\": " + (r.repeatable ? "true" : "false") + "}";
  return o;
}

[[noreturn]] void usage(const char *argv0, int status) {
  fprintf(status ? stderr : stdout,
          "usage: %s [--threads N] [--quick] [-w WORKLOAD ...] [--json FILE]\n"
          "workloads: tiny chain mlp elementwise rnn conv deep (default: all)\n",
          argv0);
  exit(status);
}

}  // namespace

int main(int argc, char **argv) {
  int threads = 1;
  bool quick = false;
  const char *json_path = nullptr;
  std::vector<std::string> chosen;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    bool has_value = i + 1 < argc;
    if (!strcmp(a, "--threads") && has_value) {
      char *end;
      long n = strtol(argv[++i], &end, 10);
      if (*end || n < 1 || n > 4096) {
        fprintf(stderr, "%s: --threads needs a count >= 1\n", argv[0]);
        return 2;
      }
      threads = (int)n;
    } else if (!strcmp(a, "--quick")) {
      quick = true;
    } else if ((!strcmp(a, "-w") || !strcmp(a, "--workload")) && has_value) {
      std::string n = argv[++i];
      if (std::find(std::begin(kWorkloads), std::end(kWorkloads), n) == std::end(kWorkloads)) {
        fprintf(stderr, "%s: no workload %s\n", argv[0], n.c_str());
        usage(argv[0], 2);
      }
      chosen.push_back(n);
    } else if (!strcmp(a, "--json") && has_value) {
      json_path = argv[++i];
    } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(argv[0], 0);
    } else {
      fprintf(stderr, "%s: bad argument %s\n", argv[0], a);
      usage(argv[0], 2);
    }
  }
  at::set_num_threads(threads);
  printf("libtorch %s (C++ API), at::get_num_threads() %d\n", TORCH_VERSION,
         at::get_num_threads());
  fflush(stdout);

  // in the canonical order, as torch_compare.py and tapegrad bench run them
  std::string json = "{";
  int failed = 0;
  for (const char *name : kWorkloads) {
    if (!chosen.empty() && std::find(chosen.begin(), chosen.end(), name) == chosen.end())
      continue;
    std::string entry;
    try {
      Result r = run(name, quick);
      printf("%-12s forward %.4g  fwd_bwd %.4g  train_step %.4g ms (medians)\n", name,
             r.variant[0].median, r.variant[1].median, r.variant[2].median);
      entry = result_json(r);
    } catch (const c10::Error &e) {
      fprintf(stderr, "%s: %s\n", name, e.what_without_backtrace());
      entry = "{\"error\": " + quote(e.what_without_backtrace()) + "}";
      failed++;
    } catch (const std::exception &e) {
      fprintf(stderr, "%s: %s\n", name, e.what());
      entry = "{\"error\": " + quote(e.what()) + "}";
      failed++;
    }
    fflush(stdout);
    json += std::string(json.size() > 1 ? ",\n " : "\n ") + quote(name) + ": " + entry;
  }
  json += "\n}\n";
  if (json_path) {
    FILE *fh = fopen(json_path, "w");
    if (!fh || fputs(json.c_str(), fh) == EOF || fclose(fh) != 0) {
      fprintf(stderr, "%s: cannot write %s: %s\n", argv[0], json_path, strerror(errno));
      return 1;
    }
  }
  return failed ? 1 : 0;
}
