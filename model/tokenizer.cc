// GPT-2 byte-level BPE from a Hugging Face tokenizer.json; see tokenizer.h.
#include "model/tokenizer.h"

#include <algorithm>
#include <array>
#include <climits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "strata/input_file.h"

namespace strata::model {
namespace {

using json = nlohmann::json;

// The code point at text[i] and its length in bytes; a byte that does not start valid UTF-8
// stands for itself (as U+0080..U+00FF would), with length 1.
std::pair<uint32_t, size_t> NextCodePoint(std::string_view text, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return {c, 1};
  const size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
  if (len == 0 || i + len > text.size()) return {c, 1};
  uint32_t cp = c & (0x7F >> len);
  for (size_t k = 1; k < len; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return {c, 1};
    cp = (cp << 6) | (b(i + k) & 0x3F);
  }
  return {cp, len};
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool IsSpace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}
bool IsNumber(uint32_t cp) {
  return (cp >= '0' && cp <= '9') || cp == 0xB2 || cp == 0xB3 || cp == 0xB9 ||
         (cp >= 0xBC && cp <= 0xBE);
}
bool IsLetter(uint32_t cp) {
  if (cp < 0x80) return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z');
  if (IsSpace(cp) || IsNumber(cp)) return false;
  if (cp >= 0xA1 && cp <= 0xBF) return cp == 0xAA || cp == 0xB5 || cp == 0xBA;
  if (cp == 0xD7 || cp == 0xF7) return false;
  if (cp >= 0x2010 && cp <= 0x205E) return false;
  if (cp >= 0x3000 && cp <= 0x303F) return false;
  return true;
}
enum class CharClass { kSpace, kLetter, kNumber, kOther };
CharClass ClassOf(uint32_t cp) {
  if (IsSpace(cp)) return CharClass::kSpace;
  if (IsLetter(cp)) return CharClass::kLetter;
  if (IsNumber(cp)) return CharClass::kNumber;
  return CharClass::kOther;
}

// Length of the pre-token at text[i] under GPT-2's pattern (see tokenizer.h).
size_t PreTokenLength(std::string_view text, size_t i) {
  const size_t n = text.size();
  if (text[i] == '\'') {
    for (std::string_view c : {"s", "t", "re", "ve", "m", "ll", "d"}) {
      if (text.substr(i + 1, c.size()) == c) return 1 + c.size();
    }
  }
  size_t j = i;
  if (text[i] == ' ' && i + 1 < n &&
      ClassOf(NextCodePoint(text, i + 1).first) != CharClass::kSpace) {
    j = i + 1;  // " ?" of the letter, number and other alternatives
  }
  const CharClass cls = ClassOf(NextCodePoint(text, j).first);
  if (cls != CharClass::kSpace) {
    while (j < n) {
      auto [cp, len] = NextCodePoint(text, j);
      if (ClassOf(cp) != cls) break;
      j += len;
    }
    return j - i;
  }
  // A run of white space: \s+(?!\S) leaves the run's last character to the word after it
  // (when there is one and the run is longer than one character); \s+ takes the rest.
  size_t end = i, last = i;
  while (end < n) {
    auto [cp, len] = NextCodePoint(text, end);
    if (!IsSpace(cp)) break;
    last = end;
    end += len;
  }
  if (end < n && last > i) return last - i;
  return end - i;
}

// GPT-2's bytes_to_unicode: the printable character each byte is written as.
std::array<uint32_t, 256> ByteCodePoints() {
  std::array<uint32_t, 256> cps{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    cps[b] = printable ? b : next++;
  }
  return cps;
}

uint64_t PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

}  // namespace

struct Tokenizer::Impl {
  std::unordered_map<std::string, int32_t> vocab;  // byte-level string -> id
  std::vector<std::string> decoded;                // id -> the bytes it stands for
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // pair -> (rank, id)
  std::vector<std::pair<std::string, int32_t>> added;                // longest first
  std::array<int32_t, 256> byte_id{};  // the id of each byte alone, -1 when missing
  bool add_prefix_space = false;
  bool split = true;  // ByteLevel's use_regex
  mutable std::mutex mu;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;  // pre-token -> ids

