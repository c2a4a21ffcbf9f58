// GPUMEM_CONF: the grammar, its errors, what it builds, and the default current
// resource following it.
#include <gtest/gtest.h>

#include "adaptors/adaptor_test_support.hpp"
#include "gpumem/adaptors/deferred_free.hpp"
#include "gpumem/adaptors/limiting.hpp"
#include "gpumem/adaptors/logging.hpp"
#include "gpumem/adaptors/statistics.hpp"
#include "gpumem/config.hpp"
#include "gpumem/current_resource.hpp"
#include "gpumem/device.hpp"
#include "gpumem/pool_resource.hpp"
#include "support/touch.hpp"

namespace gpumem::test {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

std::string error_of(std::string_view conf) {
  try {
    describe_config(conf);
  } catch (const logic_error& e) {
    return e.what();
  }
  return "no error";
}

TEST(Config, AdaptorsAreLayeredInOneOrderWhateverTheOrderWritten) {
  EXPECT_EQ(describe_config("cuda"), "cuda");
  EXPECT_EQ(describe_config("pool"), "pool(cuda)");
  EXPECT_EQ(describe_config(" Pool , initial = 50% "), "pool(cuda)");
  EXPECT_EQ(describe_config("pool,stats,limit=1G,defer,track"), "stats(track(defer(limit(pool(cuda)))))");
  EXPECT_EQ(describe_config("pool,log=/tmp/x.csv,stats"), "log(stats(pool(log:upstream(cuda))))");
  EXPECT_EQ(describe_config("cuda,track=stacks,log=x.csv,sites"), "log(track(cuda))");
}

TEST(Config, ErrorsNameTheBadToken) {
  EXPECT_NE(error_of("pool,initail=50%").find("unknown option \"initail=50%\""), std::string::npos);
  EXPECT_NE(error_of("pool,initial=lots").find("\"lots\" is not a size"), std::string::npos);
  EXPECT_NE(error_of("pool,initial=0").find("is not a size"), std::string::npos);
  EXPECT_NE(error_of("pool,maximum=150%").find("is not a size"), std::string::npos);
  EXPECT_NE(error_of("pool,initial").find("option \"initial\" needs a size"), std::string::npos);
  EXPECT_NE(error_of("cuda,initial=1G").find("applies to a pool, not to base \"cuda\""), std::string::npos);
  EXPECT_NE(error_of("pool,stats,stats").find("\"stats\" is given twice"), std::string::npos);
  EXPECT_NE(error_of("pool,stats=1").find("takes no value"), std::string::npos);
  EXPECT_NE(error_of("pool,,stats").find("empty option"), std::string::npos);
  EXPECT_NE(error_of("").find("empty"), std::string::npos);
  EXPECT_NE(error_of("heap").find("unknown base resource \"heap\""), std::string::npos);
  EXPECT_NE(error_of("initial=1G").find("first token must name a base resource"), std::string::npos);
  EXPECT_NE(error_of("pool,log=").find("needs a path"), std::string::npos);
  EXPECT_NE(error_of("pool,sites").find("needs log=PATH"), std::string::npos);
  EXPECT_NE(error_of("pool,track=all").find("track takes no value or \"stacks\""), std::string::npos);
  // Resources planned but not built yet are named as such.
  for (const char* planned : {"async", "managed", "vmm"}) {
    const std::string e = error_of(planned);
    EXPECT_NE(e.find("is not available in this version of gpumem"), std::string::npos) << e;
    EXPECT_NE(e.find("available: cuda, pool"), std::string::npos) << e;
  }
  EXPECT_NE(error_of("pool,x=1").find("GPUMEM_CONF \"pool,x=1\""), std::string::npos) << "the whole string is quoted";
  EXPECT_THROW(make_resource_from_config("pool,bogus", 0), logic_error);
}

TEST(Config, SizesAreBytesOrPercentOfTheDevice) {
  const std::size_t total = device_memory_info(0).total_bytes;
  auto r = make_resource_from_config("pool,initial=1%,maximum=2%", 0);
  auto* pool = dynamic_cast<pool_resource*>(r.get());
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->options().maximum_bytes, total / 50);
  EXPECT_GE(pool->statistics().reserved_bytes, total / 100);
  EXPECT_LE(pool->statistics().reserved_bytes, total / 100 + 256);
  auto l = make_resource_from_config("cuda,limit=3MiB", 0);
  ASSERT_NE(dynamic_cast<limiting_adaptor*>(l.get()), nullptr);
  EXPECT_EQ(dynamic_cast<limiting_adaptor*>(l.get())->limit_bytes(), 3 * MiB);
  for (const char* s : {"64k", "64K", "64KiB", "64kb"}) {
    auto p = make_resource_from_config(std::string("pool,min_chunk=") + s + ",max_chunk=1M", 0);
    EXPECT_EQ(dynamic_cast<pool_resource*>(p.get())->options().min_chunk_bytes, 64U << 10) << s;
  }
  EXPECT_THROW(make_resource_from_config("pool,initial=2G,maximum=1G", 0), logic_error)
      << "the pool's own checks come back as configuration errors";
}

