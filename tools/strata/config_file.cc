// --config FILE; see config_file.h.
#include "tools/strata/config_file.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string_view>
#include <vector>

#include "strata/input_file.h"

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

// A flags file is a few lines; a bigger one is the wrong file (and /dev/zero has no end).
constexpr uint64_t kMaxConfigBytes = uint64_t{1} << 20;

// `s` with the characters a terminal does not show escaped: control characters as \xNN, the
// byte order mark and the zero-width spaces as \uXXXX (an error naming a key must show
// what is wrong with it).
std::string Visible(std::string_view s) {
  static constexpr std::pair<std::string_view, std::string_view> kInvisible[] = {
      {"\xEF\xBB\xBF", "\\uFEFF"},
      {"\xE2\x80\x8B", "\\u200B"},
      {"\xE2\x80\x8C", "\\u200C"},
      {"\xE2\x80\x8D", "\\u200D"},
      {"\xE2\x81\xA0", "\\u2060"}};
  std::string out;
  for (size_t i = 0; i < s.size();) {
    bool replaced = false;
    for (const auto& [bytes, name] : kInvisible) {
      if (s.substr(i, bytes.size()) == bytes) {
        out += name;
        i += bytes.size();
        replaced = true;
        break;
      }
    }
    if (replaced) continue;
    const auto c = static_cast<unsigned char>(s[i++]);
    if (c < 0x20 || c == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02X", c);
      out += hex;
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out;
}

std::string_view Trim(std::string_view s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

// The quoted strings of one line (or of an array's joined lines), as offsets (npos: none).
struct Quotes {
  size_t open = std::string_view::npos;            // the quote of a string left open
  size_t hash_in_string = std::string_view::npos;  // the first '#' inside a string
  size_t comment = std::string_view::npos;         // the first '#' outside one
  size_t equals = std::string_view::npos;          // the first '=' outside one (before '#')
};

Quotes ScanQuotes(std::string_view text) {
  Quotes q;
  for (size_t i = 0; i < text.size() && q.comment == std::string_view::npos; ++i) {
    const char c = text[i];
    if (q.open != std::string_view::npos) {
      if (c == text[q.open]) q.open = std::string_view::npos;
      if (c == '#' && q.hash_in_string == std::string_view::npos) q.hash_in_string = i;
    } else if (c == '"' || c == '\'') {
      q.open = i;
    } else if (c == '#') {
      q.comment = i;
    } else if (c == '=' && q.equals == std::string_view::npos) {
      q.equals = i;
    }
  }
  return q;
}

// CLI11 2.1's TOML reader (which ApplyConfigFile then runs) is lenient where a typo would
// change a value without a word: a string left open keeps its quote (`save = "out.st`
// names a file `"out.st`), an array left open swallows the lines after it, a '#' inside
// quotes starts a comment there, and a """multi-line""" string keeps two of its quotes. Such
// lines are refused here, naming the line. The lines are split as CLI11 splits them.
Status CheckConfigSyntax(const std::string& text, const std::string& where) {
  std::vector<std::string_view> lines;
  for (size_t p = 0; p <= text.size();) {
    size_t q = text.find('\n', p);
    if (q == std::string::npos) q = text.size();
    lines.push_back(std::string_view(text).substr(p, q - p));
    p = q + 1;
  }
  const std::string hash_in_string =
      "a '#' inside a quoted value starts a comment in a --config file; give this value on the "
      "command line";
  auto fail = [&](size_t line, const std::string& what) {
    return Status::InvalidArgument(where + ": line " + std::to_string(line + 1) + ": " + what);
  };
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string_view line = Trim(lines[i]);
    if (line.size() < 3 || line.front() == '[' || line.front() == '#' || line.front() == ';') {
      continue;  // CLI11 skips lines this short; sections and comments
    }
    const size_t eq = line.find('=');
    if (eq == std::string_view::npos) continue;  // a bare key: a switch turned on
    const std::string_view value = Trim(line.substr(eq + 1));
    if (value.substr(0, 3) == "\"\"\"" || value.substr(0, 3) == "'''") {
      return fail(i, "multi-line strings (" + std::string(value.substr(0, 3)) +
                         ") are not read; write the value on one line between quotes");
    }
    // CLI11 cuts the value at its first '#', inside a string or not.
    const Quotes q = ScanQuotes(value);
    if (q.hash_in_string != std::string_view::npos) return fail(i, hash_in_string);
    if (value.empty() || value.front() != '[') {
      if (q.open == std::string_view::npos) continue;
      return fail(i, "the string " + Visible(value.substr(q.open)) +
                         " is not closed; end it with " + value[q.open]);
    }
    // An array: CLI11 joins the lines that follow, as they are, until one ends with ']'.
    std::string array(Trim(value.substr(0, q.comment)));
    if (array == "[") {
      return fail(i, "write the array's first element on the line of its key ([\"a\", ...)");
    }
    size_t last = i;
    while (array.back() != ']' && last + 1 < lines.size()) {
      const std::string_view next = Trim(lines[last + 1]);
      const Quotes nq = ScanQuotes(next);
      if (nq.equals != std::string_view::npos || (!next.empty() && next.front() == '[')) {
        break;  // the next flag or section: the array was left open
      }
      ++last;
      if (nq.comment != std::string_view::npos) {
        return fail(last, "a comment inside an array is not read as one; move it above");
      }
      array += next;
    }
    const size_t open = ScanQuotes(array).open;
    if (open != std::string_view::npos) {
      return fail(i, "the string " + Visible(std::string_view(array).substr(open)) +
                         " is not closed; end it with " + array[open]);
    }
    if (array.back() != ']') {
      return fail(i, "the array " + Visible(array) + " is not closed; end it with ]");
    }
    i = last;
  }
  return Status::OK();
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
  STRATA_ASSIGN_OR_RETURN(std::string text, ReadInputFile(path, "--config", kMaxConfigBytes));
  // A UTF-8 byte order mark (Notepad writes one) is not part of the first key.
  if (text.rfind("\xEF\xBB\xBF", 0) == 0) text.erase(0, 3);
  STRATA_RETURN_IF_ERROR(CheckConfigSyntax(text, where).WithPath(path));
  std::vector<CLI::ConfigItem> items;
  try {
    std::istringstream in(text);
    items = CLI::ConfigTOML().from_config(in);
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
      return Status::InvalidArgument(where + ": section [" + Visible(section) +
                                     "] is not a strata command (sections name commands: "
                                     "[train], [generate], [eval], ...)")
          .WithPath(path);
    }
    std::string key = item.name;
    std::replace(key.begin(), key.end(), '_', '-');
    CLI::Option* opt = key == "config" ? nullptr : FindFlag(target, key);
    if (opt == nullptr) {
      return Status::InvalidArgument(where + ": '" + Visible(item.name) + "' in [" +
                                     SectionName(target) + "] is not a flag of strata " +
                                     CommandName(target) +
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