  Status EncodeWord(std::string_view word, std::vector<int32_t>* out) const;
};

Status Tokenizer::Impl::EncodeWord(std::string_view word, std::vector<int32_t>* out) const {
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(std::string(word));
    if (it != cache.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return Status::OK();
    }
  }
  std::vector<int32_t> syms;
  for (unsigned char c : word) {
    if (byte_id[c] < 0) {
      return Status::InvalidArgument("the tokenizer's vocabulary has no token for byte " +
                                     std::to_string(c) + "; is it a byte-level BPE (GPT-2) one?");
    }
    syms.push_back(byte_id[c]);
  }
  // Merge the pair of lowest rank, everywhere it occurs, until no pair has a rank.
  while (syms.size() > 1) {
    int32_t best = INT32_MAX, merged = -1;
    uint64_t best_key = 0;
    for (size_t i = 0; i + 1 < syms.size(); ++i) {
      auto it = merges.find(PairKey(syms[i], syms[i + 1]));
      if (it != merges.end() && it->second.first < best) {
        best = it->second.first;
        merged = it->second.second;
        best_key = it->first;
      }
    }
    if (merged < 0) break;
    std::vector<int32_t> next;
    for (size_t i = 0; i < syms.size(); ++i) {
      if (i + 1 < syms.size() && PairKey(syms[i], syms[i + 1]) == best_key) {
        next.push_back(merged);
        ++i;
      } else {
        next.push_back(syms[i]);
      }
    }
    syms.swap(next);
  }
  out->insert(out->end(), syms.begin(), syms.end());
  std::lock_guard<std::mutex> lock(mu);
  cache.emplace(std::string(word), std::move(syms));
  return Status::OK();
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Result<Tokenizer> Tokenizer::Load(const std::string& path) {
  // Hugging Face's tokenizer.json files run to a few MiB (GPT-2's 1.4, Llama 3's 9).
  constexpr uint64_t kMaxTokenizerBytes = uint64_t{256} << 20;
  STRATA_ASSIGN_OR_RETURN(const std::string text,
                          ReadInputFile(path, "tokenizer file", kMaxTokenizerBytes));
  return Parse(text, path);
}

Result<Tokenizer> Tokenizer::Parse(std::string_view text, const std::string& name) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto corrupt = [&](const std::string& what) {
    return Status::Corruption("tokenizer file " + name + ": " + what).WithPath(name);
  };
  if (j.is_discarded() || !j.is_object()) return corrupt("not a JSON object");
  if (!j.contains("model") || !j["model"].is_object()) return corrupt("no \"model\" object");
  const json& m = j["model"];
  if (m.value("type", std::string("BPE")) != "BPE") {
    return Status::NotSupported("tokenizer file " + name + ": model type " +
                                m["type"].get<std::string>() +
                                "; only byte-level BPE (GPT-2) tokenizers are supported");
  }
  if (j.contains("normalizer") && !j["normalizer"].is_null()) {
    return Status::NotSupported("tokenizer file " + name +
                                ": has a normalizer; only GPT-2 style byte-level BPE without one "
                                "is supported");
  }
  auto impl = std::make_unique<Impl>();
  // The ByteLevel pre-tokenizer, alone or in a Sequence.
  const json* byte_level = nullptr;
  if (j.contains("pre_tokenizer") && j["pre_tokenizer"].is_object()) {
    const json& p = j["pre_tokenizer"];
    if (p.value("type", "") == "ByteLevel") byte_level = &p;
    if (p.value("type", "") == "Sequence" && p.contains("pretokenizers")) {
      for (const json& q : p["pretokenizers"]) {
        if (q.value("type", "") == "ByteLevel" && p["pretokenizers"].size() == 1) byte_level = &q;
      }
    }
  }
  if (byte_level == nullptr) {
    return Status::NotSupported("tokenizer file " + name +
                                ": its pre_tokenizer is not ByteLevel; only byte-level BPE "
                                "(GPT-2) tokenizers are supported");
  }
  impl->add_prefix_space = byte_level->value("add_prefix_space", false);
  impl->split = byte_level->value("use_regex", true);

