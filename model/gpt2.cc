// The GPT-2 model: blocks, initialisation, weights I/O and the forward/backward drivers.
// Per-op formulas are in gpt2_ops.h; this file wires them into layers (see gpt2.h).
#include "model/gpt2.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>

#include "model/gpt2_ops.h"
#include "strata/bytes.h"

namespace strata::model {
namespace {

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

const char* const kLayerTensorNames[kNumLayerTensors] = {
    "ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
    "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

Status Gpt2Config::Validate() const {
  auto bad = [](const std::string& m) { return Status::InvalidArgument(m); };
  if (layers < 1) return bad("--layers must be >= 1 (got " + std::to_string(layers) + ")");
  if (d_model < 1) return bad("--d-model must be >= 1 (got " + std::to_string(d_model) + ")");
  if (heads < 1 || d_model % heads != 0) {
    return bad("--d-model " + std::to_string(d_model) + " must be a multiple of --heads " +
               std::to_string(heads));
  }
  if (max_seq < 1) return bad("--seq-len must be >= 1 (got " + std::to_string(max_seq) + ")");
  if (vocab < 1) return bad("--vocab must be >= 1 (got " + std::to_string(vocab) + ")");
  return Status::OK();
}

std::vector<BlockSpec> Gpt2BlockSpecs(const Gpt2Config& cfg) {
  const int64_t C = cfg.d_model;
  std::vector<BlockSpec> specs;
  specs.push_back(
      {"embed", {{"wte.weight", {cfg.vocab, C}, true}, {"wpe.weight", {cfg.max_seq, C}, true}}});
  const std::vector<std::vector<int64_t>> shapes = {{C}, {C}, {C, 3 * C}, {3 * C}, {C, C},     {C},
                                                    {C}, {C}, {C, 4 * C}, {4 * C}, {4 * C, C}, {C}};
  for (int l = 0; l < cfg.layers; ++l) {
    BlockSpec b{"h." + std::to_string(l), {}};
    for (int t = 0; t < kNumLayerTensors; ++t) {
      b.tensors.push_back({kLayerTensorNames[t], shapes[t], shapes[t].size() >= 2});
    }
    specs.push_back(std::move(b));
  }
  specs.push_back({"ln_f", {{"ln_f.weight", {C}, false}, {"ln_f.bias", {C}, false}}});
  return specs;
}

std::string HfTensorName(const std::vector<BlockSpec>& specs, int block, int tensor) {
  const BlockSpec& b = specs[block];
  const std::string& t = b.tensors[tensor].name;
  return b.name.rfind("h.", 0) == 0 ? b.name + "." + t : t;
}

uint64_t Gpt2NumParams(const Gpt2Config& cfg) {
  uint64_t n = 0;
  for (const BlockSpec& b : Gpt2BlockSpecs(cfg))
    for (const TensorSpec& t : b.tensors) n += static_cast<uint64_t>(Numel(t.shape));
  return n;
}

double Gpt2TrainFlopsPerToken(const Gpt2Config& cfg, int seq_len, bool recompute) {
  const double C = cfg.d_model, L = cfg.layers, T = seq_len;
  const double attention_fwd = 4.0 * L * T * C;
  double flops = 6.0 * static_cast<double>(Gpt2NumParams(cfg)) + 3.0 * attention_fwd;
  if (recompute) flops += 2.0 * L * (12.0 * C * C + 13.0 * C) + attention_fwd;
  return flops;
}

std::vector<BlockLayout> PlainLayout(const std::vector<BlockSpec>& specs, uint32_t alignment) {
  std::vector<BlockLayout> out;
  for (const BlockSpec& b : specs) {
    BlockLayout l;
    l.name = b.name;
    uint64_t off = 0;
    for (const TensorSpec& t : b.tensors) {
      off = RoundUp(off, alignment);
      const uint64_t n = static_cast<uint64_t>(Numel(t.shape));
      l.tensors.push_back({t.name, t.shape, off, n, t.weight_decay});
      off += n;
      l.numel += n;
    }
    l.padded_numel = l.shard_numel = off;
    out.push_back(std::move(l));
  }
  return out;
}

void InitTensor(const Gpt2Config& cfg, const std::vector<BlockSpec>& specs, int block, int tensor,
                uint64_t seed, std::span<float> out) {
  const TensorSpec& t = specs[block].tensors[tensor];
  const bool is_ln_weight =
      t.name.find("ln_") != std::string::npos && t.name.find(".weight") != std::string::npos;
  if (t.shape.size() < 2) {  // biases 0, LayerNorm weights 1
    std::fill(out.begin(), out.end(), is_ln_weight ? 1.0f : 0.0f);
    return;
  }
  double std = 0.02;
  if (t.name == "attn.c_proj.weight" || t.name == "mlp.c_proj.weight") {
    std = 0.02 / std::sqrt(2.0 * cfg.layers);
  }
  // Box-Muller on a splitmix64 stream keyed by (seed, block, tensor): the same numbers on
  // every platform and independent of the order tensors are initialised in.
  uint64_t state = SplitMix(seed ^ SplitMix((static_cast<uint64_t>(block) << 20) + tensor));
  auto uniform = [&] {
    state = SplitMix(state);
    return (static_cast<double>(state >> 11) + 0.5) * (1.0 / 9007199254740992.0);
  };
  for (size_t i = 0; i < out.size(); i += 2) {
    const double r = std::sqrt(-2.0 * std::log(uniform())), th = 2.0 * M_PI * uniform();
    out[i] = static_cast<float>(std * r * std::cos(th));
    if (i + 1 < out.size()) out[i + 1] = static_cast<float>(std * r * std::sin(th));
  }
}

namespace {
std::string FindName(const SafetensorsReader& f, const std::string& name) {
  if (f.Find(name) != nullptr) return name;
  if (f.Find("transformer." + name) != nullptr) return "transformer." + name;
  return "";
}
}  // namespace

int DefaultHeads(int d_model) { return d_model > 0 && d_model % 64 == 0 ? d_model / 64 : 1; }

std::map<std::string, std::string> GeometryMetadata(const Gpt2Config& c) {
  return {{"n_layer", std::to_string(c.layers)},
          {"n_embd", std::to_string(c.d_model)},
          {"n_head", std::to_string(c.heads)},
          {"n_positions", std::to_string(c.max_seq)},
          {"vocab_size", std::to_string(c.vocab)}};
}

Result<Gpt2Config> ConfigFromSafetensors(const SafetensorsReader& f, int heads) {
  Gpt2Config cfg;
  const std::string wte = FindName(f, "wte.weight"), wpe = FindName(f, "wpe.weight");
  if (wte.empty() || wpe.empty()) {
    return Status::NotFound("safetensors file " + f.path() + " has no " +
                            std::string(wte.empty() ? "wte.weight" : "wpe.weight") +
                            " (expected Hugging Face GPT-2 names, optionally prefixed "
                            "\"transformer.\")")
        .WithPath(f.path());
  }
  const TensorEntry* e = f.Find(wte);
  const TensorEntry* p = f.Find(wpe);
  if (e->shape.size() != 2 || p->shape.size() != 2 || e->shape[1] != p->shape[1]) {
    return Status::InvalidArgument("wte.weight " + ShapeString(e->shape) + " and wpe.weight " +
                                   ShapeString(p->shape) + " in " + f.path() +
                                   ": expected [V, C] and [P, C] with the same C")
        .WithPath(f.path());
  }
  cfg.vocab = static_cast<int>(e->shape[0]);
  cfg.d_model = static_cast<int>(e->shape[1]);
  cfg.max_seq = static_cast<int>(p->shape[0]);
  int layers = 0;
  while (!FindName(f, "h." + std::to_string(layers) + ".ln_1.weight").empty()) ++layers;
  if (layers == 0) {
    return Status::NotFound("safetensors file " + f.path() +
                            " has no transformer layer (expected h.0.ln_1.weight)")
        .WithPath(f.path());
  }
  cfg.layers = layers;
  cfg.heads = heads > 0 ? heads : DefaultHeads(cfg.d_model);
  // What the metadata records must agree with the tensors; its n_head is the one value the
  // shapes cannot tell.
  for (const auto& [key, value] : f.metadata()) {
    int* field = key == "n_layer"       ? &cfg.layers
                 : key == "n_embd"      ? &cfg.d_model
                 : key == "n_head"      ? &cfg.heads
                 : key == "n_positions" ? &cfg.max_seq
                 : key == "vocab_size"  ? &cfg.vocab
                                        : nullptr;
    if (field == nullptr) continue;
    char* end = nullptr;
    const long v = std::strtol(value.c_str(), &end, 10);
    if (value.empty() || *end != '\0' || v < 1 || v > (1L << 30)) {
      return Status::Corruption("safetensors file " + f.path() + ": __metadata__ " + key + " = \"" +
                                value + "\" is not a positive integer")
          .WithPath(f.path());
    }
    if (key == "n_head") {
      if (heads == 0) cfg.heads = static_cast<int>(v);
    } else if (*field != v) {
      return Status::Corruption("safetensors file " + f.path() + ": __metadata__ " + key + " = " +
                                value + " but the tensors give " + std::to_string(*field))
          .WithPath(f.path());
    }
  }
  STRATA_RETURN_IF_ERROR(cfg.Validate());
  return cfg;
}

Status LoadTensor(const SafetensorsReader& f, const std::vector<BlockSpec>& specs, int block,
                  int tensor, std::span<float> out) {
  const std::string name = HfTensorName(specs, block, tensor);
  std::string found = FindName(f, name);
  if (found.empty()) found = name;  // ReadFloat reports NotFound with the expected shape
  return f.ReadFloat(found, specs[block].tensors[tensor].shape, out.data(), out.size());
}

// ---- the model ---------------------------------------------------------------------------

template <typename F>
struct Gpt2Model<F>::Acts {
  struct Layer {
    std::vector<F> ln1, ln1_mean, ln1_rstd, qkv, att, atty, x_mid, ln2, ln2_mean, ln2_rstd, fch,
        fch_gelu;
  };
  // What one micro-batch keeps from its forward to its backward (and, in backward, from one
  // block to the next): its tokens, the residual stream, each layer's intermediates unless
  // they are recomputed, the final LayerNorm, the gradient flowing back and the head's wte
  // gradient (added to the embedding's in its backward).
  struct Slot {
    std::vector<int32_t> inputs, targets;
    bool has_targets = false;        // the last SetTokens gave targets: Head computes the loss
    std::vector<std::vector<F>> xs;  // residual stream: input of layer l, xs[L] = output
    std::vector<Layer> layers;       // one per layer; empty with recompute
    std::vector<F> lnf, lnf_mean, lnf_rstd;
    std::vector<F> dres, dwte_head;
  };
  std::vector<Slot> slots;
  Slot* cur = nullptr;      // the slot UseSlot chose
  std::vector<Layer> redo;  // with recompute: the one layer's intermediates, rebuilt in backward
  // Whose intermediates `redo` holds: the slot, the layer and the micro-batch (SetTokens calls
  // so far) whose LayerForward wrote them last, or layer -1 once a backward has used them.
  // The last layer's backward follows its forward with nothing in between that writes `redo`
  // (the final LayerNorm and the head keep their own buffers), so it needs no recompute.
  const Slot* redo_slot = nullptr;
  int redo_layer = -1;
  uint64_t redo_tokens = 0;
  uint64_t tokens_set = 0;  // SetTokens calls so far: a new micro-batch in some slot
  std::vector<F> tmp;       // [N,C] projection outputs before the residual add
  std::vector<F> wte_copy;  // the same in every slot: params do not change within a step
  std::vector<F> logits, losses;
  // Backward scratch.
  std::vector<F> dlnf, dln, dqkv, datty, dfch, dfch_gelu;

  Layer& LayerActs(int l) { return redo.empty() ? cur->layers[l] : redo[0]; }
};

template <typename F>
Gpt2Model<F>::Gpt2Model(const Gpt2Config& cfg, int B, int T, bool recompute, int micro_slots)
    : config_(cfg), B_(B), T_(T), recompute_(recompute), a_(std::make_unique<Acts>()) {
  const size_t N = static_cast<size_t>(B) * T, C = cfg.d_model, V = cfg.vocab;
  Acts& a = *a_;
  auto size_layer = [&](typename Acts::Layer& l) {
    l.ln1.resize(N * C);
    l.ln1_mean.resize(N);
    l.ln1_rstd.resize(N);
    l.qkv.resize(N * 3 * C);
    l.att.resize(static_cast<size_t>(B) * cfg.heads * T * T);
    l.atty.resize(N * C);
    l.x_mid.resize(N * C);
    l.ln2.resize(N * C);
    l.ln2_mean.resize(N);
    l.ln2_rstd.resize(N);
    l.fch.resize(N * 4 * C);
    l.fch_gelu.resize(N * 4 * C);
  };
  a.slots.resize(static_cast<size_t>(std::max(1, micro_slots)));
  for (typename Acts::Slot& s : a.slots) {
    s.inputs.resize(N);
    s.targets.resize(N);
    s.xs.assign(cfg.layers + 1, std::vector<F>(N * C));
    s.layers.resize(recompute ? 0 : cfg.layers);
    for (auto& l : s.layers) size_layer(l);
    s.lnf.resize(N * C);
    s.lnf_mean.resize(N);
    s.lnf_rstd.resize(N);
    s.dres.resize(N * C);
    s.dwte_head.resize(V * C);
  }
  a.cur = &a.slots[0];
  a.redo.resize(recompute ? 1 : 0);
  for (auto& l : a.redo) size_layer(l);
  a.tmp.resize(N * C);
  a.wte_copy.resize(V * C);
  a.logits.resize(N * V);
  a.losses.resize(N);
  a.dlnf.resize(N * C);
  a.dln.resize(N * C);
  a.dqkv.resize(N * 3 * C);
  a.datty.resize(N * C);
  a.dfch.resize(N * 4 * C);
  a.dfch_gelu.resize(N * 4 * C);
}

template <typename F>
Gpt2Model<F>::~Gpt2Model() = default;

template <typename F>
int Gpt2Model<F>::micro_slots() const {
  return static_cast<int>(a_->slots.size());
}

template <typename F>
void Gpt2Model<F>::UseSlot(int slot) {
  a_->cur = &a_->slots[static_cast<size_t>(slot)];
}

template <typename F>
F* Gpt2Model<F>::ResidualBuffer(int slot, int l) {
  return a_->slots[static_cast<size_t>(slot)].xs[static_cast<size_t>(l)].data();
}

template <typename F>
F* Gpt2Model<F>::ResidualGradBuffer(int slot) {
  return a_->slots[static_cast<size_t>(slot)].dres.data();
}

template <typename F>
F* Gpt2Model<F>::HeadWteGradBuffer(int slot) {
  return a_->slots[static_cast<size_t>(slot)].dwte_head.data();
}

template <typename F>
void Gpt2Model<F>::SetTokens(const int32_t* inputs, const int32_t* targets) {
  const size_t N = static_cast<size_t>(B_) * T_;
  typename Acts::Slot& s = *a_->cur;
  ++a_->tokens_set;
  std::copy(inputs, inputs + N, s.inputs.begin());
  s.has_targets = targets != nullptr;
  if (targets != nullptr) std::copy(targets, targets + N, s.targets.begin());
}

template <typename F>
const F* Gpt2Model<F>::logits() const {
  return a_->logits.data();
}

template <typename F>
void Gpt2Model<F>::EmbedForward(const BlockPtrs<F>& b) {
  const int C = config_.d_model;
  const F* wte = b.P(kWte);
  std::copy(wte, wte + static_cast<size_t>(config_.vocab) * C, a_->wte_copy.begin());
  EmbeddingForward(a_->cur->xs[0].data(), a_->cur->inputs.data(), wte, b.P(kWpe), B_, T_, C);
}

template <typename F>
void Gpt2Model<F>::LayerForward(int l, const BlockPtrs<F>& b) {
  const int N = B_ * T_, C = config_.d_model, NH = config_.heads;
  Acts& a = *a_;
  typename Acts::Layer& s = a.LayerActs(l);
  if (recompute_) {
    a.redo_slot = a.cur;
    a.redo_layer = l;
    a.redo_tokens = a.tokens_set;
  }
  const F* x = a.cur->xs[l].data();
  LayerNormForward(s.ln1.data(), s.ln1_mean.data(), s.ln1_rstd.data(), x, b.P(kLn1W), b.P(kLn1B), N,
                   C);
  MatmulForward(s.qkv.data(), s.ln1.data(), b.P(kAttnW), b.P(kAttnB), N, C, 3 * C);
  AttentionForward(s.atty.data(), s.att.data(), s.qkv.data(), B_, T_, C, NH);
  MatmulForward(a.tmp.data(), s.atty.data(), b.P(kAttnProjW), b.P(kAttnProjB), N, C, C);
  ResidualForward(s.x_mid.data(), x, a.tmp.data(), static_cast<size_t>(N) * C);
  LayerNormForward(s.ln2.data(), s.ln2_mean.data(), s.ln2_rstd.data(), s.x_mid.data(), b.P(kLn2W),
                   b.P(kLn2B), N, C);
  MatmulForward(s.fch.data(), s.ln2.data(), b.P(kFcW), b.P(kFcB), N, C, 4 * C);
  GeluForward(s.fch_gelu.data(), s.fch.data(), static_cast<size_t>(N) * 4 * C);
  MatmulForward(a.tmp.data(), s.fch_gelu.data(), b.P(kFcProjW), b.P(kFcProjB), N, 4 * C, C);
  ResidualForward(a.cur->xs[l + 1].data(), s.x_mid.data(), a.tmp.data(),
                  static_cast<size_t>(N) * C);
}

template <typename F>
void Gpt2Model<F>::FinalForward(const BlockPtrs<F>& b) {
  typename Acts::Slot& s = *a_->cur;
  LayerNormForward(s.lnf.data(), s.lnf_mean.data(), s.lnf_rstd.data(), s.xs[config_.layers].data(),
                   b.P(kLnfW), b.P(kLnfB), B_ * T_, config_.d_model);
}

template <typename F>
double Gpt2Model<F>::Head(bool backward, F dloss) {
  Acts& a = *a_;
  typename Acts::Slot& s = *a.cur;
  const int N = B_ * T_, C = config_.d_model, V = config_.vocab;
  LmHeadForward(a.logits.data(), s.lnf.data(), a.wte_copy.data(), N, C, V);
  if (!s.has_targets) return 0;  // forward only: keep the logits
  last_loss_ = SoftmaxCrossEntropyForward(a.logits.data(), a.losses.data(), a.logits.data(),
                                          s.targets.data(), N, V);
  if (backward) {
    SoftmaxCrossEntropyBackward(a.logits.data(), a.logits.data(), s.targets.data(), N, V, dloss);
    std::fill(a.dlnf.begin(), a.dlnf.end(), F(0));
    std::fill(s.dwte_head.begin(), s.dwte_head.end(), F(0));
    LmHeadBackward(a.dlnf.data(), s.dwte_head.data(), a.logits.data(), s.lnf.data(),
                   a.wte_copy.data(), N, C, V);
  }
  return last_loss_;
}

template <typename F>
void Gpt2Model<F>::FinalBackward(const BlockPtrs<F>& b) {
  Acts& a = *a_;
  typename Acts::Slot& s = *a.cur;
  Fill(b.g, F(0), b.layout->padded_numel);
  std::fill(s.dres.begin(), s.dres.end(), F(0));
  LayerNormBackward(s.dres.data(), b.G(kLnfW), b.G(kLnfB), a.dlnf.data(),
                    s.xs[config_.layers].data(), b.P(kLnfW), s.lnf_mean.data(), s.lnf_rstd.data(),
                    B_ * T_, config_.d_model);
}

template <typename F>
void Gpt2Model<F>::LayerBackward(int l, const BlockPtrs<F>& b) {
  const int N = B_ * T_, C = config_.d_model, NH = config_.heads;
  Acts& a = *a_;
  // Rebuilds the scratch activations from xs[l], unless they are this micro-batch's own from
  // its forward (the last layer in batch-major order).
  const bool kept = a.redo_slot == a.cur && a.redo_layer == l && a.redo_tokens == a.tokens_set;
  if (recompute_ && !kept) LayerForward(l, b);
  a.redo_layer = -1;  // the backward below may use the intermediates as scratch
  typename Acts::Layer& s = a.LayerActs(l);
  F* dres = a.cur->dres.data();
  const size_t NC = static_cast<size_t>(N) * C;
  Fill(b.g, F(0), b.layout->padded_numel);
  // dres holds d(output of the layer); the residual adds make it d(x_mid), then d(input).
  std::fill(a.dfch_gelu.begin(), a.dfch_gelu.end(), F(0));
  MatmulBackward(a.dfch_gelu.data(), b.G(kFcProjW), b.G(kFcProjB), dres, s.fch_gelu.data(),
                 b.P(kFcProjW), N, 4 * C, C);
  std::fill(a.dfch.begin(), a.dfch.end(), F(0));
  GeluBackward(a.dfch.data(), s.fch.data(), a.dfch_gelu.data(), NC * 4);
  std::fill(a.dln.begin(), a.dln.end(), F(0));
  MatmulBackward(a.dln.data(), b.G(kFcW), b.G(kFcB), a.dfch.data(), s.ln2.data(), b.P(kFcW), N, C,
                 4 * C);
  LayerNormBackward(dres, b.G(kLn2W), b.G(kLn2B), a.dln.data(), s.x_mid.data(), b.P(kLn2W),
                    s.ln2_mean.data(), s.ln2_rstd.data(), N, C);
  std::fill(a.datty.begin(), a.datty.end(), F(0));
  MatmulBackward(a.datty.data(), b.G(kAttnProjW), b.G(kAttnProjB), dres, s.atty.data(),
                 b.P(kAttnProjW), N, C, C);
  std::fill(a.dqkv.begin(), a.dqkv.end(), F(0));
  AttentionBackward(a.dqkv.data(), a.datty.data(), s.qkv.data(), s.att.data(), B_, T_, C, NH);
  std::fill(a.dln.begin(), a.dln.end(), F(0));
  MatmulBackward(a.dln.data(), b.G(kAttnW), b.G(kAttnB), a.dqkv.data(), s.ln1.data(), b.P(kAttnW),
                 N, C, 3 * C);
  LayerNormBackward(dres, b.G(kLn1W), b.G(kLn1B), a.dln.data(), a.cur->xs[l].data(), b.P(kLn1W),
                    s.ln1_mean.data(), s.ln1_rstd.data(), N, C);
}

template <typename F>
void Gpt2Model<F>::EmbedBackward(const BlockPtrs<F>& b) {
  typename Acts::Slot& s = *a_->cur;
  Fill(b.g, F(0), b.layout->padded_numel);
  std::copy(s.dwte_head.begin(), s.dwte_head.end(), b.G(kWte));  // the head's share first
  EmbeddingBackward(b.G(kWte), b.G(kWpe), s.dres.data(), s.inputs.data(), B_, T_, config_.d_model);
}

template class Gpt2Model<float>;
template class Gpt2Model<double>;

uint64_t SavedActivationBytes(const Gpt2Config& cfg, int64_t rows, int64_t seq_len,
                              bool recompute) {
  using u128 = unsigned __int128;
  const u128 L = static_cast<u128>(cfg.layers), C = static_cast<u128>(cfg.d_model);
  const u128 V = static_cast<u128>(cfg.vocab), H = static_cast<u128>(cfg.heads);
  const u128 T = static_cast<u128>(seq_len), N = static_cast<u128>(rows) * T;
  // Gpt2Model<F>::Acts::Slot, field by field: tokens, xs, lnf (+ mean, rstd), dres,
  // dwte_head, and without recompute every layer's intermediates.
  const u128 per_layer = 15 * N * C + 4 * N + static_cast<u128>(rows) * H * T * T;
  const u128 floats =
      2 * N + (L + 1) * N * C + (N * C + 2 * N) + N * C + V * C + (recompute ? 0 : L * per_layer);
  const u128 bytes = 4 * floats;
  return bytes > UINT64_MAX ? UINT64_MAX : static_cast<uint64_t>(bytes);
}

OffloadedActivationShape OffloadedActivations(const Gpt2Config& cfg, int64_t rows, int64_t seq_len,
                                              int residual_value_bytes) {
  OffloadedActivationShape s;
  const uint64_t L = uint64_t(cfg.layers);
  s.key_bytes =
      uint64_t(rows) * uint64_t(seq_len) * uint64_t(cfg.d_model) * uint64_t(residual_value_bytes);
  const uint64_t wte = uint64_t(cfg.vocab) * uint64_t(cfg.d_model) * sizeof(float);
  s.wte_grad_keys = static_cast<int>((wte + s.key_bytes - 1) / s.key_bytes);
  s.keys_per_micro_batch = static_cast<int>(L + 2) + s.wte_grad_keys;
  s.d2h_bytes_per_micro_batch = 2 * (L + 1) * s.key_bytes + wte;
  s.h2d_bytes_per_micro_batch = (L + 2 * (L + 1)) * s.key_bytes + wte;
  return s;
}

// ---- drivers -----------------------------------------------------------------------------

template <typename F>
double ForwardBackwardPlain(Gpt2Model<F>& m, const std::vector<BlockLayout>& layouts,
                            const std::vector<const F*>& params, const std::vector<F*>& grads,
                            const int32_t* inputs, const int32_t* targets, F dloss) {
  const int L = m.config().layers;
  auto ptrs = [&](int b) { return BlockPtrs<F>{params[b], grads[b], &layouts[b]}; };
  m.SetTokens(inputs, targets);
  m.EmbedForward(ptrs(0));
  for (int l = 0; l < L; ++l) m.LayerForward(l, ptrs(l + 1));
  m.FinalForward(ptrs(L + 1));
  const double loss = m.Head(/*backward=*/true, dloss);
  m.FinalBackward(ptrs(L + 1));
  for (int l = L - 1; l >= 0; --l) m.LayerBackward(l, ptrs(l + 1));
  m.EmbedBackward(ptrs(0));
  return loss;
}

template <typename F>
double ForwardPlain(Gpt2Model<F>& m, const std::vector<BlockLayout>& layouts,
                    const std::vector<const F*>& params, const int32_t* inputs,
                    const int32_t* targets) {
  const int L = m.config().layers;
  auto ptrs = [&](int b) { return BlockPtrs<F>{params[b], nullptr, &layouts[b]}; };
  m.SetTokens(inputs, targets);
  m.EmbedForward(ptrs(0));
  for (int l = 0; l < L; ++l) m.LayerForward(l, ptrs(l + 1));
  m.FinalForward(ptrs(L + 1));
  return m.Head(/*backward=*/false, F(0));
}

template double ForwardBackwardPlain<float>(Gpt2Model<float>&, const std::vector<BlockLayout>&,
                                            const std::vector<const float*>&,
                                            const std::vector<float*>&, const int32_t*,
                                            const int32_t*, float);
template double ForwardBackwardPlain<double>(Gpt2Model<double>&, const std::vector<BlockLayout>&,
                                             const std::vector<const double*>&,
                                             const std::vector<double*>&, const int32_t*,
                                             const int32_t*, double);
template double ForwardPlain<float>(Gpt2Model<float>&, const std::vector<BlockLayout>&,
                                    const std::vector<const float*>&, const int32_t*,
                                    const int32_t*);
template double ForwardPlain<double>(Gpt2Model<double>&, const std::vector<BlockLayout>&,
                                     const std::vector<const double*>&, const int32_t*,
                                     const int32_t*);

std::vector<const float*> HostWeights::Ptrs() const {
  std::vector<const float*> p;
  for (const auto& b : blocks) p.push_back(b.data());
  return p;
}

Status SaveWeights(const std::string& path, const std::vector<BlockSpec>& specs,
                   const HostWeights& w, const std::map<std::string, std::string>& metadata) {
  std::vector<TensorToWrite> ts;
  for (size_t b = 0; b < specs.size(); ++b) {
    for (size_t t = 0; t < specs[b].tensors.size(); ++t) {
      ts.push_back({HfTensorName(specs, static_cast<int>(b), static_cast<int>(t)),
                    specs[b].tensors[t].shape,
                    w.blocks[b].data() + w.layouts[b].tensors[t].offset});
    }
  }
  return WriteSafetensors(path, ts, metadata);
}

Status SamplingOptions::Validate() const {
  if (!(temperature >= 0)) {
    return Status::InvalidArgument("--temperature " + std::to_string(temperature) +
                                   ": expected 0 (greedy) or a positive number");
  }
  if (top_k < 0) {
    return Status::InvalidArgument("--top-k " + std::to_string(top_k) +
                                   ": expected 0 (every token) or a positive count");
  }
  if (!(top_p > 0 && top_p <= 1)) {
    return Status::InvalidArgument("--top-p " + std::to_string(top_p) +
                                   ": expected a probability mass in (0, 1]");
  }
  return Status::OK();
}

std::vector<double> SamplingDistribution(std::span<const float> logits, const SamplingOptions& s) {
  const size_t V = logits.size();
  std::vector<double> p(V, 0.0);
  if (V == 0) return p;
  const size_t argmax = std::max_element(logits.begin(), logits.end()) - logits.begin();
  if (s.temperature <= 0 || s.top_k == 1) {
    p[argmax] = 1;
    return p;
  }
  const double mx = logits[argmax];
  double sum = 0;
  for (size_t v = 0; v < V; ++v) sum += p[v] = std::exp((logits[v] - mx) / s.temperature);
  for (double& x : p) x /= sum;
  // Most probable first (ties by id, so the cut is deterministic); keep the top k, then the
  // shortest prefix of those whose mass reaches top_p.
  std::vector<size_t> order(V);
  for (size_t v = 0; v < V; ++v) order[v] = v;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return p[x] > p[y]; });
  size_t keep = s.top_k > 0 ? std::min<size_t>(V, s.top_k) : V;
  if (s.top_p < 1) {
    double mass = 0;
    for (size_t i = 0; i < keep; ++i) {
      mass += p[order[i]];
      if (mass >= s.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double kept = 0;
  for (size_t i = 0; i < keep; ++i) kept += p[order[i]];
  for (size_t i = keep; i < V; ++i) p[order[i]] = 0;
  for (double& x : p) x /= kept;
  return p;
}

std::vector<int32_t> Generate(const Gpt2Config& cfg, const HostWeights& w, std::vector<int32_t> seq,
                              int tokens, const SamplingOptions& sampling) {
  std::mt19937_64 rng(sampling.seed);
  const std::vector<const float*> params = w.Ptrs();
  if (seq.empty()) seq.push_back('\n' < cfg.vocab ? '\n' : 0);
  for (int i = 0; i < tokens; ++i) {
    const int T = std::min<int>(static_cast<int>(seq.size()), cfg.max_seq);
    Gpt2Model<float> m(cfg, 1, T, /*recompute=*/false);
    ForwardPlain(m, w.layouts, params, seq.data() + seq.size() - T, nullptr);
    const float* row = m.logits() + static_cast<size_t>(T - 1) * cfg.vocab;
    const std::vector<double> p =
        SamplingDistribution(std::span<const float>(row, cfg.vocab), sampling);
    // Inverse CDF; the last token with mass catches what rounding leaves over.
    double u = std::uniform_real_distribution<double>(0, 1)(rng);
    int next = 0;
    for (int v = 0; v < cfg.vocab; ++v) {
      if (p[v] == 0) continue;
      next = v;
      if ((u -= p[v]) < 0) break;
    }
    seq.push_back(next);
  }
  return seq;
}

}  // namespace strata::model
