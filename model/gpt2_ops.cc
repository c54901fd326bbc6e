// CPU implementation of the GPT-2 operators (see gpt2_ops.h for the contract).
//
// Matrix products: CBLAS sgemm/dgemm in row blocks fixed by the product's shape, shared out
// over the OpenMP team (see Gemm: so the thread count never changes a bit). Everything else:
// OpenMP loops whose iterations own disjoint outputs, so their results never depend on the
// thread count. Reductions across rows (parameter grads) are parallel over channel chunks;
// each chunk walks rows in ascending order.
#include "model/gpt2_ops.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

namespace strata::model {
namespace {

// Channels per chunk in row-reductions: a chunk is one or two cache lines of every row.
constexpr int kChanChunk = 32;

// Below this many elements an elementwise op runs on the calling thread: forking and joining
// a team costs more than the work (and far more on a loaded machine, where a waiting
// thread spins while its peer is descheduled). Never changes a result.
constexpr size_t kParallelMin = size_t{1} << 15;

// exp(x) for float, vectorisable (no libm call): x = n ln2 + r, |r| <= ln2/2, e^r by its
// degree-6 Taylor polynomial (relative error < 2e-7, about one ulp), times 2^n built in
// the exponent bits. Inputs are clamped to [-87, 88] (the normal range). n is rounded by
// integer conversion, not floor(), which is a libm call without SSE4.1.
inline float ExpVec(float x) {
  x = std::min(88.0f, std::max(-87.0f, x));
  const float t = x * 1.44269504f;
  const float n = static_cast<float>(static_cast<int32_t>(t + (t >= 0.0f ? 0.5f : -0.5f)));
  const float r = (x - n * 0.693145752f) - n * 1.42860677e-6f;  // ln2 split: hi + lo
  const float p =
      1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 +
                                          r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720))))));
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}

// tanh(u) = sign(u) (1 - e) / (1 + e), e = exp(-2|u|): float uses ExpVec so the GELU loops
// vectorise (glibc's tanhf was a third of the small model's step); double keeps std::tanh
// (the finite-difference reference).
inline float TanhOp(float u) {
  const float e = ExpVec(-2.0f * std::fabs(u));
  return std::copysign((1.0f - e) / (1.0f + e), u);
}
inline double TanhOp(double u) { return std::tanh(u); }

void BlasGemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha,
              const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void BlasGemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, double alpha,
              const double* a, int lda, const double* b, int ldb, double beta, double* c, int ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// C[m,n] = alpha op(A) op(B) + beta C, row-major. One thread pool per process: OpenBLAS
// runs single-threaded and the rows of C are split across the OpenMP team, each thread
// multiplying its slices. Two pools (OpenMP's for the loops, OpenBLAS's pthreads for the
// GEMMs) on the same cores made each spin while the other worked: on a loaded 2-core
// machine a step took 20x longer. The bits of a row of C depend on the slice it falls in
// (OpenBLAS picks its blocking and edge kernels by the slice's shape), so the slices are
// fixed by the product's shape alone: blocks of at least kGemmBlockRows rows, at most
// kGemmMaxBlocks of them, whatever the thread count. The threads share out whole blocks,
// and any thread count (--threads, one per core) gives the same bits.
constexpr int kGemmBlockRows = 64;
constexpr int kGemmMaxBlocks = 32;

