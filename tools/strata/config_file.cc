// --config FILE; see config_file.h.
#include "tools/strata/config_file.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <vector>

namespace strata::cli {
namespace {

// The subcommand a section's path names, from the root app ("bench.step" is
// {"bench", "step"}); nullptr when there is none.
CLI::App* FindSubcommand(CLI::App* root, const std::vector<std::string>& parents) {
  CLI::App* app = root;
  for (const std::string& name : parents) {
    CLI::App* next = nullptr;
    for (CLI::App* s : app->get_subcommands({})) {
      if (s->get_name() == name) next = s;
    }
    if (next == nullptr) return nullptr;
    app = next;
  }
  return app;
}

// The full name of `sub` as a section: "bench.step".
std::string SectionName(const CLI::App* sub) {
  std::string name = sub->get_name();
  for (const CLI::App* p = sub->get_parent(); p != nullptr && p->get_parent() != nullptr;
       p = p->get_parent()) {
    name = p->get_name() + "." + name;
  }
  return name;
}

// Its name on the command line: "bench step".
std::string CommandName(const CLI::App* sub) {
  std::string name = SectionName(sub);
  std::replace(name.begin(), name.end(), '.', ' ');
  return name;
}

CLI::Option* FindFlag(CLI::App* app, const std::string& key) {
  if (key.empty() || key.front() == '-') return nullptr;
  try {
    return app->get_option("--" + key);
  } catch (const CLI::Error&) {
    return nullptr;
  }
}

}  // namespace

CLI::Option* AddConfigFlag(CLI::App* sub, std::string* path) {
  return sub->add_option("--config", *path,
                         "Read flags from a TOML file: key = value lines, flag names without "
                         "the leading dashes (d-model = 128); [" +
                             SectionName(sub) +
                             "] or no section for this command, other sections for other "
                             "commands (README: configuration files); the command line wins");
}

void SetCallbackWithConfig(CLI::App* sub, std::function<int()> run, int* exit_code) {
  auto path = std::make_shared<std::string>();
  AddConfigFlag(sub, path.get());
  sub->callback([sub, path, run = std::move(run), exit_code] {
    if (!path->empty()) {
      if (Status s = ApplyConfigFile(sub, *path); !s.ok()) {
        std::fprintf(stderr, "strata %s: %s\n", CommandName(sub).c_str(), s.ToString().c_str());
        *exit_code = 1;
        return;
      }
    }
    *exit_code = run();
  });
}

Status ApplyConfigFile(CLI::App* sub, const std::string& path) {
  const std::string where = "--config " + path;
  std::vector<CLI::ConfigItem> items;
  try {
    items = CLI::ConfigTOML().from_file(path);
  } catch (const CLI::Error& e) {
    return Status::InvalidArgument(where + ": " + e.what()).WithPath(path);
  }
  CLI::App* root = sub;
  while (root->get_parent() != nullptr) root = root->get_parent();
  for (const CLI::ConfigItem& item : items) {
    if (item.name == "++" || item.name == "--") continue;  // CLI11's section markers
    CLI::App* target = item.parents.empty() ? sub : FindSubcommand(root, item.parents);
    const std::string section = CLI::detail::join(item.parents, ".");
    if (target == nullptr || target == root) {
      return Status::InvalidArgument(where + ": section [" + section +
                                     "] is not a strata command (sections name commands: "
                                     "[train], [generate], [eval], ...)")
          .WithPath(path);
    }
    std::string key = item.name;
    std::replace(key.begin(), key.end(), '_', '-');
    CLI::Option* opt = key == "config" ? nullptr : FindFlag(target, key);
    if (opt == nullptr) {
      return Status::InvalidArgument(where + ": '" + item.name + "' in [" + SectionName(target) +
                                     "] is not a flag of strata " + CommandName(target) +
                                     " (keys are flag names without the dashes, e.g. d-model)")
          .WithPath(path);
    }
    if (target != sub || opt->count() > 0) continue;  // another command's, or the command line's
    if (item.inputs.empty()) continue;                // an empty array: the flag's default
    try {
      opt->add_result(item.inputs);
      opt->run_callback();
    } catch (const CLI::Error& e) {
      return Status::InvalidArgument(where + ": " + item.name + " = " +
                                     CLI::detail::join(item.inputs) + ": " + e.what())
          .WithPath(path);
    }
  }
  return Status::OK();
}

}  // namespace strata::cli
