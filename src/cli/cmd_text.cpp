// Verbs that need only the tokenizer files: tokenize (and --decode) and render-chat.
// Both read JSON lines on stdin and write one JSON line per input line; a bad line gets
// {"error": "..."} and the verb exits 1 at the end, having answered every line.
#include <iostream>
#include <string>
#include <vector>

#include "cli/common.h"
#include "cli/verbs.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace kestrel::cli {
namespace {

using nlohmann::json;

json ErrorLine(const std::string& message) { return json{{"error", message}}; }

// Parses one input line as a JSON object, or explains why not.
Result<json> ParseLine(const std::string& line) {
  json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument("input line is not valid JSON");
  if (!j.is_object()) return InvalidArgument("input line must be a JSON object");
  return j;
}

json TokenizeLine(const Tokenizer& tok, const json& in, bool decode) {
  if (decode) {
    auto it = in.find("ids");
    if (it == in.end() || !it->is_array()) return ErrorLine("expected {\"ids\": [...]}");
    std::vector<int32_t> ids;
    for (const json& v : *it) {
      if (!v.is_number_integer()) return ErrorLine("ids must be integers");
      int64_t id = v.get<int64_t>();
      if (id < 0 || id >= tok.vocab_size()) {
        return ErrorLine("token id " + std::to_string(id) + " outside the vocabulary [0, " +
                         std::to_string(tok.vocab_size()) + ")");
      }
      ids.push_back(static_cast<int32_t>(id));
    }
    return json{{"text", tok.Decode(ids, /*skip_special=*/false)}};
  }
  auto it = in.find("text");
  if (it == in.end() || !it->is_string()) return ErrorLine("expected {\"text\": \"...\"}");
  return json{{"ids", tok.Encode(it->get<std::string>(), /*add_special_tokens=*/false)}};
}

// Request JSON keeps its key order (ordered_json): templates print tool schemas with tojson,
// and transformers keeps the order the caller wrote.
json RenderLine(const ChatTemplate& tmpl, const std::string& line) {
  using ojson = nlohmann::ordered_json;
  ojson in = ojson::parse(line, nullptr, /*allow_exceptions=*/false);
  if (in.is_discarded()) return ErrorLine("input line is not valid JSON");
  if (!in.is_object()) return ErrorLine("input line must be a JSON object");
  auto messages = in.find("messages");
  if (messages == in.end() || !messages->is_array()) return ErrorLine("expected \"messages\": [...]");
  ojson tools = in.value("tools", ojson(nullptr));
  if (!tools.is_null() && !tools.is_array()) return ErrorLine("\"tools\" must be an array or null");
  ojson agp = in.value("add_generation_prompt", ojson(false));
  if (!agp.is_boolean()) return ErrorLine("\"add_generation_prompt\" must be a boolean");
  ojson kwargs = in.value("kwargs", ojson::object());
  if (kwargs.is_null()) kwargs = ojson::object();
  if (!kwargs.is_object()) return ErrorLine("\"kwargs\" must be an object");
  Result<std::string> r = tmpl.Render(*messages, tools, agp.get<bool>(), kwargs);
  if (!r.ok()) return ErrorLine(r.status().message());
  return json{{"rendered", *r}};
}

// Drives a JSON-lines loop over raw lines; returns the exit code.
template <class Fn>
int JsonLinesLoop(Fn&& handle_line) {
  std::string line;
  bool any_error = false;
  while (std::getline(std::cin, line)) {
    if (line.empty() || line == "\r") continue;
    json out = handle_line(line);
    any_error |= out.contains("error");
    WriteLine(DumpJson(out));
  }
  return any_error ? 1 : 0;
}

}  // namespace

void RegisterTokenize(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand(
      "tokenize", "JSON lines {\"text\"} -> {\"ids\"} (no special tokens added); --decode reverses");
  static std::string model_storage;
  auto* model = &model_storage;
  static bool decode_storage = false;
  auto* decode = &decode_storage;
  cmd->add_option("--model", *model, "Model directory (needs only tokenizer files)");
  cmd->add_flag("--decode", *decode, "Read {\"ids\": [...]} and write {\"text\": ...}");
  cmd->callback([&exit_code, model, decode] {
    std::string dir = ResolveModelDir(*model);
    if (Status s = CheckModelDir(dir); !s.ok()) {
      exit_code = Fail(s);
      return;
    }
    Result<Tokenizer> tok = Tokenizer::FromDirectory(dir);
    if (!tok.ok()) {
      exit_code = Fail(tok.status());
      return;
    }
    exit_code = JsonLinesLoop([&](const std::string& line) {
      Result<json> in = ParseLine(line);
      return in.ok() ? TokenizeLine(*tok, *in, *decode) : ErrorLine(in.status().message());
    });
  });
}

void RegisterRenderChat(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand(
      "render-chat", "JSON lines {messages, tools, add_generation_prompt, kwargs} -> {\"rendered\"}");
  static std::string model_storage;
  auto* model = &model_storage;
  cmd->add_option("--model", *model, "Model directory (needs only tokenizer files)");
  cmd->callback([&exit_code, model] {
    std::string dir = ResolveModelDir(*model);
    if (Status s = CheckModelDir(dir); !s.ok()) {
      exit_code = Fail(s);
      return;
    }
    Result<ChatTemplate> tmpl = ChatTemplate::FromDirectory(dir);
    if (!tmpl.ok()) {
      exit_code = Fail(tmpl.status());
      return;
    }
    exit_code = JsonLinesLoop([&](const std::string& line) { return RenderLine(*tmpl, line); });
  });
}

}  // namespace kestrel::cli
