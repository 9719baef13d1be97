#include "server/parsers/parsed_output.h"

#include "core/check.h"

namespace kestrel::server {

void AppendPiece(OutputPieces* pieces, OutputPiece piece) {
  if (piece.text.empty() && !piece.starts_call()) return;
  if (!pieces->empty() && !piece.starts_call()) {
    OutputPiece& last = pieces->back();
    if (last.kind == piece.kind && last.tool_index == piece.tool_index) {
      last.text += piece.text;
      return;
    }
  }
  pieces->push_back(std::move(piece));
}

void AppendText(OutputPieces* pieces, OutputPiece::Kind kind, std::string_view text) {
  KCHECK(kind != OutputPiece::Kind::kToolCall);
  OutputPiece p;
  p.kind = kind;
  p.text = std::string(text);
  AppendPiece(pieces, std::move(p));
}

void AppendToolStart(OutputPieces* pieces, int32_t index, std::string name) {
  KCHECK(!name.empty());
  OutputPiece p;
  p.kind = OutputPiece::Kind::kToolCall;
  p.tool_index = index;
  p.tool_name = std::move(name);
  AppendPiece(pieces, std::move(p));
}

void AppendToolArguments(OutputPieces* pieces, int32_t index, std::string_view fragment) {
  OutputPiece p;
  p.kind = OutputPiece::Kind::kToolCall;
  p.tool_index = index;
  p.text = std::string(fragment);
  AppendPiece(pieces, std::move(p));
}

void ParsedMessage::Add(const OutputPiece& piece) {
  switch (piece.kind) {
    case OutputPiece::Kind::kReasoning:
      reasoning += piece.text;
      break;
    case OutputPiece::Kind::kContent:
      content += piece.text;
      break;
    case OutputPiece::Kind::kToolCall: {
      KCHECK(piece.tool_index >= 0);
      const size_t index = static_cast<size_t>(piece.tool_index);
      if (piece.starts_call()) {
        KCHECK(index == tool_calls.size());
        tool_calls.push_back({piece.tool_name, ""});
      }
      KCHECK(index < tool_calls.size());
      tool_calls[index].arguments += piece.text;
      break;
    }
  }
}

}  // namespace kestrel::server
