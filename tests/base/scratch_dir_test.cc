// The test scratch directory deletes only what this process made (issue: remove_all on a freed
// path at exit).
#include "scratch_dir.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace kvc::testing {
namespace {

namespace fs = std::filesystem;

TEST(ScratchDir, IsMadeUnderTmpdirAndRemovedWithItsContents) {
  fs::path made;
  {
    ScratchDir d("kvcache-scratch-test-");
    made = d.path();
    EXPECT_TRUE(fs::is_directory(made));
    EXPECT_EQ(made.parent_path(), fs::temp_directory_path());
    fs::create_directories(made / "a" / "b");
    std::ofstream(made / "a" / "b" / "f") << "x";
  }
  EXPECT_FALSE(fs::exists(made));
}

TEST(ScratchDir, TwoDirectoriesAreDistinct) {
  ScratchDir a("kvcache-scratch-test-");
  ScratchDir b("kvcache-scratch-test-");
  EXPECT_NE(a.path(), b.path());
}

TEST(ScratchDir, NeverRemovesADirectoryThatReplacedItsOwn) {
  ScratchDir outer("kvcache-scratch-test-");
  fs::path moved;
  {
    ScratchDir d("kvcache-scratch-test-");
    moved = outer.path() / "moved";
    fs::rename(d.path(), moved);
    // Someone else's directory now has the same path, with a file inside.
    fs::create_directory(d.path());
    std::ofstream(d.path() / "keep") << "x";
    EXPECT_FALSE(d.remove());
    EXPECT_TRUE(fs::exists(d.path() / "keep"));
    fs::remove(d.path() / "keep");
    fs::remove(d.path());
  }
  EXPECT_TRUE(fs::is_directory(moved));
}

TEST(ScratchDir, NeverFollowsASymlinkThatReplacedIt) {
  ScratchDir outer("kvcache-scratch-test-");
  const fs::path target = outer.path() / "target";
  fs::create_directory(target);
  std::ofstream(target / "keep") << "x";
  {
    ScratchDir d("kvcache-scratch-test-");
    const fs::path original = d.path();
    fs::remove(original);
    fs::create_directory_symlink(target, original);
    EXPECT_FALSE(d.remove());
    fs::remove(original);
  }
  EXPECT_TRUE(fs::exists(target / "keep"));
}

TEST(ScratchDir, ProcessScratchDirIsStableAndLivesUnderTmpdir) {
  const fs::path& a = scratch_dir();
  EXPECT_EQ(&a, &scratch_dir());
  EXPECT_TRUE(fs::is_directory(a));
  EXPECT_EQ(a.parent_path(), fs::temp_directory_path());
  EXPECT_EQ(a.filename().string().rfind("kvcache-test-", 0), 0u);
}

}  // namespace
}  // namespace kvc::testing
