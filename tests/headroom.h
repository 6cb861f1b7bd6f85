// How close matches() (oracle.h) comes to its bounds: the largest error / bound ratio it saw (a
// pass is <= 1) by tolerance, cache layout and query dtype. With SMLA_TEST_HEADROOM set the
// tests print the table as they end, so that a GPU run shows how far each tolerance could
// tighten. `group` is the bound in force (scaled by each 64-dim group's largest |value|), `row`
// the same tolerance scaled by the row's largest |value| (the bound before the seventy-fourth
// session). Each kind also names the test and case (DecodeCase::summary) that set its group ratio.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

namespace smla::test {

struct HeadroomRatios {
  double row = 0, group = 0, lse = 0;
  int64_t elements = 0;
  std::string group_case;  // the case that set `group`: the test's name is added by record()
};

class Headroom : public ::testing::Environment {
 public:
  static void record(const std::string& kind, const HeadroomRatios& r) {
    const std::lock_guard lock(mutex());
    HeadroomRatios& worst = table()[kind];
    worst.row = std::max(worst.row, r.row);
    if (r.group > worst.group) {
      const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
      worst.group_case = (test ? std::string(test->test_suite_name()) + "." + test->name() : "") +
                         ": " + r.group_case;
    }
    worst.group = std::max(worst.group, r.group);
    worst.lse = std::max(worst.lse, r.lse);
    worst.elements += r.elements;
  }

  void TearDown() override {
    if (!std::getenv("SMLA_TEST_HEADROOM") || table().empty()) return;
    std::printf("headroom: largest error / bound (<= 1 passes)\n%-40s %9s %9s %9s %12s\n", "kind",
                "row", "group", "lse", "elements");
    for (const auto& [kind, r] : table())
      std::printf("%-40s %9.3g %9.3g %9.3g %12lld\n", kind.c_str(), r.row, r.group, r.lse,
                  static_cast<long long>(r.elements));
    for (const auto& [kind, r] : table())
      std::printf("largest group ratio of %s: %s\n", kind.c_str(), r.group_case.c_str());
  }

 private:
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::map<std::string, HeadroomRatios>& table() {
    static std::map<std::string, HeadroomRatios> t;
    return t;
  }
};

// error / bound, where a zero bound takes no error at all; a NaN error is past every bound.
inline double headroom_ratio(double error, double bound) {
  if (std::isnan(error)) return HUGE_VAL;
  return bound > 0 ? error / bound : error > 0 ? HUGE_VAL : 0;
}

inline const bool kHeadroomReported =
    (::testing::AddGlobalTestEnvironment(new Headroom), true);

}  // namespace smla::test
