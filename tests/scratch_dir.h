// A scratch directory for tests, with one owner and a bounded lifetime.
//
// Thread-safety: ScratchDir is not thread-safe; scratch_dir() may be called from test threads only
// after the first call has returned on the main thread (tests create it before starting threads).
#pragma once

#include <sys/stat.h>

#include <filesystem>
#include <memory>
#include <string>

namespace kvc::testing {

// A directory this process made itself with mkdtemp under $TMPDIR (or /tmp). The destructor
// removes it recursively, but only if the path still names that very directory (same device and
// inode, not a symbolic link): a recursive delete never reaches anything this process did not make.
class ScratchDir {
 public:
  // Makes a fresh directory named PREFIX + six random characters; throws on failure.
  explicit ScratchDir(const std::string& prefix);
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  // The directory's path (absolute).
  const std::filesystem::path& path() const { return path_; }

  // Removes the directory now (as the destructor does); true if it was removed.
  bool remove();

 private:
  std::filesystem::path path_;
  dev_t device_ = 0;
  ino_t inode_ = 0;
  bool removed_ = false;
};

// Registers the gtest global environment that owns scratch_dir(); called once by the test main.
void register_scratch_environment();

// The per-process scratch directory of the test binary, made on first use and removed when the
// test program's global environment is torn down (after the last test, before exit). Calling it
// after that teardown is an error (it throws), never a read of a dead object.
const std::filesystem::path& scratch_dir();

}  // namespace kvc::testing
