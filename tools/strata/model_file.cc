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

Result<ModelFile> LoadModelFile(const std::string& path, int heads) {
  STRATA_ASSIGN_OR_RETURN(auto reader, model::SafetensorsReader::Open(path));
  if (heads == 0) {
    const model::TensorEntry* wte = reader.Find("wte.weight")
                                        ? reader.Find("wte.weight")
                                        : reader.Find("transformer.wte.weight");
    heads = (wte && wte->shape.size() == 2 && wte->shape[1] % 64 == 0)
                ? static_cast<int>(wte->shape[1] / 64)
                : 1;
  }
  ModelFile f;
  STRATA_ASSIGN_OR_RETURN(f.config, model::ConfigFromSafetensors(reader, heads));
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
