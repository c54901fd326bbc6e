// A GPT-2 byte-level BPE tokenizer read from a Hugging Face `tokenizer.json` (the file the
// `tokenizers` library writes next to GPT-2 weights), for text given to `strata generate`,
// `strata eval` and `strata train --data`.
//
// Encoding, as GPT-2 does it:
//   1. added tokens (e.g. "<|endoftext|>") are cut out of the text and map to their ids;
//   2. the rest is split into pre-tokens by GPT-2's pattern
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      (a leading space stays with the word after it; of a run of spaces before a word,
//      the last one goes with the word);
//   3. each pre-token's bytes become printable characters (GPT-2's bytes_to_unicode table:
//      '!'..'~', U+00A1..U+00AC, U+00AE..U+00FF stand for themselves, every other byte b for
//      U+0100 + its rank among those), and the merges are applied, lowest rank first, until
//      none applies; each resulting symbol is looked up in the vocabulary.
// Decoding concatenates the tokens' strings and maps the characters back to bytes.
//
// Character classes: ASCII exactly; beyond ASCII, Unicode white space is \s, the Latin-1
// superscripts and fractions are \p{N}, Latin-1 and general punctuation/symbols
// (U+00A1..U+00BF, U+00D7, U+00F7, U+2010..U+205E, U+3000..U+303F) are neither, and every
// other code point counts as a letter. Text in scripts whose digits or punctuation lie
// elsewhere may therefore split differently from Hugging Face's (still a valid encoding that
// decodes to the same bytes, only not the canonical one).
//
// A Tokenizer is immutable after Load; Encode and Decode are const and safe to call from
// several threads, except that Encode fills a per-object cache under a mutex.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "strata/status.h"

namespace strata::model {

class Tokenizer {
 public:
  // Reads `path`. Errors: NotFound/IOError from the file system; Corruption naming the path
  // and the field for a file that is not JSON or lacks model.vocab / model.merges, a merge
  // of symbols missing from the vocabulary; NotSupported for a model other than BPE or a
  // pre-tokenizer other than ByteLevel (e.g. SentencePiece files).
  static Result<Tokenizer> Load(const std::string& path);
  // The same from the file's text; `name` stands for the path in messages.
  static Result<Tokenizer> Parse(std::string_view json, const std::string& name);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Token ids of `text`. InvalidArgument when a symbol is missing from the vocabulary (a
  // vocabulary without all 256 byte characters), naming it.
  Result<std::vector<int32_t>> Encode(std::string_view text) const;
  // The bytes of `tokens`; an id outside the vocabulary is written as "<id>".
  std::string Decode(const std::vector<int32_t>& tokens) const;
  // One more than the largest id (vocabulary and added tokens).
  int vocab_size() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::model
