// Gradient checks of every GPT-2 CPU op against central finite differences in float64, and
// agreement of the float instantiation with the double one.
#include "model/gpt2_ops.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

namespace strata::model {
namespace {

using Vec = std::vector<double>;

Vec Random(size_t n, std::mt19937_64& rng, double scale = 1.0) {
  std::normal_distribution<double> d(0.0, scale);
  Vec v(n);
  for (double& x : v) x = d(rng);
  return v;
}

double Dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Compares `analytic` with central differences of `loss` w.r.t. every element of *x.
void ExpectGradNear(const char* what, Vec* x, const Vec& analytic,
                    const std::function<double()>& loss, double h = 1e-5) {
  ASSERT_EQ(x->size(), analytic.size()) << what;
  double max_err = 0;
  for (size_t i = 0; i < x->size(); ++i) {
    const double saved = (*x)[i];
    (*x)[i] = saved + h;
    const double lp = loss();
    (*x)[i] = saved - h;
    const double lm = loss();
    (*x)[i] = saved;
    const double fd = (lp - lm) / (2 * h);
    const double err = std::abs(fd - analytic[i]) / (1e-6 + std::abs(fd) + std::abs(analytic[i]));
    max_err = std::max(max_err, err);
    ASSERT_LT(err, 1e-5) << what << "[" << i << "]: finite difference " << fd << ", backward "
                         << analytic[i];
  }
  ::testing::Test::RecordProperty(what, std::to_string(max_err));
}

constexpr uint64_t kSeed = 1234;

TEST(Gpt2OpsGrad, Embedding) {
  std::mt19937_64 rng(kSeed);
  const int B = 2, T = 3, C = 5, V = 7;
  std::vector<int32_t> tok = {1, 3, 1, 6, 1, 0};  // repeated ids exercise the scatter-add
  Vec wte = Random(V * C, rng), wpe = Random(T * C, rng), r = Random(B * T * C, rng);
  Vec out(B * T * C);
  auto loss = [&] {
    EmbeddingForward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
    return Dot(out, r);
  };
  Vec dwte(V * C, 0.0), dwpe(T * C, 0.0);
  EmbeddingBackward(dwte.data(), dwpe.data(), r.data(), tok.data(), B, T, C);
  ExpectGradNear("wte", &wte, dwte, loss);
  ExpectGradNear("wpe", &wpe, dwpe, loss);
}

TEST(Gpt2OpsGrad, LayerNorm) {
  std::mt19937_64 rng(kSeed);
  const int N = 4, C = 37;  // odd channel count: crosses a chunk boundary
  Vec x = Random(N * C, rng, 2.0), w = Random(C, rng), b = Random(C, rng), r = Random(N * C, rng);
  Vec out(N * C), mean(N), rstd(N);
  auto loss = [&] {
    LayerNormForward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    return Dot(out, r);
  };
  loss();
  Vec dx(N * C, 0.0), dw(C, 0.0), db(C, 0.0);
  LayerNormBackward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), mean.data(),
                    rstd.data(), N, C);
  ExpectGradNear("x", &x, dx, loss);
  ExpectGradNear("w", &w, dw, loss);
  ExpectGradNear("b", &b, db, loss);
}

TEST(Gpt2OpsGrad, Matmul) {
  std::mt19937_64 rng(kSeed);
  const int N = 5, IC = 6, OC = 35;
  Vec x = Random(N * IC, rng), w = Random(IC * OC, rng), b = Random(OC, rng),
      r = Random(N * OC, rng);
  Vec out(N * OC);
  auto loss = [&] {
    MatmulForward(out.data(), x.data(), w.data(), b.data(), N, IC, OC);
    return Dot(out, r);
  };
  Vec dx(N * IC, 0.0), dw(IC * OC, 0.0), db(OC, 0.0);
  MatmulBackward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), N, IC, OC);
  ExpectGradNear("x", &x, dx, loss);
  ExpectGradNear("w", &w, dw, loss);
  ExpectGradNear("bias", &b, db, loss);
}

TEST(Gpt2OpsGrad, Attention) {
  std::mt19937_64 rng(kSeed);
  const int B = 2, T = 5, C = 6, NH = 2;
  Vec qkv = Random(B * T * 3 * C, rng), r = Random(B * T * C, rng);
  Vec out(B * T * C), att(B * NH * T * T);
  auto loss = [&] {
    AttentionForward(out.data(), att.data(), qkv.data(), B, T, C, NH);
    return Dot(out, r);
  };
  loss();
  // Causality: row t of att is zero beyond column t and sums to one.
  for (int bh = 0; bh < B * NH; ++bh) {
    for (int t = 0; t < T; ++t) {
      double s = 0;
      for (int u = 0; u < T; ++u) {
        const double p = att[(bh * T + t) * T + u];
        if (u > t) {
          EXPECT_EQ(p, 0.0);
        }
        s += p;
      }
      EXPECT_NEAR(s, 1.0, 1e-12);
    }
  }
  Vec dqkv(qkv.size(), 0.0);
  AttentionBackward(dqkv.data(), r.data(), qkv.data(), att.data(), B, T, C, NH);
  ExpectGradNear("qkv", &qkv, dqkv, loss);
}

