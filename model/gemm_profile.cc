#include "model/gemm_profile.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>

namespace strata::model {

// A linear layer out[N,OC] = in[N,IC] · w[IC,OC]: forward NN; dX = dout · wᵀ (NT);
// dW = inᵀ · dout (TN).
std::vector<GemmShape> BlockForwardGemms(const Gpt2Config& cfg, int B, int T) {
  const int N = B * T, C = cfg.d_model;
  return {{false, false, N, 3 * C, C},
          {false, false, N, C, C},
          {false, false, N, 4 * C, C},
          {false, false, N, C, 4 * C}};
}

std::vector<GemmShape> ModelGemms(const Gpt2Config& cfg, int B, int T) {
  const int N = B * T, C = cfg.d_model, V = cfg.vocab;
  std::vector<GemmShape> g;
  auto linear_bwd = [&](int ic, int oc) {
    g.push_back({false, true, N, ic, oc});
    g.push_back({true, false, ic, oc, N});
  };
  const std::vector<GemmShape> block = BlockForwardGemms(cfg, B, T);
  for (int l = 0; l < cfg.layers; ++l) g.insert(g.end(), block.begin(), block.end());
  g.push_back({false, true, N, V, C});   // logits = x · wteᵀ
  g.push_back({false, false, N, C, V});  // dx = dlogits · wte
  g.push_back({true, false, V, C, N});   // dwte = dlogitsᵀ · x
  for (int l = cfg.layers - 1; l >= 0; --l) {
    linear_bwd(4 * C, C);
    linear_bwd(C, 4 * C);
    linear_bwd(C, C);
    linear_bwd(C, 3 * C);
  }
  return g;
}

double TotalFlops(const std::vector<GemmShape>& gemms) {
  double f = 0;
  for (const GemmShape& g : gemms) f += g.Flops();
  return f;
}

GemmRunner::GemmRunner(const std::vector<GemmShape>& gemms) : gemms_(gemms) {
  size_t a = 0, b = 0, c = 0;
  for (const GemmShape& g : gemms) {
    a = std::max(a, static_cast<size_t>(g.m) * g.k);
    b = std::max(b, static_cast<size_t>(g.k) * g.n);
    c = std::max(c, static_cast<size_t>(g.m) * g.n);
  }
  a_.assign(a, 0.01f);
  b_.assign(b, 0.02f);
  c_.assign(c, 0.0f);
}

void GemmRunner::Run() {
  // The BLAS alone, with its own threads (as many as OpenMP would use): its best.
  const int threads = omp_get_max_threads();
  if (openblas_get_num_threads() != threads) openblas_set_num_threads(threads);
  for (const GemmShape& g : gemms_) {
    const int lda = g.trans_a ? g.m : g.k, ldb = g.trans_b ? g.k : g.n;
    cblas_sgemm(CblasRowMajor, g.trans_a ? CblasTrans : CblasNoTrans,
                g.trans_b ? CblasTrans : CblasNoTrans, g.m, g.n, g.k, 1.0f, a_.data(), lda,
                b_.data(), ldb, 1.0f, c_.data(), g.n);
  }
}

double GemmRunner::TimedRun(int runs) {
  Run();
  double best = 0;
  for (int r = 0; r < std::max(runs, 1); ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    Run();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = r == 0 ? s : std::min(best, s);
  }
  return best;
}

}  // namespace strata::model
