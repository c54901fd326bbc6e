// The CUDA ops' host-side decisions, without a GPU: STRATA_CUDA_KERNELS's grammar and its
// default (per family the newest variant with a pass in docs/gpu_record.md), the workspace the
// model reserves for a kernel choice, and which devices flash attention accepts.
//
// Run: ctest --test-dir build/release -R 'KernelChoice|KernelRecord|Workspace|FlashSupports'
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>
#include <string>

#include "model/cuda/gpt2_cuda_kernels.h"
#include "model/cuda/gpt2_cuda_ops.h"
#include "strata/kernel_record.h"

namespace strata::model::cuda_ops {
namespace {

// STRATA_CUDA_KERNELS's grammar; needs no GPU.
TEST(KernelChoiceTest, Parses) {
  auto all = KernelChoice::Parse("naive");
  ASSERT_TRUE(all.ok());
  EXPECT_TRUE(all->naive_attention && all->naive_embedding && all->naive_classifier &&
              all->naive_matmul && all->naive_elementwise);
  EXPECT_EQ(all->ToString(),
            "attention=naive,embedding=naive,classifier=naive,matmul=naive,elementwise=naive");
  auto tuned = KernelChoice::Parse("tuned");
  ASSERT_TRUE(tuned.ok());
  EXPECT_EQ(tuned->ToString(),
            "attention=tuned,embedding=tuned,classifier=tuned,matmul=tuned,elementwise=tuned");
  auto some = KernelChoice::Parse(
      "attention=naive,classifier,matmul=tuned,embedding=tuned,"
      "elementwise=tuned");
  ASSERT_TRUE(some.ok());
  EXPECT_TRUE(some->naive_attention && some->naive_classifier);
  EXPECT_FALSE(some->naive_embedding || some->naive_matmul || some->naive_elementwise);
  auto flash = KernelChoice::Parse("attention=flash");
  ASSERT_TRUE(flash.ok());
  EXPECT_TRUE(flash->flash_attention && !flash->naive_attention);
  EXPECT_EQ(flash->Variant("attention"), "flash");
  // ToString parses back to the same choice (a run's record names its kernels this way).
  for (const char* spec : {"naive", "tuned", "default", "attention=flash", "matmul=naive"}) {
    auto k = KernelChoice::Parse(spec);
    ASSERT_TRUE(k.ok()) << spec;
    auto again = KernelChoice::Parse(k->ToString());
    ASSERT_TRUE(again.ok()) << spec;
    EXPECT_EQ(again->ToString(), k->ToString()) << spec;
  }
  EXPECT_EQ(KernelChoice::Parse("matmul=flash").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(KernelChoice::Parse("attenton").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(KernelChoice::Parse("attention=fast").status().code(), StatusCode::kInvalidArgument);
}

// The default ("" or "default") is, per family, the newest variant with a pass in
// docs/gpu_record.md (today the 2026-12-01 H200 set: every family's naive kernels); a list
// changes only the families it names. Needs no GPU.
TEST(KernelChoiceTest, DefaultIsWhatHasRunOnAGpu) {
  for (const char* spec : {"", "default"}) {
    auto k = KernelChoice::Parse(spec);
    ASSERT_TRUE(k.ok());
    for (const char* family : {"attention", "embedding", "classifier", "matmul", "elementwise"}) {
      const KernelVariant& d = DefaultKernelVariant(family);
      EXPECT_EQ(k->Variant(family), d.variant) << family;
      // The default has passed on a GPU, or no variant of the family has.
      if (!d.pass.passed()) {
        for (const KernelVariant& v : KernelVariants()) {
          if (v.family == family) {
            EXPECT_FALSE(v.pass.passed()) << family << "=" << v.variant;
          }
        }
      }
      // No newer variant of the family that may be a default has passed.
      bool after = false;
      for (const KernelVariant& v : KernelVariants()) {
        if (v.family != family) continue;
        if (after && !v.opt_in) {
          EXPECT_FALSE(v.pass.passed()) << family << "=" << v.variant;
        }
        if (&v == &d) after = true;
      }
      EXPECT_FALSE(d.opt_in) << family;
    }
  }
  const KernelVariant* naive = FindKernelVariant("attention", "naive");
  ASSERT_NE(naive, nullptr);
  EXPECT_TRUE(naive->pass.passed()) << "the 2026-12-01 H200 run passed the naive attention";
  auto one = KernelChoice::Parse("matmul=tuned");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->Variant("matmul"), "tuned");
  EXPECT_EQ(one->Variant("attention"), KernelChoice::Recorded().Variant("attention"));
}

// Every row of docs/gpu_record.md names a known variant, every variant has a row, and the
// build's record holds exactly the rows with a device.
TEST(KernelRecordTest, MatchesTheDocsTable) {
  std::ifstream in(std::string(STRATA_SOURCE_DIR) + "/docs/gpu_record.md");
  ASSERT_TRUE(in) << "docs/gpu_record.md";
  const std::regex row(R"(^\| *([a-z]+) *\| *([a-z]+) *\|([^|]*)\|([^|]*)\|([^|]*)\|)");
  std::set<std::string> seen;
  std::string line;
  while (std::getline(in, line)) {
    std::smatch m;
    if (!std::regex_search(line, m, row) || m[1] == "family") continue;
    const std::string family = m[1], variant = m[2];
    auto trim = [](std::string s) {
      s.erase(0, s.find_first_not_of(' '));
      s.erase(s.find_last_not_of(' ') + 1);
      return s;
    };
    const std::string device = trim(m[3]);
    const KernelVariant* v = FindKernelVariant(family, variant);
    ASSERT_NE(v, nullptr) << "docs/gpu_record.md names " << family << "=" << variant;
    EXPECT_TRUE(seen.insert(family + "=" + variant).second)
        << "twice: " << family << "=" << variant;
    if (device == "never") {
      EXPECT_FALSE(v->pass.passed()) << family << "=" << variant;
    } else {
      EXPECT_EQ(v->pass.device, device) << family << "=" << variant;
      EXPECT_EQ(v->pass.date, trim(m[4])) << family << "=" << variant;
      EXPECT_EQ(v->pass.commit, trim(m[5])) << family << "=" << variant;
    }
  }
  EXPECT_EQ(seen.size(), KernelVariants().size()) << "a variant has no row in docs/gpu_record.md";
}

// Fix 2 of issue 44: with attention=flash the model's workspace holds no head-major copies or
// T×T buffers (the flash kernels read qkv in place), where the shape and the device allow
// flash; elsewhere the cuBLAS path's. At GPT-2 small, B 8, T 1024, that is 856 MiB less.
TEST(WorkspaceTest, FlashReservesNoCublasAttentionBuffers) {
  const int B = 8, T = 1024, C = 768, NH = 12;
  KernelChoice tuned;  // every tuned kernel, cuBLAS attention
  KernelChoice flash = tuned;
  flash.flash_attention = true;
  const size_t cublas = AttentionWorkspaceBytes(tuned, 90, B, T, C, NH);
  EXPECT_GT(cublas, size_t{768} << 20);
  EXPECT_EQ(AttentionWorkspaceBytes(flash, 90, B, T, C, NH), 0u);
  EXPECT_EQ(AttentionWorkspaceBytes(flash, 80, B, T, C, NH), 0u);
  // The model's reservation: only cuBLASLt's and the embedding sort's remain.
  const size_t model_flash = ModelWorkspaceBytes(flash, 90, B, T, C, NH);
  EXPECT_LT(model_flash, size_t{64} << 20);
  EXPECT_GE(ModelWorkspaceBytes(tuned, 90, B, T, C, NH) - model_flash, size_t{850} << 20);
  // Where flash cannot run (head size 48; a device below sm_80) the cuBLAS path runs, and
  // its buffers are reserved.
  EXPECT_EQ(AttentionWorkspaceBytes(flash, 90, B, T, 576, NH),
            AttentionWorkspaceBytes(tuned, 90, B, T, 576, NH));
  EXPECT_GT(AttentionWorkspaceBytes(flash, 90, B, T, 576, NH), 0u);
  EXPECT_EQ(AttentionWorkspaceBytes(flash, 75, B, T, C, NH), cublas);
  KernelChoice naive;
  naive.naive_attention = true;
  EXPECT_EQ(AttentionWorkspaceBytes(naive, 90, B, T, C, NH), 0u);
}

// Fix 4 of issue 44: the flash kernels need bf16 WMMA (sm_80); a device below it is refused
// by capability (the dispatch then takes the cuBLAS path) instead of running kernels that
// compiled to nothing.
TEST(FlashSupportsTest, RefusesDevicesBelowSm80) {
  EXPECT_TRUE(FlashAttentionSupports(8, 768, 12, 80));
  EXPECT_TRUE(FlashAttentionSupports(8, 768, 12, 90));
  EXPECT_TRUE(FlashAttentionSupports(8, 1536, 12, 120));
  EXPECT_FALSE(FlashAttentionSupports(8, 768, 12, 75));
  EXPECT_FALSE(FlashAttentionSupports(8, 768, 12, 70));
  EXPECT_FALSE(FlashAttentionSupports(8, 768, 12, 0));       // the capability is unknown
  EXPECT_FALSE(FlashAttentionSupports(8, 576, 12, 90));      // head size 48
  EXPECT_FALSE(FlashAttentionSupports(65536, 768, 12, 90));  // more heads than the grid's y
}

}  // namespace
}  // namespace strata::model::cuda_ops
