// The kernel families and their GPU record: see kernel_record.h. The passes come from
// docs/gpu_record.md through the generated gpu_record.inc (gpu/CMakeLists.txt).
#include "strata/kernel_record.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdio>
#include <mutex>

#include "strata/env.h"

namespace strata {
namespace {

struct RecordRow {
  std::string_view family, variant, device, date, commit;
};
// {"attention", "naive", "NVIDIA H200 (sm_90)", "2026-12-01", "2fc09cc"}, ... (only the rows
// that passed).
constexpr RecordRow kRecord[] = {
#include "gpu_record.inc"
    {"", "", "", "", ""},  // the table may have no passed row at all
};

constexpr GpuPass PassOf(std::string_view family, std::string_view variant) {
  for (const RecordRow& r : kRecord) {
    if (r.family == family && r.variant == variant) return {r.device, r.date, r.commit};
  }
  return {};
}

constexpr KernelVariant V(std::string_view family, std::string_view variant, bool opt_in = false) {
  return {family, variant, PassOf(family, variant), opt_in};
}

constexpr std::array kVariants = {
    V("attention", "naive"),   V("attention", "tuned"),   V("attention", "flash", /*opt_in=*/true),
    V("embedding", "naive"),   V("embedding", "tuned"),   V("classifier", "naive"),
    V("classifier", "tuned"),  V("matmul", "naive"),      V("matmul", "tuned"),
    V("elementwise", "naive"), V("elementwise", "tuned"), V("activations", "slots"),
    V("python", "cuda"),
};

}  // namespace

std::span<const KernelVariant> KernelVariants() { return kVariants; }

const KernelVariant& DefaultKernelVariant(std::string_view family) {
  const KernelVariant* oldest = nullptr;
  const KernelVariant* newest_passed = nullptr;
  for (const KernelVariant& v : kVariants) {
    if (v.family != family) continue;
    if (oldest == nullptr) oldest = &v;
    if (v.pass.passed() && !v.opt_in) newest_passed = &v;
  }
  if (newest_passed != nullptr) return *newest_passed;
  return oldest != nullptr ? *oldest : kVariants[0];
}

const KernelVariant* FindKernelVariant(std::string_view family, std::string_view variant) {
  for (const KernelVariant& v : kVariants) {
    if (v.family == family && v.variant == variant) return &v;
  }
  return nullptr;
}

namespace {

size_t FamilyIndex(std::string_view family) {
  for (size_t i = 0; i < kSelectableFamilies.size(); ++i) {
    if (kSelectableFamilies[i] == family) return i;
  }
  return kSelectableFamilies.size();
}

}  // namespace

Result<KernelSelection> KernelSelection::Parse(std::string_view spec) {
  KernelSelection k;
  const bool named_all = spec == "tuned" || spec == "naive";
  for (size_t i = 0; i < kSelectableFamilies.size(); ++i) {
    k.variants_[i] = named_all ? FindKernelVariant(kSelectableFamilies[i], spec)
                               : &DefaultKernelVariant(kSelectableFamilies[i]);
  }
  if (spec.empty() || spec == "default" || named_all) return k;
  size_t start = 0;
  while (start <= spec.size()) {
    const size_t comma = std::min(spec.find(',', start), spec.size());
    const std::string_view item = spec.substr(start, comma - start);
    start = comma + 1;
    const size_t eq = item.find('=');
    const std::string_view name = item.substr(0, eq);
    const std::string_view variant = eq == std::string_view::npos ? "naive" : item.substr(eq + 1);
    const size_t i = FamilyIndex(name);
    if (i == kSelectableFamilies.size()) {
      return Status::InvalidArgument(
          "STRATA_CUDA_KERNELS: unknown kernel '" + std::string(name) +
          "' (known: attention, embedding, classifier, matmul, elementwise; or default, tuned, "
          "naive)");
    }
    const KernelVariant* v = FindKernelVariant(name, variant);
    if (v == nullptr) {
      return Status::InvalidArgument("STRATA_CUDA_KERNELS: '" + std::string(item) +
                                     "': the variant must be naive or tuned (or flash, for "
                                     "attention)");
    }
    k.variants_[i] = v;
  }
  return k;
}

const KernelVariant& KernelSelection::Of(std::string_view family) const {
  const size_t i = FamilyIndex(family);
  return i < variants_.size() ? *variants_[i] : kVariants[0];
}

std::string KernelSelection::ToString() const {
  std::string out;
  for (size_t i = 0; i < variants_.size(); ++i) {
    if (i > 0) out += ',';
    out += std::string(kSelectableFamilies[i]) + "=" + std::string(variants_[i]->variant);
  }
  return out;
}

std::string KernelRecordTable() {
  std::string out;
  std::string_view family;
  for (const KernelVariant& v : kVariants) {
    if (v.family != family) {
      family = v.family;
      if (!out.empty()) out += '\n';
      const KernelVariant& d = DefaultKernelVariant(family);
      char head[64];
      std::snprintf(head, sizeof head, "  %-12s default=%-6s", std::string(family).c_str(),
                    std::string(d.variant).c_str());
      out += head;
    } else {
      out += ";";
    }
    out.append(" ").append(v.variant).append(": ").append(DescribePass(v.pass));
  }
  return out + '\n';
}

namespace {
std::mutex run_spec_mu;
std::string* run_spec = nullptr;  // set once by a front end; never freed (process lifetime)
}  // namespace

std::string RunKernelSpec() {
  {
    std::lock_guard<std::mutex> lock(run_spec_mu);
    if (run_spec != nullptr) return *run_spec;
  }
  return EnvGet("STRATA_CUDA_KERNELS");
}

void SetRunKernelSpec(const std::string& spec) {
  std::lock_guard<std::mutex> lock(run_spec_mu);
  if (run_spec == nullptr) {
    run_spec = new std::string(spec);
  } else {
    *run_spec = spec;
  }
}

std::string DescribePass(const GpuPass& pass) {
  if (!pass.passed()) return "never run on a GPU";
  return std::string(pass.device) + ", " + std::string(pass.date) + ", commit " +
         std::string(pass.commit);
}

}  // namespace strata
