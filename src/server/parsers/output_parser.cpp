#include "server/parsers/output_parser.h"

#include "server/parsers/text_scan.h"

namespace kestrel::server {
namespace {

using Json = nlohmann::ordered_json;
using Kind = OutputPiece::Kind;
using parsers::FindTag;
using parsers::IsJsonSpace;
using parsers::SkipSpace;

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";

}  // namespace

bool PromptOpensReasoning(std::string_view prompt) {
  while (!prompt.empty() && IsJsonSpace(prompt.back())) prompt.remove_suffix(1);
  return prompt.ends_with(kThinkOpen);
}

// ---- ReasoningParser ----

ReasoningParser::ReasoningParser(bool starts_in_reasoning)
    : state_(starts_in_reasoning ? State::kReasoning : State::kStart) {}

void ReasoningParser::Feed(std::string_view text, OutputPieces* out) {
  buf_.append(text);
  while (Step(out)) {
  }
}

bool ReasoningParser::Step(OutputPieces* out) {
  switch (state_) {
    case State::kStart: {
      const size_t i = SkipSpace(buf_, 0);
      const std::string_view rest = std::string_view(buf_).substr(i);
      if (rest.starts_with(kThinkOpen)) {
        buf_.erase(0, i + kThinkOpen.size());
        state_ = State::kReasoning;
        return true;
      }
      if (rest.size() < kThinkOpen.size() && kThinkOpen.starts_with(rest)) return false;
      state_ = State::kContent;
      return true;
    }
    case State::kReasoning: {
      size_t hold = 0;
      const size_t pos = FindTag(buf_, kThinkClose, &hold);
      if (pos == std::string::npos) {
        AppendText(out, Kind::kReasoning, std::string_view(buf_).substr(0, buf_.size() - hold));
        buf_.erase(0, buf_.size() - hold);
        return false;
      }
      AppendText(out, Kind::kReasoning, std::string_view(buf_).substr(0, pos));
      buf_.erase(0, pos + kThinkClose.size());
      state_ = State::kAfterReasoning;
      return true;
    }
    case State::kAfterReasoning: {
      const size_t i = SkipSpace(buf_, 0);
      buf_.erase(0, i);
      if (buf_.empty()) return false;
      state_ = State::kContent;
      return true;
    }
    case State::kContent:
      AppendText(out, Kind::kContent, buf_);
      buf_.clear();
      return false;
  }
  return false;
}

void ReasoningParser::Finish(OutputPieces* out) {
  if (state_ == State::kReasoning) {
    AppendText(out, Kind::kReasoning, buf_);
  } else if (state_ != State::kAfterReasoning) {
    AppendText(out, Kind::kContent, buf_);
  }
  buf_.clear();
}

// ---- OutputParser ----

OutputParser::OutputParser(const OutputParserOptions& options)
    : parallel_tool_calls_(options.parallel_tool_calls),
      tools_(MakeToolCallParser(options.tool_calls, options.tools)) {
  if (options.reasoning) {
    reasoning_ = std::make_unique<ReasoningParser>(options.starts_in_reasoning);
  }
}

OutputParser::~OutputParser() = default;
OutputParser::OutputParser(OutputParser&&) noexcept = default;
OutputParser& OutputParser::operator=(OutputParser&&) noexcept = default;

void OutputParser::Feed(std::string_view text, OutputPieces* out) {
  if (reasoning_ == nullptr) {
    scratch_a_.clear();
    AppendText(&scratch_a_, Kind::kContent, text);
    return Route(scratch_a_, out);
  }
  scratch_a_.clear();
  reasoning_->Feed(text, &scratch_a_);
  Route(scratch_a_, out);
}

void OutputParser::Finish(OutputPieces* out) {
  if (reasoning_ != nullptr) {
    scratch_a_.clear();
    reasoning_->Finish(&scratch_a_);
    Route(scratch_a_, out);
  }
  if (tools_ != nullptr) {
    scratch_b_.clear();
    tools_->Finish(&scratch_b_);
    Filter(scratch_b_, out);
    if (n_tool_calls_ == 0) AppendText(out, Kind::kContent, pending_space_);
    pending_space_.clear();
  }
}

void OutputParser::Route(const OutputPieces& pieces, OutputPieces* out) {
  for (const OutputPiece& piece : pieces) {
    if (piece.kind != Kind::kContent || tools_ == nullptr) {
      AppendPiece(out, piece);
      continue;
    }
    scratch_b_.clear();
    tools_->Feed(piece.text, &scratch_b_);
    Filter(scratch_b_, out);
  }
}

void OutputParser::Filter(const OutputPieces& pieces, OutputPieces* out) {
  for (const OutputPiece& piece : pieces) {
    if (piece.kind == Kind::kToolCall) {
      if (!parallel_tool_calls_ && piece.tool_index > 0) continue;
      if (piece.starts_call()) {
        pending_space_.clear();
        ++n_tool_calls_;
      }
      AppendPiece(out, piece);
      continue;
    }
    if (piece.kind != Kind::kContent) {
      AppendPiece(out, piece);
      continue;
    }
    pending_space_ += piece.text;
    size_t end = pending_space_.size();
    while (end > 0 && IsJsonSpace(pending_space_[end - 1])) --end;
    if (end == 0) continue;
    AppendText(out, Kind::kContent, std::string_view(pending_space_).substr(0, end));
    pending_space_.erase(0, end);
  }
}

// ---- formats ----

const char* ToolCallFormatName(ToolCallFormat f) {
  switch (f) {
    case ToolCallFormat::kNone:
      return "none";
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kQwen3Coder:
      return "qwen3_coder";
    case ToolCallFormat::kLlama3Json:
      return "llama3_json";
  }
  return "none";
}

bool ParseToolCallFormat(std::string_view name, ToolCallFormat* out) {
  for (ToolCallFormat f : {ToolCallFormat::kNone, ToolCallFormat::kHermes,
                           ToolCallFormat::kQwen3Coder, ToolCallFormat::kLlama3Json}) {
    if (name == ToolCallFormatName(f)) {
      *out = f;
      return true;
    }
  }
  return false;
}

std::unique_ptr<ToolCallParser> MakeToolCallParser(ToolCallFormat format, const Json& tools) {
  switch (format) {
    case ToolCallFormat::kNone:
      return nullptr;
    case ToolCallFormat::kHermes:
      return parsers::MakeHermesParser();
    case ToolCallFormat::kQwen3Coder:
      return parsers::MakeQwen3CoderParser(tools);
    case ToolCallFormat::kLlama3Json:
      return parsers::MakeLlama3JsonParser();
  }
  return nullptr;
}

}  // namespace kestrel::server
