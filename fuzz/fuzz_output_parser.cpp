// libFuzzer target: the output parsers (reasoning + every tool-call format) over arbitrary model
// text must never crash or hang, must produce a well-formed piece stream (calls start in order,
// fragments follow their start), and must give the same message however the text is split into
// deltas (the split points come from the input too).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "server/parsers/output_parser.h"

namespace {

using kestrel::server::OutputParser;
using kestrel::server::OutputParserOptions;
using kestrel::server::OutputPiece;
using kestrel::server::OutputPieces;
using kestrel::server::ParsedMessage;
using kestrel::server::ToolCallFormat;

ParsedMessage Run(const OutputParserOptions& options, const std::vector<std::string_view>& parts) {
  OutputParser parser(options);
  OutputPieces pieces;
  for (std::string_view part : parts) parser.Feed(part, &pieces);
  parser.Finish(&pieces);
  ParsedMessage m;
  int32_t n_started = 0;
  for (const OutputPiece& p : pieces) {
    if (p.kind == OutputPiece::Kind::kToolCall) {
      if (p.starts_call() ? p.tool_index != n_started++ : p.tool_index >= n_started) std::abort();
    }
    m.Add(p);  // KCHECKs the indexes too
  }
  if (parser.n_tool_calls() != static_cast<int32_t>(m.tool_calls.size())) std::abort();
  return m;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  // Byte 0: the format and the reasoning options; byte 1: the split stride.
  OutputParserOptions options;
  options.tool_calls = static_cast<ToolCallFormat>(data[0] % 4);
  options.reasoning = (data[0] & 4) != 0;
  options.starts_in_reasoning = (data[0] & 8) != 0;
  options.parallel_tool_calls = (data[0] & 16) == 0;
  options.tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {
      "name": "f", "parameters": {"type": "object", "properties": {"n": {"type": "integer"},
      "o": {"type": "object"}, "b": {"type": "boolean"}}}}}])");
  const size_t stride = 1 + data[1] % 16;
  const std::string_view text(reinterpret_cast<const char*>(data + 2), size - 2);

  const ParsedMessage whole = Run(options, {text});
  std::vector<std::string_view> parts;
  for (size_t pos = 0; pos < text.size(); pos += stride) parts.push_back(text.substr(pos, stride));
  if (!(Run(options, parts) == whole)) std::abort();
  return 0;
}
