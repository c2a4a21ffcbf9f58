// The fixture of pool_resource's own tests (pool_resource_test.cpp,
// pool_threads_test.cpp): one test suite, one fixture type.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>

#include "gpumem/cuda_resource.hpp"
#include "gpumem/stream.hpp"

namespace gpumem::test {

class Pool : public ::testing::Test {
 protected:
  cuda_resource upstream{0};
  stream s{0};
};

}  // namespace gpumem::test
