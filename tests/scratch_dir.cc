#include "scratch_dir.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace kvc::testing {

ScratchDir::ScratchDir(const std::string& prefix) {
  std::error_code ec;
  const std::filesystem::path base = std::filesystem::temp_directory_path(ec);
  if (ec) throw std::runtime_error("no temporary directory: " + ec.message());
  std::string templ = (base / (prefix + "XXXXXX")).string();
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) {
    throw std::runtime_error("mkdtemp " + templ + ": " + std::strerror(errno));
  }
  path_ = std::filesystem::absolute(buf.data());
  struct stat st {};
  if (::lstat(path_.c_str(), &st) != 0) {
    throw std::runtime_error("stat " + path_.string() + ": " + std::strerror(errno));
  }
  device_ = st.st_dev;
  inode_ = st.st_ino;
}

ScratchDir::~ScratchDir() {
  remove();
}

bool ScratchDir::remove() {
  if (removed_) return false;
  removed_ = true;
  // Only the directory mkdtemp made: same device and inode, still a real directory.
  struct stat st {};
  if (::lstat(path_.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_dev != device_ ||
      st.st_ino != inode_) {
    return false;
  }
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
  return !ec;
}

namespace {

// Owns the scratch directory for the whole test program; gtest calls TearDown after the last
// test, while every object the directory's users hold is still alive.
class ScratchEnvironment : public ::testing::Environment {
 public:
  const std::filesystem::path& dir() {
    if (torn_down_) throw std::logic_error("scratch_dir() used after the test environment ended");
    if (!dir_) dir_ = std::make_unique<ScratchDir>("kvcache-test-");
    return dir_->path();
  }
  void TearDown() override {
    torn_down_ = true;
    dir_.reset();
  }

 private:
  std::unique_ptr<ScratchDir> dir_;
  bool torn_down_ = false;
};

// gtest owns the environment (it deletes it); this raw pointer is trivially destructible, so no
// exit-time code can read a destroyed object through it.
ScratchEnvironment* g_environment = nullptr;

}  // namespace

void register_scratch_environment() {
  if (g_environment != nullptr) return;
  g_environment = new ScratchEnvironment;
  ::testing::AddGlobalTestEnvironment(g_environment);
}

const std::filesystem::path& scratch_dir() {
  if (g_environment == nullptr) throw std::logic_error("register_scratch_environment() not called");
  return g_environment->dir();
}

}  // namespace kvc::testing
