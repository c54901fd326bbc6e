// Reading a GPT-2 safetensors file (--init) into host memory for the subcommands that run
// the model outside the engine (`strata generate`, `strata eval`). Internal to the CLI;
// nothing here prints, and the result belongs to the caller.
#pragma once

#include <string>

#include "model/gpt2.h"
#include "strata/status.h"

namespace strata::cli {

struct ModelFile {
  model::Gpt2Config config;
  model::HostWeights weights;  // plain layout (alignment 1)
};

// Reads every tensor of the GPT-2 model in `path`. `heads` 0 means d_model / 64 (GPT-2's
// head size), or 1 when d_model is not a multiple of 64. Errors: the reader's (NotFound,
// IOError, Corruption naming the path), ConfigFromSafetensors's and LoadTensor's (naming
// the tensor that is missing or has the wrong shape).
Result<ModelFile> LoadModelFile(const std::string& path, int heads);

}  // namespace strata::cli
