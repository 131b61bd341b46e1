// Subcommand registry: each cmd_*.cpp defines a static Registration that adds
// its subcommand to the `kvtier` app, so commands are added without editing main.
#pragma once
#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

#include "core/status.h"

namespace kvtier::tools {

// setup(app) creates the subcommand on `app` and sets its callback. The
// callback returns through exceptions: kvtier::Error becomes exit code 1 with
// its message, CLI::Error the usual CLI11 behaviour.
using CommandSetup = std::function<void(CLI::App& app)>;

struct Registration {
  Registration(int order, CommandSetup setup);
};

std::vector<std::pair<int, CommandSetup>>& command_registry();

// Exit code a command callback can set (default 0).
int& command_exit_code();

}  // namespace kvtier::tools