TEST(Gpt2OpsGrad, Gelu) {
  std::mt19937_64 rng(kSeed);
  const size_t n = 17;
  Vec x = Random(n, rng, 2.0), r = Random(n, rng), out(n);
  auto loss = [&] {
    GeluForward(out.data(), x.data(), n);
    return Dot(out, r);
  };
  Vec dx(n, 0.0);
  GeluBackward(dx.data(), x.data(), r.data(), n);
  ExpectGradNear("x", &x, dx, loss);
  // The tanh approximation at known points.
  double v[3] = {0.0, 1.0, -1.0}, o[3];
  GeluForward(o, v, 3);
  EXPECT_EQ(o[0], 0.0);
  EXPECT_NEAR(o[1], 0.8411919906082768, 1e-12);
  EXPECT_NEAR(o[2], -0.15880800939172324, 1e-12);
}

TEST(Gpt2OpsGrad, Residual) {
  std::mt19937_64 rng(kSeed);
  const size_t n = 15;
  Vec a = Random(n, rng), b = Random(n, rng), r = Random(n, rng), out(n);
  auto loss = [&] {
    ResidualForward(out.data(), a.data(), b.data(), n);
    return Dot(out, r);
  };
  Vec da(n, 0.0), db(n, 0.0);
  ResidualBackward(da.data(), db.data(), r.data(), n);
  ExpectGradNear("a", &a, da, loss);
  ExpectGradNear("b", &b, db, loss);
}

TEST(Gpt2OpsGrad, LmHeadAndCrossEntropy) {
  std::mt19937_64 rng(kSeed);
  const int N = 6, C = 5, V = 11;
  Vec x = Random(N * C, rng), wte = Random(V * C, rng);
  std::vector<int32_t> tgt = {0, 10, 3, 3, 7, 1};
  Vec logits(N * V), probs(N * V), losses(N);
  auto loss = [&] {
    LmHeadForward(logits.data(), x.data(), wte.data(), N, C, V);
    return SoftmaxCrossEntropyForward(probs.data(), losses.data(), logits.data(), tgt.data(), N, V);
  };
  const double l0 = loss();
  // The mean loss equals the mean of -log p[target].
  double ref = 0;
  for (int n = 0; n < N; ++n) ref -= std::log(probs[n * V + tgt[n]]);
  EXPECT_NEAR(l0, ref / N, 1e-12);
  Vec dlogits(N * V);
  SoftmaxCrossEntropyBackward(dlogits.data(), probs.data(), tgt.data(), N, V, 1.0 / N);
  Vec dx(N * C, 0.0), dwte(V * C, 0.0);
  LmHeadBackward(dx.data(), dwte.data(), dlogits.data(), x.data(), wte.data(), N, C, V);
  ExpectGradNear("x", &x, dx, loss);
  ExpectGradNear("wte", &wte, dwte, loss);
}

TEST(Gpt2OpsGrad, CrossEntropyInPlaceMatchesSeparate) {
  std::mt19937_64 rng(kSeed);
  const int N = 3, V = 9;
  Vec logits = Random(N * V, rng, 3.0), probs(N * V), losses(N), d1(N * V);
  std::vector<int32_t> tgt = {8, 0, 4};
  const double l1 =
      SoftmaxCrossEntropyForward(probs.data(), losses.data(), logits.data(), tgt.data(), N, V);
  SoftmaxCrossEntropyBackward(d1.data(), probs.data(), tgt.data(), N, V, 0.5);
  Vec inplace = logits;
  const double l2 =
      SoftmaxCrossEntropyForward(inplace.data(), losses.data(), inplace.data(), tgt.data(), N, V);
  SoftmaxCrossEntropyBackward(inplace.data(), inplace.data(), tgt.data(), N, V, 0.5);
  EXPECT_EQ(l1, l2);
  EXPECT_EQ(d1, inplace);
}

// ---- float agrees with double; results do not depend on the thread count --------------------

std::vector<float> ToFloat(const Vec& v) { return std::vector<float>(v.begin(), v.end()); }

void ExpectClose(const std::vector<float>& f, const Vec& d, double tol, const char* what) {
  ASSERT_EQ(f.size(), d.size());
  for (size_t i = 0; i < f.size(); ++i) {
    ASSERT_NEAR(f[i], d[i], tol * (1 + std::abs(d[i]))) << what << "[" << i << "]";
  }
}

