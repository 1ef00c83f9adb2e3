#include "base/huge_page_memory.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

namespace kvc {
namespace {

// The kernel's transparent huge page mode ("always", "madvise" or "never"), empty if unknown.
std::string thp_mode() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  std::getline(in, line);
  const auto open = line.find('['), close = line.find(']');
  if (open == std::string::npos || close == std::string::npos) return "";
  return line.substr(open + 1, close - open - 1);
}

// KiB of huge pages backing the mapping that contains p, from /proc/self/smaps.
long huge_kib_at(const void* p) {
  std::ifstream in("/proc/self/smaps");
  const auto address = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    uintptr_t begin = 0, end = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> begin >> dash >> end && dash == '-') {
      inside = begin <= address && address < end;
    } else if (inside && line.rfind("AnonHugePages:", 0) == 0) {
      return std::stol(line.substr(14));
    }
  }
  return -1;
}

TEST(HugePageMemory, ZeroFilledAndOnAHugePageBoundary) {
  HugePageMemory m(3 * HugePageMemory::kHugePageBytes + 5);
  ASSERT_NE(m.data(), nullptr);
  EXPECT_EQ(m.size(), 3 * HugePageMemory::kHugePageBytes + 5);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(m.data()) % HugePageMemory::kHugePageBytes, 0u);
  for (size_t i = 0; i < m.size(); i += 4093) ASSERT_EQ(m.data()[i], 0) << i;
  m.data()[m.size() - 1] = 7;
  EXPECT_EQ(m.data()[m.size() - 1], 7);
}

TEST(HugePageMemory, EmptyHoldsNothing) {
  HugePageMemory m(0);
  EXPECT_EQ(m.data(), nullptr);
  EXPECT_EQ(m.size(), 0u);
  m.commit();
}

TEST(HugePageMemory, MovesHandOverTheMemory) {
  HugePageMemory a(4096);
  a.data()[10] = 3;
  uint8_t* const p = a.data();
  HugePageMemory b(std::move(a));
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(b.data()[10], 3);
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(a.size(), 0u);
  HugePageMemory c(100);
  c = std::move(b);
  EXPECT_EQ(c.data(), p);
  EXPECT_EQ(c.size(), 4096u);
}

// The point of the class: where the kernel offers transparent huge pages, the committed memory
// is backed by them.
TEST(HugePageMemory, CommittedMemoryGetsHugePagesWhereTheKernelOffersThem) {
  const std::string mode = thp_mode();
  HugePageMemory m(8 * HugePageMemory::kHugePageBytes);
  m.commit();
  const long huge = huge_kib_at(m.data());
  if (mode != "always" && mode != "madvise") {
    GTEST_SKIP() << "transparent huge pages are '" << mode << "' here: plain pages only";
  }
  ASSERT_GE(huge, 0) << "no smaps entry for the mapping";
  EXPECT_GT(huge, 0) << "8 committed huge pages' worth of memory got no huge page (mode " << mode
                     << ")";
}

}  // namespace
}  // namespace kvc
