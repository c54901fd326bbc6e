#include "model/data.h"

#include <cstdio>
#include <cstring>
#include <fstream>

#include "strata/input_file.h"
#include "strata/log.h"

namespace strata::model {
namespace {

constexpr int32_t kLlmcMagic = 20240520;
constexpr int kLlmcHeaderInts = 256;
// Above this share of control bytes a "text" file is almost surely binary.
constexpr double kMaxNonTextShare = 0.05;

// splitmix64: a tiny, portable generator, so the corpus is the same on every platform.
struct Rng {
  uint64_t s;
  uint64_t Next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  size_t Pick(size_t n) { return static_cast<size_t>(Next() % n); }
  template <size_t N>
  const char* Of(const char* const (&a)[N]) {
    return a[Pick(N)];
  }
};

// The grammar: subjects agree with verbs in number; optional adjectives, adverbs,
// prepositional phrases and subordinate clauses; questions and quoted speech now and then.
const char* const kNamesSg[] = {"the cat",     "a small dog",  "the old man", "my sister",
                                "the teacher", "a young girl", "the king",    "our neighbour",
                                "the farmer",  "a tired bird", "the baker",   "the captain"};
const char* const kNamesPl[] = {"the children", "two cats",   "the soldiers", "my friends",
                                "the farmers",  "many birds", "the students", "our parents"};
const char* const kVerbsSg[] = {"sees",      "likes",  "finds",  "carries", "watches", "follows",
                                "remembers", "paints", "builds", "loves",   "wants",   "opens"};
const char* const kVerbsPl[] = {"see",      "like",  "find",  "carry", "watch", "follow",
                                "remember", "paint", "build", "love",  "want",  "open"};
const char* const kIntransSg[] = {"sleeps", "sings", "waits", "laughs", "runs", "smiles"};
const char* const kIntransPl[] = {"sleep", "sing", "wait", "laugh", "run", "smile"};
const char* const kAdj[] = {"red",  "quiet",   "green",  "heavy",  "bright", "little",
                            "warm", "strange", "wooden", "golden", "broken", "happy"};
const char* const kObjects[] = {"apple",  "house", "river", "letter", "garden", "boat",
                                "window", "song",  "book",  "bridge", "lamp",   "story"};
const char* const kAdverbs[] = {"slowly",   "quietly", "again",     "every morning",
                                "at night", "today",   "with care", "without a word"};
const char* const kPreps[] = {"near", "behind", "under", "beside", "across", "inside"};
const char* const kConj[] = {"because", "while", "when", "although", "after"};

void Capitalize(std::string* s, size_t at) {
  if (at < s->size() && (*s)[at] >= 'a' && (*s)[at] <= 'z') (*s)[at] -= 32;
}

void NounPhrase(Rng& r, std::string* out) {
  out->append(r.Pick(2) ? "the " : "a ");
  if (r.Pick(2)) {
    out->append(r.Of(kAdj));
    out->push_back(' ');
  }
  out->append(r.Of(kObjects));
}

void Clause(Rng& r, std::string* out) {
  const bool plural = r.Pick(3) == 0;
  out->append(plural ? r.Of(kNamesPl) : r.Of(kNamesSg));
  out->push_back(' ');
  if (r.Pick(4) == 0) {
    out->append(plural ? r.Of(kIntransPl) : r.Of(kIntransSg));
  } else {
    out->append(plural ? r.Of(kVerbsPl) : r.Of(kVerbsSg));
    out->push_back(' ');
    NounPhrase(r, out);
  }
  if (r.Pick(3) == 0) {
    out->push_back(' ');
    out->append(r.Of(kPreps));
    out->push_back(' ');
    NounPhrase(r, out);
  }
  if (r.Pick(3) == 0) {
    out->push_back(' ');
    out->append(r.Of(kAdverbs));
  }
}

void Sentence(Rng& r, std::string* out) {
  const size_t start = out->size();
  const size_t kind = r.Pick(10);
  if (kind == 0) {
    out->append("\"");
    Clause(r, out);
    Capitalize(out, start + 1);
    out->append(",\" said ");
    out->append(r.Of(kNamesSg));
    out->append(".");
    return;
  }
  if (kind == 1) {
    out->append(r.Pick(2) ? "does " : "why does ");
    out->append(r.Of(kNamesSg));
    out->push_back(' ');
    out->append(r.Of(kVerbsPl));
    out->push_back(' ');
    NounPhrase(r, out);
    out->append("?");
    Capitalize(out, start);
    return;
  }
  Clause(r, out);
  if (r.Pick(3) == 0) {
    out->push_back(' ');
    out->append(r.Of(kConj));
    out->push_back(' ');
    Clause(r, out);
  }
  out->append(".");
  Capitalize(out, start);
}

}  // namespace

std::string GenerateCorpus(size_t bytes, uint64_t seed) {
  Rng r{seed};
  std::string out;
  out.reserve(bytes + 256);
  while (out.size() < bytes) {
    const size_t sentences = 2 + r.Pick(4);
    for (size_t i = 0; i < sentences && out.size() < bytes; ++i) {
      if (i) out.push_back(' ');
      Sentence(r, &out);
    }
    out.push_back('\n');
  }
  out.resize(bytes);
  return out;
}

TokenStream DefaultCorpus() {
  const std::string text = GenerateCorpus(400 * 1024, 1);
  TokenStream s;
  s.tokens.assign(text.begin(), text.end());
  for (int32_t& t : s.tokens) t &= 0xff;
  s.vocab = 256;
  s.description = "built-in corpus (" + std::to_string(text.size()) + " bytes, seed 1)";
  return s;
}

namespace {

// The whole of `path`, which must be a regular file (a folder, a FIFO or a device is
// refused by name rather than read until something gives way).
Result<std::string> ReadDataFile(const std::string& path) {
  Result<std::string> bytes = ReadInputFile(path, "data file");
  if (bytes.ok()) return std::move(bytes).value();
  if (bytes.status().code() != StatusCode::kInvalidArgument) return bytes.status();
  return Status::InvalidArgument(bytes.status().message() +
                                 "; give a text file or an llm.c token file")
      .WithPath(path);
}

// The share of bytes that plain text (UTF-8 included) never holds: control characters other
// than tab, newline, carriage return and form feed.
double NonTextShare(const std::string& bytes) {
  if (bytes.empty()) return 0;
  size_t odd = 0;
  for (unsigned char c : bytes) {
    if ((c < 0x20 && c != '\t' && c != '\n' && c != '\r' && c != '\f') || c == 0x7f) ++odd;
  }
  return static_cast<double>(odd) / static_cast<double>(bytes.size());
}

}  // namespace

Result<TokenStream> LoadTokens(const std::string& path) {
  Result<std::string> read = ReadDataFile(path);
  if (!read.ok()) return read.status();
  const std::string& bytes = *read;
  TokenStream s;
  int32_t header[kLlmcHeaderInts] = {};
  if (bytes.size() >= sizeof(int32_t)) std::memcpy(header, bytes.data(), sizeof(int32_t));
  if (bytes.size() >= sizeof(int32_t) && header[0] == kLlmcMagic) {
    if (bytes.size() < sizeof(header)) {
      return Status::Corruption("llm.c token file " + path + " is " + std::to_string(bytes.size()) +
                                " bytes, shorter than its " + std::to_string(sizeof(header)) +
                                "-byte header")
          .WithPath(path);
    }
    std::memcpy(header, bytes.data(), sizeof(header));
    if (header[1] != 1) {
      return Status::Corruption("llm.c token file " + path + " has version " +
                                std::to_string(header[1]) + "; only version 1 (uint16 tokens) " +
                                "is supported")
          .WithPath(path);
    }
    const int64_t count = header[2];
    const uint64_t payload = bytes.size() - sizeof(header);
    if (count < 0 || static_cast<uint64_t>(count) * 2 != payload) {
      return Status::Corruption("llm.c token file " + path + ": header says " +
                                std::to_string(count) + " tokens (" + std::to_string(count * 2) +
                                " bytes) but " + std::to_string(payload) +
                                " bytes follow the header")
          .WithPath(path);
    }
    s.tokens.resize(static_cast<size_t>(count));
    const auto* p = reinterpret_cast<const uint8_t*>(bytes.data()) + sizeof(header);
    int32_t max_tok = 0;
    for (int64_t i = 0; i < count; ++i) {
      s.tokens[i] = p[2 * i] | (p[2 * i + 1] << 8);
      max_tok = std::max(max_tok, s.tokens[i]);
    }
    s.vocab = max_tok + 1;
    s.description = "llm.c token file " + path + " (" + std::to_string(count) + " tokens)";
    return s;
  }
  const double odd = NonTextShare(bytes);
  if (odd > kMaxNonTextShare) {
    LogWarning("data file " + path +
               " does not look like text: " + std::to_string(static_cast<int>(odd * 100)) +
               "% of its bytes are control characters; training on its raw bytes anyway (give "
               "a text file or an llm.c token file)");
  }
  s.tokens.assign(bytes.begin(), bytes.end());
  for (int32_t& t : s.tokens) t &= 0xff;
  s.vocab = 256;
  s.description = "text file " + path + " (" + std::to_string(bytes.size()) + " bytes)";
  return s;
}

Status WriteLlmcTokens(const std::string& path, const std::vector<int32_t>& tokens) {
  int32_t header[kLlmcHeaderInts] = {};
  header[0] = kLlmcMagic;
  header[1] = 1;
  header[2] = static_cast<int32_t>(tokens.size());
  std::string out(reinterpret_cast<const char*>(header), sizeof(header));
  for (int32_t t : tokens) {
    if (t < 0 || t > 65535) {
      return Status::InvalidArgument("token " + std::to_string(t) +
                                     " does not fit an llm.c uint16 token file");
    }
    out.push_back(static_cast<char>(t & 0xff));
    out.push_back(static_cast<char>(t >> 8));
  }
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(out.data(), static_cast<std::streamsize>(out.size()));
  f.close();
  if (!f) return Status::IOError("write " + path).WithPath(path);
  return Status::OK();
}

Result<Batcher> Batcher::Create(const TokenStream* stream, int B, int T, double val_fraction) {
  if (B < 1 || T < 1) {
    return Status::InvalidArgument("batch rows and sequence length must be >= 1 (got B=" +
                                   std::to_string(B) + ", T=" + std::to_string(T) + ")");
  }
  Batcher b;
  b.stream_ = stream;
  b.B_ = B;
  b.T_ = T;
  b.n_ = stream->tokens.size();
  b.train_end_ = b.n_ - static_cast<size_t>(static_cast<double>(b.n_) * val_fraction);
  const size_t need = static_cast<size_t>(T) + 2;
  if (b.train_end_ < need || (val_fraction > 0 && b.n_ - b.train_end_ < need)) {
    return Status::InvalidArgument(
        "data " + stream->description + " is too short for sequence length " + std::to_string(T) +
        ": the training range (" + std::to_string(b.train_end_) +
        " tokens) and the held-out tail (" + std::to_string(b.n_ - b.train_end_) +
        " tokens) each need at least " + std::to_string(need) +
        "; use a longer file or a smaller --seq-len");
  }
  return b;
}

void Batcher::Cut(size_t begin, size_t n, int64_t i, int32_t* inputs, int32_t* targets) const {
  const uint64_t span = n - static_cast<size_t>(T_) - 1;
  for (int r = 0; r < B_; ++r) {
    const uint64_t o =
        ((static_cast<uint64_t>(i) * B_ + static_cast<uint64_t>(r)) * static_cast<uint64_t>(T_)) %
        span;
    const int32_t* src = stream_->tokens.data() + begin + o;
    std::memcpy(inputs + static_cast<size_t>(r) * T_, src, sizeof(int32_t) * T_);
    std::memcpy(targets + static_cast<size_t>(r) * T_, src + 1, sizeof(int32_t) * T_);
  }
}

void Batcher::TrainBatch(int64_t i, int32_t* inputs, int32_t* targets) const {
  Cut(0, train_end_, i, inputs, targets);
}

void Batcher::ValBatch(int64_t i, int32_t* inputs, int32_t* targets) const {
  Cut(train_end_, n_ - train_end_, i, inputs, targets);
}

}  // namespace strata::model
