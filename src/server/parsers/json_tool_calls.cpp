// The JSON tool-call formats: Hermes/Qwen3 (<tool_call>{...}</tool_call> anywhere in the text)
// and Llama 3 ({"name", "parameters"} objects at the start of the output, optionally after
// <|python_tag|>, separated by ';'). Both read a call's head ({"name": "f", "arguments": ) and
// then stream the arguments object byte for byte until its closing brace.
#include <string>

#include "server/parsers/text_scan.h"
#include "server/parsers/tool_call_parser.h"

namespace kestrel::server::parsers {
namespace {

constexpr std::string_view kToolCallOpen = "<tool_call>";
constexpr std::string_view kToolCallClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";

using Kind = OutputPiece::Kind;

void EmitCall(const ParsedToolCall& call, int32_t index, OutputPieces* out) {
  AppendToolStart(out, index, call.name);
  AppendToolArguments(out, index, call.arguments);
}

class HermesParser final : public ToolCallParser {
 public:
  void Feed(std::string_view text, OutputPieces* out) override {
    buf_.append(text);
    while (Step(out)) {
    }
  }

  void Finish(OutputPieces* out) override {
    switch (state_) {
      case State::kText:
        AppendText(out, Kind::kContent, buf_);
        break;
      case State::kHead:
      case State::kBuffered:
        Resolve(buf_, /*closed=*/false, out);
        break;
      case State::kArguments:  // truncated arguments: what was streamed stays
      case State::kTail:
        break;
    }
    buf_.clear();
    state_ = State::kText;
  }

 private:
  enum class State {
    kText,       // content; looking for <tool_call>
    kHead,       // after <tool_call>: reading {"name": ..., "arguments":
    kArguments,  // streaming the arguments object
    kTail,       // after the arguments: skipping to </tool_call>
    kBuffered,   // a call that does not stream: waiting for </tool_call>
  };

  // One transition; false when more text is needed.
  bool Step(OutputPieces* out) {
    size_t hold = 0;
    switch (state_) {
      case State::kText: {
        const size_t pos = FindTag(buf_, kToolCallOpen, &hold);
        if (pos == std::string::npos) {
          AppendText(out, Kind::kContent, std::string_view(buf_).substr(0, buf_.size() - hold));
          buf_.erase(0, buf_.size() - hold);
          return false;
        }
        AppendText(out, Kind::kContent, std::string_view(buf_).substr(0, pos));
        buf_.erase(0, pos + kToolCallOpen.size());
        state_ = State::kHead;
        return true;
      }
      case State::kHead: {
        CallHead head;
        const Match m = MatchJsonCallHead(buf_, &head);
        // The call ends at the first closing tag: one inside the head (in the name) makes the
        // body a call that does not stream, whatever the split of the text.
        const size_t close = buf_.find(kToolCallClose);
        if (m == Match::kYes && (close == std::string::npos || close >= head.args_offset)) {
          AppendToolStart(out, n_calls_, head.name);
          buf_.erase(0, head.args_offset);
          args_ = JsonValueScanner();
          state_ = State::kArguments;
          return true;
        }
        if (m != Match::kNeedMore || close != std::string::npos) {
          state_ = State::kBuffered;
          return true;
        }
        return false;
      }
      case State::kArguments: {
        const size_t n = args_.Scan(buf_);
        AppendToolArguments(out, n_calls_, std::string_view(buf_).substr(0, n));
        buf_.erase(0, n);
        if (!args_.done()) return false;
        ++n_calls_;
        state_ = State::kTail;
        return true;
      }
      case State::kTail: {
        // Normally just "}\n"; anything else before the closing tag is dropped.
        const size_t pos = FindTag(buf_, kToolCallClose, &hold);
        if (pos == std::string::npos) {
          buf_.erase(0, buf_.size() - hold);
          return false;
        }
        buf_.erase(0, pos + kToolCallClose.size());
        state_ = State::kText;
        return true;
      }
      case State::kBuffered: {
        const size_t pos = buf_.find(kToolCallClose);
        if (pos == std::string::npos) return false;
        Resolve(std::string_view(buf_).substr(0, pos), /*closed=*/true, out);
        buf_.erase(0, pos + kToolCallClose.size());
        state_ = State::kText;
        return true;
      }
    }
    return false;
  }

  // A call body read whole: a call when it is one, else the text as content (tags included).
  void Resolve(std::string_view body, bool closed, OutputPieces* out) {
    if (std::optional<ParsedToolCall> call = ToolCallFromJson(body)) {
      EmitCall(*call, n_calls_++, out);
      return;
    }
    std::string text(kToolCallOpen);
    text += body;
    if (closed) text += kToolCallClose;
    AppendText(out, Kind::kContent, text);
  }

  State state_ = State::kText;
  std::string buf_;  // text not yet turned into pieces
  JsonValueScanner args_;
  int32_t n_calls_ = 0;
};

class Llama3JsonParser final : public ToolCallParser {
 public:
  void Feed(std::string_view text, OutputPieces* out) override {
    buf_.append(text);
    while (Step(out, /*final=*/false)) {
    }
  }