TEST(Config, TheWholeStackWorks) {
  temp_path file("conf.csv");
  auto r = make_resource_from_config("pool,initial=4M,limit=64M,defer,track,stats,log=" + file.str(), 0);
  EXPECT_EQ(r->properties().device, 0);
  EXPECT_TRUE(r->properties().thread_safe);
  auto* log = dynamic_cast<logging_adaptor*>(r.get());
  ASSERT_NE(log, nullptr);
  auto* stats = dynamic_cast<statistics_adaptor*>(&log->upstream());
  ASSERT_NE(stats, nullptr);
  stream s(0);
  void* p = r->allocate(MiB, s);
  device_fill(p, MiB, 0x5E, s);
  EXPECT_EQ(device_count_mismatches(p, MiB, 0x5E, s), 0U);
  EXPECT_EQ(stats->statistics().current_bytes, MiB);
  EXPECT_THROW(r->allocate(65 * MiB, s), out_of_memory) << "the limit is in the stack";
  r->deallocate(p, MiB, s);
  log->flush();
  const csv_file csv = read_csv(file.str());
  std::size_t upstream_rows = 0;
  for (const auto& row : csv.rows) upstream_rows += row.at("source") == "upstream" ? 1 : 0;
  EXPECT_EQ(upstream_rows, 1U) << "the pool's initial chunk";
  EXPECT_EQ(csv.rows.size(), 4U);
  testing::internal::CaptureStderr();
  r.reset();
  EXPECT_NE(testing::internal::GetCapturedStderr().find("statistics (GPUMEM_CONF): peak 1.00 MiB"),
            std::string::npos);
}

TEST(Config, TheDefaultCurrentResourceFollowsGpumemConf) {
  auto before = set_current_resource(0, nullptr);
  {
    scoped_env conf("GPUMEM_CONF", "cuda,limit=5MiB,defer");
    set_current_resource(0, nullptr);  // the default is made again on next use
    auto r = get_current_resource(0);
    auto* d = dynamic_cast<deferred_free_adaptor*>(r.get());
    ASSERT_NE(d, nullptr) << "GPUMEM_CONF was not honoured";
    EXPECT_NE(dynamic_cast<limiting_adaptor*>(&d->upstream()), nullptr);
    EXPECT_THROW(r->allocate(6 * MiB, stream_view{}), out_of_memory);
  }
  {
    scoped_env conf("GPUMEM_CONF", "pool,maximum=banana");
    set_current_resource(0, nullptr);
    try {
      get_current_resource(0);
      ADD_FAILURE() << "a bad GPUMEM_CONF was accepted";
    } catch (const logic_error& e) {
      EXPECT_NE(std::string(e.what()).find("banana"), std::string::npos) << e.what();
    }
  }
  {
    scoped_env conf("GPUMEM_CONF", "");
    set_current_resource(0, nullptr);
    EXPECT_NE(dynamic_cast<pool_resource*>(get_current_resource(0).get()), nullptr) << "empty: the default";
  }
  set_current_resource(0, before);
}

}  // namespace
}  // namespace gpumem::test