template <typename F>
void Gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, F alpha, const F* a, int lda,
          const F* b, int ldb, F beta, F* c, int ldc) {
  if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
  const double flops = 2.0 * m * n * k;
  if (flops < 4e6 || m < 2 * kGemmBlockRows) {
    BlasGemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  // Rows per block: a multiple of 16 (every kernel's row unroll), so only the last block
  // has an edge.
  const int spread = (m + kGemmMaxBlocks - 1) / kGemmMaxBlocks;
  const int rows = (std::max(kGemmBlockRows, spread) + 15) / 16 * 16;
  const int blocks = (m + rows - 1) / rows;
  const int threads = std::min(omp_get_max_threads(), blocks);
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
  for (int blk = 0; blk < blocks; ++blk) {
    const int r0 = blk * rows;
    const int r1 = std::min(m, r0 + rows);
    // op(A) rows r0..r1: rows of A, or columns of A when A is transposed.
    const F* as = ta == CblasNoTrans ? a + static_cast<size_t>(r0) * lda : a + r0;
    BlasGemm(ta, tb, r1 - r0, n, k, alpha, as, lda, b, ldb, beta, c + static_cast<size_t>(r0) * ldc,
             ldc);
  }
}

// dst[c] += sum_n src[n, c] for c in [0, C), rows in ascending order per channel.
template <typename F>
void ColumnSumAccumulate(F* dst, const F* src, int N, int C) {
  const int chunks = (C + kChanChunk - 1) / kChanChunk;
#pragma omp parallel for schedule(static) if (static_cast <size_t>(N) * C >= kParallelMin)
  for (int ch = 0; ch < chunks; ++ch) {
    const int c0 = ch * kChanChunk, c1 = std::min(C, c0 + kChanChunk);
    F acc[kChanChunk] = {};
    for (int n = 0; n < N; ++n) {
      const F* row = src + static_cast<size_t>(n) * C;
#pragma omp simd
      for (int c = c0; c < c1; ++c) acc[c - c0] += row[c];
    }
    for (int c = c0; c < c1; ++c) dst[c] += acc[c - c0];
  }
}

}  // namespace

// ---- embeddings ----------------------------------------------------------------------------
template <typename F>
void EmbeddingForward(F* out, const int32_t* tokens, const F* wte, const F* wpe, int B, int T,
                      int C) {
#pragma omp parallel for schedule(static) if (static_cast <size_t>(B) * T * C >= kParallelMin)
  for (int bt = 0; bt < B * T; ++bt) {
    const int t = bt % T;
    const F* e = wte + static_cast<size_t>(tokens[bt]) * C;
    const F* p = wpe + static_cast<size_t>(t) * C;
    F* o = out + static_cast<size_t>(bt) * C;
#pragma omp simd
    for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
  }
}

template <typename F>
void EmbeddingBackward(F* dwte, F* dwpe, const F* dout, const int32_t* tokens, int B, int T,
                       int C) {
  // Several positions may share a token id, so each thread owns a channel chunk and adds
  // the rows in ascending order: race-free and independent of the thread count.
  const int chunks = (C + kChanChunk - 1) / kChanChunk;
#pragma omp parallel for schedule(static) if (static_cast <size_t>(B) * T * C >= kParallelMin)
  for (int ch = 0; ch < chunks; ++ch) {
    const int c0 = ch * kChanChunk, c1 = std::min(C, c0 + kChanChunk);
    for (int bt = 0; bt < B * T; ++bt) {
      const F* d = dout + static_cast<size_t>(bt) * C;
      F* e = dwte + static_cast<size_t>(tokens[bt]) * C;
      F* p = dwpe + static_cast<size_t>(bt % T) * C;
#pragma omp simd
      for (int c = c0; c < c1; ++c) {
        e[c] += d[c];
        p[c] += d[c];
      }
    }
  }
}

