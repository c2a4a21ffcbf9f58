// gpumem-bench's harness: how --rounds joins a cell's rounds (add_round).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "harness.hpp"

namespace gpumem::bench {
namespace {

cell measured(std::vector<double> reps) {
  cell c;
  c.reps = std::move(reps);
  c.iterations = 1000;
  return c;
}

cell went_wrong(cell_status status, std::string message) {
  cell c;
  c.status = status;
  c.message = std::move(message);
  return c;
}

TEST(BenchRounds, TheRepetitionsOfEveryRoundJoinAndTheFigureIsTheirMedian) {
  cell c = measured({10, 12});
  add_round(c, measured({30, 31}), 2);
  add_round(c, measured({11}), 3);
  EXPECT_EQ(c.status, cell_status::ok);
  EXPECT_EQ(c.reps, (std::vector<double>{10, 12, 30, 31, 11}));
  EXPECT_DOUBLE_EQ(c.median(), 12);
  EXPECT_FALSE(c.cut_by_budget);
}

TEST(BenchRounds, ARoundThatFailsMakesTheCellFailNamingTheRound) {
  cell c = measured({10, 12});
  add_round(c, went_wrong(cell_status::failed, "out of memory: the pool could not grow"), 2);
  EXPECT_EQ(c.status, cell_status::failed);
  EXPECT_EQ(c.message, "round 2: out of memory: the pool could not grow");
  EXPECT_TRUE(c.reps.empty()) << "a failed cell has no figure";
  // A later round neither revives it nor replaces the first failure.
  add_round(c, measured({9}), 3);
  add_round(c, went_wrong(cell_status::error, "something else"), 4);
  EXPECT_EQ(c.status, cell_status::failed);
  EXPECT_EQ(c.message, "round 2: out of memory: the pool could not grow");
  EXPECT_TRUE(c.reps.empty());
}

TEST(BenchRounds, ARoundWhoseFailureIsTheTimedResultKeepsItsTime) {
  cell c = measured({40});
  cell oom = went_wrong(cell_status::failed, "the 25% allocation failed");
  oom.outcome = "OOM";
  oom.reps = {52};
  add_round(c, std::move(oom), 2);
  EXPECT_EQ(c.status, cell_status::failed);
  EXPECT_EQ(c.outcome, "OOM");
  EXPECT_EQ(c.reps, (std::vector<double>{52}));
  EXPECT_EQ(c.message, "round 2: the 25% allocation failed");
}

TEST(BenchRounds, ARoundThatSkippedTheCellLeavesTheEarlierFigureMarkedShort) {
  cell c = measured({10, 12});
  add_round(c, went_wrong(cell_status::skipped, "16 threads would not fit --cell-budget-s 5"), 2);
  EXPECT_EQ(c.status, cell_status::ok);
  EXPECT_EQ(c.reps, (std::vector<double>{10, 12}));
  EXPECT_TRUE(c.cut_by_budget);
}

TEST(BenchRounds, ACellThatWentWrongInTheFirstRoundStaysAsItWas) {
  cell c = went_wrong(cell_status::skipped, "needs a GPU");
  add_round(c, measured({10}), 2);
  EXPECT_EQ(c.status, cell_status::skipped);
  EXPECT_EQ(c.message, "needs a GPU");
  EXPECT_TRUE(c.reps.empty());
}

TEST(BenchRounds, ARoundCutToItsBudgetMarksTheCell) {
  cell c = measured({10, 12});
  cell short_round = measured({11});
  short_round.cut_by_budget = true;
  add_round(c, std::move(short_round), 2);
  EXPECT_TRUE(c.cut_by_budget);
  EXPECT_EQ(c.reps.size(), 3U);
}

}  // namespace
}  // namespace gpumem::bench
