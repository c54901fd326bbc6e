// Reading a GPT-2 safetensors file into host memory; see model_file.h.
#include "tools/strata/model_file.h"

#include <fstream>
#include <span>

#include "model/safetensors.h"

namespace strata::cli {
namespace {

// Whether `path` starts with the llm.c token file magic (20240520, little-endian int32), as
// LoadTokens tells them apart.
bool IsLlmcTokenFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  unsigned char b[4] = {};
  if (!f.read(reinterpret_cast<char*>(b), sizeof b)) return false;
  const uint32_t magic = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
  return magic == 20240520u;
}

}  // namespace

Result<model::Gpt2Config> ConfigOfFile(const model::SafetensorsReader& file,
                                       const GeometryFlags& given) {
  const auto& meta = file.metadata();
  const auto recorded = meta.find("n_head");
  if (given.heads > 0 && recorded != meta.end() &&
      recorded->second != std::to_string(given.heads)) {
    return Status::InvalidArgument("--heads " + std::to_string(given.heads) + " contradicts " +
                                   file.path() + ", which records n_head = " + recorded->second +
                                   " in its __metadata__; drop --heads")
        .WithPath(file.path());
  }
  STRATA_ASSIGN_OR_RETURN(model::Gpt2Config cfg, model::ConfigFromSafetensors(file, given.heads));
  const struct {
    const char* flag;
    const char* name;
    int given, file;
  } shapes[] = {{"--layers", "layers", given.layers, cfg.layers},
                {"--d-model", "d_model", given.d_model, cfg.d_model},
                {"--vocab", "vocab", given.vocab, cfg.vocab}};
  for (const auto& s : shapes) {
    if (s.given > 0 && s.given != s.file) {
      return Status::InvalidArgument(std::string(s.flag) + " " + std::to_string(s.given) +
                                     " contradicts " + file.path() + ", whose tensors give " +
                                     s.name + " " + std::to_string(s.file) + "; drop " + s.flag)
          .WithPath(file.path());
    }
  }
  return cfg;
}

Result<ModelFile> LoadModelFile(const std::string& path, const GeometryFlags& given) {
  STRATA_ASSIGN_OR_RETURN(auto reader, model::SafetensorsReader::Open(path));
  ModelFile f;
  STRATA_ASSIGN_OR_RETURN(f.config, ConfigOfFile(reader, given));
  const auto specs = model::Gpt2BlockSpecs(f.config);
  model::HostWeights& w = f.weights;
  w.layouts = model::PlainLayout(specs, 1);
  for (size_t b = 0; b < specs.size(); ++b) {
    w.blocks.emplace_back(w.layouts[b].padded_numel);
    for (size_t t = 0; t < specs[b].tensors.size(); ++t) {
      const TensorLayout& tl = w.layouts[b].tensors[t];
      STRATA_RETURN_IF_ERROR(
          model::LoadTensor(reader, specs, static_cast<int>(b), static_cast<int>(t),
                            std::span<float>(w.blocks[b].data() + tl.offset, tl.numel)));
    }
  }
  return f;
}

Result<model::TokenStream> LoadDataFile(const std::string& path, const model::Tokenizer* tokenizer,
                                        bool* is_text) {
  bool ignored;
  if (is_text == nullptr) is_text = &ignored;
  *is_text = true;
  if (path.empty()) {
    if (tokenizer == nullptr) return model::DefaultCorpus();
    model::TokenStream s;
    const std::string text = model::GenerateCorpus(400 * 1024, 1);
    STRATA_ASSIGN_OR_RETURN(s.tokens, tokenizer->Encode(text));
    s.vocab = tokenizer->vocab_size();
    s.description = "built-in corpus (" + std::to_string(text.size()) + " bytes, " +
                    std::to_string(s.tokens.size()) + " tokens)";
    return s;
  }
  STRATA_ASSIGN_OR_RETURN(model::TokenStream stream, model::LoadTokens(path));
  *is_text = !IsLlmcTokenFile(path);
  if (!*is_text || tokenizer == nullptr) return stream;
  const std::string text(stream.tokens.begin(), stream.tokens.end());
  stream.tokens.clear();
  STRATA_ASSIGN_OR_RETURN(stream.tokens, tokenizer->Encode(text));
  stream.vocab = tokenizer->vocab_size();
  stream.description = "text file " + path + " (" + std::to_string(text.size()) + " bytes, " +
                       std::to_string(stream.tokens.size()) + " tokens)";
  return stream;
}

}  // namespace strata::cli
