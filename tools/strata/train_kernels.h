// The CUDA kernels of a `strata train` run on a GPU (strata/kernel_record.h): each family's
// variant from STRATA_CUDA_KERNELS and the GPU record (docs/gpu_record.md) for a fresh run;
// on --resume, the variants the run's record names, so that a default changed since the run
// began does not change its bits, unless STRATA_CUDA_KERNELS asks for others (then it says
// that the bits will differ). Internal to the CLI; nothing here prints.
#pragma once

#include <string>
#include <vector>

#include "strata/status.h"

namespace strata::cli {

struct RunKernels {
  std::string spec;  // what runs and is recorded: "attention=naive,...,elementwise=naive"
  std::vector<std::string> lines;  // to print: each family's variant and where it last ran; notes
};

// `env`: STRATA_CUDA_KERNELS as set ("" when unset); `resumed`: whether the run continues a
// stored one; `recorded`: that run's record's cuda-kernels ("" when the record predates them).
// InvalidArgument naming STRATA_CUDA_KERNELS, or the record, when a spec does not parse.
Result<RunKernels> ChooseRunKernels(const std::string& env, bool resumed,
                                    const std::string& recorded);

}  // namespace strata::cli
