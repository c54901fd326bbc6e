// Reading a GPT-2 safetensors file (--init) into host memory for the subcommands that run
// the model outside the engine (`strata generate`, `strata eval`), and a --data file through
// an optional --tokenizer. Internal to the CLI; nothing here prints, and the results belong
// to the caller.
#pragma once

#include <string>

#include "model/data.h"
#include "model/gpt2.h"
#include "model/safetensors.h"
#include "model/tokenizer.h"
#include "strata/status.h"

namespace strata::cli {

struct ModelFile {
  model::Gpt2Config config;
  model::HostWeights weights;  // plain layout (alignment 1)
};

// The geometry flags given alongside --init; 0: not given.
struct GeometryFlags {
  int layers = 0, d_model = 0, heads = 0, vocab = 0;
};

// The configuration of the model in `file`: its tensors' shapes, the heads its metadata
// records (files strata saved), else --heads, else model::DefaultHeads. A flag that
// contradicts the file is InvalidArgument naming both values ("--heads 4 contradicts
// m.safetensors, which records n_head = 2 in its __metadata__; drop --heads").
Result<model::Gpt2Config> ConfigOfFile(const model::SafetensorsReader& file,
                                       const GeometryFlags& given);

// Reads every tensor of the GPT-2 model in `path`, its configuration as ConfigOfFile says.
// Errors: the reader's (NotFound, IOError, Corruption naming the path), ConfigOfFile's and
// LoadTensor's (naming the tensor that is missing or has the wrong shape).
Result<ModelFile> LoadModelFile(const std::string& path, const GeometryFlags& given);

// The tokens of --data `path`: an llm.c token file as it is; any other file is text, split
// into bytes, or encoded by `tokenizer` when not null (the stream's vocab is then the
// tokenizer's). An empty path is the built-in corpus (bytes). *is_text (when not null) says
// whether the tokens came from text. Errors: LoadTokens's, or the tokenizer's Encode error.
Result<model::TokenStream> LoadDataFile(const std::string& path, const model::Tokenizer* tokenizer,
                                        bool* is_text = nullptr);

}  // namespace strata::cli
