// Known encodings on the real Qwen3 / Llama 3 tokenizers (ids checked against HF tokenizers
// 0.23), special tokens, decoding, streaming, config and concurrency.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"
#include "tokenizer_test_util.h"

namespace kestrel {
namespace {

using Ids = std::vector<int32_t>;
using testing::LoadRealTokenizer;

struct Case {
  const char* text;
  Ids ids;
};

TEST(TokenizerReal, Qwen3KnownEncodings) {
  auto tok = LoadRealTokenizer("qwen3");
  ASSERT_NE(tok, nullptr);
  const std::vector<Case> cases = {
      {"Hello world", {9707, 1879}},
      {"I'LL don't 'Re", {40, 6, 4086, 1513, 944, 364, 693}},
      {"  x\n\n\ty", {220, 856, 271, 14522}},
      {"12345", {16, 17, 18, 19, 20}},  // one digit per pre-token
      {"\xC3\xA9", {963}},               // é precomposed
      {"e\xCC\x81", {963}},              // e + U+0301: NFC composes it first
      {"<|im_start|>user\nhi<|im_end|>", {151644, 872, 198, 6023, 151645}},
      {"<|im_start", {27, 91, 318, 4906}},  // partial special token: plain text
      {"<think>\n</think>", {151667, 198, 151668}},
      {"a\xE3\x80\x80\xE3\x80\x80" "b", {64, 22441, 22441, 65}},  // U+3000 is \s
      {"na\xC3\xAFve caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xF0\x9F\x87\xAF\xF0\x9F\x87\xB5",
       {3376, 37572, 586, 51950, 75402, 21894, 102819, 11162, 229, 107, 145516}},
      {"", {}},
  };
  for (const Case& c : cases) EXPECT_EQ(tok->Encode(c.text), c.ids) << c.text;
  EXPECT_EQ(tok->vocab_size(), 151669);
}

TEST(TokenizerReal, Llama3KnownEncodings) {
  auto tok = LoadRealTokenizer("llama3");
  ASSERT_NE(tok, nullptr);
  const std::vector<Case> cases = {
      {"Hello world", {9906, 1917}},
      {"I'LL don't 'Re", {40, 6, 4178, 1541, 956, 364, 697}},
      {"12345", {4513, 1774}},  // up to three digits per pre-token
      {"\xC3\xA9", {978}},
      {"e\xCC\x81", {68, 54939}},  // no normalizer: stays decomposed
      {"<|begin_of_text|>Hi<|eot_id|>", {128000, 13347, 128009}},
      {"<|im_start|>user\nhi<|im_end|>",  // not special for Llama 3
       {27, 91, 318, 5011, 91, 29, 882, 198, 6151, 27, 91, 318, 6345, 91, 29}},
      {"a\xC2\xA0" "b", {64, 115648}},  // ignore_merges: "\u00a0b" is itself a token
      {"<think>\n</think>", {14023, 771, 397, 524, 27963, 29}},
      {"na\xC3\xAFve caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xF0\x9F\x87\xAF\xF0\x9F\x87\xB5",
       {3458, 38672, 588, 53050, 105180, 102158, 11410, 229, 107, 9468, 229, 113}},
  };
  for (const Case& c : cases) EXPECT_EQ(tok->Encode(c.text), c.ids) << c.text;
  EXPECT_EQ(tok->vocab_size(), 128256);
}

TEST(TokenizerReal, SpecialTokensAndVocabularyLookups) {
  auto qwen = LoadRealTokenizer("qwen3");
  ASSERT_NE(qwen, nullptr);
  EXPECT_EQ(qwen->TokenToId("<|im_end|>"), std::optional<int32_t>(151645));
  EXPECT_EQ(qwen->TokenToId("\xC4\xA0world"), std::optional<int32_t>(1879));  // "Ġworld"
  EXPECT_EQ(qwen->TokenToId("no such token \x01"), std::nullopt);
  EXPECT_EQ(qwen->IdToToken(1879), "\xC4\xA0world");
  EXPECT_EQ(qwen->IdToToken(151644), "<|im_start|>");
  EXPECT_EQ(qwen->IdToToken(-1), "");
  EXPECT_EQ(qwen->IdToToken(1 << 30), "");
  EXPECT_TRUE(qwen->IsSpecial(151645));
  EXPECT_FALSE(qwen->IsSpecial(151667));  // <think> is an added, non-special token
  EXPECT_FALSE(qwen->IsSpecial(9707));
  EXPECT_EQ(qwen->TokenBytes(1879), " world");
  EXPECT_EQ(qwen->TokenBytes(151645), "<|im_end|>");

  const Ids ids = {151644, 872, 151667, 151645, 9707};
  EXPECT_EQ(qwen->Decode(ids), "<|im_start|>user<think><|im_end|>Hello");
  EXPECT_EQ(qwen->Decode(ids, /*skip_special=*/true), "user<think>Hello");
  // Unknown ids are dropped, as HF does.
  EXPECT_EQ(qwen->Decode(Ids{999999, 9707, 0, -5}), "Hello!");
}

TEST(TokenizerReal, DecodeIsLossyLikeHuggingFace) {
  auto tok = LoadRealTokenizer("llama3");
  ASSERT_NE(tok, nullptr);
  // "👍" is three tokens in Llama 3: F0 9F / 91 / 8D.
  EXPECT_EQ(tok->Decode(Ids{9468, 239}), "\xEF\xBF\xBD");  // truncated: one U+FFFD
  EXPECT_EQ(tok->Decode(Ids{239}), "\xEF\xBF\xBD");        // lone continuation byte
  EXPECT_EQ(tok->Decode(Ids{9468, 239, 235}), "\xF0\x9F\x91\x8D");
  EXPECT_EQ(tok->Decode(Ids{9468, 239, 235, 9468}), "\xF0\x9F\x91\x8D\xEF\xBF\xBD");
  EXPECT_EQ(tok->Decode(Ids{239, 9468}), "\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(TokenizerReal, StreamingNeverSplitsCodePoints) {
  auto tok = LoadRealTokenizer("llama3");
  ASSERT_NE(tok, nullptr);
  // Multi-byte text whose characters span several tokens each.
  const std::string text =
      "\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E "
      "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7 "
      "\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4 \xD9\x85\xD8\xB1\xD8\xAD\xD8\xA8\xD8\xA7";
  const Ids ids = tok->Encode(text);
  ASSERT_GT(ids.size(), 10u);
  StreamingDetokenizer stream(tok);
  std::string joined;
  size_t n_empty = 0;
  for (const int32_t id : ids) {
    const std::string chunk = stream.Push(id);
    EXPECT_TRUE(tok::IsValidUtf8(chunk));
    EXPECT_EQ(chunk.find("\xEF\xBF\xBD"), std::string::npos) << "no replacement mid-stream";
    if (chunk.empty()) ++n_empty;
    joined += chunk;
  }
  joined += stream.Finish();
  EXPECT_EQ(joined, text);
  EXPECT_GT(n_empty, 0u) << "some tokens end inside a code point and must be held back";

  // An incomplete tail is flushed by Finish as U+FFFD, as HF decode does.
  StreamingDetokenizer partial(tok);
  EXPECT_EQ(partial.Push(9468), "");
  EXPECT_EQ(partial.Push(239), "");
  EXPECT_EQ(partial.Finish(), "\xEF\xBF\xBD");
  // A byte that can never start a character is emitted at once.
  StreamingDetokenizer bad(tok);
  EXPECT_EQ(bad.Push(239), "\xEF\xBF\xBD");
  EXPECT_EQ(bad.Push(9906), "Hello");
}

TEST(TokenizerReal, StreamingSkipsSpecialTokensWhenAsked) {
  auto tok = LoadRealTokenizer("qwen3");
  ASSERT_NE(tok, nullptr);
  StreamingDetokenizer stream(tok, /*skip_special=*/true);
  std::string out;
  for (const int32_t id : Ids{151644, 872, 151667, 151645, 9707}) out += stream.Push(id);
  out += stream.Finish();
  EXPECT_EQ(out, "user<think>Hello");
}

TEST(TokenizerReal, InvalidUtf8InputIsRepairedNotFatal) {
  auto tok = LoadRealTokenizer("llama3");
  ASSERT_NE(tok, nullptr);
  // Invalid bytes become U+FFFD first (String::from_utf8_lossy), then encode as HF would.
  EXPECT_EQ(tok->Encode("a\xFF" "b"), (Ids{64, 5809, 65}));
  EXPECT_EQ(tok->Encode("a\xE4\xB8" "b"), (Ids{64, 5809, 65}));  // one maximal subpart
  EXPECT_EQ(tok->Encode("\xED\xA0\x80"), tok->Encode("\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"));
  EXPECT_EQ(tok->Encode(std::string("\x00\x80\xC0", 3)),
            tok->Encode(std::string("\x00\xEF\xBF\xBD\xEF\xBF\xBD", 7)));
}

TEST(TokenizerReal, ConfigTokens) {
  auto qwen = LoadRealTokenizer("qwen3");
  auto llama = LoadRealTokenizer("llama3");
  ASSERT_TRUE(qwen != nullptr && llama != nullptr);
  EXPECT_EQ(qwen->bos_token(), "");  // null in tokenizer_config.json
  EXPECT_EQ(qwen->eos_token(), "<|im_end|>");
  EXPECT_FALSE(qwen->add_bos_token());
  EXPECT_EQ(llama->bos_token(), "<|begin_of_text|>");
  EXPECT_EQ(llama->eos_token(), "<|end_of_text|>");
  EXPECT_FALSE(llama->add_bos_token());
  // This Llama 3 tokenizer.json's post-processor is ByteLevel only: no BOS is added.
  EXPECT_EQ(llama->Encode("Hi", /*add_special_tokens=*/true), (Ids{13347}));
}

TEST(TokenizerReal, ConcurrentEncodeMatchesSingleThread) {
  auto tok = LoadRealTokenizer("qwen3");
  ASSERT_NE(tok, nullptr);
  const std::vector<std::string> texts = testing::ReadCorpus();
  std::vector<Ids> expected;
  for (const std::string& t : texts) expected.push_back(tok->Encode(t));
  constexpr int kThreads = 4;
  std::vector<int> n_mismatch(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Different start offsets so that the threads' caches see words in different orders.
      for (size_t k = 0; k < texts.size(); ++k) {
        const size_t i = (k + t * texts.size() / kThreads) % texts.size();
        if (tok->Encode(texts[i]) != expected[i]) ++n_mismatch[t];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(n_mismatch[t], 0) << "thread " << t;
}

TEST(TokenizerReal, MissingDirectoryIsNotFound) {
  auto tok = Tokenizer::FromDirectory(testing::SourcePath("tests/data/no-such-tokenizer"));
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), StatusCode::kNotFound);
  EXPECT_NE(tok.status().message().find("tokenizer.json"), std::string::npos);
}

}  // namespace
}  // namespace kestrel
