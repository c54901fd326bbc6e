// Training data for the GPT-2 workload: token streams and the deterministic batches cut
// from them.
//
// Sources: a text file (byte-level tokens, vocabulary 256), an llm.c token file (a header of
// 256 little-endian int32 — magic 20240520, version 1, token count — then that many uint16
// tokens), or the built-in corpus: English-like sentences from a small grammar, generated
// deterministically from a seed (no download).
//
// Batches: batch i (counting micro-batches from 0), row r starts at
// o = ((i*B + r) * T) mod (N - T - 1) within the stream's training range; inputs are
// tokens [o, o+T), targets [o+1, o+T+1). The last `val_fraction` of the stream is held out
// for validation and never appears in a training batch.
//
// TokenStream is a plain value; its methods are const and safe to call from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/status.h"

namespace strata::model {

struct TokenStream {
  std::vector<int32_t> tokens;
  int vocab = 256;          // exclusive bound of token ids seen in the source's format
  std::string description;  // "text file corpus.txt (312345 bytes)"
};

// Reads `path`: an llm.c token file when it starts with the magic 20240520, otherwise its
// bytes as tokens. Corruption (naming the path and the field) for an llm.c header with a
// wrong version, a token count that disagrees with the file size, or a negative count;
// IOError/NotFound from the file system.
Result<TokenStream> LoadTokens(const std::string& path);

// The built-in corpus: about `bytes` bytes of English-like text (sentences from a small
// grammar with agreement, clauses and punctuation), a pure function of `seed`.
std::string GenerateCorpus(size_t bytes, uint64_t seed);
TokenStream DefaultCorpus();  // GenerateCorpus(400 KiB, seed 1) as byte tokens

// Writes `tokens` as an llm.c token file (for tests and for users converting data).
// InvalidArgument for a token outside [0, 65535].
Status WriteLlmcTokens(const std::string& path, const std::vector<int32_t>& tokens);

// Cuts batches from a stream: [0, train_end) for training, [train_end, N) for validation.
class Batcher {
 public:
  // InvalidArgument when either range is too short for one row of T+1 tokens (naming the
  // sizes), or B, T < 1.
  static Result<Batcher> Create(const TokenStream* stream, int B, int T, double val_fraction = 0.1);
  // Training micro-batch i: inputs/targets of B*T tokens each.
  void TrainBatch(int64_t i, int32_t* inputs, int32_t* targets) const;
  // Validation batch i, by the same rule over the held-out range.
  void ValBatch(int64_t i, int32_t* inputs, int32_t* targets) const;
  int64_t train_tokens() const { return static_cast<int64_t>(train_end_); }
  int64_t val_tokens() const { return static_cast<int64_t>(n_ - train_end_); }

 private:
  void Cut(size_t begin, size_t n, int64_t i, int32_t* inputs, int32_t* targets) const;
  const TokenStream* stream_ = nullptr;
  int B_ = 0, T_ = 0;
  size_t n_ = 0, train_end_ = 0;
};

}  // namespace strata::model
