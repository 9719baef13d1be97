// Kestrel's tokenizer against Hugging Face tokenizers 0.23 on the real Qwen3 and Llama 3
// tokenizer.json. Goldens: tests/data/tokenizer/golden_{qwen3,llama3}.jsonl, line-aligned with
// corpus.jsonl, written by tools/golden_tokenizer.py (or tools/golden_tokenizer_node.js).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"
#include "tokenizer_test_util.h"

namespace kestrel {
namespace {

using testing::LoadRealTokenizer;
using testing::ReadCorpus;
using testing::ReadJsonl;
using testing::SourcePath;

std::string Preview(const std::string& s) {
  std::string out = s.substr(0, 80);
  return nlohmann::json(out).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// ids[from, from + 24) as text.
std::string IdsToString(const std::vector<int32_t>& ids, size_t from) {
  std::string out = from > 0 ? "[...," : "[";
  for (size_t i = from; i < ids.size() && i < from + 24; ++i) {
    if (i > from) out += ',';
    out += std::to_string(ids[i]);
  }
  out += ids.size() > from + 24 ? ",...]" : "]";
  return out;
}

size_t FirstDifference(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

void CheckGolden(const std::string& name, bool nfc) {
  auto tok = LoadRealTokenizer(name);
  ASSERT_NE(tok, nullptr);
  const std::string golden_path = SourcePath("tests/data/tokenizer/golden_" + name + ".jsonl");
  ASSERT_TRUE(FileExists(golden_path))
      << golden_path << " is missing: generate it with tools/golden_tokenizer.py --tokenizer-dir "
      << "tests/data/npm/" << name << " --name " << name
      << " --corpus tests/data/tokenizer/corpus.jsonl --out " << golden_path;
  const std::vector<std::string> texts = ReadCorpus();
  const std::vector<nlohmann::json> golden = ReadJsonl(golden_path);
  ASSERT_GE(texts.size(), 2500u);
  ASSERT_EQ(golden.size(), texts.size()) << golden_path << " is not line-aligned with the corpus";

  size_t n_id_mismatch = 0, n_decode_mismatch = 0, n_roundtrip_mismatch = 0, n_hf_roundtrip = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::string& text = texts[i];
    const auto want_ids = golden[i].at("ids").get<std::vector<int32_t>>();
    const auto want_decoded = golden[i].at("decoded").get<std::string>();
    const std::vector<int32_t> ids = tok->Encode(text);
    if (ids != want_ids) {
      if (++n_id_mismatch <= 10) {
        const size_t at = FirstDifference(ids, want_ids);
        const size_t from = at > 4 ? at - 4 : 0;
        ADD_FAILURE() << name << " line " << i + 1 << " " << Preview(text)
                      << "\n  first difference at token " << at << "\n  want "
                      << IdsToString(want_ids, from) << "\n  got  " << IdsToString(ids, from);
      }
    }
    const std::string decoded = tok->Decode(want_ids);
    if (decoded != want_decoded && ++n_decode_mismatch <= 10) {
      ADD_FAILURE() << name << " line " << i + 1 << ": decode(golden ids) " << Preview(decoded)
                    << " != " << Preview(want_decoded);
    }
    // Round trip, wherever HF's own round trip holds.
    std::string expected = text;
    if (nfc) tok::NfcNormalize(text, &expected);
    if (want_decoded == expected) {
      ++n_hf_roundtrip;
      const std::string round = tok->Decode(ids);
      if (round != expected && ++n_roundtrip_mismatch <= 10) {
        ADD_FAILURE() << name << " line " << i + 1 << ": round trip " << Preview(round)
                      << " != " << Preview(expected);
      }
    }
  }
  EXPECT_EQ(n_id_mismatch, 0u) << name << ": lines whose ids differ from HF";
  EXPECT_EQ(n_decode_mismatch, 0u) << name << ": lines whose decode differs from HF";
  EXPECT_EQ(n_roundtrip_mismatch, 0u) << name << ": lines whose round trip differs";
  // Byte-level BPE is lossless: HF round-trips every line of the corpus.
  EXPECT_EQ(n_hf_roundtrip, texts.size());
}

TEST(TokenizerGolden, Qwen3MatchesHuggingFace) { CheckGolden("qwen3", /*nfc=*/true); }

TEST(TokenizerGolden, Llama3MatchesHuggingFace) { CheckGolden("llama3", /*nfc=*/false); }

// Streaming detokenization of every corpus line, one token at a time: the concatenation equals
// Decode, and no chunk ends inside a code point.
void CheckStreaming(const std::string& name) {
  auto tok = LoadRealTokenizer(name);
  ASSERT_NE(tok, nullptr);
  size_t n_lines = 0;
  for (const std::string& text : ReadCorpus()) {
    const std::vector<int32_t> ids = tok->Encode(text);
    StreamingDetokenizer stream(tok);
    std::string joined;
    for (const int32_t id : ids) {
      const std::string chunk = stream.Push(id);
      ASSERT_TRUE(tok::IsValidUtf8(chunk)) << name << ": chunk is not valid UTF-8 in "
                                           << Preview(text);
      joined += chunk;
    }
    joined += stream.Finish();
    ASSERT_EQ(joined, tok->Decode(ids)) << name << ": " << Preview(text);
    ++n_lines;
  }
  EXPECT_GE(n_lines, 2500u);
}

TEST(TokenizerGolden, Qwen3StreamingEqualsDecode) { CheckStreaming("qwen3"); }

TEST(TokenizerGolden, Llama3StreamingEqualsDecode) { CheckStreaming("llama3"); }

}  // namespace
}  // namespace kestrel
