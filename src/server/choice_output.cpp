#include "server/choice_output.h"

#include <random>

namespace kestrel::server {

std::string RandomId(const std::string& prefix) {
  static constexpr char kAlphabet[] =
      "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_int_distribution<size_t> pick(0, sizeof(kAlphabet) - 2);
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += kAlphabet[pick(rng)];
  return id;
}

ChoiceOutput::ChoiceOutput(const OutputParserOptions& options, std::string tool_id_prefix)
    : parser_(options), tool_id_prefix_(std::move(tool_id_prefix)) {}

const OutputPieces& ChoiceOutput::Add(const RequestOutput& event) {
  pieces_.clear();
  if (finished_) return pieces_;
  parser_.Feed(event.text, &pieces_);
  if (event.finished) {
    parser_.Finish(&pieces_);
    finished_ = true;
    finish_reason_ = event.finish_reason;
    stop_index_ = event.stop_index;
  }
  usage_ = event.usage;
  for (const OutputPiece& p : pieces_) {
    if (p.starts_call()) tool_ids_.push_back(RandomId(tool_id_prefix_));
  }
  message_.Add(pieces_);
  return pieces_;
}

}  // namespace kestrel::server
