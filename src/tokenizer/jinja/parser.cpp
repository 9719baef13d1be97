#include "tokenizer/jinja/parser.h"

#include <algorithm>
#include <initializer_list>
#include <string_view>

namespace kestrel::jinja {

namespace {

constexpr int kMaxNesting = 200;  // expression / block nesting; deeper templates are refused

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  StmtList ParseTemplate() { return Subparse({}); }

 private:
  // ---------------------------------------------------------------- token stream

  const Token& Cur() const { return tokens_[pos_]; }
  const Token& Look() const { return tokens_[std::min(pos_ + 1, tokens_.size() - 1)]; }
  void Next() {
    if (pos_ + 1 < tokens_.size()) ++pos_;
  }
  bool IsOp(std::string_view op) const {
    return Cur().type == TokenType::kOperator && Cur().value == op;
  }
  bool IsName(std::string_view name) const {
    return Cur().type == TokenType::kName && Cur().value == name;
  }
  bool SkipOp(std::string_view op) {
    if (!IsOp(op)) return false;
    Next();
    return true;
  }
  bool SkipName(std::string_view name) {
    if (!IsName(name)) return false;
    Next();
    return true;
  }

  [[noreturn]] void Fail(const std::string& msg, int line = 0) const {
    throw Error("template syntax error (line " + std::to_string(line ? line : Cur().line) +
                "): " + msg);
  }

  static std::string Describe(const Token& t) {
    switch (t.type) {
      case TokenType::kText:
        return "template data";
      case TokenType::kVariableBegin:
        return "begin of print statement";
      case TokenType::kVariableEnd:
        return "end of print statement";
      case TokenType::kBlockBegin:
        return "begin of statement block";
      case TokenType::kBlockEnd:
        return "end of statement block";
      case TokenType::kString:
        return "string";
      case TokenType::kInteger:
        return "integer";
      case TokenType::kFloat:
        return "float";
      case TokenType::kEof:
        return "end of template";
      default:
        return t.value;
    }
  }

  void ExpectOp(std::string_view op) {
    if (!SkipOp(op))
      Fail("expected token '" + std::string(op) + "', got '" + Describe(Cur()) + "'");
  }
  void ExpectName(std::string_view name) {
    if (!SkipName(name)) {
      Fail("expected token '" + std::string(name) + "', got '" + Describe(Cur()) + "'");
    }
  }
  std::string ExpectAnyName() {
    if (Cur().type != TokenType::kName) Fail("expected name, got '" + Describe(Cur()) + "'");
    std::string v = Cur().value;
    Next();
    return v;
  }
  void Expect(TokenType type) {
    if (Cur().type != type) {
      Token want;
      want.type = type;
      Fail("expected token '" + Describe(want) + "', got '" + Describe(Cur()) + "'");
    }
    Next();
  }

  struct DepthGuard {
    explicit DepthGuard(Parser* p) : p_(p) {
      if (++p_->depth_ > kMaxNesting) p_->Fail("template nested too deeply");
    }
    ~DepthGuard() { --p_->depth_; }
    Parser* p_;
  };

  ExprPtr Make(ExprKind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  // ---------------------------------------------------------------- statements

  StmtList Subparse(std::initializer_list<std::string_view> end_tokens) {
    DepthGuard guard(this);
    StmtList body;
    while (Cur().type != TokenType::kEof) {
      const Token& t = Cur();
      if (t.type == TokenType::kText) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kText;
        s->line = t.line;
        s->text = t.value;
        body.push_back(std::move(s));
        Next();
      } else if (t.type == TokenType::kVariableBegin) {
        Next();
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kOutput;
        s->line = Cur().line;
        s->expr = ParseTuple(false, true, {}, false);
        Expect(TokenType::kVariableEnd);
        body.push_back(std::move(s));
      } else if (t.type == TokenType::kBlockBegin) {
        Next();
        if (Cur().type == TokenType::kName &&
            std::find(end_tokens.begin(), end_tokens.end(), Cur().value) != end_tokens.end()) {
          return body;
        }
        ParseStatement(&body);
        Expect(TokenType::kBlockEnd);
      } else {
        Fail("unexpected '" + Describe(t) + "'");
      }
    }
    if (end_tokens.size() != 0) {
      std::string want;
      for (auto e : end_tokens) want += (want.empty() ? "'" : " or '") + std::string(e) + "'";
      Fail("Unexpected end of template. Jinja was looking for the following tags: " + want + ".");
    }
    return body;
  }

