// Reading a GPT-2 safetensors file (--init) into host memory for the subcommands that run
// the model outside the engine (`strata generate`, `strata eval`), and a --data file through
// an optional --tokenizer. Internal to the CLI; nothing here prints, and the results belong
// to the caller.
#pragma once

#include <string>

#include "model/data.h"
#include "model/gpt2.h"
#include "model/tokenizer.h"
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

// The tokens of --data `path`: an llm.c token file as it is; any other file is text, split
// into bytes, or encoded by `tokenizer` when not null (the stream's vocab is then the
// tokenizer's). An empty path is the built-in corpus (bytes). *is_text (when not null) says
// whether the tokens came from text. Errors: LoadTokens's, or the tokenizer's Encode error.
Result<model::TokenStream> LoadDataFile(const std::string& path, const model::Tokenizer* tokenizer,
                                        bool* is_text = nullptr);

}  // namespace strata::cli
