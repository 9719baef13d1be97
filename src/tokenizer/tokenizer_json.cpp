#include "tokenizer/tokenizer_json.h"

namespace kestrel::tok {
namespace {

using json = nlohmann::json;

// nlohmann SAX handler: builds the DOM like json::parse, except for model.vocab and
// model.merges, which go straight into TokenizerJson's vectors.
class Handler {
 public:
  explicit Handler(TokenizerJson* out) : out_(out) {}

  bool null() { return Scalar(json(nullptr)); }
  bool boolean(bool v) { return Scalar(json(v)); }
  bool number_integer(json::number_integer_t v) {
    if (mode_ == Mode::kVocab) return VocabId(v);
    return Scalar(json(v));
  }
  bool number_unsigned(json::number_unsigned_t v) {
    if (mode_ == Mode::kVocab) {
      return VocabId(v > static_cast<json::number_unsigned_t>(INT64_MAX) ? -1
                                                                          : static_cast<int64_t>(v));
    }
    return Scalar(json(v));
  }
  bool number_float(json::number_float_t v, const json::string_t&) { return Scalar(json(v)); }
  bool binary(json::binary_t&) { return Fail("unexpected binary value"); }

  bool string(json::string_t& v) {
    if (mode_ == Mode::kMerges) return MergeLine(v);
    if (mode_ == Mode::kMergePair) {
      if (pair_.size() >= 2) return Fail(MergeMessage());
      pair_.push_back(std::move(v));
      return true;
    }
    return Scalar(json(std::move(v)));
  }

  bool key(json::string_t& k) {
    if (mode_ == Mode::kVocab) {
      vocab_key_ = std::move(k);
      return true;
    }
    key_ = std::move(k);
    return true;
  }

  bool start_object(std::size_t) {
    if (mode_ != Mode::kDom) {
      return Fail(mode_ == Mode::kVocab ? VocabMessage() : MergeMessage());
    }
    if (AtModelField("vocab")) {
      mode_ = Mode::kVocab;
      return true;
    }
    json* child = Open(json::object());
    if (child == nullptr) return false;
    if (stack_.size() == 1 && key_ == "model") model_ = child;
    stack_.push_back(child);
    return true;
  }

  bool end_object() {
    if (mode_ == Mode::kVocab) {
      mode_ = Mode::kDom;
      (*stack_.back())["vocab"] = json::object();
      return true;
    }
    stack_.pop_back();
    return true;
  }

  bool start_array(std::size_t) {
    if (mode_ == Mode::kVocab) return Fail(VocabMessage());
    if (mode_ == Mode::kMergePair) return Fail(MergeMessage());
    if (mode_ == Mode::kMerges) {
      mode_ = Mode::kMergePair;
      pair_.clear();
      return true;
    }
    if (AtModelField("merges")) {
      mode_ = Mode::kMerges;
      return true;
    }
    json* child = Open(json::array());
    if (child == nullptr) return false;
    stack_.push_back(child);
    return true;
  }

  bool end_array() {
    if (mode_ == Mode::kMergePair) {
      if (pair_.size() != 2) return Fail(MergeMessage());
      out_->merges.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
      mode_ = Mode::kMerges;
      return true;
    }
    if (mode_ == Mode::kMerges) {
      mode_ = Mode::kDom;
      (*stack_.back())["merges"] = json::array();
      return true;
    }
    stack_.pop_back();
    return true;
  }

  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) {
    status_ = InvalidArgument("not valid JSON (byte " + std::to_string(position) + "): " +
                              e.what());
    return false;
  }

  const Status& status() const { return status_; }

 private:
  enum class Mode { kDom, kVocab, kMerges, kMergePair };

  bool AtModelField(const char* field) const {
    return model_ != nullptr && stack_.size() == 2 && stack_.back() == model_ && key_ == field;
  }

  // Adds a container value to the current parent (or as the root) and returns it.
  json* Open(json&& value) {
    if (stack_.empty()) {
      out_->root = std::move(value);
      return &out_->root;
    }
    json* parent = stack_.back();
    if (parent->is_object()) {
      json& slot = (*parent)[key_];
      slot = std::move(value);
      return &slot;
    }
    parent->push_back(std::move(value));
    return &parent->back();
  }

  bool Scalar(json&& value) {
    if (mode_ == Mode::kVocab) return Fail(VocabMessage());
    if (mode_ != Mode::kDom) return Fail(MergeMessage());
    return Open(std::move(value)) != nullptr;
  }

  bool VocabId(int64_t id) {
    out_->vocab.emplace_back(std::move(vocab_key_), id);
    return true;
  }

  bool MergeLine(const std::string& line) {
    // HF: a legacy merge is exactly two tokens separated by one space.
    const size_t space = line.find(' ');
    if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
      return Fail("merge #" + std::to_string(out_->merges.size() + 1) + " '" + line +
                  "' is not of the form 'a b'");
    }
    out_->merges.emplace_back(line.substr(0, space), line.substr(space + 1));
    return true;
  }

  std::string VocabMessage() const {
    return "model.vocab['" + vocab_key_ + "'] must be a non-negative integer id";
  }
  std::string MergeMessage() const {
    return "merge #" + std::to_string(out_->merges.size() + 1) +
           " must be a string 'a b' or a pair of strings";
  }

  bool Fail(std::string message) {
    status_ = InvalidArgument(std::move(message));
    return false;
  }

  TokenizerJson* out_;
  std::vector<json*> stack_;  // open containers, innermost last
  json* model_ = nullptr;     // the top-level "model" object
  std::string key_;           // key of the next value in the innermost object
  std::string vocab_key_;
  std::vector<std::string> pair_;
  Mode mode_ = Mode::kDom;
  Status status_;
};

}  // namespace

Result<TokenizerJson> ParseTokenizerJson(std::string_view text) {
  TokenizerJson out;
  Handler handler(&out);
  const bool ok = json::sax_parse(text.begin(), text.end(), &handler);
  if (!ok) {
    if (!handler.status().ok()) return handler.status();
    return InvalidArgument("not valid JSON");
  }
  return out;
}

}  // namespace kestrel::tok
