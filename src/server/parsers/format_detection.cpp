// Which tool-call and reasoning formats a chat template uses: it is rendered with a probe
// conversation (a tool call with a known name and argument, reasoning with a known text), and
// where the template puts them names the format.
#include "server/parsers/output_parser.h"
#include "tokenizer/chat_template.h"

namespace kestrel::server {
namespace {

using Json = nlohmann::ordered_json;

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";

// Names no real conversation contains, so the rendered text shows where the template put them.
constexpr const char* kProbeFunction = "kestrel_probe_fn";
constexpr const char* kProbeArgument = "kestrel_probe_arg";
constexpr const char* kProbeReasoning = "kestrel-probe-reasoning";

Json ProbeTools() {
  return Json::parse(R"([{"type": "function", "function": {"name": "kestrel_probe_fn",
      "description": "probe", "parameters": {"type": "object",
      "properties": {"kestrel_probe_arg": {"type": "string"}}, "required": []}}}])");
}

Json ProbeMessages(bool with_tool_result) {
  Json messages = Json::parse(R"([{"role": "user", "content": "kestrel-probe-question"},
      {"role": "assistant", "content": "", "reasoning_content": "kestrel-probe-reasoning",
       "tool_calls": [{"id": "call_probe", "type": "function", "function": {
         "name": "kestrel_probe_fn", "arguments": {"kestrel_probe_arg": "v"}}}]}])");
  if (with_tool_result) {
    messages.push_back(Json{
        {"role", "tool"}, {"tool_call_id", "call_probe"}, {"content", "kestrel-probe-result"}});
  }
  return messages;
}

}  // namespace

OutputFormats DetectOutputFormats(const ChatTemplate& chat_template) {
  OutputFormats formats;
  // Some templates insist on a tool result after a call, others on ending with the assistant.
  Result<std::string> rendered = chat_template.Render(
      ProbeMessages(true), ProbeTools(), /*add_generation_prompt=*/true, Json::object());
  if (!rendered.ok()) {
    rendered = chat_template.Render(ProbeMessages(false), ProbeTools(),
                                    /*add_generation_prompt=*/false, Json::object());
  }
  if (!rendered.ok()) return formats;
  const std::string& text = *rendered;
  const std::string function(kProbeFunction);
  if (text.find("<function=" + function + ">") != std::string::npos) {
    formats.tool_calls = ToolCallFormat::kQwen3Coder;
  } else if (text.find("<tool_call>") != std::string::npos &&
             text.find("\"" + function + "\"") != std::string::npos) {
    formats.tool_calls = ToolCallFormat::kHermes;
  } else if (text.find("\"name\": \"" + function + "\"") != std::string::npos &&
             text.find(kProbeArgument) != std::string::npos) {
    formats.tool_calls = ToolCallFormat::kLlama3Json;
  }
  const size_t reasoning = text.find(kProbeReasoning);
  const size_t open = text.rfind(kThinkOpen, reasoning);
  formats.reasoning = (reasoning != std::string::npos && open != std::string::npos &&
                       text.find(kThinkClose, reasoning) != std::string::npos) ||
                      PromptOpensReasoning(text);
  return formats;
}

}  // namespace kestrel::server
