#include "model/run_size.h"

#include <unistd.h>

#include <cstdio>
#include <string>

namespace strata::model {
namespace {

using u128 = unsigned __int128;
// Anything above this (1 PiB) is no run a host can do; it also keeps every later sum and
// product of these sizes far from 64-bit overflow.
constexpr u128 kMaxBytes = u128{1} << 50;

std::string Bytes(u128 n) {
  char buf[64];
  const double d = static_cast<double>(n);
  if (n >= (u128{1} << 40)) {
    std::snprintf(buf, sizeof(buf), "%.1f TiB", d / static_cast<double>(1ull << 40));
  } else if (n >= (u128{1} << 30)) {
    std::snprintf(buf, sizeof(buf), "%.1f GiB", d / static_cast<double>(1ull << 30));
  } else {
    std::snprintf(buf, sizeof(buf), "%.1f MiB", d / static_cast<double>(1ull << 20));
  }
  return buf;
}

}  // namespace

Result<RunSize> EstimateRunSize(const Gpt2Config& cfg, int64_t rows, int64_t seq_len,
                                bool recompute) {
  // Every factor is below 2^31, so products of up to four of them fit 128 bits.
  const u128 L = static_cast<u128>(cfg.layers), C = static_cast<u128>(cfg.d_model);
  const u128 V = static_cast<u128>(cfg.vocab), P = static_cast<u128>(cfg.max_seq);
  const u128 H = static_cast<u128>(cfg.heads), T = static_cast<u128>(seq_len);
  const u128 N = static_cast<u128>(rows) * T;
  const u128 layer_params = 12 * C * C + 13 * C;
  const u128 embed_params = V * C + P * C;
  const u128 params = embed_params + L * layer_params + 2 * C;
  // Gpt2Model<float>: the residual stream of every layer, one layer's (or every layer's)
  // intermediates, the logits and two vocabulary-sized copies of wte.
  const u128 per_layer = 15 * N * C + 4 * N + static_cast<u128>(rows) * H * T * T;
  const u128 floats =
      (L + 1) * N * C + (recompute ? 1 : L) * per_layer + N * V + 2 * V * C + 13 * N * C;
  RunSize s;
  const u128 state = 16 * params;
  const u128 block = 4 * (embed_params > layer_params ? embed_params : layer_params);
  const u128 acts = 4 * floats;
  if (state > kMaxBytes || block > kMaxBytes || acts > kMaxBytes) {
    return Status::InvalidArgument(
        "the run is far too large for any host: the model and optimizer states take " +
        Bytes(state) + ", its largest block " + Bytes(block) + " and the activations " +
        Bytes(acts) + " (--layers " + std::to_string(cfg.layers) + ", --d-model " +
        std::to_string(cfg.d_model) + ", --vocab " + std::to_string(cfg.vocab) + ", " +
        std::to_string(rows) + " rows of --batch on this rank, --seq-len " +
        std::to_string(seq_len) + "); lower them");
  }
  s.params = static_cast<uint64_t>(params);
  s.state_bytes = static_cast<uint64_t>(state);
  s.largest_block_bytes = static_cast<uint64_t>(block);
  s.activation_bytes = static_cast<uint64_t>(acts);
  return s;
}

uint64_t HostRoomLeft(const RunSize& s, const RunSizeLimits& limits) {
  const uint64_t mem = limits.host_memory_bytes;
  if (mem == 0) return 0;
  const uint64_t acts = limits.cpu_model ? s.activation_bytes : 0;
  const uint64_t states = limits.have_nvme ? 0 : s.state_bytes;
  const uint64_t used = acts > UINT64_MAX - states ? UINT64_MAX : acts + states;
  return mem > used ? mem - used : 1;
}

Status CheckRunSize(const RunSize& s, const RunSizeLimits& limits) {
  const uint64_t mem = limits.host_memory_bytes;
  if (mem == 0) return Status::OK();
  // A block's params and gradient are in host memory while it computes or is updated.
  if (2 * s.largest_block_bytes > mem) {
    return Status::InvalidArgument("one block of the model takes " + Bytes(s.largest_block_bytes) +
                                   " (twice that with its gradient), more than this host's " +
                                   Bytes(mem) + " of memory; lower --d-model or --vocab");
  }
  if (limits.cpu_model && s.activation_bytes > mem) {
    return Status::InvalidArgument(
        "the CPU model's activations for one micro-batch take " + Bytes(s.activation_bytes) +
        ", more than this host's " + Bytes(mem) +
        " of memory; lower --batch (raise --micro-batches to keep the tokens per step), "
        "--seq-len or --layers, or add --recompute");
  }
  if (!limits.have_nvme && s.state_bytes > mem) {
    return Status::InvalidArgument("the model and optimizer states take " + Bytes(s.state_bytes) +
                                   " (" + std::to_string(s.params) +
                                   " parameters x 16 bytes), more than this host's " + Bytes(mem) +
                                   " of memory; give --nvme folders to spill them, or a smaller "
                                   "model");
  }
  return Status::OK();
}

uint64_t HostMemoryBytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
}

}  // namespace strata::model