TEST(Gpt2OpsFloat, AgreesWithDouble) {
  std::mt19937_64 rng(kSeed);
  const int B = 2, T = 7, C = 16, NH = 4, N = B * T;
  Vec qkv = Random(N * 3 * C, rng), dout = Random(N * C, rng);
  Vec out(N * C), att(B * NH * T * T), dqkv(qkv.size(), 0.0);
  AttentionForward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  AttentionBackward(dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);
  std::vector<float> qf = ToFloat(qkv), df = ToFloat(dout), of(N * C), af(att.size()),
                     dqf(qkv.size(), 0.f);
  AttentionForward(of.data(), af.data(), qf.data(), B, T, C, NH);
  AttentionBackward(dqf.data(), df.data(), qf.data(), af.data(), B, T, C, NH);
  ExpectClose(of, out, 1e-5, "attention out");
  ExpectClose(dqf, dqkv, 1e-4, "attention dqkv");

  Vec x = Random(N * C, rng, 3.0), w = Random(C, rng), b = Random(C, rng), mean(N), rstd(N);
  Vec ln(N * C), dx(N * C, 0.0), dw(C, 0.0), db(C, 0.0);
  LayerNormForward(ln.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  LayerNormBackward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), mean.data(),
                    rstd.data(), N, C);
  std::vector<float> xf = ToFloat(x), wf = ToFloat(w), bf = ToFloat(b), lnf(N * C), mf(N), rf(N),
                     dxf(N * C, 0.f), dwf(C, 0.f), dbf(C, 0.f);
  LayerNormForward(lnf.data(), mf.data(), rf.data(), xf.data(), wf.data(), bf.data(), N, C);
  LayerNormBackward(dxf.data(), dwf.data(), dbf.data(), df.data(), xf.data(), wf.data(), mf.data(),
                    rf.data(), N, C);
  ExpectClose(lnf, ln, 1e-5, "layernorm out");
  ExpectClose(dxf, dx, 1e-4, "layernorm dx");
  ExpectClose(dwf, dw, 1e-4, "layernorm dw");

  Vec g(N * C), dg(N * C, 0.0);
  GeluForward(g.data(), x.data(), g.size());
  GeluBackward(dg.data(), x.data(), dout.data(), g.size());
  std::vector<float> gf(N * C), dgf(N * C, 0.f);
  GeluForward(gf.data(), xf.data(), gf.size());
  GeluBackward(dgf.data(), xf.data(), df.data(), gf.size());
  ExpectClose(gf, g, 1e-6, "gelu");
  ExpectClose(dgf, dg, 1e-5, "gelu backward");
}

template <typename Fn>
std::vector<float> RunWithThreads(int threads, Fn fn) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  std::vector<float> r = fn();
  omp_set_num_threads(saved);
  return r;
}

TEST(Gpt2OpsFloat, IndependentOfThreadCount) {
  std::mt19937 rng(kSeed);
  std::normal_distribution<float> nd;
  const int B = 3, T = 9, C = 40, NH = 5, V = 13, N = B * T;
  std::vector<float> qkv(N * 3 * C), dout(N * C), x(N * C), w(C), b(C), wte(V * C), wpe(T * C);
  for (auto* v : {&qkv, &dout, &x, &w, &b, &wte, &wpe})
    for (float& e : *v) e = nd(rng);
  std::vector<int32_t> tok(N);
  for (int i = 0; i < N; ++i) tok[i] = static_cast<int32_t>(rng() % V);
  auto run = [&] {
    std::vector<float> all;
    std::vector<float> out(N * C), att(B * NH * T * T), dqkv(qkv.size(), 0.f);
    AttentionForward(out.data(), att.data(), qkv.data(), B, T, C, NH);
    AttentionBackward(dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);
    std::vector<float> ln(N * C), m(N), r(N), dx(N * C, 0.f), dw(C, 0.f), db(C, 0.f);
    LayerNormForward(ln.data(), m.data(), r.data(), x.data(), w.data(), b.data(), N, C);
    LayerNormBackward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), m.data(),
                      r.data(), N, C);
    std::vector<float> dwte(V * C, 0.f), dwpe(T * C, 0.f);
    EmbeddingBackward(dwte.data(), dwpe.data(), dout.data(), tok.data(), B, T, C);
    for (auto* v : {&out, &att, &dqkv, &ln, &dx, &dw, &db, &dwte, &dwpe})
      all.insert(all.end(), v->begin(), v->end());
    return all;
  };
  const std::vector<float> one = RunWithThreads(1, run);
  const std::vector<float> two = RunWithThreads(2, run);
  const std::vector<float> three = RunWithThreads(3, run);
  EXPECT_EQ(one, two);
  EXPECT_EQ(one, three);
}