  // Parses the body after a statement head: block_end, statements, up to an end tag (the
  // current token is then that tag's name).
  StmtList ParseBody(std::initializer_list<std::string_view> end_tokens, bool drop_needle) {
    SkipOp(":");
    Expect(TokenType::kBlockEnd);
    StmtList body = Subparse(end_tokens);
    if (drop_needle) Next();
    return body;
  }

  void ParseStatement(StmtList* out) {
    if (Cur().type != TokenType::kName) Fail("tag name expected");
    const std::string tag = Cur().value;
    const int line = Cur().line;
    auto s = std::make_unique<Stmt>();
    s->line = line;
    if (tag == "for") {
      ParseFor(s.get());
    } else if (tag == "if") {
      ParseIf(s.get());
    } else if (tag == "set") {
      ParseSet(s.get());
    } else if (tag == "macro") {
      ParseMacro(s.get());
    } else if (tag == "call") {
      ParseCallBlock(s.get());
    } else if (tag == "filter") {
      Next();
      s->kind = StmtKind::kFilterBlock;
      s->expr = ParseFilterChain(nullptr, true);
      s->body = ParseBody({"endfilter"}, true);
    } else if (tag == "with") {
      ParseWith(s.get());
    } else if (tag == "generation") {
      // transformers' AssistantTracker extension: renders its body unchanged.
      Next();
      s->kind = StmtKind::kScope;
      s->body = ParseBody({"endgeneration"}, true);
    } else if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) Fail("'" + tag + "' outside of a loop");
      Next();
      s->kind = tag == "break" ? StmtKind::kBreak : StmtKind::kContinue;
    } else if (tag == "print") {
      Next();
      s->kind = StmtKind::kOutput;
      s->expr = ParseTuple(false, true, {}, false);
    } else if (tag == "block" || tag == "extends" || tag == "include" || tag == "import" ||
               tag == "from" || tag == "autoescape") {
      Fail("the '" + tag + "' tag is not supported in chat templates");
    } else {
      Fail("Encountered unknown tag '" + tag + "'.");
    }
    out->push_back(std::move(s));
  }

  void ParseFor(Stmt* s) {
    Next();
    s->kind = StmtKind::kFor;
    s->target = ParseAssignTarget(true, false, {"in"});
    ExpectName("in");
    s->expr = ParseTuple(false, false, {"recursive"}, false);
    if (SkipName("if")) s->cond = ParseExpression(true);
    if (IsName("recursive")) Fail("recursive loops are not supported");
    ++loop_depth_;
    s->body = ParseBody({"endfor", "else"}, false);
    --loop_depth_;
    const bool has_else = IsName("else");
    Next();
    if (has_else) s->else_body = ParseBody({"endfor"}, true);
  }

  void ParseIf(Stmt* s) {
    Next();
    s->kind = StmtKind::kIf;
    while (true) {
      ExprPtr cond = ParseTuple(false, false, {}, false);
      StmtList body = ParseBody({"elif", "else", "endif"}, false);
      s->branches.emplace_back(std::move(cond), std::move(body));
      const std::string tok = Cur().value;
      Next();
      if (tok == "elif") continue;
      if (tok == "else") s->else_body = ParseBody({"endif"}, true);
      break;
    }
  }

  void ParseSet(Stmt* s) {
    Next();
    s->target = ParseAssignTarget(true, true, {});
    if (SkipOp("=")) {
      s->kind = StmtKind::kSet;
      s->expr = ParseTuple(false, true, {}, false);
      return;
    }
    s->kind = StmtKind::kSetBlock;
    if (IsOp("|")) s->expr = ParseFilterChain(nullptr, false);
    s->body = ParseBody({"endset"}, true);
  }

  void ParseWith(Stmt* s) {
    Next();
    s->kind = StmtKind::kWith;
    while (Cur().type != TokenType::kBlockEnd) {
      if (!s->assignments.empty()) ExpectOp(",");
      Target t = ParseAssignTarget(true, false, {});
      ExpectOp("=");
      s->assignments.emplace_back(std::move(t), ParseExpression(true));
    }
    s->body = ParseBody({"endwith"}, true);
  }

  void ParseSignature(Stmt* s) {
    ExpectOp("(");
    bool seen_default = false;
    while (!IsOp(")")) {
      if (!s->params.empty()) ExpectOp(",");
      s->params.push_back(ExpectAnyName());
      if (SkipOp("=")) {
        s->defaults.push_back(ParseExpression(true));
        seen_default = true;
      } else {
        if (seen_default) Fail("non-default argument follows default argument");
        s->defaults.push_back(nullptr);
      }
    }
    ExpectOp(")");
  }

  void ParseMacro(Stmt* s) {
    Next();
    s->kind = StmtKind::kMacro;
    s->name = ExpectAnyName();
    ParseSignature(s);
    const int saved_loops = loop_depth_;
    loop_depth_ = 0;
    s->body = ParseBody({"endmacro"}, true);
    loop_depth_ = saved_loops;
    ScanSpecialNames(s);
  }

  void ParseCallBlock(Stmt* s) {
    Next();
    s->kind = StmtKind::kCallBlock;
    if (IsOp("(")) ParseSignature(s);
    s->expr = ParseExpression(true);
    if (s->expr->kind != ExprKind::kCall) Fail("expected call", s->line);
    const int saved_loops = loop_depth_;
    loop_depth_ = 0;
    s->body = ParseBody({"endcall"}, true);
    loop_depth_ = saved_loops;
    ScanSpecialNames(s);
  }

  Target ParseAssignTarget(bool with_tuple, bool with_namespace,
                           std::initializer_list<std::string_view> extra_end) {
    Target t;
    if (with_namespace && Cur().type == TokenType::kName && Look().type == TokenType::kOperator &&
        Look().value == ".") {
      t.kind = Target::Kind::kNamespaceAttr;
      t.name = ExpectAnyName();
      Next();  // '.'
      t.attr = ExpectAnyName();
      return t;
    }
    ExprPtr e = with_tuple ? ParseTuple(true, true, extra_end, false) : ParsePrimary();
    return ToTarget(*e);
  }

  Target ToTarget(const Expr& e) {
    Target t;
    if (e.kind == ExprKind::kName) {
      t.kind = Target::Kind::kName;
      t.name = e.name;
      return t;
    }
    if (e.kind == ExprKind::kTuple) {
      t.kind = Target::Kind::kTuple;
      for (const auto& item : e.args) t.items.push_back(ToTarget(*item));
      return t;
    }
    Fail("can't assign to this expression", e.line);
  }

  // ---------------------------------------------------------------- expressions

  bool IsTupleEnd(std::initializer_list<std::string_view> extra_end) const {
    const Token& t = Cur();
    if (t.type == TokenType::kVariableEnd || t.type == TokenType::kBlockEnd ||
        (t.type == TokenType::kOperator && t.value == ")")) {
      return true;
    }
    if (t.type == TokenType::kEof) return true;
    for (auto n : extra_end) {
      if (IsName(n)) return true;
    }
    return false;
  }

  ExprPtr ParseTuple(bool simplified, bool with_condexpr,
                     std::initializer_list<std::string_view> extra_end, bool explicit_parens) {
    const int line = Cur().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) ExpectOp(",");
      if (IsTupleEnd(extra_end)) break;
      items.push_back(simplified ? ParsePrimary() : ParseExpression(with_condexpr));
      if (IsOp(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) Fail("Expected an expression, got '" + Describe(Cur()) + "'");
    }
    auto e = Make(ExprKind::kTuple, line);
    e->args = std::move(items);
    return e;
  }

  ExprPtr ParseExpression(bool with_condexpr) {
    DepthGuard guard(this);
    if (!with_condexpr) return ParseOr();
    ExprPtr expr = ParseOr();
    while (IsName("if")) {
      const int line = Cur().line;
      Next();
      ExprPtr cond = ParseOr();
      ExprPtr otherwise;
      if (SkipName("else")) otherwise = ParseExpression(true);
      auto e = Make(ExprKind::kCondExpr, line);
      e->args.push_back(std::move(cond));
      e->args.push_back(std::move(expr));
      e->args.push_back(std::move(otherwise));
      expr = std::move(e);
    }
    return expr;
  }

  ExprPtr ParseOr() {
    ExprPtr left = ParseAnd();
    while (IsName("or")) {
      const int line = Cur().line;
      Next();
      auto e = Make(ExprKind::kOr, line);
      e->args.push_back(std::move(left));
      e->args.push_back(ParseAnd());
      left = std::move(e);
    }
    return left;
  }

  ExprPtr ParseAnd() {
    ExprPtr left = ParseNot();
    while (IsName("and")) {
      const int line = Cur().line;
      Next();
      auto e = Make(ExprKind::kAnd, line);
      e->args.push_back(std::move(left));
      e->args.push_back(ParseNot());
      left = std::move(e);
    }
    return left;
  }

  ExprPtr ParseNot() {
    if (IsName("not")) {
      DepthGuard guard(this);
      const int line = Cur().line;
      Next();
      auto e = Make(ExprKind::kNot, line);
      e->args.push_back(ParseNot());
      return e;
    }
    return ParseCompare();
  }

  ExprPtr ParseCompare() {
    const int line = Cur().line;
    ExprPtr first = ParseMath1();
    std::vector<Op> ops;
    std::vector<ExprPtr> operands;
    while (true) {
      Op op;
      if (IsOp("==")) {
        op = Op::kEq;
      } else if (IsOp("!=")) {
        op = Op::kNe;
      } else if (IsOp("<")) {
        op = Op::kLt;
      } else if (IsOp("<=")) {
        op = Op::kLe;
      } else if (IsOp(">")) {
        op = Op::kGt;
      } else if (IsOp(">=")) {
        op = Op::kGe;
      } else if (IsName("in")) {
        op = Op::kIn;
      } else if (IsName("not") && Look().type == TokenType::kName && Look().value == "in") {
        Next();
        op = Op::kNotIn;
      } else {
        break;
      }
      Next();
      ops.push_back(op);
      operands.push_back(ParseMath1());
    }
    if (ops.empty()) return first;
    auto e = Make(ExprKind::kCompare, line);
    e->ops = std::move(ops);
    e->args.push_back(std::move(first));
    for (auto& o : operands) e->args.push_back(std::move(o));
    return e;
  }

  ExprPtr Binary(Op op, ExprPtr left, ExprPtr right, int line) {
    auto e = Make(ExprKind::kBinary, line);
    e->op = op;
    e->args.push_back(std::move(left));
    e->args.push_back(std::move(right));
    return e;
  }

  ExprPtr ParseMath1() {
    ExprPtr left = ParseConcat();
    while (IsOp("+") || IsOp("-")) {
      const Op op = IsOp("+") ? Op::kAdd : Op::kSub;
      const int line = Cur().line;
      Next();
      left = Binary(op, std::move(left), ParseConcat(), line);
    }
    return left;
  }

  ExprPtr ParseConcat() {
    ExprPtr left = ParseMath2();
    while (IsOp("~")) {
      const int line = Cur().line;
      Next();
      left = Binary(Op::kConcat, std::move(left), ParseMath2(), line);
    }
    return left;
  }

  ExprPtr ParseMath2() {
    ExprPtr left = ParsePow();
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const Op op = IsOp("*")    ? Op::kMul
                    : IsOp("/")  ? Op::kDiv
                    : IsOp("//") ? Op::kFloorDiv
                                 : Op::kMod;
      const int line = Cur().line;
      Next();
      left = Binary(op, std::move(left), ParsePow(), line);
    }
    return left;
  }

  ExprPtr ParsePow() {
    ExprPtr left = ParseUnary(true);
    while (IsOp("**")) {
      const int line = Cur().line;
      Next();
      left = Binary(Op::kPow, std::move(left), ParseUnary(true), line);
    }
    return left;
  }

  ExprPtr ParseUnary(bool with_filter) {
    DepthGuard guard(this);
    const int line = Cur().line;
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      const Op op = IsOp("-") ? Op::kNeg : Op::kPos;
      Next();
      node = Make(ExprKind::kUnary, line);
      node->op = op;
      node->args.push_back(ParseUnary(false));
    } else {
      node = ParsePrimary();
    }
    node = ParsePostfix(std::move(node));
    if (with_filter) node = ParseFilterExpr(std::move(node));
    return node;
  }

  ExprPtr ParsePrimary() {
    DepthGuard guard(this);
    const Token& t = Cur();
    const int line = t.line;
    if (t.type == TokenType::kName) {
      ExprPtr e;
      if (t.value == "true" || t.value == "True" || t.value == "false" || t.value == "False") {
        e = Make(ExprKind::kLiteral, line);
        e->literal = Value::MakeBool(t.value == "true" || t.value == "True");
      } else if (t.value == "none" || t.value == "None") {
        e = Make(ExprKind::kLiteral, line);
        e->literal = Value::MakeNone();
      } else {
        e = Make(ExprKind::kName, line);
        e->name = t.value;
      }
      Next();
      return e;
    }
    if (t.type == TokenType::kString) {
      std::string s;
      while (Cur().type == TokenType::kString) {
        s += Cur().value;
        Next();
      }
      auto e = Make(ExprKind::kLiteral, line);
      e->literal = Value::MakeString(std::move(s));
      return e;
    }
    if (t.type == TokenType::kInteger || t.type == TokenType::kFloat) {
      auto e = Make(ExprKind::kLiteral, line);
      e->literal = t.type == TokenType::kInteger ? Value::MakeInt(t.int_value)
                                                 : Value::MakeFloat(t.float_value);
      Next();
      return e;
    }
    if (IsOp("(")) {
      Next();
      ExprPtr e = ParseTuple(false, true, {}, true);
      ExpectOp(")");
      return e;
    }
    if (IsOp("[")) {
      Next();
      auto e = Make(ExprKind::kList, line);
      while (!IsOp("]")) {
        if (!e->args.empty()) ExpectOp(",");
        if (IsOp("]")) break;
        e->args.push_back(ParseExpression(true));
      }
      ExpectOp("]");
      return e;
    }
    if (IsOp("{")) {
      Next();
      auto e = Make(ExprKind::kDict, line);
      while (!IsOp("}")) {
        if (!e->args.empty()) ExpectOp(",");
        if (IsOp("}")) break;
        e->args.push_back(ParseExpression(true));
        ExpectOp(":");
        e->args.push_back(ParseExpression(true));
      }
      ExpectOp("}");
      return e;
    }
    Fail("unexpected '" + Describe(t) + "'");
  }

  ExprPtr ParsePostfix(ExprPtr node) {
    while (true) {
      if (IsOp(".") || IsOp("[")) {
        node = ParseSubscript(std::move(node));
      } else if (IsOp("(")) {
        node = ParseCall(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr ParseFilterExpr(ExprPtr node) {
    while (true) {
      if (IsOp("|")) {
        node = ParseFilterChain(std::move(node), false);
      } else if (IsName("is")) {
        node = ParseTest(std::move(node));
      } else if (IsOp("(")) {
        node = ParseCall(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr ParseSubscript(ExprPtr node) {
    const int line = Cur().line;
    if (SkipOp(".")) {
      if (Cur().type == TokenType::kName) {
        auto e = Make(ExprKind::kGetAttr, line);
        e->name = Cur().value;
        e->args.push_back(std::move(node));
        Next();
        return e;
      }
      if (Cur().type != TokenType::kInteger) Fail("expected name or number");
      auto key = Make(ExprKind::kLiteral, line);
      key->literal = Value::MakeInt(Cur().int_value);
      Next();
      auto e = Make(ExprKind::kGetItem, line);
      e->args.push_back(std::move(node));
      e->args.push_back(std::move(key));
      return e;
    }
    ExpectOp("[");
    std::vector<ExprPtr> subs;
    while (!IsOp("]")) {
      if (!subs.empty()) {
        ExpectOp(",");
        if (IsOp("]")) break;
      }
      subs.push_back(ParseSubscribed());
    }
    ExpectOp("]");
    if (subs.empty()) Fail("expected subscript expression");
    ExprPtr key;
    if (subs.size() == 1) {
      key = std::move(subs[0]);
    } else {
      key = Make(ExprKind::kTuple, line);
      key->args = std::move(subs);
    }
    if (key->kind == ExprKind::kSlice) {
      key->args.insert(key->args.begin(), std::move(node));
      return key;
    }
    auto e = Make(ExprKind::kGetItem, line);
    e->args.push_back(std::move(node));
    e->args.push_back(std::move(key));
    return e;
  }

  // One subscript: an expression or a slice [start]:[stop][:[step]]. A slice comes back as a
  // kSlice with args (start, stop, step); the subject is inserted by the caller.
  ExprPtr ParseSubscribed() {
    const int line = Cur().line;
    std::vector<ExprPtr> parts;
    if (SkipOp(":")) {
      parts.push_back(nullptr);
    } else {
      ExprPtr e = ParseExpression(true);
      if (!SkipOp(":")) return e;
      parts.push_back(std::move(e));
    }
    if (IsOp(":") || IsOp("]") || IsOp(",")) {
      parts.push_back(nullptr);
    } else {
      parts.push_back(ParseExpression(true));
    }
    if (SkipOp(":")) {
      if (IsOp("]") || IsOp(",")) {
        parts.push_back(nullptr);
      } else {
        parts.push_back(ParseExpression(true));
      }
    } else {
      parts.push_back(nullptr);
    }
    auto s = Make(ExprKind::kSlice, line);
    s->args = std::move(parts);
    return s;
  }

  void ParseCallArgs(Expr* e) {
    ExpectOp("(");
    bool require_comma = false;
    while (!IsOp(")")) {
      if (require_comma) {
        ExpectOp(",");
        if (IsOp(")")) break;
      }
      if (IsOp("*") || IsOp("**")) {
        const std::string star = Cur().value;
        Next();
        e->kwargs.emplace_back(star, ParseExpression(true));
      } else if (Cur().type == TokenType::kName && Look().type == TokenType::kOperator &&
                 Look().value == "=") {
        std::string key = Cur().value;
        Next();
        Next();
        e->kwargs.emplace_back(std::move(key), ParseExpression(true));
      } else {
        if (!e->kwargs.empty()) Fail("invalid syntax for function call expression");
        e->args.push_back(ParseExpression(true));
      }
      require_comma = true;
    }
    ExpectOp(")");
  }

  ExprPtr ParseCall(ExprPtr callee) {
    auto e = Make(ExprKind::kCall, Cur().line);
    e->args.push_back(std::move(callee));
    ParseCallArgs(e.get());
    return e;
  }

  std::string ParseDottedName() {
    std::string name = ExpectAnyName();
    while (IsOp(".")) {
      Next();
      name.push_back('.');
      name.append(ExpectAnyName());
    }
    return name;
  }

  // `|name(args)|name2 ...`; with start_inline the first name has no leading pipe.
  ExprPtr ParseFilterChain(ExprPtr node, bool start_inline) {
    if (node == nullptr) node = Make(ExprKind::kBlockSubject, Cur().line);
    while (IsOp("|") || start_inline) {
      if (!start_inline) Next();
      start_inline = false;
      const int line = Cur().line;
      auto e = Make(ExprKind::kFilter, line);
      e->name = ParseDottedName();
      e->args.push_back(std::move(node));
      if (IsOp("(")) ParseCallArgs(e.get());
      node = std::move(e);
    }
    return node;
  }

  ExprPtr ParseTest(ExprPtr node) {
    const int line = Cur().line;
    Next();  // 'is'
    const bool negated = SkipName("not");
    auto e = Make(ExprKind::kTest, line);
    e->name = ParseDottedName();
    e->args.push_back(std::move(node));
    const Token& t = Cur();
    if (IsOp("(")) {
      ParseCallArgs(e.get());
    } else if ((t.type == TokenType::kName || t.type == TokenType::kString ||
                t.type == TokenType::kInteger || t.type == TokenType::kFloat || IsOp("[") ||
                IsOp("{")) &&
               !IsName("else") && !IsName("or") && !IsName("and")) {
      if (IsName("is")) Fail("You cannot chain multiple tests with is");
      e->args.push_back(ParsePostfix(ParsePrimary()));
    }
    if (!negated) return e;
    auto n = Make(ExprKind::kNot, line);
    n->args.push_back(std::move(e));
    return n;
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

StmtList Parse(std::vector<Token> tokens) {
  StmtList body = Parser(std::move(tokens)).ParseTemplate();
  ResolveNames(body);
  return body;
}

}  // namespace kestrel::jinja
