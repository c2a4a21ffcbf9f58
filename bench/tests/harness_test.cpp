// gpumem-bench's harness: how --rounds joins a cell's rounds (add_round), and
// how --time-limit-s stops cells (run_cells).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
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

std::atomic<int> resources_made{0};
const subject counted{"counted", subject_kind::peer, [](int) -> std::shared_ptr<memory_resource> {
                        ++resources_made;
                        throw std::runtime_error("this test's cells never build a resource");
                      }};

TEST(BenchTimeLimit, ACellBegunAfterTheDeadlineIsSkippedWithoutBuildingOrRunning) {
  options opts;
  opts.time_limit_seconds = 90;
  context ctx{opts, 0};
  ctx.deadline = std::chrono::steady_clock::now() - std::chrono::seconds(1);
  bool ran = false;
  const std::vector<cell> cells = run_cells(counted, ctx, 3, [&](memory_resource&, stream&) {
    ran = true;
    return std::vector<cell>(3);
  });
  ASSERT_EQ(cells.size(), 3U);
  for (const cell& c : cells) {
    EXPECT_EQ(c.status, cell_status::skipped);
    EXPECT_EQ(c.message, "not run: the run reached --time-limit-s 90");
  }
  EXPECT_FALSE(ran);
  EXPECT_EQ(resources_made.load(), 0);
  // run_cell, which the one-column workloads use, the same.
  EXPECT_EQ(run_cell(counted, ctx, [&](memory_resource&, stream&) { return cell{}; }).status, cell_status::skipped);
  EXPECT_EQ(resources_made.load(), 0);
}

TEST(BenchTimeLimit, BeforeTheDeadlineTheCellIsBuiltAndRun) {
  options opts;
  opts.time_limit_seconds = 90;
  context ctx{opts, 0};
  ctx.deadline = std::chrono::steady_clock::now() + std::chrono::hours(1);
  const int before = resources_made.load();
  const cell c = run_cell(counted, ctx, [&](memory_resource&, stream&) { return cell{}; });
  EXPECT_EQ(resources_made.load(), before + 1);
  EXPECT_EQ(c.status, cell_status::error);  // the subject's own exception, as a cell
  EXPECT_EQ(c.message, "this test's cells never build a resource");
}

}  // namespace
}  // namespace gpumem::bench
