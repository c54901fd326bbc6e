// Which CUDA kernels a run uses and what it prints about them: see train_kernels.h.
#include "tools/strata/train_kernels.h"

#include "strata/kernel_record.h"

namespace strata::cli {

Result<RunKernels> ChooseRunKernels(const std::string& env, bool resumed,
                                    const std::string& recorded) {
  STRATA_ASSIGN_OR_RETURN(const KernelSelection now, KernelSelection::Parse(env));
  const bool asked = !env.empty() && env != "default";
  RunKernels out;
  out.spec = now.ToString();
  KernelSelection chosen = now;
  if (resumed && !recorded.empty() && recorded != out.spec) {
    auto was = KernelSelection::Parse(recorded);
    if (!was.ok()) {
      return Status::InvalidArgument("--resume: the run's record names CUDA kernels '" + recorded +
                                     "' that this strata does not have (" + was.status().message() +
                                     "); set STRATA_CUDA_KERNELS to choose others (the losses "
                                     "then differ in their last bits from the run's own)");
    }
    if (asked) {
      out.lines.push_back("STRATA_CUDA_KERNELS=" + env + " changes the run's CUDA kernels " +
                          recorded + " -> " + out.spec +
                          ": the losses from here on will not be bit-identical to an "
                          "uninterrupted run's");
    } else {
      chosen = *was;
      out.spec = recorded;
      out.lines.push_back(
          "resuming with the CUDA kernels the run began with (its record), not "
          "today's default " +
          now.ToString() +
          ": the same bits as an uninterrupted run (STRATA_CUDA_KERNELS "
          "chooses others)");
    }
  } else if (resumed && recorded.empty()) {
    out.lines.push_back(
        "the run's record does not name its CUDA kernels (written before records did; such runs "
        "ran every tuned kernel unless STRATA_CUDA_KERNELS said otherwise): running " +
        out.spec + "; STRATA_CUDA_KERNELS=tuned keeps a tuned run's bits");
  }
  std::string line = "CUDA kernels:";
  for (std::string_view family : kSelectableFamilies) {
    const KernelVariant& v = chosen.Of(family);
    line += "\n#   " + std::string(family) + "=" + std::string(v.variant) +
            (v.pass.passed() ? " (passed on a GPU: " + DescribePass(v.pass) + ")"
                             : " (NEVER RUN ON A GPU)");
  }
  const KernelVariant* slots = FindKernelVariant("activations", "slots");
  if (slots != nullptr) {
    line += "\n#   activation slots (layer-major order, offloaded activations): " +
            std::string(slots->pass.passed() ? "passed on a GPU: " + DescribePass(slots->pass)
                                             : "NEVER RUN ON A GPU");
  }
  out.lines.insert(out.lines.begin(), line);
  return out;
}

}  // namespace strata::cli
