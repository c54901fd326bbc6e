// The divider's floor of the AdamW formula. Every element costs a square root and IEEE
// divisions, which share one divider unit, so no kernel that computes the formula exactly can
// update more elements per second than these loops do:
//   - gelements_per_s: torch's rounding, the fp32 and bf16 kernels' (a square root and two
//     divisions: denom = sqrt(v) / sqrt(bc2) + eps; m / denom);
//   - folded_gelements_per_s: the int8 kernel's (the bias correction folded into the
//     constants: a square root and one division, m / (sqrt(v) + eps * sqrt(bc2)); AdamApply's
//     kFolded in cpu_optim/kernel_templates.h).
// Each runs on registers of the widest vectors this CPU has (AVX-512, else AVX2), in 12
// independent chains so that only the divider's throughput counts (bench/int8_kernel_floor.sh
// sets the folded floor beside the int8 kernel's streaming bound; bench/PERFORMANCE.md).
//
// Usage: divider_floor [SECONDS]   (default 0.5 per loop; prints one JSON object)
#include <immintrin.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace {

constexpr int kChains = 12;
constexpr long kItersPerCheck = 1 << 16;

// Chains of x = m / (sqrt(x) / c + eps) (FOLDED: m / (sqrt(x) + eps)) for about `seconds`;
// sets *per_s to elements per second. The values stay near 1 (no sub-normals, no infinities). A
// macro rather than a template: each expansion compiles under its function's target attribute.
#define STRATA_DIVIDER_LOOP(VEC, SET1, SQRT, DIV, ADD, FIRST, WIDTH, FOLDED)                   \
  do {                                                                                         \
    VEC x[kChains];                                                                            \
    for (int k = 0; k < kChains; ++k) x[k] = SET1(1.0f + 0.01f * static_cast<float>(k));       \
    const VEC c = SET1(0.999f), eps = SET1(1e-8f), m = SET1(1.0001f);                          \
    const auto t0 = std::chrono::steady_clock::now();                                          \
    long iters = 0;                                                                            \
    double elapsed = 0.0;                                                                      \
    do {                                                                                       \
      for (long i = 0; i < kItersPerCheck; ++i) {                                              \
        for (int k = 0; k < kChains; ++k) {                                                    \
          x[k] = FOLDED ? DIV(m, ADD(SQRT(x[k]), eps)) : DIV(m, ADD(DIV(SQRT(x[k]), c), eps)); \
        }                                                                                      \
      }                                                                                        \
      iters += kItersPerCheck;                                                                 \
      elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();  \
    } while (elapsed < seconds);                                                               \
    float sink = 0.0f;                                                                         \
    for (int k = 0; k < kChains; ++k) sink += FIRST(x[k]);                                     \
    if (sink != sink) std::fprintf(stderr, "divider_floor: NaN\n"); /* keeps x alive */        \
    *per_s = static_cast<double>(iters) * kChains * (WIDTH) / elapsed;                         \
  } while (false)

template <bool kFolded>
__attribute__((target("avx2"))) void MeasureAvx2(double seconds, double* per_s) {
  STRATA_DIVIDER_LOOP(__m256, _mm256_set1_ps, _mm256_sqrt_ps, _mm256_div_ps, _mm256_add_ps,
                      _mm256_cvtss_f32, 8, kFolded);
}

// The zero-masked form: GCC 12's _mm512_sqrt_ps reads an undefined vector (-Wuninitialized).
__attribute__((target("avx512f"))) inline __m512 Sqrt512(__m512 a) {
  return _mm512_maskz_sqrt_ps(0xffff, a);
}

template <bool kFolded>
__attribute__((target("avx512f"))) void MeasureAvx512(double seconds, double* per_s) {
  STRATA_DIVIDER_LOOP(__m512, _mm512_set1_ps, Sqrt512, _mm512_div_ps, _mm512_add_ps,
                      _mm512_cvtss_f32, 16, kFolded);
}

}  // namespace

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 0.5;
  if (!(seconds > 0.0)) {
    std::fprintf(stderr, "divider_floor: SECONDS must be a positive number, got %s\n", argv[1]);
    return 2;
  }
  __builtin_cpu_init();
  const char* isa = nullptr;
  double per_s = 0.0, folded_per_s = 0.0;
  if (__builtin_cpu_supports("avx512f")) {
    isa = "avx512";
    MeasureAvx512<false>(seconds, &per_s);
    MeasureAvx512<true>(seconds, &folded_per_s);
  } else if (__builtin_cpu_supports("avx2")) {
    isa = "avx2";
    MeasureAvx2<false>(seconds, &per_s);
    MeasureAvx2<true>(seconds, &folded_per_s);
  } else {
    std::fprintf(stderr, "divider_floor: this CPU has neither AVX-512 nor AVX2\n");
    return 2;
  }
  std::printf(
      "{\"isa\": \"%s\", \"chains\": %d, \"gelements_per_s\": %.4f, "
      "\"folded_gelements_per_s\": %.4f}\n",
      isa, kChains, per_s / 1e9, folded_per_s / 1e9);
  return 0;
}
