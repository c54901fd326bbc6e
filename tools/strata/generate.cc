// `strata generate`: prints text continued by a GPT-2 model from a safetensors file.
#include <cstdio>
#include <memory>
#include <string>

#include "model/gpt2.h"
#include "model/tokenizer.h"
#include "tools/strata/cli_common.h"
#include "tools/strata/commands.h"
#include "tools/strata/config_file.h"
#include "tools/strata/model_file.h"

namespace strata::cli {
namespace {

struct GenerateArgs {
  std::string init, tokenizer, prompt = "The ";
  int tokens = 100;
  model::SamplingOptions sampling;
  int heads = 0;
  int threads = 0;  // 0: STRATA_NUM_THREADS, else one per core
};

int RunGenerate(const GenerateArgs& a) {
  SetComputeThreads(ResolveThreads(a.threads));
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "strata generate: %s\n", s.ToString().c_str());
    return 1;
  };
  if (a.init.empty()) {
    return fail(Status::InvalidArgument("--init is required: the model's .safetensors file"));
  }
  if (Status s = a.sampling.Validate(); !s.ok()) return fail(s);
  if (a.tokens < 0) {
    return fail(Status::InvalidArgument("--tokens " + std::to_string(a.tokens) +
                                        ": expected a token count >= 0"));
  }
  auto file = LoadModelFile(a.init, GeometryFlags{.heads = a.heads});
  if (!file.ok()) return fail(Status(file.status()).Annotate("--init"));
  const model::Gpt2Config& cfg = file->config;
  std::vector<int32_t> prompt;
  std::string text;
  if (!a.tokenizer.empty()) {
    auto tok = model::Tokenizer::Load(a.tokenizer);
    if (!tok.ok()) return fail(Status(tok.status()).Annotate("--tokenizer"));
    if (tok->vocab_size() > cfg.vocab) {
      return fail(Status::InvalidArgument(
          "--tokenizer " + a.tokenizer + " has " + std::to_string(tok->vocab_size()) +
          " tokens but the model in --init " + a.init + " only " + std::to_string(cfg.vocab) +
          "; give the tokenizer the model was trained with"));
    }
    auto ids = tok->Encode(a.prompt);
    if (!ids.ok()) return fail(ids.status());
    prompt = std::move(ids).value();
    text = tok->Decode(model::Generate(cfg, file->weights, prompt, a.tokens, a.sampling));
  } else {
    if (cfg.vocab < 256) {
      return fail(Status::InvalidArgument(
          "the model's vocabulary (" + std::to_string(cfg.vocab) +
          ") is not byte-level; --prompt needs vocab >= 256 (or a --tokenizer)"));
    }
    for (unsigned char c : a.prompt) prompt.push_back(c);
    for (int32_t t : model::Generate(cfg, file->weights, prompt, a.tokens, a.sampling)) {
      if (t < 256) {
        text.push_back(static_cast<char>(t));
      } else {
        text += "<" + std::to_string(t) + ">";
      }
    }
  }
  std::printf("%s\n", text.c_str());
  return 0;
}

}  // namespace

void AddSamplingFlags(CLI::App& sub, model::SamplingOptions* s) {
  sub.add_option("--temperature", s->temperature,
                 "0: greedy (the most probable token); > 0: sample from softmax(logits / "
                 "temperature)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub.add_option("--top-k", s->top_k,
                 "Sample only among the k most probable tokens (0: all; 1: greedy)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub.add_option("--top-p", s->top_p,
                 "Sample only among the most probable tokens whose probabilities add up to this "
                 "(nucleus sampling; 1: all)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
}

void AddGenerate(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* sub = app.add_subcommand("generate", "Print text continued by a GPT-2 model");
  sub->add_option("--init", a->init, "Model weights: GPT-2 .safetensors file (required)");
  sub->add_option("--tokenizer", a->tokenizer,
                  "Hugging Face tokenizer.json (GPT-2 byte-level BPE) for the prompt and the "
                  "output (default: bytes are tokens)");
  sub->add_option("--prompt", a->prompt, "Text to continue")->capture_default_str();
  sub->add_option("--tokens", a->tokens, "Tokens to generate")->capture_default_str();
  AddSamplingFlags(*sub, &a->sampling);
  sub->add_option("--seed", a->sampling.seed, "Seed of the sampling")->capture_default_str();
  sub->add_option("--heads", a->heads,
                  "Attention heads (default: the n_head the file records, as files "
                  "strata saved do, else d_model / 64); must agree with the file");
  AddModelThreadsFlag(sub, &a->threads);
  SetCallbackWithConfig(
      sub, [a] { return RunGenerate(*a); }, exit_code);
}

}  // namespace strata::cli
