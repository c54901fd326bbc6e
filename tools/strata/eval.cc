// `strata eval`: the loss of a GPT-2 model (a safetensors file) over the whole held-out split
// of a data file, with perplexity and bits per byte.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "model/data.h"
#include "model/gpt2.h"
#include "model/tokenizer.h"
#include "tools/strata/cli_common.h"
#include "tools/strata/commands.h"
#include "tools/strata/config_file.h"
#include "tools/strata/model_file.h"

namespace strata::cli {
namespace {

struct EvalArgs {
  std::string init, data, tokenizer, json;
  int heads = 0;
  int seq_len = 0;  // 0: the model's context (rows of wpe)
  int batch = 8;
  double val_fraction = 0.1;
  int threads = 0;  // 0: STRATA_NUM_THREADS, else one per core
};

struct HeldOutLoss {
  int64_t tokens = 0;  // tokens predicted
  double nats = 0;     // sum of their losses
};

// Every token of tokens[begin, end) but the first, predicted once: windows of up to T
// predictions that start where the previous one's targets end (inputs [o, o+T), targets
// [o+1, o+T+1)), B windows per forward pass; the last window may be shorter.
HeldOutLoss LossOver(const model::Gpt2Config& cfg, const model::HostWeights& w,
                     const std::vector<int32_t>& tokens, size_t begin, size_t end, int T, int B) {
  HeldOutLoss r;
  const std::vector<const float*> params = w.Ptrs();
  std::vector<size_t> full;  // starts of the windows of exactly T predictions
  size_t o = begin;
  for (; o + T + 1 <= end; o += T) full.push_back(o);
  std::vector<int32_t> in, tg;
  auto run = [&](const std::vector<size_t>& starts, int rows, int t) {
    model::Gpt2Model<float> m(cfg, rows, t, /*recompute=*/false);
    for (size_t s = 0; s + rows <= starts.size(); s += rows) {
      in.clear();
      tg.clear();
      for (int row = 0; row < rows; ++row) {
        const int32_t* src = tokens.data() + starts[s + row];
        in.insert(in.end(), src, src + t);
        tg.insert(tg.end(), src + 1, src + t + 1);
      }
      const double mean = model::ForwardPlain(m, w.layouts, params, in.data(), tg.data());
      r.nats += mean * rows * t;
      r.tokens += static_cast<int64_t>(rows) * t;
    }
  };
  const size_t whole = full.size() / B * B;
  if (whole > 0) run(std::vector<size_t>(full.begin(), full.begin() + whole), B, T);
  if (whole < full.size()) {
    run(std::vector<size_t>(full.begin() + whole, full.end()),
        static_cast<int>(full.size() - whole), T);
  }
  if (o + 1 < end) run({o}, 1, static_cast<int>(end - o - 1));
  return r;
}

int RunEval(const EvalArgs& a) {
  SetComputeThreads(ResolveThreads(a.threads));
  // With --json -, standard output carries only the JSON; the report goes to standard error.
  FILE* const out = a.json == "-" ? stderr : stdout;
  auto fail = [](const Status& s, const std::string& what) {
    std::fprintf(stderr, "strata eval: %s: %s\n", what.c_str(), s.ToString().c_str());
    return 1;
  };
  if (a.init.empty()) {
    return fail(Status::InvalidArgument("required: the model's .safetensors file"), "--init");
  }
  const auto t0 = std::chrono::steady_clock::now();
  if (!(a.val_fraction > 0 && a.val_fraction < 1)) {
    return fail(Status::InvalidArgument("expected a share between 0 and 1, not " +
                                        std::to_string(a.val_fraction)),
                "--val-fraction");
  }
  auto file = LoadModelFile(a.init, GeometryFlags{.heads = a.heads});
  if (!file.ok()) return fail(file.status(), "--init");
  const model::Gpt2Config& cfg = file->config;
  std::optional<model::Tokenizer> tok;
  if (!a.tokenizer.empty()) {
    auto t = model::Tokenizer::Load(a.tokenizer);
    if (!t.ok()) return fail(t.status(), "--tokenizer");
    tok = std::move(t).value();
  }
  bool is_text = false;
  auto data = LoadDataFile(a.data, tok ? &*tok : nullptr, &is_text);
  if (!data.ok()) return fail(data.status(), "--data");
  if (data->vocab > cfg.vocab) {
    return fail(Status::InvalidArgument(data->description + " holds token ids up to " +
                                        std::to_string(data->vocab - 1) + " but the model's " +
                                        "vocabulary is " + std::to_string(cfg.vocab) +
                                        (tok ? "" : "; give its --tokenizer")),
                "--data");
  }
  const int T = a.seq_len > 0 ? a.seq_len : cfg.max_seq;
  if (T > cfg.max_seq) {
    return fail(
        Status::InvalidArgument("--seq-len " + std::to_string(T) + " is longer than the " +
                                "model's context (" + std::to_string(cfg.max_seq) + " positions)"),
        "--seq-len");
  }
  // The split `strata train` uses: Batcher's held-out tail.
  auto batcher = model::Batcher::Create(&*data, 1, 1, a.val_fraction);
  if (!batcher.ok()) return fail(batcher.status(), "--data");
  const size_t begin = static_cast<size_t>(batcher->train_tokens());
  const size_t end = data->tokens.size();
  std::fprintf(out, "# strata eval: %s, GPT-2 %d layers, d_model %d, %d heads, vocab %d\n",
               a.init.c_str(), cfg.layers, cfg.d_model, cfg.heads, cfg.vocab);
  std::fprintf(out, "# data: %s; held-out split: the last %.0f%%, tokens %zu..%zu (%zu)\n",
               data->description.c_str(), a.val_fraction * 100, begin, end, end - begin);
  const HeldOutLoss r = LossOver(cfg, file->weights, data->tokens, begin, end, T, a.batch);
  const double loss = r.nats / static_cast<double>(r.tokens);
  // Bytes of the predicted tokens: one per token for byte-level text, the decoded length
  // with a tokenizer, unknown for a token file without one.
  std::optional<int64_t> bytes;
  if (tok) {
    bytes = static_cast<int64_t>(
        tok->Decode(std::vector<int32_t>(data->tokens.begin() + begin + 1, data->tokens.end()))
            .size());
  } else if (is_text) {
    bytes = r.tokens;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(out, "tokens %lld  loss %.4f  perplexity %.3f  bits/token %.4f",
               static_cast<long long>(r.tokens), loss, std::exp(loss), loss / std::log(2.0));
  if (bytes) {
    std::fprintf(out, "  bits/byte %.4f\n", r.nats / std::log(2.0) / static_cast<double>(*bytes));
  } else {
    std::fprintf(out, "  bits/byte n/a (a token file: give --tokenizer to count its bytes)\n");
  }
  if (!a.json.empty()) {
    nlohmann::json j = {{"init", a.init},
                        {"data", data->description},
                        {"heads", cfg.heads},
                        {"seq_len", T},
                        {"val_fraction", a.val_fraction},
                        {"held_out_begin", begin},
                        {"held_out_tokens", end - begin},
                        {"tokens", r.tokens},
                        {"loss", loss},
                        {"perplexity", std::exp(loss)},
                        {"bits_per_token", loss / std::log(2.0)},
                        {"bits_per_byte", nullptr},
                        {"seconds", seconds}};
    if (bytes) {
      j["bytes"] = *bytes;
      j["bits_per_byte"] = r.nats / std::log(2.0) / static_cast<double>(*bytes);
    }
    if (Status s = WriteOutput("--json", a.json, j.dump(1) + "\n"); !s.ok()) {
      return fail(s, "--json");
    }
  }
  return 0;
}

}  // namespace

void AddEval(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<EvalArgs>();
  CLI::App* sub = app.add_subcommand(
      "eval",
      "Loss, perplexity and bits per byte of a GPT-2 model over the held-out split of --data: "
      "the last --val-fraction of its tokens, which `strata train` never trains on (its "
      "--val-every reports a few batches of the same split). Every held-out token after the "
      "first is predicted once, from up to --seq-len tokens before it (windows that do not "
      "overlap, so a token early in a window sees little context)");
  sub->add_option("--init", a->init, "Model weights: GPT-2 .safetensors file (required)");
  sub->add_option("--data", a->data,
                  "Text file (bytes are tokens, or --tokenizer's) or llm.c token file "
                  "(default: the built-in corpus, as train)");
  sub->add_option("--tokenizer", a->tokenizer,
                  "Hugging Face tokenizer.json (GPT-2 byte-level BPE) for a text --data");
  sub->add_option("--val-fraction", a->val_fraction,
                  "Share of the data, at its end, that is held out (as train)")
      ->capture_default_str();
  sub->add_option("--seq-len", a->seq_len,
                  "Tokens per window (default: the model's context, the rows of wpe)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--batch", a->batch, "Windows per forward pass")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--heads", a->heads,
                  "Attention heads (default: the n_head the file records, as files "
                  "strata saved do, else d_model / 64); must agree with the file");
  AddModelThreadsFlag(sub, &a->threads);
  sub->add_option("--json", a->json, "Also write the results as JSON to FILE (-: standard output)");
  SetCallbackWithConfig(
      sub, [a] { return RunEval(*a); }, exit_code);
}

}  // namespace strata::cli