  if (!m.contains("vocab") || !m["vocab"].is_object()) return corrupt("no model.vocab object");
  const std::array<uint32_t, 256> cps = ByteCodePoints();
  std::unordered_map<uint32_t, unsigned char> byte_of;
  for (int b = 0; b < 256; ++b) byte_of[cps[b]] = static_cast<unsigned char>(b);
  auto put = [&](const std::string& token, int32_t id, bool raw) {
    if (static_cast<size_t>(id) >= impl->decoded.size()) impl->decoded.resize(id + 1);
    std::string& bytes = impl->decoded[id];
    if (raw) {
      bytes = token;
      return;
    }
    bytes.clear();
    for (size_t i = 0; i < token.size();) {
      auto [cp, len] = NextCodePoint(token, i);
      auto it = byte_of.find(cp);
      if (it != byte_of.end()) {
        bytes.push_back(static_cast<char>(it->second));
      } else {
        bytes.append(token, i, len);  // not a byte-level character: kept as written
      }
      i += len;
    }
  };
  for (const auto& [token, id] : m["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= INT32_MAX) {
      return corrupt("model.vocab[\"" + token + "\"] is not a token id");
    }
    impl->vocab[token] = id.get<int32_t>();
    put(token, id.get<int32_t>(), false);
  }
  impl->byte_id.fill(-1);
  for (int b = 0; b < 256; ++b) {
    std::string s;
    AppendUtf8(cps[b], &s);
    auto it = impl->vocab.find(s);
    if (it != impl->vocab.end()) impl->byte_id[b] = it->second;
  }
  if (!m.contains("merges") || !m["merges"].is_array()) return corrupt("no model.merges array");
  int32_t rank = 0;
  for (const json& mg : m["merges"]) {
    std::string a, b;
    if (mg.is_string()) {
      const std::string s = mg.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos) return corrupt("merge \"" + s + "\" is not two symbols");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string()) {
      a = mg[0].get<std::string>();
      b = mg[1].get<std::string>();
    } else {
      return corrupt("merge " + std::to_string(rank) + " is neither \"a b\" nor [\"a\", \"b\"]");
    }
    auto ia = impl->vocab.find(a), ib = impl->vocab.find(b), iab = impl->vocab.find(a + b);
    if (ia == impl->vocab.end() || ib == impl->vocab.end() || iab == impl->vocab.end()) {
      return corrupt("merge \"" + a + " " + b + "\" names a symbol missing from model.vocab");
    }
    impl->merges.emplace(PairKey(ia->second, ib->second), std::make_pair(rank++, iab->second));
  }
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const json& t : j["added_tokens"]) {
      if (!t.contains("id") || !t.contains("content") || !t["content"].is_string() ||
          !t["id"].is_number_integer() || t["id"].get<int64_t>() < 0) {
        return corrupt("an added_tokens entry lacks its id or content");
      }
      const std::string content = t["content"].get<std::string>();
      if (content.empty()) continue;
      impl->added.emplace_back(content, t["id"].get<int32_t>());
      put(content, t["id"].get<int32_t>(), true);
    }
    std::stable_sort(impl->added.begin(), impl->added.end(),
                     [](const auto& x, const auto& y) { return x.first.size() > y.first.size(); });
  }
  return Tokenizer(std::move(impl));
}

Result<std::vector<int32_t>> Tokenizer::Encode(std::string_view text) const {
  std::vector<int32_t> ids;
  std::string prefixed;
  if (impl_->add_prefix_space && !text.empty() && text[0] != ' ') {
    prefixed.assign(" ").append(text);
    text = prefixed;
  }
  // Pieces between added tokens are pre-tokenized and merged; added tokens map directly.
  auto encode_piece = [&](std::string_view piece) -> Status {
    for (size_t i = 0; i < piece.size();) {
      const size_t len = impl_->split ? PreTokenLength(piece, i) : piece.size();
      STRATA_RETURN_IF_ERROR(impl_->EncodeWord(piece.substr(i, len), &ids));
      i += len;
    }
    return Status::OK();
  };
  size_t start = 0;
  for (size_t i = 0; i < text.size();) {
    const std::pair<std::string, int32_t>* hit = nullptr;
    for (const auto& a : impl_->added) {
      if (text.substr(i, a.first.size()) == a.first) {
        hit = &a;
        break;
      }
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    STRATA_RETURN_IF_ERROR(encode_piece(text.substr(start, i - start)));
    ids.push_back(hit->second);
    i += hit->first.size();
    start = i;
  }
  STRATA_RETURN_IF_ERROR(encode_piece(text.substr(start)));
  return ids;
}

std::string Tokenizer::Decode(const std::vector<int32_t>& tokens) const {
  std::string out;
  for (int32_t t : tokens) {
    if (t >= 0 && static_cast<size_t>(t) < impl_->decoded.size()) {
      out += impl_->decoded[t];
    } else {
      out.append("<").append(std::to_string(t)).append(">");
    }
  }
  return out;
}

int Tokenizer::vocab_size() const { return static_cast<int>(impl_->decoded.size()); }

}  // namespace strata::model
