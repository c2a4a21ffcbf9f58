// The command line of every gpumem tool, on CLI11: one behaviour for all of them.
//   - `--opt value` and `--opt=value` both work; given twice, the last one counts;
//   - -h/--help prints the help (CLI11's layout: the description, the options, and
//     an epilog that says which environment variables count and what the exit
//     status means) and exits 0; --version prints "TOOL (gpumem) VERSION" and exits 0;
//   - a usage error (an unknown option, a missing value, a value that is not a
//     number or is out of range) prints "TOOL: what is wrong" (naming the option)
//     and "Try 'TOOL --help'." on stderr and exits 2.
// Numbers are checked by whole_number(), not converted leniently: "abc" or "5x" is
// an error, never 0 or 5.
#pragma once

#include <CLI/CLI.hpp>

#include <charconv>
#include <iostream>
#include <optional>
#include <string>
#include <system_error>

#ifndef GPUMEM_VERSION
#error "GPUMEM_VERSION (the project's version) must be defined: link gpumem_tools_cli"
#endif

namespace gpumem::tools {

inline constexpr int exit_usage = 2;

// What --version prints.
inline std::string version_text(const std::string& tool) { return tool + " (gpumem) " GPUMEM_VERSION; }

// An application with gpumem's conventions; add the options, then parse_command_line.
inline void apply_conventions(CLI::App& app, const std::string& epilog) {
  app.set_help_flag("-h,--help", "print this help and exit");
  app.set_version_flag("--version", version_text(app.get_name()), "print the gpumem version and exit");
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.footer(epilog);
  app.get_formatter()->column_width(26);
}

// A check for an option that takes a whole number from lo to hi (decimal digits,
// an optional minus sign): anything else is a usage error naming the option.
inline CLI::Validator whole_number(long long lo, long long hi) {
  return CLI::Validator(
      [lo, hi](std::string& value) -> std::string {
        long long v = 0;
        const char* end = value.data() + value.size();
        const auto [at, ec] = std::from_chars(value.data(), end, v);
        if (value.empty() || ec != std::errc{} || at != end || v < lo || v > hi) {
          return "wants a whole number from " + std::to_string(lo) + " to " + std::to_string(hi) +
                 ", not '" + value + "'";
        }
        return {};
      },
      "", "whole number");
}

// Prints a usage error the way every tool does; returns exit_usage.
inline int usage_error(const CLI::App& app, const std::string& message) {
  std::cerr << app.get_name() << ": " << message << "\nTry '" << app.get_name() << " --help'.\n";
  return exit_usage;
}

// Parses argv. An exit status when the program is to stop now (0 after --help or
// --version, exit_usage after a usage error, reported on stderr); none otherwise.
inline std::optional<int> parse_command_line(CLI::App& app, int argc, const char* const* argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);  // the help on stdout, 0
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);  // the version on stdout, 0
  } catch (const CLI::ParseError& e) {
    return usage_error(app, e.what());
  }
  return std::nullopt;
}

}  // namespace gpumem::tools
