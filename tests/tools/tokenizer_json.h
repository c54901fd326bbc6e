// A small GPT-2 byte-level BPE tokenizer.json for the CLI tests: bytes are ids 0..255 (each
// as GPT-2's printable stand-in character) and `merges` add ids from 256 in order.
#pragma once

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace strata::testing {

// `merges`: ("Ġ t", "Ġt") pairs of the merge rule and the token it makes.
inline void WriteByteLevelTokenizer(
    const std::string& path, const std::vector<std::pair<std::string, std::string>>& merges) {
  nlohmann::json vocab = nlohmann::json::object();
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const int cp = printable ? b : next++;
    std::string s;
    if (cp < 0x80) {
      s.push_back(static_cast<char>(cp));
    } else {
      s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
    vocab[s] = b;
  }
  nlohmann::json rules = nlohmann::json::array();
  int id = 256;
  for (const auto& [rule, token] : merges) {
    rules.push_back(rule);
    vocab[token] = id++;
  }
  nlohmann::json j = {{"pre_tokenizer", {{"type", "ByteLevel"}}},
                      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", rules}}}};
  std::ofstream(path) << j.dump();
}

}  // namespace strata::testing
