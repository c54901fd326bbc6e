// Uses the installed public API only: a HostDevice, an Engine over two one-tensor blocks with
// a host budget that sends the optimizer states to NVMe, one training step with gradient 1
// everywhere. AdamW's first step moves every weight by -lr (m̂ = 1, v̂ = 1): the program checks
// that and exits 0, or prints what differs and exits 1. The NVMe tier's backend is the
// shipped fault injector, splitting and retrying requests (which must change nothing).
//   strata_consumer NVME_DIR
#include <strata/device.h>
#include <strata/engine.h>
#include <strata/fault_injection.h>
#include <strata/version.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {

int Fail(const char* what, const strata::Status& s) {
  std::fprintf(stderr, "consumer: %s: %s\n", what, s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: strata_consumer NVME_DIR\n");
    return 2;
  }
  auto device = strata::CreateHostDevice({});
  if (!device.ok()) return Fail("CreateHostDevice", device.status());

  const int64_t n = 64 * 1024;  // 256 KiB of fp32 per component
  std::vector<strata::BlockSpec> blocks = {{"a", {{"w", {n}}}}, {"b", {{"w", {n}}}}};
  strata::EngineOptions options;
  options.device = device->get();
  options.host_mem_bytes = 2 << 20;  // under the 2.5 MiB of states: some go to NVMe
  options.nvme_paths = {argv[1]};
  strata::FaultInjectionOptions faults;
  faults.short_transfer = 0.5;
  faults.eagain = 0.5;
  options.io_backend_factory = strata::FaultInjectionFactory(faults);
  auto engine = strata::Engine::Create(blocks, options);
  if (!engine.ok()) return Fail("Engine::Create", engine.status());
  strata::Engine& e = **engine;

  std::vector<float> init(n, 0.5f);
  for (int b = 0; b < 2; ++b) {
    if (auto s = e.WriteParams(b, 0, init); !s.ok()) return Fail("WriteParams", s);
  }
  if (auto s = e.CommitParams(); !s.ok()) return Fail("CommitParams", s);

  const double lr = 1e-2;
  if (auto s = e.BeginStep({.lr = lr}); !s.ok()) return Fail("BeginStep", s);
  for (int b = 0; b < 2; ++b) {
    if (auto v = e.Acquire(b, strata::Pass::kForward); !v.ok()) return Fail("Acquire", v.status());
    if (auto s = e.Release(b); !s.ok()) return Fail("Release", s);
  }
  for (int b = 1; b >= 0; --b) {
    if (auto v = e.Acquire(b, strata::Pass::kBackward); !v.ok()) {
      return Fail("Acquire", v.status());
    }
    auto g = e.GradBuffer(b);
    if (!g.ok()) return Fail("GradBuffer", g.status());
    // The HostDevice's "device memory" is host memory; a CUDA program would fill it with a
    // kernel on Lane::kCompute instead.
    const uint64_t len = e.Layout()[b].padded_numel;
    for (uint64_t i = 0; i < len; ++i) (*g)[i] = 1.0f;
    if (auto s = e.SubmitGrads(b); !s.ok()) return Fail("SubmitGrads", s);
    if (auto s = e.Release(b); !s.ok()) return Fail("Release", s);
  }
  auto stats = e.EndStep();
  if (!stats.ok()) return Fail("EndStep", stats.status());

  std::vector<float> after(n);
  for (int b = 0; b < 2; ++b) {
    if (auto s = e.ReadParams(b, 0, after); !s.ok()) return Fail("ReadParams", s);
    for (int64_t i = 0; i < n; ++i) {
      if (std::fabs(after[i] - (0.5 - lr)) > 1e-5) {
        std::fprintf(stderr, "consumer: block %d weight %lld is %.7f, expected %.7f\n", b,
                     static_cast<long long>(i), after[i], 0.5 - lr);
        return 1;
      }
    }
  }
  int on_nvme = 0;
  for (const strata::ComponentPlacement& c : e.Placement().components) {
    on_nvme += c.home == strata::Tier::kNvme;
  }
  if (on_nvme == 0) {
    std::fprintf(stderr, "consumer: no state went to NVMe; the test meant to cover that tier\n");
    return 1;
  }
  std::printf("strata %s: one step over 2 blocks, weights moved by -lr, %d components on NVMe\n",
              strata::Version(), on_nvme);
  return 0;
}
