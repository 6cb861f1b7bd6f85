// Asserts that a call throws smla::Error of `kind` naming `argument`, whose what() quotes its
// expected and got parts and whose expected/got mention the given fragments.
#pragma once
#include <gtest/gtest.h>

#include <string>

#include "smla/error.h"

namespace smla::test {

template <class Call>
void expect_smla_error(const Call& call, ErrorKind kind, const std::string& argument,
                       const std::string& expected, const std::string& got) {
  try {
    call();
    ADD_FAILURE() << "no error; expected one for " << argument;
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.kind(), kind) << what;
    EXPECT_EQ(e.argument(), argument) << what;
    EXPECT_NE(what.find("expected " + e.expected()), std::string::npos) << what;
    EXPECT_NE(e.expected().find(expected), std::string::npos) << what << "\n  lacks " << expected;
    EXPECT_NE(e.got().find(got), std::string::npos) << what << "\n  lacks " << got;
  }
}

}  // namespace smla::test