// GEMMs large enough to be split across the OpenMP team: the slices are fixed by the
// product's shape, so every thread count gives the same bits (a resumed run on another
// machine, or with another --threads, continues bit for bit).
TEST(Gpt2OpsFloat, SplitGemmsAreIndependentOfThreadCount) {
  std::mt19937 rng(99);
  std::normal_distribution<float> nd;
  const int N = 257, IC = 129, OC = 385, V = 259;  // odd: slices end mid-tile
  std::vector<float> x(N * IC), w(IC * OC), b(OC), dout(N * OC), wte(V * IC), dl(N * V);
  for (auto* v : {&x, &w, &b, &dout, &wte, &dl})
    for (float& e : *v) e = nd(rng);
  auto run = [&] {
    std::vector<float> out(N * OC), dx(N * IC, 0.f), dw(IC * OC, 0.f), db(OC, 0.f);
    std::vector<float> logits(N * V), dxh(N * IC, 0.f), dwte(V * IC, 0.f);
    MatmulForward(out.data(), x.data(), w.data(), b.data(), N, IC, OC);
    MatmulBackward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), N, IC, OC);
    LmHeadForward(logits.data(), x.data(), wte.data(), N, IC, V);
    LmHeadBackward(dxh.data(), dwte.data(), dl.data(), x.data(), wte.data(), N, IC, V);
    std::vector<float> all;
    for (auto* v : {&out, &dx, &dw, &db, &logits, &dxh, &dwte})
      all.insert(all.end(), v->begin(), v->end());
    return all;
  };
  const std::vector<float> one = RunWithThreads(1, run);
  for (int threads : {2, 3, 5}) {
    const std::vector<float> a = RunWithThreads(threads, run);
    ASSERT_EQ(a.size(), one.size());
    size_t differ = 0;
    for (size_t i = 0; i < a.size(); ++i) differ += std::memcmp(&a[i], &one[i], sizeof(float)) != 0;
    EXPECT_EQ(differ, 0u) << "of " << a.size() << " values with " << threads << " threads";
  }
}

TEST(Gpt2OpsFloat, GeluAtExtremesMatchesDouble) {
  const std::vector<double> xs = {-100, -30, -9, -5, -1, -1e-3, -1e-6, 0,  1e-6,
                                  1e-3, 0.5, 1,  3,  5,  9,     30,    100};
  Vec out(xs.size()), d(xs.size(), 0.0), ones(xs.size(), 1.0);
  GeluForward(out.data(), xs.data(), xs.size());
  GeluBackward(d.data(), xs.data(), ones.data(), xs.size());
  std::vector<float> xf = ToFloat(xs), of(xs.size()), df(xs.size(), 0.f), onesf(xs.size(), 1.f);
  GeluForward(of.data(), xf.data(), xf.size());
  GeluBackward(df.data(), xf.data(), onesf.data(), xf.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    EXPECT_NEAR(of[i], out[i], 1e-6 * (1 + std::abs(out[i]))) << "gelu(" << xs[i] << ")";
    EXPECT_NEAR(df[i], d[i], 2e-6 * (1 + std::abs(d[i]))) << "gelu'(" << xs[i] << ")";
    EXPECT_TRUE(std::isfinite(of[i]) && std::isfinite(df[i]));
  }
}

// The whole-buffer ops run over the team: every value exact on any thread count, the widening
// of every bf16 pattern (NaN, infinity, subnormals, both zeros) the float with those high bits.
TEST(Gpt2OpsFloat, WidenAndFillAreExactOnAnyThreadCount) {
  const size_t n = (size_t{1} << 16) * 3 + 7;  // above the team's threshold, with an edge
  std::vector<uint16_t> bf16(n);
  for (size_t i = 0; i < n; ++i) bf16[i] = static_cast<uint16_t>(i * 40503u);
  for (int threads : {1, 2, 3}) {
    const std::vector<float> wide = RunWithThreads(threads, [&] {
      std::vector<float> out(n, -1.0f);
      WidenBf16(out.data(), bf16.data(), n);
      return out;
    });
    for (size_t i = 0; i < n; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &wide[i], sizeof bits);
      ASSERT_EQ(bits, uint32_t{bf16[i]} << 16) << "value " << i << ", " << threads << " threads";
    }
    const std::vector<float> filled = RunWithThreads(threads, [&] {
      std::vector<float> out(n, 3.0f);
      Fill(out.data(), 0.0f, n - 1);
      return out;
    });
    for (size_t i = 0; i + 1 < n; ++i) ASSERT_EQ(filled[i], 0.0f) << i;
    EXPECT_EQ(filled[n - 1], 3.0f);  // past the range: untouched
  }
}

}  // namespace
}  // namespace strata::model