// ---- LayerNorm -----------------------------------------------------------------------------
template <typename F>
void LayerNormForward(F* out, F* mean, F* rstd, const F* inp, const F* w, const F* b, int N,
                      int C) {
  constexpr F kEps = F(1e-5);
#pragma omp parallel for schedule(static) if (static_cast <size_t>(N) * C >= kParallelMin)
  for (int n = 0; n < N; ++n) {
    const F* x = inp + static_cast<size_t>(n) * C;
    F m = 0;
#pragma omp simd reduction(+ : m)
    for (int c = 0; c < C; ++c) m += x[c];
    m /= C;
    F v = 0;
#pragma omp simd reduction(+ : v)
    for (int c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
    v /= C;
    const F s = F(1) / std::sqrt(v + kEps);
    F* o = out + static_cast<size_t>(n) * C;
#pragma omp simd
    for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * s * w[c] + b[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

template <typename F>
void LayerNormBackward(F* dinp, F* dw, F* db, const F* dout, const F* inp, const F* w,
                       const F* mean, const F* rstd, int N, int C) {
  // Input grads: per row. dx = rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)),
  // with dnorm = dout * w and norm = (x - mean) * rstd.
#pragma omp parallel for schedule(static) if (static_cast <size_t>(N) * C >= kParallelMin)
  for (int n = 0; n < N; ++n) {
    const F* x = inp + static_cast<size_t>(n) * C;
    const F* d = dout + static_cast<size_t>(n) * C;
    const F m = mean[n], s = rstd[n];
    F sum_dn = 0, sum_dn_norm = 0;
#pragma omp simd reduction(+ : sum_dn, sum_dn_norm)
    for (int c = 0; c < C; ++c) {
      const F dn = d[c] * w[c];
      sum_dn += dn;
      sum_dn_norm += dn * (x[c] - m) * s;
    }
    sum_dn /= C;
    sum_dn_norm /= C;
    F* dx = dinp + static_cast<size_t>(n) * C;
#pragma omp simd
    for (int c = 0; c < C; ++c) {
      const F norm = (x[c] - m) * s;
      dx[c] += s * (d[c] * w[c] - sum_dn - norm * sum_dn_norm);
    }
  }
  // Parameter grads: a reduction over rows, split by channel chunk.
  const int chunks = (C + kChanChunk - 1) / kChanChunk;
#pragma omp parallel for schedule(static) if (static_cast <size_t>(N) * C >= kParallelMin)
  for (int ch = 0; ch < chunks; ++ch) {
    const int c0 = ch * kChanChunk, c1 = std::min(C, c0 + kChanChunk);
    F aw[kChanChunk] = {}, ab[kChanChunk] = {};
    for (int n = 0; n < N; ++n) {
      const F* x = inp + static_cast<size_t>(n) * C;
      const F* d = dout + static_cast<size_t>(n) * C;
      const F m = mean[n], s = rstd[n];
#pragma omp simd
      for (int c = c0; c < c1; ++c) {
        aw[c - c0] += d[c] * (x[c] - m) * s;
        ab[c - c0] += d[c];
      }
    }
    for (int c = c0; c < c1; ++c) {
      dw[c] += aw[c - c0];
      db[c] += ab[c - c0];
    }
  }
}

// ---- linear --------------------------------------------------------------------------------
template <typename F>
void MatmulForward(F* out, const F* inp, const F* w, const F* bias, int N, int IC, int OC) {
  F beta = 0;
  if (bias != nullptr) {
#pragma omp parallel for schedule(static) if (static_cast <size_t>(N) * OC >= kParallelMin)
    for (int n = 0; n < N; ++n) std::copy(bias, bias + OC, out + static_cast<size_t>(n) * OC);
    beta = 1;
  }
  if (N == 0 || OC == 0) return;
  Gemm(CblasNoTrans, CblasNoTrans, N, OC, IC, F(1), inp, IC, w, OC, beta, out, OC);
}

template <typename F>
void MatmulBackward(F* dinp, F* dw, F* dbias, const F* dout, const F* inp, const F* w, int N,
                    int IC, int OC) {
  if (N == 0) return;
  if (dinp != nullptr) {
    Gemm(CblasNoTrans, CblasTrans, N, IC, OC, F(1), dout, OC, w, OC, F(1), dinp, IC);
  }
  if (dw != nullptr) {
    Gemm(CblasTrans, CblasNoTrans, IC, OC, N, F(1), inp, IC, dout, OC, F(1), dw, OC);
  }
  if (dbias != nullptr) ColumnSumAccumulate(dbias, dout, N, OC);
}

// ---- attention -----------------------------------------------------------------------------
template <typename F>
void AttentionForward(F* out, F* att, const F* qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const F scale = F(1) / std::sqrt(static_cast<F>(hs));
  const size_t C3 = static_cast<size_t>(3) * C;
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const F* base = qkv + static_cast<size_t>(b) * T * C3 + static_cast<size_t>(h) * hs;
      F* a_bh = att + (static_cast<size_t>(b) * NH + h) * T * T;
      for (int t = 0; t < T; ++t) {
        const F* q = base + t * C3;
        F* a = a_bh + static_cast<size_t>(t) * T;
        F mx = -INFINITY;
        for (int s = 0; s <= t; ++s) {
          const F* k = base + s * C3 + C;
          F dot = 0;
#pragma omp simd reduction(+ : dot)
          for (int i = 0; i < hs; ++i) dot += q[i] * k[i];
          dot *= scale;
          a[s] = dot;
          mx = std::max(mx, dot);
        }
        F sum = 0;
        for (int s = 0; s <= t; ++s) {
          a[s] = std::exp(a[s] - mx);
          sum += a[s];
        }
        const F inv = F(1) / sum;
        for (int s = 0; s <= t; ++s) a[s] *= inv;
        for (int s = t + 1; s < T; ++s) a[s] = 0;
        F* o = out + (static_cast<size_t>(b) * T + t) * C + static_cast<size_t>(h) * hs;
        for (int i = 0; i < hs; ++i) o[i] = 0;
        for (int s = 0; s <= t; ++s) {
          const F* v = base + s * C3 + 2 * C;
          const F p = a[s];
#pragma omp simd
          for (int i = 0; i < hs; ++i) o[i] += p * v[i];
        }
      }
    }
  }
}

template <typename F>
void AttentionBackward(F* dqkv, const F* dout, const F* qkv, const F* att, int B, int T, int C,
                       int NH) {
  const int hs = C / NH;
  const F scale = F(1) / std::sqrt(static_cast<F>(hs));
  const size_t C3 = static_cast<size_t>(3) * C;
  // Each (b, h) writes only its head's q/k/v slices of dqkv: no races, fixed order.
#pragma omp parallel
  {
    std::vector<F> datt(T), dpre(T);
#pragma omp for collapse(2) schedule(static)
    for (int b = 0; b < B; ++b) {
      for (int h = 0; h < NH; ++h) {
        const F* base = qkv + static_cast<size_t>(b) * T * C3 + static_cast<size_t>(h) * hs;
        F* dbase = dqkv + static_cast<size_t>(b) * T * C3 + static_cast<size_t>(h) * hs;
        const F* a_bh = att + (static_cast<size_t>(b) * NH + h) * T * T;
        for (int t = 0; t < T; ++t) {
          const F* a = a_bh + static_cast<size_t>(t) * T;
          const F* d = dout + (static_cast<size_t>(b) * T + t) * C + static_cast<size_t>(h) * hs;
          // out = att · v: datt[s] = d · v[s]; dv[s] += att[s] * d.
          for (int s = 0; s <= t; ++s) {
            const F* v = base + s * C3 + 2 * C;
            F* dv = dbase + s * C3 + 2 * C;
            F dot = 0;
            const F p = a[s];
#pragma omp simd reduction(+ : dot)
            for (int i = 0; i < hs; ++i) {
              dot += d[i] * v[i];
              dv[i] += p * d[i];
            }
            datt[s] = dot;
          }
          // softmax: dpre[s] = att[s] * (datt[s] - sum_j att[j] datt[j]).
          F sum = 0;
          for (int s = 0; s <= t; ++s) sum += a[s] * datt[s];
          for (int s = 0; s <= t; ++s) dpre[s] = a[s] * (datt[s] - sum) * scale;
          // pre = scale * q · k[s]: dq += dpre[s] k[s]; dk[s] += dpre[s] q.
          const F* q = base + t * C3;
          F* dq = dbase + t * C3;
          for (int s = 0; s <= t; ++s) {
            const F* k = base + s * C3 + C;
            F* dk = dbase + s * C3 + C;
            const F g = dpre[s];
#pragma omp simd
            for (int i = 0; i < hs; ++i) {
              dq[i] += g * k[i];
              dk[i] += g * q[i];
            }
          }
        }
      }
    }
  }
}

// ---- GELU ----------------------------------------------------------------------------------
namespace {

constexpr double kGeluK = 0.7978845608028654;  // sqrt(2/pi)
constexpr size_t kGeluChunk = 4096;

template <typename F>
inline F GeluValue(F x) {
  const F k = static_cast<F>(kGeluK);
  return F(0.5) * x * (F(1) + TanhOp(k * (x + F(0.044715) * x * x * x)));
}

template <typename F>
inline F GeluGrad(F x) {
  const F k = static_cast<F>(kGeluK);
  const F u = k * (x + F(0.044715) * x * x * x);
  const F th = TanhOp(u);
  const F sech2 = F(1) - th * th;
  return F(0.5) * (F(1) + th) + F(0.5) * x * sech2 * k * (F(1) + F(3 * 0.044715) * x * x);
}

// The float loops are compiled for AVX-512, AVX2 and the baseline, chosen when the program
// loads (GCC function multiversioning): the build targets baseline x86-64, where these
// loops run at a quarter of the speed. Elementwise with the same operations in every clone
// (no reductions, no contraction under -std=c++20), so every clone gives the same bits.
// Not under ThreadSanitizer: the loader runs the clones' resolver before TSan has started,
// and the instrumented resolver crashes the program before main.
#if defined(__SANITIZE_THREAD__)
#define STRATA_FLOAT_CLONES
#else
#define STRATA_FLOAT_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
STRATA_FLOAT_CLONES void GeluForwardChunk(float* out, const float* inp, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = GeluValue(inp[i]);
}

STRATA_FLOAT_CLONES void GeluBackwardChunk(float* dinp, const float* inp, const float* dout,
                                           size_t n) {
  for (size_t i = 0; i < n; ++i) dinp[i] += GeluGrad(inp[i]) * dout[i];
}

void GeluForwardChunk(double* out, const double* inp, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = GeluValue(inp[i]);
}

void GeluBackwardChunk(double* dinp, const double* inp, const double* dout, size_t n) {
  for (size_t i = 0; i < n; ++i) dinp[i] += GeluGrad(inp[i]) * dout[i];
}

}  // namespace

template <typename F>
void GeluForward(F* out, const F* inp, size_t n) {
  const int64_t chunks = static_cast<int64_t>((n + kGeluChunk - 1) / kGeluChunk);
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t c = 0; c < chunks; ++c) {
    const size_t b = static_cast<size_t>(c) * kGeluChunk;
    GeluForwardChunk(out + b, inp + b, std::min(kGeluChunk, n - b));
  }
}

template <typename F>
void GeluBackward(F* dinp, const F* inp, const F* dout, size_t n) {
  const int64_t chunks = static_cast<int64_t>((n + kGeluChunk - 1) / kGeluChunk);
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t c = 0; c < chunks; ++c) {
    const size_t b = static_cast<size_t>(c) * kGeluChunk;
    GeluBackwardChunk(dinp + b, inp + b, dout + b, std::min(kGeluChunk, n - b));
  }
}

