#include "kv/host_resolver.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "dns_test_servers.h"

namespace kvc::kv {
namespace {

using ::testing::AnyOf;
using ::testing::Contains;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

TEST(HostResolver, NumericAddressesAreReturnedWithNoLookup) {
  testing::SilentDnsServer dns;  // were any lookup made, it would wait out the timeout
  ASSERT_TRUE(dns.bound());
  const auto t0 = Clock::now();
  EXPECT_EQ(resolve_host("127.0.0.1", 1000, dns.servers()).addresses,
            std::vector<std::string>{"127.0.0.1"});
  EXPECT_EQ(resolve_host("::1", 1000, dns.servers()).addresses, std::vector<std::string>{"::1"});
  EXPECT_EQ(resolve_host("fe80::1%lo", 1000, dns.servers()).addresses,
            std::vector<std::string>{"fe80::1%lo"});
  EXPECT_LT(ms_since(t0), 500);
}

TEST(HostResolver, NamesInTheHostsFileResolveWithoutAServer) {
  testing::SilentDnsServer dns;
  ASSERT_TRUE(dns.bound());
  const HostResolution r = resolve_host("localhost", 2000, dns.servers());
  EXPECT_THAT(r.addresses, Contains(AnyOf("127.0.0.1", "::1"))) << r.error;
}

TEST(HostResolver, AServerThatNeverAnswersCostsOneTimeout) {
  testing::SilentDnsServer dns;
  ASSERT_TRUE(dns.bound());
  const auto t0 = Clock::now();
  const HostResolution r = resolve_host("redis.kvcache-test.example", 150, dns.servers());
  const double ms = ms_since(t0);
  EXPECT_TRUE(r.addresses.empty());
  EXPECT_THAT(r.error, HasSubstr("no answer within 150 ms"));
  EXPECT_GE(ms, 140);
  EXPECT_LT(ms, 1000) << "the lookup outlived its timeout";
}

// A server that answers A queries and never AAAA ones: the IPv4 address that came in is used
// when the deadline ends the wait for the other half (it used to be thrown away).
TEST(HostResolver, AnUnansweredIpv6HalfKeepsTheIpv4Answer) {
  testing::Ipv4OnlyDnsServer dns;
  ASSERT_TRUE(dns.bound());
  const HostResolution r = resolve_host("redis.kvcache-test.example", 200, dns.servers());
  EXPECT_EQ(r.addresses, std::vector<std::string>{"127.0.0.1"}) << r.error;
  EXPECT_GE(dns.a_queries(), 1);
  EXPECT_GE(dns.aaaa_queries(), 1);
}

TEST(HostResolver, AMalformedServerListIsAnError) {
  const HostResolution r = resolve_host("redis.kvcache-test.example", 100, "not an address");
  EXPECT_TRUE(r.addresses.empty());
  EXPECT_FALSE(r.error.empty());
}

}  // namespace
}  // namespace kvc::kv
