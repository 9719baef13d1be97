// A GGUF file's tokenizer metadata (tokenizer.ggml.*, tokenizer.chat_template) as the
// tokenizer.json and tokenizer_config.json Hugging Face would ship for the same model, so that
// one loader (tokenizer_load.cpp) and one chat-template path serve both.
//
// tokenizer.ggml.model must be "gpt2" (byte-level BPE). tokenizer.ggml.pre picks what GGUF does
// not record: the split regex, the NFC normalizer and ignore_merges, as the model's own
// tokenizer.json has them:
//   qwen2, deepseek-r1-qwen   Qwen2/2.5/3 regex (digits one by one), NFC
//   qwen35                    Qwen3.5 regex (marks joined to letters), NFC
//   llama-bpe, llama3, ...    Llama 3 regex (digits in threes), ignore_merges
// Token types: CONTROL tokens become special added tokens, USER_DEFINED ones non-special added
// tokens (both matched before BPE), UNUSED padding entries are left out.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "core/gguf.h"
#include "core/status.h"

namespace kestrel::tok {

struct GgufTokenizerFiles {
  nlohmann::json tokenizer;         // tokenizer.json
  nlohmann::json tokenizer_config;  // bos/eos tokens, add_bos_token, chat_template
};

Result<GgufTokenizerFiles> TokenizerFilesFromGguf(const GgufFile& g);
// Only the tokenizer_config.json part (bos/eos token strings, add_bos_token, chat_template): what
// the chat template needs, without rewriting the vocabulary.
Result<nlohmann::json> TokenizerConfigFromGguf(const GgufFile& g);

}  // namespace kestrel::tok
