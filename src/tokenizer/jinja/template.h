// A compiled jinja2 template, rendered the way transformers renders chat templates:
// ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, loopcontrols) with
// tojson = json.dumps(ensure_ascii=False), raise_exception and strftime_now.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "core/status.h"
#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/interp.h"
#include "tokenizer/jinja/value.h"

namespace kestrel::jinja {

class Template {
 public:
  // Fails on any syntax error, unknown tag, or unknown filter / test.
  static Result<std::unique_ptr<Template>> Parse(std::string_view source);

  // `context` is a dict of template variables. A raise_exception() in the template comes back
  // as an InvalidArgument Status whose message is the exception's message, verbatim; other
  // render errors (undefined values misused, type errors, limits) are InvalidArgument too.
  Result<std::string> Render(const Value& context, const RenderLimits& limits = {}) const;

 private:
  Template() = default;
  StmtList body_;
};

}  // namespace kestrel::jinja
