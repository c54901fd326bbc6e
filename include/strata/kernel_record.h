// The CUDA kernel families, their variants, and where each variant last passed
// tools/gpu_check.sh on a GPU (docs/gpu_record.md, read at build time). The default of a
// family is the newest variant that has passed; a build without CUDA lists the same record
// (`strata env`). Plain data and pure functions, safe for concurrent use, except the process's
// run spec (SetRunKernelSpec), which is guarded by a mutex.
#pragma once

#include <array>
#include <span>
#include <string>
#include <string_view>

#include "strata/status.h"

namespace strata {

// Where a variant last passed every check of tools/gpu_check.sh that covers it; empty fields
// when it never has.
struct GpuPass {
  std::string_view device;  // "NVIDIA H200 (sm_90)"
  std::string_view date;    // "2026-12-01" (UTC)
  std::string_view commit;  // the bundle's commit, short hash
  bool passed() const { return !device.empty(); }
};

// One implementation of a family ("attention", "naive").
struct KernelVariant {
  std::string_view family;
  std::string_view variant;
  GpuPass pass;
  // Never the default, whatever its record (attention=flash: for shapes and devices it does
  // not take it falls back to the tuned attention, which must have passed on its own).
  bool opt_in = false;
};

// Every variant, families in a fixed order (attention, embedding, classifier, matmul,
// elementwise, activations, python), each family's variants oldest first. A family's
// variants are contiguous.
std::span<const KernelVariant> KernelVariants();

// The variant of `family` that runs by default: the newest that has passed on a GPU and is
// not opt_in, else the oldest. REQUIRES: `family` is one of KernelVariants()' families.
const KernelVariant& DefaultKernelVariant(std::string_view family);

// The variant named, or nullptr.
const KernelVariant* FindKernelVariant(std::string_view family, std::string_view variant);

// "NVIDIA H200 (sm_90), 2026-12-01, commit 2fc09cc", or "never run on a GPU".
std::string DescribePass(const GpuPass& pass);

// The five selectable families, in order.
inline constexpr std::array<std::string_view, 5> kSelectableFamilies = {
    "attention", "embedding", "classifier", "matmul", "elementwise"};

// Which variant of each selectable family runs: STRATA_CUDA_KERNELS's meaning, without CUDA
// (the CUDA ops' KernelChoice is made from one).
class KernelSelection {
 public:
  // "" or "default": each family's DefaultKernelVariant; "tuned": every tuned variant;
  // "naive": every naive one; otherwise a comma list of families, each optionally "=naive" or
  // "=tuned" (a bare name means naive), and "attention=flash", applied to the default.
  // ToString()'s output parses back to the same selection. InvalidArgument naming the bad
  // entry.
  static Result<KernelSelection> Parse(std::string_view spec);
  // The variant of one of kSelectableFamilies.
  const KernelVariant& Of(std::string_view family) const;
  // "attention=naive,embedding=naive,classifier=naive,matmul=naive,elementwise=naive".
  std::string ToString() const;

 private:
  std::array<const KernelVariant*, kSelectableFamilies.size()> variants_{};
};

// The spec the CUDA ops of this process use (KernelChoice::FromEnv): the one a front end set
// with SetRunKernelSpec (strata train: the run's kernels, a resume's from its record), else
// STRATA_CUDA_KERNELS. Thread-safe.
std::string RunKernelSpec();
void SetRunKernelSpec(const std::string& spec);

// One line per family for `strata env`: its default variant and where each variant last
// passed on a GPU.
std::string KernelRecordTable();

}  // namespace strata