// ---- residual ------------------------------------------------------------------------------
template <typename F>
void ResidualForward(F* out, const F* a, const F* b, size_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <typename F>
void ResidualBackward(F* da, F* db, const F* dout, size_t n) {
  if (da != nullptr) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
    for (size_t i = 0; i < n; ++i) da[i] += dout[i];
  }
  if (db != nullptr) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
    for (size_t i = 0; i < n; ++i) db[i] += dout[i];
  }
}

// ---- whole buffers -------------------------------------------------------------------------
// Over the team like the other elementwise ops: a layer of GPT-2 large is 20 M values, which
// one thread filled or widened while the others waited (docs/design.md, "2-byte master").
template <typename F>
void Fill(F* out, F value, size_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (size_t i = 0; i < n; ++i) out[i] = value;
}

void WidenBf16(float* out, const uint16_t* in, size_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (size_t i = 0; i < n; ++i) out[i] = std::bit_cast<float>(uint32_t{in[i]} << 16);
}

// ---- LM head -------------------------------------------------------------------------------
template <typename F>
void LmHeadForward(F* logits, const F* x, const F* wte, int N, int C, int V) {
  if (N == 0 || V == 0) return;
  Gemm(CblasNoTrans, CblasTrans, N, V, C, F(1), x, C, wte, C, F(0), logits, V);
}

