// The test runner: doctest's main, with one rule added. Every test case that runs must evaluate at least one
// assertion, or say why it did not run with skip_test() (tests/skip.h): a case that checks nothing passes whatever
// the code does. ctest reports a skipped case as skipped (SKIP_REGULAR_EXPRESSION "skipped: ", tests/CMakeLists.txt),
// never as passed.
#define DOCTEST_CONFIG_IMPLEMENT
#include "skip.h"

#include <doctest/doctest.h>

#include <iostream>
#include <mutex>
#include <string>
#include <vector>

namespace {

std::mutex checked_mutex;
std::vector<std::string> cases_without_assertions;

// Watches each test case's end: a case that ran to its end with no assertion and no skip_test() is recorded.
struct AssertionCountListener : doctest::IReporter {
  explicit AssertionCountListener(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_start(const doctest::TestCaseData& data) override {
    current_ = data.m_name;
    optjit::test::skipped_reason().clear();
  }
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats& stats) override {
    if (stats.numAssertsCurrentTest == 0 && stats.testCaseSuccess && optjit::test::skipped_reason().empty()) {
      std::lock_guard lock(checked_mutex);
      cases_without_assertions.push_back(current_);
    }
  }
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}

private:
  std::string current_;
};

REGISTER_LISTENER("assertion_count", 1, AssertionCountListener);

} // namespace

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  int status = context.run();
  if (context.shouldExit())
    return status;
  for (const std::string& name : cases_without_assertions)
    std::cout << "test case '" << name << "' ran no assertion: a test must check something, or call skip_test() "
              << "with the reason it cannot run here\n";
  return cases_without_assertions.empty() ? status : 1;
}
