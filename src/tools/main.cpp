// The `spattn` command: mask, run, show, explain, info, bench, tsvd. Bad input gives a one-line message on stderr
// and a non-zero exit code, never an abort.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "spattn/config.hpp"
#include "spattn/device.hpp"
#include "spattn/format.hpp"
#include "spattn/pattern.hpp"
#include "spattn/reference.hpp"
#include "plan/analysis.hpp"
#include "plan/gpu/block_plan.hpp"
#include "plan/gpu/launch.hpp"
#include "spattn/plan.hpp"
#include "common/args.hpp"
#include "bench/bench.hpp"
#include "tools/commands.hpp"
#include "tools/npy.hpp"
#include "tools/png.hpp"

namespace spattn::tools {
using common::Args;
namespace {

const char* kUsage =
    "usage: spattn <command> [options]      (spattn <command> --help for one command's options)\n"
    "  run      attention on random or .npy inputs\n"
    "  mask     print each query row's keys\n"
    "  show     draw the mask (PNG or text)\n"
    "  explain  what spattn plans for a problem: keys per row, engine and kernel, cost, block fill\n"
    "  bench    benchmark suite\n"
    "  dist-bench  context-parallel attention over W ranks: bytes exchanged, simulated ranks\n"
    "  info     version, build options, CPU, GPUs\n"
    "  tsvd     tiled SVD compression of a weight matrix and the matmul through it   (spattn tsvd help)\n"
    "`spattn run` with no options: attention on a default Longformer-style problem.\n";

const char* kRunUsage =
    "usage: spattn run [--pattern SPEC] [--len L | --q-len A --k-len B] [--batch B] [--heads H] [--kv-heads HK]\n"
    "                  [--dim D] [--value-dim DV] [--dtype fp32|fp16|bf16] [--seed S] [--scale X]\n"
    "                  [--q q.npy --k k.npy --v v.npy] [--out o.npy] [--lse lse.npy]\n"
    "                  [--do do.npy] [--dq dq.npy] [--dk dk.npy] [--dv dv.npy]\n"
    "                  [--impl " SPATTN_CPU_IMPLS "] [--device cpu|cuda] [--threads N]\n"
    "Attention on random inputs (from --seed) of the given shape, or on q, k, v from .npy files (float32 or\n"
    "float16, [B, L, H, D]; the shape and dtype then come from the files). O is written as float32 [B, L, H, Dv],\n"
    "the log-sum-exp as float32 [B, H, L]. With no arguments: a small Longformer-style default.\n"
    "--dq, --dk, --dv: the gradients of O's loss <dO, O> by the backward pass on the same device and --impl,\n"
    "written as float32 laid out as q, k and v; dO from --do ([B, L, H, Dv]; random from --seed with random\n"
    "inputs). The timing line then adds the backward's (effective GFLOP/s count 2 nnz (3 D + 2 Dv) a head).\n"
    "Without --len (and without .npy inputs) L is 4096, said on stderr. A large run (about a second or more)\n"
    "prints its stages on stderr as it goes; SPATTN_PROGRESS=1 prints them always, 0 never.\n";

const char* kMaskUsage =
    "usage: spattn mask --pattern SPEC (--len L | --q-len A --k-len B)\n"
    "One line per query row: the row's keys in increasing order, separated by spaces (an empty line: no key).\n";

const char* kShowUsage =
    "usage: spattn show --pattern SPEC (--len L | --q-len A --k-len B) (-o mask.png | --ascii) [--size N]\n"
    "Draws the mask with queries down and keys across: one pixel (or character) per (query, key) up to N x N\n"
    "(default 512, or 64 with --ascii); beyond that each covers a block of entries and is shaded by the share of\n"
    "them that is kept, any kept entry visible however large the block. A legend line says what each shade means.\n";

const char* kExplainUsage =
    "usage: spattn explain --pattern SPEC (--len L | --q-len A --k-len B) [--dim D] [--batch B] [--heads H]\n"
    "                      [--kv-heads HK] [--dtype fp32|fp16|bf16] [--device cpu|cuda] [--engine E] [--kernel K]\n"
    "What spattn plans for this problem: keys per row, the engine and kernel chosen and why, the predicted cost,\n"
    "how the mask fills blocks of 16 to 128, and (on the CPU) the tiles the fused GPU kernel would run.\n"
    "Engines: auto, cpu, cuda_fused, cuda_unfused, reference.\n";

const char* kInfoUsage = "usage: spattn info\nThe version, build options, CPU features and GPUs this build of spattn sees.\n";

// Lengths from --len or --q-len/--k-len.
// def < 0: the lengths are required.
std::pair<int64_t, int64_t> lengths(const Args& a, int64_t def) {
  if (a.has("len") && (a.has("q-len") || a.has("k-len"))) throw Error("give either --len or --q-len/--k-len, not both");
  if (def < 0 && !a.has("len") && !a.has("q-len") && !a.has("k-len"))
    throw Error("missing --len L (or --q-len A and --k-len B): the sequence length to bind the pattern to");
  int64_t lq = a.integer("len", def), lk = lq;
  if (a.has("q-len") || a.has("k-len")) {
    if (!a.has("q-len") || !a.has("k-len")) throw Error("--q-len and --k-len go together");
    lq = a.integer("q-len", 0);
    lk = a.integer("k-len", 0);
  }
  if (lq < 0 || lk < 0) throw Error("lengths must not be negative (got " + std::to_string(lq) + " x " + std::to_string(lk) + ")");
  if (lk > (int64_t(1) << 31) - 1) throw Error("key length " + std::to_string(lk) + " is too large (at most 2^31 - 1)");
  return {lq, lk};
}

std::string require(const Args& a, const std::string& name) {
  if (!a.has(name)) throw Error("missing --" + name);
  return a.str(name);
}

// ---- mask ----
int cmd_mask(int argc, char** argv) {
  Args a(argc, argv, 2, {"pattern", "len", "q-len", "k-len"}, {});
  const auto [lq, lk] = lengths(a, -1);
  const BoundPattern p = Pattern::parse(require(a, "pattern")).bind(lq, lk);
  if (lq == 0)  // (on stderr: stdout keeps one line a query row, here none)
    std::fprintf(stderr, "spattn mask: no query rows: the mask is 0 x %lld\n", static_cast<long long>(lk));
  std::string buf;
  std::vector<int64_t> keys;
  char num[24];
  for (int64_t q = 0; q < lq; ++q) {
    p.row_keys(q, keys);
    for (size_t i = 0; i < keys.size(); ++i) {
      if (i) buf += ' ';
      const int n = std::snprintf(num, sizeof num, "%lld", static_cast<long long>(keys[i]));
      buf.append(num, size_t(n));
    }
    buf += '\n';
    if (buf.size() > (1 << 20)) {
      std::fwrite(buf.data(), 1, buf.size(), stdout);
      buf.clear();
    }
  }
  std::fwrite(buf.data(), 1, buf.size(), stdout);
  return std::fflush(stdout) == 0 ? 0 : 1;
}

// ---- show ----
// The share of kept entries of a picture cell, as a character and as a gray level. Any kept entry shows (a cell of a
// million entries with one kept is not drawn as empty): ascii by decades of the share, the PNG on a log scale from
// light gray (1e-4 or less) to near black, black only where every entry is kept.
char show_char(double kept, double entries) {
  if (kept <= 0) return '.';
  if (kept >= entries) return '#';
  const double d = kept / entries;
  return d < 1e-3 ? ':' : d < 1e-2 ? '-' : d < 0.1 ? '=' : d < 0.5 ? '+' : '*';
}
const char* kShowAsciiLegend =
    "'.' none kept, ':' under 0.1%, '-' 0.1-1%, '=' 1-10%, '+' 10-50%, '*' over 50%, '#' all kept";
uint8_t show_gray(double kept, double entries) {
  if (kept <= 0) return 255;
  if (kept >= entries) return 0;
  const double t = std::clamp((std::log10(kept / entries) + 4.0) / 4.0, 0.0, 1.0);  // 1e-4 -> 0, 1 -> 1
  return uint8_t(std::lround(224.0 - 192.0 * t));                                   // 224 (light) .. 32 (dark)
}
const char* kShowPngLegend =
    "white none kept, black all kept, gray some kept: light for a share of 0.01% or less, darker on a log scale to "
    "near black at 100%";

int cmd_show(int argc, char** argv) {
  Args a(argc, argv, 2, {"pattern", "len", "q-len", "k-len", "o", "out", "size"}, {"ascii"});
  int64_t lq = 0, lk = 0;  // (not a structured binding: the lambdas below capture them, which clang 14 refuses)
  std::tie(lq, lk) = lengths(a, -1);
  const BoundPattern p = Pattern::parse(require(a, "pattern")).bind(lq, lk);
  if (lq == 0 || lk == 0)
    throw Error("nothing to draw: the mask is " + std::to_string(lq) + " x " + std::to_string(lk) + " (a length is 0)");
  const bool ascii = a.has("ascii");
  if (a.has("o") && a.has("out")) throw Error("give -o FILE.png or --out FILE.png, not both");
  const std::string out = a.has("o") ? a.str("o") : a.str("out");
  if (!ascii && out.empty()) throw Error("give -o FILE.png or --ascii");
  const int64_t size = a.integer("size", ascii ? 64 : 512);
  if (size < 1 || size > 8192) throw Error("--size must be in [1, 8192], got " + std::to_string(size));
  const int64_t W = std::max<int64_t>(1, std::min(lk, size)), H = std::max<int64_t>(1, std::min(lq, size));
  // Kept entries of each picture cell (bins of rows by bins of keys), from the row runs: a run adds to each bin it
  // spans the number of its keys there, so a long strided run costs its bins, not its keys. One binning rule for
  // rows, keys and the cells' sizes: index i of n goes to bin i * bins / n, so bin b starts at ceil(b * n / bins).
  std::vector<double> kept(size_t(W * H), 0.0);
  auto bin_of = [](int64_t i, int64_t n, int64_t bins) { return i * bins / n; };
  auto bin_start = [](int64_t b, int64_t n, int64_t bins) { return (b * n + bins - 1) / bins; };
  auto col_bin = [&](int64_t k) { return bin_of(k, lk, W); };
  RowRuns runs;
  for (int64_t q = 0; q < lq; ++q) {
    double* cells = &kept[size_t(bin_of(q, lq, H) * W)];
    p.row(q, runs);
    for (const Run& r : runs) {
      if (r.count <= 0) continue;
      const int64_t x0 = col_bin(r.start), x1 = col_bin(r.last());
      if (r.count <= x1 - x0 + 1) {
        for (int64_t t = 0; t < r.count; ++t) cells[col_bin(r.start + t * r.stride)] += 1;
        continue;
      }
      for (int64_t x = x0; x <= x1; ++x) {  // keys start + t * stride in [a, b)
        const int64_t ka = std::max(bin_start(x, lk, W), r.start), kb = std::min(bin_start(x + 1, lk, W), r.end());
        if (ka >= kb) continue;
        const int64_t t0 = (ka - r.start + r.stride - 1) / r.stride, t1 = (kb - 1 - r.start) / r.stride;
        if (t1 >= t0) cells[x] += double(t1 - t0 + 1);
      }
    }
  }
  auto entries = [&](int64_t y, int64_t x) {
    return double(bin_start(y + 1, lq, H) - bin_start(y, lq, H)) * double(bin_start(x + 1, lk, W) - bin_start(x, lk, W));
  };
  const bool exact = W == lk && H == lq;
  char scale[160];
  std::snprintf(scale, sizeof scale, "%lldx%lld cells of up to %lld x %lld entries (queries down, keys across)",
                (long long)W, (long long)H, (long long)((lq + H - 1) / H), (long long)((lk + W - 1) / W));
  if (ascii) {
    std::string pic;
    for (int64_t y = 0; y < H; ++y) {
      for (int64_t x = 0; x < W; ++x) pic += show_char(kept[size_t(y * W + x)], entries(y, x));
      pic += '\n';
    }
    std::cout << pic << "legend: " << (exact ? "'#' kept, '.' not kept (one character per entry)" : kShowAsciiLegend)
              << "; " << scale << "\n";
  }
  if (!out.empty()) {
    std::vector<uint8_t> px(size_t(W * H));
    for (int64_t y = 0; y < H; ++y)
      for (int64_t x = 0; x < W; ++x) px[size_t(y * W + x)] = show_gray(kept[size_t(y * W + x)], entries(y, x));
    write_png_gray(out, int(W), int(H), px);
    std::cerr << "wrote " << out << ": " << scale << "; legend: "
              << (exact ? "black kept, white not kept (one pixel per entry)" : kShowPngLegend) << "\n";
  }
  return 0;
}

// ---- explain ----
int cmd_explain(int argc, char** argv) {
  Args a(argc, argv, 2, {"pattern", "len", "q-len", "k-len", "dim", "batch", "heads", "kv-heads", "dtype", "device", "engine", "kernel"},
         {});
  const auto [lq, lk] = lengths(a, -1);
  const Pattern pat = Pattern::parse(require(a, "pattern"));
  const Device dev = Device::parse(a.str("device", "cpu"));
  Problem pr;
  pr.q_len = lq;
  pr.kv_len = lk;
  pr.batch = a.integer("batch", 1);
  pr.q_heads = a.integer("heads", 4);  // run's default too
  pr.kv_heads = a.integer("kv-heads", pr.q_heads);
  pr.head_dim = a.integer("dim", 64);
  pr.dtype = parse_dtype(a.str("dtype", dev.kind == Device::Kind::cpu ? "fp32" : "bf16"));
  PlanOptions opt;
  opt.engine = parse_engine(a.str("engine", "auto"));
  opt.kernel = a.str("kernel", "");
  const Plan plan = make_plan(pat, pr, dev, opt);
  const BoundPattern p = pat.bind(lq, lk);
  std::string preview;
  if (lq == 0 || lk == 0) {
    preview = "fused     no tiles: the mask is " + std::to_string(lq) + " x " + std::to_string(lk) + "\n";
  } else if (dev.kind == Device::Kind::cpu) {
    // What the fused GPU engine would launch (the planner's decision, made on the CPU for an sm_90a device of 132
    // SMs with default options): each tile list's plan, row and why; a compound split's parts one a line.
    const auto t0 = std::chrono::steady_clock::now();
    const plan::Analysis an = plan::analyze(p);
    const plan::PatternDecision d = plan::decide_pattern(p, an, pr.head_dim, plan::GpuTarget{90, 132}, PlanOptions{});
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    for (size_t i = 0; i < d.split.parts.size(); ++i) {
      const plan::Part& part = d.split.parts[i];
      preview += i == 0 ? "fused     D=" + std::to_string(pr.head_dim) + ", sm_90a: "
                        : "          " + std::string(plan::part_kind_name(part.kind)) + " part: ";
      if (!d.launches[i]) {
        preview += "kernel cuda_scattered (" + plan::describe(part) + ")\n";
        continue;
      }
      const plan::LaunchDecision& l = *d.launches[i];
      preview += l.tiles.describe() + "; kernel " + (l.kernel_row >= 0 ? plan::kKernels[l.kernel_row].name : "none") +
                 " (" + l.why + ")" + (i == 0 && d.compound() ? "; compound: the " + std::string(plan::part_kind_name(part.kind)) + " part" : "") +
                 "\n";
    }
    char line[64];
    std::snprintf(line, sizeof line, "          planned in %.1f ms\n", ms);
    preview += line;
  }
  std::printf("%s\n%s%s", plan.explain().c_str(), plan::block_histogram(p).c_str(), preview.c_str());
  return 0;
}

// ---- info ----
int cmd_info(int argc, char** argv) {
  Args a(argc, argv, 2, {}, {});
  std::printf("spattn %s (%s build)\n", SPATTN_VERSION, SPATTN_BUILD_TYPE);
  std::printf("cuda      %s", SPATTN_HAVE_CUDA ? "on" : "off");
  if (SPATTN_HAVE_CUDA) std::printf(" (architectures %s)", SPATTN_CUDA_ARCHS);
  std::printf("\ncpu       %u hardware threads;", std::thread::hardware_concurrency());
#if defined(__x86_64__)
  __builtin_cpu_init();
  std::printf(" sse4.2 %s, avx2 %s, fma %s, avx512f %s", __builtin_cpu_supports("sse4.2") ? "yes" : "no",
              __builtin_cpu_supports("avx2") ? "yes" : "no", __builtin_cpu_supports("fma") ? "yes" : "no",
              __builtin_cpu_supports("avx512f") ? "yes" : "no");
#endif
  std::printf("\ncpu impls %s\n", SPATTN_CPU_IMPLS);
  std::string why;
  const auto gpus = list_gpus(&why);
  if (gpus.empty()) std::printf("gpus      none (%s)\n", why.c_str());
  for (const GpuInfo& g : gpus)
    std::printf("gpu %d     %s, compute capability %d.%d, %d SMs, %.1f GiB\n", g.index, g.name.c_str(), g.cc_major, g.cc_minor,
                g.multiprocessors, double(g.memory_bytes) / (1 << 30));
  return 0;
}

// ---- run ----
int cmd_run(int argc, char** argv) {
  Args a(argc, argv, 2,
         {"pattern", "len", "q-len", "k-len", "batch", "heads", "kv-heads", "dim", "value-dim", "dtype", "seed", "scale", "q", "k", "v",
          "out", "lse", "do", "dq", "dk", "dv", "impl", "device", "threads"},
         {});
  const bool defaults = argc == 2;
  RunOptions o;
  o.spec = a.str("pattern", "longformer(128, 16)");
  std::tie(o.problem.q_len, o.problem.kv_len) = lengths(a, 4096);
  o.problem.batch = a.integer("batch", 1);
  o.problem.q_heads = a.integer("heads", 4);
  o.problem.kv_heads = a.integer("kv-heads", o.problem.q_heads);
  o.problem.head_dim = a.integer("dim", 64);
  o.problem.value_dim = a.integer("value-dim", 0);
  o.problem.dtype = parse_dtype(a.str("dtype", "fp32"));
  if (a.has("scale")) o.problem.scale = a.real("scale", 0.0);  // 0 is a scale (uniform attention), not the default
  o.seed = uint64_t(a.integer("seed", 0));
  o.q_path = a.str("q");
  o.k_path = a.str("k");
  o.v_path = a.str("v");
  o.out_path = a.str("out");
  o.lse_path = a.str("lse");
  o.do_path = a.str("do");
  o.dq_path = a.str("dq");
  o.dk_path = a.str("dk");
  o.dv_path = a.str("dv");
  o.impl = a.str("impl", "auto");
  o.device = a.str("device", "cpu");
  o.threads = int(a.integer("threads", 0));
  o.verbose = true;  // the timing line with --out too (it was hidden)
  for (const char* f : {"len", "q-len", "k-len", "batch", "heads", "kv-heads", "dim", "value-dim", "dtype"})
    if (a.has(f)) o.shape_flags.push_back(std::string("--") + f);
  // Options that would do nothing are refused rather than ignored.
  const bool files = a.has("q") && a.has("k") && a.has("v");
  if (files && a.has("seed"))
    throw Error("--seed draws random inputs; with --q, --k and --v (and --do) nothing is random: drop --seed");
  if (o.device == "cuda" && a.has("threads"))
    throw Error("--threads sets the CPU engine's threads; --device cuda does not use it: drop --threads");
  // (not with some of --q, --k, --v: that is an error below, which the note about L came before)
  if (!defaults && !a.has("q") && !a.has("k") && !a.has("v") && !a.has("len") && !a.has("q-len") && !a.has("k-len"))
    std::fprintf(stderr, "spattn run: no --len given: L = %lld (the default)\n", (long long)o.problem.q_len);
  return run_attention(o);
}

}  // namespace

int main_impl(int argc, char** argv) {
  if (argc < 2) {  // no command: the list of commands (`spattn run` runs the default problem)
    std::cout << kUsage;
    return 0;
  }
  const std::string cmd = argv[1];
  // `spattn <command> --help` (or -h) anywhere among the options: that command's usage.
  bool help = false;
  for (int i = 2; i < argc; ++i) help |= std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h";
  if (help) {
    if (cmd == "bench") {
      for (int i = 2; i < argc; ++i)
        if (std::string(argv[i]) == "--plan-time") return bench::bench_plan_main(argc, argv);
      char* args[] = {argv[0], argv[1], const_cast<char*>("--help")};
      return bench::bench_cpu_main(3, args);
    }
    for (auto [name, usage] : {std::pair{"run", kRunUsage}, {"mask", kMaskUsage}, {"show", kShowUsage},
                               {"explain", kExplainUsage}, {"info", kInfoUsage}})
      if (cmd == name) {
        std::cout << usage;
        return 0;
      }
  }
  if (cmd == "dist-bench") return bench::dist_bench_main(argc, argv);
  if (cmd == "mask") return cmd_mask(argc, argv);
  if (cmd == "run") return cmd_run(argc, argv);
  if (cmd == "show") return cmd_show(argc, argv);
  if (cmd == "explain") return cmd_explain(argc, argv);
  if (cmd == "info") return cmd_info(argc, argv);
  if (cmd == "tsvd") return tsvd_main(argc, argv);
  if (cmd == "bench") {
    for (int i = 2; i < argc; ++i)
      if (std::string(argv[i]) == "--plan-time") return bench::bench_plan_main(argc, argv);
    for (int i = 2; i + 1 < argc; ++i)
      if (std::string(argv[i]) == "--device" && std::string(argv[i + 1]) == "cuda") {
#if SPATTN_HAVE_CUDA
        return bench::bench_cuda_main(argc - 2, argv + 2);
#else
        throw Error("this build of spattn has no CUDA support: rebuild with a CUDA compiler (SPATTN_CUDA=ON)");
#endif
      }
    return bench::bench_cpu_main(argc, argv);
  }
  if (cmd == "help" || cmd == "--help" || cmd == "-h") {
    std::cout << kUsage;
    return 0;
  }
  throw Error("unknown command '" + cmd + "' (run `spattn help` for the list)");
}

}  // namespace spattn::tools

int main(int argc, char** argv) {
  try {
    return spattn::tools::main_impl(argc, argv);
  } catch (const spattn::Error& e) {
    std::fprintf(stderr, "spattn: error: %s\n", e.what());
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "spattn: error: out of memory\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "spattn: error: %s\n", e.what());
  }
  return 2;
}
