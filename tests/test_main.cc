// The main of every test binary: gtest, plus the environment that owns the scratch directory.
#include <gtest/gtest.h>

#include "scratch_dir.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  kvc::testing::register_scratch_environment();
  return RUN_ALL_TESTS();
}
