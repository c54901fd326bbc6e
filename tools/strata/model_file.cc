// Reading a GPT-2 safetensors file into host memory; see model_file.h.
#include "tools/strata/model_file.h"

#include <span>

#include "model/safetensors.h"

namespace strata::cli {

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

}  // namespace strata::cli