template <typename F>
void LmHeadBackward(F* dx, F* dwte, const F* dlogits, const F* x, const F* wte, int N, int C,
                    int V) {
  if (N == 0) return;
  if (dx != nullptr)
    Gemm(CblasNoTrans, CblasNoTrans, N, C, V, F(1), dlogits, V, wte, C, F(1), dx, C);
  if (dwte != nullptr) {
    Gemm(CblasTrans, CblasNoTrans, V, C, N, F(1), dlogits, V, x, C, F(1), dwte, C);
  }
}

// ---- softmax cross-entropy -----------------------------------------------------------------
template <typename F>
double SoftmaxCrossEntropyForward(F* probs, F* losses, const F* logits, const int32_t* targets,
                                  int N, int V) {
#pragma omp parallel for schedule(static) if (static_cast <size_t>(N) * V >= kParallelMin)
  for (int n = 0; n < N; ++n) {
    const F* l = logits + static_cast<size_t>(n) * V;
    F* p = probs + static_cast<size_t>(n) * V;
    F mx = -INFINITY;
    for (int v = 0; v < V; ++v) mx = std::max(mx, l[v]);
    const F target_logit = l[targets[n]];  // read before p (which may alias l) overwrites it
    F sum = 0;
    for (int v = 0; v < V; ++v) {
      p[v] = std::exp(l[v] - mx);
      sum += p[v];
    }
    const F inv = F(1) / sum;
#pragma omp simd
    for (int v = 0; v < V; ++v) p[v] *= inv;
    // -log softmax computed from the logits directly: stays finite when p underflows.
    losses[n] = -(target_logit - mx - std::log(sum));
  }
  double total = 0;
  for (int n = 0; n < N; ++n) total += static_cast<double>(losses[n]);
  return N > 0 ? total / N : 0.0;
}

