// `strata bench model`: the CPU GPT-2 forward+backward against the sgemm throughput the same
// BLAS reaches alone on the model's own matrix shapes, measured in the same run.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "model/bench_stats.h"
#include "model/gemm_profile.h"
#include "model/gpt2.h"
#include "tools/strata/cli_common.h"
#include "tools/strata/commands.h"
#include "tools/strata/config_file.h"

namespace strata::cli {
namespace {

using model::Median;

struct BenchModelArgs {
  std::vector<std::string> models = {"4x128", "6x384", "12x768"};  // LAYERSxD_MODEL
  int batch = 8, seq_len = 64, vocab = 256, reps = 5;
  std::string json;
  int threads = 0;  // 0: STRATA_NUM_THREADS, else one per core
};

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

int RunBenchModel(const BenchModelArgs& a) {
  if (Status s = CheckOutput("--json", a.json); !s.ok()) {  // before the run, not after it
    std::fprintf(stderr, "strata bench model: %s\n", s.ToString().c_str());
    return 1;
  }
  // With --json -, standard output carries the JSON alone; the table goes to standard error.
  const JsonDestination json(a.json);
  SetComputeThreads(ResolveThreads(a.threads));
  std::printf(
      "# strata bench model: GPT-2 forward+backward on the CPU vs sgemm alone on the "
      "same shapes\n");
  std::printf("# batch %d x seq %d, vocab %d, %d repetitions (median), %d threads\n", a.batch,
              a.seq_len, a.vocab, a.reps, omp_get_max_threads());
  std::printf("%-8s %10s %12s %12s %12s %12s %8s %7s\n", "model", "params", "gemm_GFLOP",
              "model_ms", "gemm_ms", "model_GF/s", "share", "#wrong");
  nlohmann::json js = nlohmann::json::array();
  int status = 0;
  for (const std::string& m : a.models) {
    model::Gpt2Config cfg;
    if (std::sscanf(m.c_str(), "%dx%d", &cfg.layers, &cfg.d_model) != 2) {
      std::fprintf(stderr, "strata bench model: --model %s: expected LAYERSxD_MODEL (4x128)\n",
                   m.c_str());
      return 1;
    }
    cfg.heads = model::DefaultHeads(cfg.d_model);
    cfg.max_seq = a.seq_len;
    cfg.vocab = a.vocab;
    if (Status s = cfg.Validate(); !s.ok()) {
      std::fprintf(stderr, "strata bench model: %s\n", s.ToString().c_str());
      return 1;
    }
    const auto specs = model::Gpt2BlockSpecs(cfg);
    const auto layouts = model::PlainLayout(specs, 64);
    std::vector<std::vector<float>> p, g;
    for (size_t b = 0; b < specs.size(); ++b) {
      p.emplace_back(layouts[b].padded_numel, 0.f);
      g.emplace_back(layouts[b].padded_numel, 0.f);
      for (size_t t = 0; t < specs[b].tensors.size(); ++t) {
        const TensorLayout& tl = layouts[b].tensors[t];
        model::InitTensor(cfg, specs, b, t, 1, std::span<float>(p[b].data() + tl.offset, tl.numel));
      }
    }
    std::vector<const float*> pp;
    std::vector<float*> gp;
    for (auto& x : p) pp.push_back(x.data());
    for (auto& x : g) gp.push_back(x.data());
    const int N = a.batch * a.seq_len;
    std::vector<int32_t> in(N), tg(N);
    std::mt19937 rng(1);
    for (int i = 0; i < N; ++i) in[i] = rng() % cfg.vocab, tg[i] = rng() % cfg.vocab;
    model::Gpt2Model<float> net(cfg, a.batch, a.seq_len, false);
    const auto gemms = model::ModelGemms(cfg, a.batch, a.seq_len);
    model::GemmRunner runner(gemms);
    // Data check: the initial loss of a GPT-2-initialised model is close to ln(V).
    double loss = model::ForwardBackwardPlain(net, layouts, pp, gp, in.data(), tg.data(),
                                              1.0f / N);  // warm-up
    runner.Run();
    const bool wrong = !(std::abs(loss - std::log(cfg.vocab)) < 0.5);
    std::vector<double> tm, tg_;
    for (int r = 0; r < a.reps; ++r) {  // interleaved: both see the same machine state
      auto t0 = std::chrono::steady_clock::now();
      loss = model::ForwardBackwardPlain(net, layouts, pp, gp, in.data(), tg.data(), 1.0f / N);
      auto t1 = std::chrono::steady_clock::now();
      runner.Run();
      auto t2 = std::chrono::steady_clock::now();
      tm.push_back(Seconds(t1 - t0));
      tg_.push_back(Seconds(t2 - t1));
    }
    const double flops = model::TotalFlops(gemms);
    const double mt = Median(tm), gt = Median(tg_);
    const double share = gt / mt;  // (flops/mt) / (flops/gt)
    std::printf("%-8s %10llu %12.3f %12.2f %12.2f %12.1f %8.3f %7d\n", m.c_str(),
                static_cast<unsigned long long>(model::Gpt2NumParams(cfg)), flops / 1e9, mt * 1e3,
                gt * 1e3, flops / mt / 1e9, share, wrong ? 1 : 0);
    js.push_back({{"model", m},
                  {"params", model::Gpt2NumParams(cfg)},
                  {"gemm_flops", flops},
                  {"model_seconds", mt},
                  {"gemm_seconds", gt},
                  {"share", share},
                  {"loss", loss},
                  {"wrong", wrong ? 1 : 0}});
    if (wrong) status = 1;
  }
  if (!a.json.empty()) {
    const Status s = json.Write(
        "--json",
        nlohmann::json{{"batch", a.batch}, {"seq_len", a.seq_len}, {"results", js}}.dump(1) + "\n");
    if (!s.ok()) {
      std::fprintf(stderr, "strata bench model: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  return status;
}

}  // namespace

void AddBenchModel(CLI::App& bench, int* exit_code) {
  auto a = std::make_shared<BenchModelArgs>();
  CLI::App* sub = bench.add_subcommand(
      "model", "GPT-2 forward+backward on the CPU vs sgemm alone on the model's matrix shapes");
  sub->add_option("--model", a->models,
                  "LAYERSxD_MODEL, repeatable (heads: d_model / 64, or 1 when d_model is not a "
                  "multiple of 64, as in train)")
      ->capture_default_str();
  sub->add_option("--batch", a->batch, "Rows per micro-batch")->capture_default_str();
  sub->add_option("--seq-len", a->seq_len, "Tokens per row")->capture_default_str();
  sub->add_option("--vocab", a->vocab, "Vocabulary size")->capture_default_str();
  sub->add_option("--reps", a->reps, "Repetitions (the median is reported)")->capture_default_str();
  sub->add_option("--json", a->json,
                  "Write the results as JSON to FILE (-: standard output; the table then goes "
                  "to standard error)");
  AddModelThreadsFlag(sub, &a->threads);
  SetCallbackWithConfig(
      sub, [a] { return RunBenchModel(*a); }, exit_code);
}

}  // namespace strata::cli
