// Cases for the runner's own rule (tests/test_main.cpp), built into a binary of their own
// (architecture.runner_* in tests/CMakeLists.txt): one that checks nothing, one that skips itself, one that checks.
#include "skip.h"

#include <doctest/doctest.h>

TEST_CASE("runner: a case that checks nothing") {
  [[maybe_unused]] int computed = 6 * 7; // runs, asserts nothing: the runner must fail it
}

TEST_CASE("runner: a case that skips itself") { optjit::test::skip_test("this machine lacks what the case needs"); }

TEST_CASE("runner: a case that fails and then skips") {
  CHECK(6 * 7 == 41); // a failure wins over the skip that follows: the run exits 1
  optjit::test::skip_test("skipped after a failure");
}

TEST_CASE("runner: a case that checks") { CHECK(6 * 7 == 42); }
