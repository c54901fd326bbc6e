// `strata generate`: prints text continued by a GPT-2 model from a safetensors file.
#include <cstdio>
#include <memory>
#include <string>

#include "model/gpt2.h"
#include "model/safetensors.h"
#include "tools/strata/commands.h"

namespace strata::cli {
namespace {

struct GenerateArgs {
  std::string init, prompt = "The ";
  int tokens = 100;
  double temperature = 0;
  uint64_t seed = 1;
  int heads = 0;
};

int RunGenerate(const GenerateArgs& a) {
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "strata generate: %s\n", s.ToString().c_str());
    return 1;
  };
  auto r = model::SafetensorsReader::Open(a.init);
  if (!r.ok()) return fail(r.status());
  int heads = a.heads;
  if (heads == 0) {
    const model::TensorEntry* wte =
        r->Find("wte.weight") ? r->Find("wte.weight") : r->Find("transformer.wte.weight");
    heads = (wte && wte->shape.size() == 2 && wte->shape[1] % 64 == 0)
                ? static_cast<int>(wte->shape[1] / 64)
                : 1;
  }
  auto cfg = model::ConfigFromSafetensors(*r, heads);
  if (!cfg.ok()) return fail(cfg.status());
  const auto specs = model::Gpt2BlockSpecs(*cfg);
  model::HostWeights w;
  w.layouts = model::PlainLayout(specs, 1);
  for (size_t b = 0; b < specs.size(); ++b) {
    w.blocks.emplace_back(w.layouts[b].padded_numel);
    for (size_t t = 0; t < specs[b].tensors.size(); ++t) {
      const TensorLayout& tl = w.layouts[b].tensors[t];
      Status s = model::LoadTensor(*r, specs, b, t,
                                   std::span<float>(w.blocks[b].data() + tl.offset, tl.numel));
      if (!s.ok()) return fail(s);
    }
  }
  if (cfg->vocab < 256) {
    return fail(Status::InvalidArgument("the model's vocabulary (" + std::to_string(cfg->vocab) +
                                        ") is not byte-level; --prompt needs vocab >= 256"));
  }
  std::vector<int32_t> prompt;
  for (unsigned char c : a.prompt) prompt.push_back(c);
  const auto out = model::Generate(*cfg, w, prompt, a.tokens, a.temperature, a.seed);
  std::string text;
  for (int32_t t : out) {
    if (t < 256) {
      text.push_back(static_cast<char>(t));
    } else {
      text += "<" + std::to_string(t) + ">";
    }
  }
  std::printf("%s\n", text.c_str());
  return 0;
}

}  // namespace

void AddGenerate(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* sub =
      app.add_subcommand("generate", "Print text continued by a GPT-2 model (byte-level tokens)");
  sub->add_option("--init", a->init, "Model weights: GPT-2 .safetensors file")->required();
  sub->add_option("--prompt", a->prompt, "Text to continue")->capture_default_str();
  sub->add_option("--tokens", a->tokens, "Tokens to generate")->capture_default_str();
  sub->add_option("--temperature", a->temperature,
                  "0: greedy; > 0: sample from softmax(logits / temperature)")
      ->capture_default_str();
  sub->add_option("--seed", a->seed, "Seed of the sampling")->capture_default_str();
  sub->add_option("--heads", a->heads, "Attention heads (default: d_model / 64)");
  sub->callback([a, exit_code] { *exit_code = RunGenerate(*a); });
}

}  // namespace strata::cli
