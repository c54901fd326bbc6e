// The matrix products of one GPT-2 forward+backward pass, as a list of sgemm shapes, and a
// runner that executes exactly that list through the same CBLAS the model uses. `strata
// bench model` times the model's forward+backward and this list in the same run: the ratio
// says how much of the BLAS's own throughput the model keeps (the rest goes to attention,
// LayerNorm, GELU, softmax and memory traffic between them).
//
// Thread safety: GemmRunner owns its scratch buffers; one thread per runner.
#pragma once

#include <vector>

#include "model/gpt2.h"

namespace strata::model {

struct GemmShape {
  bool trans_a = false, trans_b = false;
  int m = 0, n = 0, k = 0;  // C[m,n] (+)= op(A)[m,k] · op(B)[k,n]
  double Flops() const { return 2.0 * m * n * k; }
};

// The sgemm calls of ForwardBackwardPlain for micro-batches of B x T, in call order:
// per layer qkv, attention projection, MLP up and down (forward: 1 call each; backward: dX
// and dW each), and the tied LM head (forward; backward dX and dW).
std::vector<GemmShape> ModelGemms(const Gpt2Config& config, int B, int T);
// The forward sgemm calls of one block (qkv, attention projection, MLP up and down) for
// micro-batches of B x T: what a recompute runs again for each block it recomputes.
std::vector<GemmShape> BlockForwardGemms(const Gpt2Config& config, int B, int T);
double TotalFlops(const std::vector<GemmShape>& gemms);

class GemmRunner {
 public:
  explicit GemmRunner(const std::vector<GemmShape>& gemms);
  // Runs every GEMM of the list once, in order.
  void Run();
  // Runs the list once to warm up, then `runs` times timed: the fastest run's seconds.
  double TimedRun(int runs = 1);

 private:
  std::vector<GemmShape> gemms_;
  std::vector<float> a_, b_, c_;
};

}  // namespace strata::model