  void Finish(OutputPieces* out) override {
    while (Step(out, /*final=*/true)) {
    }
    switch (state_) {
      case State::kStart:
      case State::kContent:
        AppendText(out, Kind::kContent, buf_);
        break;
      case State::kHead:
      case State::kBuffered:
        // Not complete, so not a call: shown as content when nothing was called before.
        if (n_calls_ == 0) AppendText(out, Kind::kContent, buf_);
        break;
      case State::kArguments:
      case State::kTail:
      case State::kBetween:
        break;
    }
    buf_.clear();
  }

 private:
  enum class State {
    kStart,      // deciding: a call starts with <|python_tag|> or '{', anything else is content
    kContent,    // plain text to the end
    kHead,       // reading {"name": ..., "parameters": at head_pos_
    kArguments,  // streaming the arguments object
    kTail,       // the rest of the call object after its arguments
    kBetween,    // after a call: ';' and spaces, then another call or the end
    kBuffered,   // a call that does not stream: reading the whole object at head_pos_
  };

  bool Step(OutputPieces* out, bool final) {
    switch (state_) {
      case State::kStart: {
        // Text stays in buf_ until a call is certain, so it can still become content.
        const size_t i = SkipSpace(buf_, 0);
        const std::string_view rest = std::string_view(buf_).substr(i);
        if (rest.empty()) return false;
        if (rest.starts_with(kPythonTag)) {
          head_pos_ = i + kPythonTag.size();
          state_ = State::kHead;
          return true;
        }
        if (rest.size() < kPythonTag.size() && kPythonTag.starts_with(rest) && !final) {
          return false;
        }
        if (rest[0] == '{') {
          head_pos_ = i;
          state_ = State::kHead;
          return true;
        }
        state_ = State::kContent;
        return true;
      }
      case State::kContent:
        AppendText(out, Kind::kContent, buf_);
        buf_.clear();
        return false;
      case State::kHead: {
        CallHead head;
        const Match m = MatchJsonCallHead(std::string_view(buf_).substr(head_pos_), &head);
        if (m == Match::kNeedMore) return false;
        if (m == Match::kNo) {
          const size_t open = SkipSpace(buf_, head_pos_);
          if (open == buf_.size() || buf_[open] != '{') {
            state_ = State::kContent;  // <|python_tag|> followed by code, not JSON
            return true;
          }
          object_ = JsonValueScanner();
          scanned_ = head_pos_;
          state_ = State::kBuffered;
          return true;
        }
        AppendToolStart(out, n_calls_, head.name);
        buf_.erase(0, head_pos_ + head.args_offset);
        args_ = JsonValueScanner();
        state_ = State::kArguments;
        return true;
      }
      case State::kArguments: {
        const size_t n = args_.Scan(buf_);
        AppendToolArguments(out, n_calls_, std::string_view(buf_).substr(0, n));
        buf_.erase(0, n);
        if (!args_.done()) return false;
        ++n_calls_;
        object_ = JsonValueScanner(/*depth=*/1);  // inside the call object
        state_ = State::kTail;
        return true;
      }
      case State::kTail: {
        const size_t n = object_.Scan(buf_);
        buf_.erase(0, n);
        if (!object_.done()) return false;
        state_ = State::kBetween;
        return true;
      }
      case State::kBetween: {
        size_t i = SkipSpace(buf_, 0);
        if (i < buf_.size() && buf_[i] == ';') i = SkipSpace(buf_, i + 1);
        if (i == buf_.size()) return false;  // spaces and ';' are held until more comes
        if (buf_[i] == '{') {
          buf_.erase(0, i);
          head_pos_ = 0;
          state_ = State::kHead;
        } else {
          state_ = State::kContent;  // text after the calls
        }
        return true;
      }
      case State::kBuffered: {
        scanned_ += object_.Scan(std::string_view(buf_).substr(scanned_));
        if (!object_.done()) return false;
        std::optional<ParsedToolCall> call =
            ToolCallFromJson(std::string_view(buf_).substr(head_pos_, scanned_ - head_pos_));
        if (!call) {
          // Not a tool call (a JSON answer, say): the text is content from here on.
          state_ = State::kContent;
          return true;
        }
        EmitCall(*call, n_calls_++, out);
        buf_.erase(0, scanned_);
        state_ = State::kBetween;
        return true;
      }
    }
    return false;
  }

  State state_ = State::kStart;
  std::string buf_;
  size_t head_pos_ = 0;  // where the current call object starts in buf_
  size_t scanned_ = 0;   // kBuffered: bytes of buf_ the object scanner has seen
  JsonValueScanner args_, object_;
  int32_t n_calls_ = 0;
};

}  // namespace

std::unique_ptr<ToolCallParser> MakeHermesParser() {
  return std::make_unique<HermesParser>();
}

std::unique_ptr<ToolCallParser> MakeLlama3JsonParser() {
  return std::make_unique<Llama3JsonParser>();
}

}  // namespace kestrel::server::parsers
