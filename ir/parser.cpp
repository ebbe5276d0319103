#include "ir/parser.h"
#include "ir/builder.h"
#include "ir/printer.h"
#include "runtime/error.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>
#include <optional>

namespace optjit {
namespace {

class LineReader {
public:
  LineReader(std::string_view line, int number) : rest_(line), number_(number) {}

  [[noreturn]] void fail(const std::string& why) const {
    throw Error("parse error on line " + std::to_string(number_) + ": " + why);
  }
  void skip_space() {
    while (!rest_.empty() && (rest_.front() == ' ' || rest_.front() == '\t'))
      rest_.remove_prefix(1);
  }
  bool done() {
    skip_space();
    return rest_.empty();
  }
  bool accept(std::string_view token) {
    skip_space();
    if (!rest_.starts_with(token))
      return false;
    rest_.remove_prefix(token.size());
    return true;
  }
  void expect(std::string_view token) {
    if (!accept(token))
      fail("expected '" + std::string(token) + "' before '" + std::string(rest_) + "'");
  }
  std::string word() {
    skip_space();
    std::size_t n = 0;
    while (n < rest_.size() && (std::isalnum(static_cast<unsigned char>(rest_[n])) || rest_[n] == '_' ||
                                rest_[n] == '.' || rest_[n] == '-' || rest_[n] == '+'))
      ++n;
    if (n == 0)
      fail("expected a word before '" + std::string(rest_) + "'");
    std::string w(rest_.substr(0, n));
    rest_.remove_prefix(n);
    return w;
  }
  std::string quoted() {
    expect("\"");
    auto end = rest_.find('"');
    if (end == std::string_view::npos)
      fail("unterminated string");
    std::string s(rest_.substr(0, end));
    rest_.remove_prefix(end + 1);
    return s;
  }
  int value_id() {
    expect("%");
    std::string w = word();
    int id = 0;
    auto [end, ec] = std::from_chars(w.data(), w.data() + w.size(), id);
    if (ec != std::errc() || end != w.data() + w.size())
      fail("bad value name %" + w);
    return id;
  }
  double number() {
    std::string w = word();
    if (w == "nan")
      return std::numeric_limits<double>::quiet_NaN();
    if (w == "inf")
      return std::numeric_limits<double>::infinity();
    if (w == "-inf")
      return -std::numeric_limits<double>::infinity();
    double v = 0;
    auto [end, ec] = std::from_chars(w.data(), w.data() + w.size(), v);
    if (ec != std::errc() || end != w.data() + w.size())
      fail("bad number '" + w + "'");
    return v;
  }

private:
  std::string_view rest_;
  int number_;
};

Dtype dtype_or_fail(LineReader& in) {
  std::string w = in.word();
  try {
    return parse_dtype(w);
  } catch (const Error&) {
    in.fail("unknown dtype '" + w + "'");
  }
}

} // namespace

Graph parse_graph(std::string_view text) {
  std::optional<GraphBuilder> builder;
  int line_number = 0;
  bool closed = false;
  while (!text.empty()) {
    auto newline = text.find('\n');
    std::string_view line = text.substr(0, newline);
    text.remove_prefix(newline == std::string_view::npos ? text.size() : newline + 1);
    LineReader in(line, ++line_number);
    if (in.done())
      continue;
    if (closed)
      in.fail("text after the closing '}'");
    if (!builder) {
      in.expect("graph");
      in.expect("@");
      std::string name = in.word();
      Dtype dtype = dtype_or_fail(in);
      in.expect("{");
      builder.emplace(name, dtype, /*intern=*/false);
      continue;
    }
    if (in.accept("}")) {
      if (!in.done())
        in.fail("text after the closing '}'");
      closed = true;
      continue;
    }
    if (in.accept("slot ")) {
      Slot slot;
      slot.name = in.quoted();
      in.expect(":");
      const std::string role = in.word(), kind = in.word();
      if (role == slot_role_name(SlotRole::Param))
        slot.role = SlotRole::Param;
      else if (role == slot_role_name(SlotRole::Grad))
        slot.role = SlotRole::Grad;
      else if (role == slot_role_name(SlotRole::State))
        slot.role = SlotRole::State;
      else if (role == slot_role_name(SlotRole::Scratch))
        slot.role = SlotRole::Scratch;
      else
        in.fail("slot role must be param, grad, state or scratch, got '" + role + "'");
      if (kind == slot_kind_name(SlotKind::Tensor))
        slot.kind = SlotKind::Tensor;
      else if (kind == slot_kind_name(SlotKind::Scalar))
        slot.kind = SlotKind::Scalar;
      else if (kind == slot_kind_name(SlotKind::Rows))
        slot.kind = SlotKind::Rows;
      else if (kind == slot_kind_name(SlotKind::Cols))
        slot.kind = SlotKind::Cols;
      else
        in.fail("slot kind must be tensor, scalar, rows or cols, got '" + kind + "'");
      const std::string storage = in.word();
      if (in.accept("/")) { // a block-quantized slot: format/block
        const auto format = block_format_from_name(storage);
        if (!format)
          in.fail("unknown block format '" + storage + "': expected signed8, unsigned8, signed4, unsigned4 or fp8");
        const std::string block = in.word();
        int64_t size = 0;
        auto [end, ec] = std::from_chars(block.data(), block.data() + block.size(), size);
        if (ec != std::errc() || end != block.data() + block.size() || block.empty())
          in.fail("bad block size '" + block + "' in '" + storage + "/" + block + "'");
        slot.blocks = SlotBlocks{*format, size};
      } else {
        try {
          slot.dtype = parse_dtype(storage);
        } catch (const Error&) {
          in.fail("unknown dtype '" + storage + "'");
        }
      }
      if (!in.done())
        in.fail("unexpected text at the end of the line");
      if (builder->size() > 0)
        in.fail("slots are declared before the first value");
      try {
        builder->declare_slot(std::move(slot));
      } catch (const Error& e) {
        in.fail(e.what());
      }
      continue;
    }
    // The longer keywords are tried first since "store" is their prefix.
    std::optional<StoreKind> store_kind;
    for (StoreKind kind : {StoreKind::Scalar, StoreKind::Carry, StoreKind::Tensor})
      if (!store_kind && in.accept(std::string(store_keyword(kind))))
        store_kind = kind;
    if (store_kind) {
      std::string slot = in.quoted();
      ValueId value = in.value_id();
      try {
        builder->add_store(Store{*store_kind, slot, value});
      } catch (const Error& e) {
        in.fail(e.what());
      }
      continue;
    }
    int id = in.value_id();
    if (id != builder->size())
      in.fail("values must be numbered in order: expected %" + std::to_string(builder->size()));
    in.expect("=");
    std::string op_text = in.word();
    Node node;
    if (!op_from_name(op_text, node.op))
      in.fail("unknown op '" + op_text + "'");
    if (node.op == Op::constant)
      node.number = in.number();
    else if (op_has_trait(node.op, kInput) || op_has_trait(node.op, kMatrix)) // a slot's, or a product's form
      node.name = in.quoted();
    for (int i = 0; i < op_arity(node.op); ++i) {
      if (i)
        in.expect(",");
      node.inputs.push_back(in.value_id());
    }
    in.expect(":");
    std::string level = in.word();
    if (level != "pt" && level != "el")
      in.fail("level must be pt or el, got '" + level + "'");
    node.dtype = dtype_or_fail(in);
    if (!in.done())
      in.fail("unexpected text at the end of the line");
    Level expected_level = level == "pt" ? Level::PerTensor : Level::Element;
    Dtype expected_dtype = node.dtype;
    ValueId made = 0;
    try {
      made = builder->add(node);
    } catch (const Error& e) { // the builder's rule, on this line
      in.fail(e.what());
    }
    const Node& typed = builder->node(made);
    if (typed.level != expected_level || typed.dtype != expected_dtype)
      in.fail("declared type '" + level + " " + std::string(dtype_name(expected_dtype)) +
              "' does not match the operands");
  }
  if (!builder)
    throw Error("parse error: no 'graph @name dtype {' line");
  if (!closed)
    throw Error("parse error: the text ends before the graph's closing '}'");
  return builder->finish();
}

} // namespace optjit
