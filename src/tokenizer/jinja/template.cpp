#include "tokenizer/jinja/template.h"

#include <exception>
#include <new>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/lexer.h"
#include "tokenizer/jinja/parser.h"

namespace kestrel::jinja {

// The interpreter reports errors by throwing jinja::Error (it keeps deep recursive evaluation
// readable); this is the one place they are turned into a Status.
Result<std::unique_ptr<Template>> Template::Parse(std::string_view source) {
  try {
    std::unique_ptr<Template> t(new Template());
    t->body_ = jinja::Parse(Tokenize(source));
    return t;
  } catch (const Error& e) {
    return InvalidArgument(e.what());
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("out of memory while parsing the template");
  } catch (const std::exception& e) {
    return InvalidArgument(std::string("template error: ") + e.what());
  }
}

Result<std::string> Template::Render(const Value& context, const RenderLimits& limits) const {
  try {
    auto globals = std::make_shared<Scope>(nullptr);
    AddGlobals(*globals);
    auto root = std::make_shared<Scope>(globals);
    if (context.is_dict()) {
      for (const auto& [k, v] : context.dict().entries()) root->Set(ToStr(k), v);
    }
    Interp interp(limits);
    return interp.Render(body_, root);
  } catch (const RaisedError& e) {
    return InvalidArgument(e.what());
  } catch (const Error& e) {
    return InvalidArgument(e.what());
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("out of memory while rendering the template");
  } catch (const std::exception& e) {
    return InvalidArgument(std::string("template error: ") + e.what());
  }
}

}  // namespace kestrel::jinja
