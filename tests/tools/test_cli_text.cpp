// The CLI's text arguments: --params shape lists and --set option lists.
#include "helpers.h"
#include "tools/cli_text.h"

using namespace optjit;
using optjit::test::check_error_contains;

TEST_CASE("cli text: shape lists, with 0-d shapes, and clear errors for bad extents") {
  CHECK(parse_shape_list("10x10,10,scalar,") == std::vector<Shape>{{10, 10}, {10}, {}, {}});
  check_error_contains([] { parse_shape_list("10x-1"); }, "bad shape '10x-1' in '10x-1'");
  check_error_contains([] { parse_shape_list("2.5"); }, "bad shape '2.5'");
  check_error_contains([] { parse_shape_list("99999999999999999999"); }, "bad shape '99999999999999999999'");
}

TEST_CASE("cli text: --set options, pairs and flags, and every malformed list refused naming the option") {
  const KeywordOptions options = parse_keyword_options("lr=0.01,amsgrad=true,betas=(0.8,0.9)");
  CHECK(options.at("lr") == std::vector<double>{0.01});
  CHECK(options.at("amsgrad") == std::vector<double>{1});
  CHECK(options.at("betas") == std::vector<double>{0.8, 0.9});
  check_error_contains([] { parse_keyword_options("lr"); }, "option 'lr' in --set: write name=value");
  check_error_contains([] { parse_keyword_options("betas=(0.8,0.9"); }, "option betas in --set: unclosed '('");
  check_error_contains([] { parse_keyword_options("betas=(0.8)x"); }, "expected ',' after its value");
  check_error_contains([] { parse_keyword_options("lr=fast"); }, "option lr=fast: expected a number");
  CHECK(parse_keyword_options("state_dtype=int4").at("state_dtype") == std::vector<double>{2}); // choices by name
  check_error_contains([] { parse_keyword_options("state_dtype=int2"); },
                       "option 'state_dtype' is 'int2': it takes one of 'plain', 'int8', 'int4', 'fp8'");
  check_error_contains([] { parse_keyword_options("lr=0.1,lr=0.2"); }, "option lr in --set: given twice");
  // A value that parses but breaks an option's rule is the optimizer's to refuse, as from the API.
  auto params = random_params({{3}}, Dtype::f32, 0);
  check_error_contains(
      [&] {
        make_optimizer("Adam", {ParamGroupSpec{params, {}}}, parse_keyword_options("amsgrad=nan"));
      },
      "Adam option 'amsgrad' is nan: a flag is 0 or 1");
}