template <typename F>
void SoftmaxCrossEntropyBackward(F* dlogits, const F* probs, const int32_t* targets, int N, int V,
                                 F dloss) {
#pragma omp parallel for schedule(static) if (static_cast <size_t>(N) * V >= kParallelMin)
  for (int n = 0; n < N; ++n) {
    const F* p = probs + static_cast<size_t>(n) * V;
    F* d = dlogits + static_cast<size_t>(n) * V;
#pragma omp simd
    for (int v = 0; v < V; ++v) d[v] = p[v] * dloss;
    d[targets[n]] -= dloss;
  }
}

#define STRATA_INSTANTIATE_OPS(F)                                                                  \
  template void EmbeddingForward<F>(F*, const int32_t*, const F*, const F*, int, int, int);        \
  template void EmbeddingBackward<F>(F*, F*, const F*, const int32_t*, int, int, int);             \
  template void LayerNormForward<F>(F*, F*, F*, const F*, const F*, const F*, int, int);           \
  template void LayerNormBackward<F>(F*, F*, F*, const F*, const F*, const F*, const F*, const F*, \
                                     int, int);                                                    \
  template void MatmulForward<F>(F*, const F*, const F*, const F*, int, int, int);                 \
  template void MatmulBackward<F>(F*, F*, F*, const F*, const F*, const F*, int, int, int);        \
  template void AttentionForward<F>(F*, F*, const F*, int, int, int, int);                         \
  template void AttentionBackward<F>(F*, const F*, const F*, const F*, int, int, int, int);        \
  template void GeluForward<F>(F*, const F*, size_t);                                              \
  template void GeluBackward<F>(F*, const F*, const F*, size_t);                                   \
  template void ResidualForward<F>(F*, const F*, const F*, size_t);                                \
  template void ResidualBackward<F>(F*, F*, const F*, size_t);                                     \
  template void Fill<F>(F*, F, size_t);                                                            \
  template void LmHeadForward<F>(F*, const F*, const F*, int, int, int);                           \
  template void LmHeadBackward<F>(F*, F*, const F*, const F*, const F*, int, int, int);            \
  template double SoftmaxCrossEntropyForward<F>(F*, F*, const F*, const int32_t*, int, int);       \
  template void SoftmaxCrossEntropyBackward<F>(F*, const F*, const int32_t*, int, int, F);

STRATA_INSTANTIATE_OPS(float)
STRATA_INSTANTIATE_OPS(double)

}  // namespace strata::model
