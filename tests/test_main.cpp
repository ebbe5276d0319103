// The test runner: doctest's main, with two rules added.
//  - Every test case that runs must evaluate at least one assertion, or say why it did not run with skip_test()
//    (tests/skip.h): a case that checks nothing passes whatever the code does. Such a case fails the run, named on
//    stderr.
//  - A run whose every case skipped itself, and none failed, exits with kSkippedExitCode: ctest (one case per
//    process, SKIP_RETURN_CODE in tests/CMakeLists.txt) then reports the case as skipped, never as passed. A failure
//    wins over a skip: a case that fails and also skips exits 1.
#define DOCTEST_CONFIG_IMPLEMENT
#include "skip.h"

#include <doctest/doctest.h>

#include <iostream>
#include <mutex>
#include <string>
#include <vector>

namespace {

std::mutex cases_mutex;
std::vector<std::string> cases_without_assertions;
int cases_run = 0, cases_skipped = 0;

// Watches each test case's end: a case that ran with no assertion and no skip_test() is recorded, and so is a skip.
struct AssertionCountListener : doctest::IReporter {
  explicit AssertionCountListener(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_start(const doctest::TestCaseData& data) override {
    current_ = data.m_name;
    optjit::test::skipped_reason().clear(); // a skip in any subcase run of the case counts for the case
  }
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats& stats) override {
    const bool skipped = !optjit::test::skipped_reason().empty();
    std::lock_guard lock(cases_mutex);
    ++cases_run;
    cases_skipped += skipped ? 1 : 0;
    if (stats.numAssertsCurrentTest == 0 && stats.testCaseSuccess && !skipped)
      cases_without_assertions.push_back(current_);
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
  const int status = context.run();
  if (context.shouldExit())
    return status;
  for (const std::string& name : cases_without_assertions)
    std::cerr << "test case '" << name << "' ran no assertion: a test must check something, or call skip_test() "
              << "with the reason it cannot run here\n";
  if (status != 0 || !cases_without_assertions.empty())
    return status != 0 ? status : 1;
  return cases_run > 0 && cases_skipped == cases_run ? optjit::test::kSkippedExitCode : 0;
}
