// The OpenAI Responses API (POST /v1/responses): the request converted to a chat request
// (instructions, input string or items: messages, function_call, function_call_output,
// reasoning; function tools; tool_choice; previous_response_id from the ResponseStore), and the
// answer built from the engine's events: a `response` object, or its SSE events
// (response.created, response.in_progress, response.output_item.added / .done,
// response.content_part.added / .done, response.output_text.delta / .done,
// response.reasoning_text.delta / .done, response.function_call_arguments.delta / .done,
// response.completed or response.incomplete), numbered by sequence_number.
// Output items follow the parser's pieces: a reasoning item, a message item, a function_call
// item per call; a change of kind starts the next item. Streamed and non-streamed answers build
// the same items from the same pieces. Pure (the store is passed in).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "server/choice_output.h"
#include "server/openai_request.h"
#include "server/response_store.h"

namespace kestrel::server {

struct ResponsesRequest {
  ChatRequest chat;   // instructions + the previous conversation + the input
  Json conversation;  // the same without instructions: what a follow-up continues
  std::string previous_response_id;
  bool store = true;
  Json echo = Json::object();  // request fields the response object repeats
};

// `store` resolves previous_response_id (400 previous_response_not_found when unknown).
std::optional<ApiError> ParseResponsesRequest(const Json& body, const ParseContext& ctx,
                                              ResponseStore& store, ResponsesRequest* out);

struct ResponsesMeta {
  std::string id;  // "resp_..."
  int64_t created_at = 0;
  std::string model;
  Json echo = Json::object();  // ResponsesRequest::echo
  OutputParserOptions parsing;
  Json conversation;               // stored with the output when `store` is set
  ResponseStore* store = nullptr;  // null: store false
};

// The answer of one response, streamed or not: Start/Add return SSE frames when streaming; a
// non-streamed answer returns its body from the Add of the finished event. A finished response
// is stored (when meta.store is set) before the last bytes are returned.
class ResponsesEncoder {
 public:
  ResponsesEncoder(ResponsesMeta meta, bool stream);
  ~ResponsesEncoder();
  std::string Start();
  std::string Add(const RequestOutput& event);
  bool finished() const { return finished_; }
  // The response object so far (status in_progress until the finished event).
  Json ResponseJson() const;

 private:
  struct Item;
  std::string Event(Json event);
  std::string OpenItem(const OutputPiece& piece);
  std::string CloseItem();
  Json ItemJson(const Item& item, bool done) const;
  void Store(const Json& response) const;

  ResponsesMeta meta_;
  bool stream_;
  ChoiceOutput output_;
  std::vector<Item> items_;
  bool item_open_ = false;
  int64_t sequence_ = 0;
  bool finished_ = false;
  std::string status_ = "in_progress";
};

}  // namespace kestrel::server
