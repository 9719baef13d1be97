#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "backends/cuda/env_setting.h"

namespace kestrel::cuda {
namespace {

int ParseDigit(const char* env) {
  return env != nullptr && env[0] >= '0' && env[0] <= '9' && env[1] == '\0' ? env[0] - '0' : -1;
}

// The first read parses the variable; later reads keep that value even when it changes.
TEST(EnvSetting, FirstReadTakesTheEnvironment) {
  ::setenv("KESTREL_TEST_ENV_SETTING_A", "7", 1);
  EnvSetting s{"KESTREL_TEST_ENV_SETTING_A", ParseDigit};
  EXPECT_EQ(s.Get(), 7);
  ::setenv("KESTREL_TEST_ENV_SETTING_A", "3", 1);
  EXPECT_EQ(s.Get(), 7);
  ::unsetenv("KESTREL_TEST_ENV_SETTING_A");
}

// Unset: the parser sees null; a value it rejects is its fallback.
TEST(EnvSetting, UnsetOrInvalidGivesTheParsersFallback) {
  ::unsetenv("KESTREL_TEST_ENV_SETTING_B");
  EnvSetting unset{"KESTREL_TEST_ENV_SETTING_B", ParseDigit};
  EXPECT_EQ(unset.Get(), -1);
  ::setenv("KESTREL_TEST_ENV_SETTING_C", "12", 1);
  EnvSetting invalid{"KESTREL_TEST_ENV_SETTING_C", ParseDigit};
  EXPECT_EQ(invalid.Get(), -1);
  ::unsetenv("KESTREL_TEST_ENV_SETTING_C");
}

// Set wins over the environment, before or after the first read.
TEST(EnvSetting, SetOverridesTheEnvironment) {
  ::setenv("KESTREL_TEST_ENV_SETTING_D", "5", 1);
  EnvSetting before{"KESTREL_TEST_ENV_SETTING_D", ParseDigit};
  before.Set(2);
  EXPECT_EQ(before.Get(), 2);
  EnvSetting after{"KESTREL_TEST_ENV_SETTING_D", ParseDigit};
  EXPECT_EQ(after.Get(), 5);
  after.Set(-1);
  EXPECT_EQ(after.Get(), -1);
  ::unsetenv("KESTREL_TEST_ENV_SETTING_D");
}

}  // namespace
}  // namespace kestrel::cuda
