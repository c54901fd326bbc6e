// The deterministic mutation driver: runs a fuzz target (LLVMFuzzerTestOneInput) where
// libFuzzer is not available (GCC builds, the default), as a CTest test.
//
//   fuzz_NAME [--mutations N] [--seconds S] [--hang-seconds H] [--save SEED:K FILE] PATH...
//
// Each PATH is a seed file or a folder of them (read in name order). Every seed runs as
// given (the regression inputs kept in tests/fuzz/corpus/NAME/), then N mutations of each,
// round robin over the seeds, until N are done or S seconds have passed. Mutation K of seed
// i is a pure function of (i, K) and the seed's bytes: bit flips, bytes set to extremes,
// truncations, byte insertions and deletions, a 1/2/4/8-byte little-endian field set to an
// extreme (0, 1, the largest signed and unsigned values, a huge count), a run of bytes
// duplicated, a number or a token of the formats spliced in. A crash or an escaped
// exception ends the process (the test fails) with the seed and K named first; `--save
// SEED:K FILE` writes that mutation to FILE, to keep it as a regression input. An input that
// runs longer than H seconds (default 10) is reported as a hang and fails the test.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

struct Seed {
  std::string name;
  std::string bytes;
};

// splitmix64, as model/data.cc: the same mutations on every platform.
struct Rng {
  uint64_t s;
  uint64_t Next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  size_t Below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(Next() % n); }
};

const char* const kTokens[] = {"-1",
                               "0",
                               "1e999",
                               "nan",
                               "-inf",
                               "18446744073709551616",
                               "9223372036854775807",
                               "-9223372036854775808",
                               "4294967296",
                               "\"",
                               "\\",
                               "[",
                               "]",
                               "{",
                               "}",
                               "[[",
                               "]]",
                               "=",
                               "'''",
                               "\"\"\"",
                               "\n",
                               "\0",
                               "#",
                               ",",
                               ":",
                               "[[train]]",
                               "[train]",
                               "[bench.step]",
                               "\"F32\"",
                               "\"BF16\"",
                               "\"F16\"",
                               "\"I64\"",
                               "\"shape\"",
                               "\"data_offsets\"",
                               "\"__metadata__\"",
                               "true",
                               "null",
                               "\xff\xfe",
                               "\xc3\x28",
                               "20240520"};

void PutLe(std::string* b, size_t at, uint64_t v, size_t width) {
  for (size_t i = 0; i < width && at + i < b->size(); ++i)
    (*b)[at + i] = static_cast<char>(v >> (8 * i));
}

std::string Mutate(const std::string& seed, uint64_t seed_index, uint64_t k) {
  Rng r{(seed_index << 32) ^ k ^ 0x5eedf00dull};
  std::string b = seed;
  const size_t edits = 1 + r.Below(4);
  for (size_t e = 0; e < edits; ++e) {
    const size_t at = r.Below(b.size() + 1);
    switch (r.Below(9)) {
      case 0:  // bit flip
        if (!b.empty()) b[r.Below(b.size())] ^= static_cast<char>(1u << r.Below(8));
        break;
      case 1: {  // a byte set to an extreme
        static const uint8_t kBytes[] = {0x00, 0x01, 0x7f, 0x80, 0xff, '0', '9', ' '};
        if (!b.empty()) b[r.Below(b.size())] = static_cast<char>(kBytes[r.Below(8)]);
        break;
      }
      case 2:  // truncation
        b.resize(r.Below(b.size() + 1));
        break;
      case 3:  // byte insertion
        b.insert(at, r.Below(4) + 1, static_cast<char>(r.Next()));
        break;
      case 4:  // byte deletion
        if (at < b.size()) b.erase(at, 1 + r.Below(std::min<size_t>(16, b.size() - at)));
        break;
      case 5: {  // a length field set to an extreme, at an aligned offset more often than not
        static const uint64_t kValues[] = {0,          1,          0x7f,       0xff,
                                           0x7fffffff, 0x80000000, 0xffffffff, 0x100000000ull,
                                           ~0ull,      ~0ull - 1,  1ull << 63, (1ull << 63) - 1,
                                           4096,       4095,       1ull << 40, ~0ull - 4095};
        static const size_t kWidths[] = {1, 2, 4, 8};
        size_t pos = r.Below(b.size());
        if (r.Below(3) != 0) pos &= ~size_t{3};
        PutLe(&b, pos, kValues[r.Below(16)], kWidths[r.Below(4)]);
        break;
      }
      case 6: {  // a run duplicated
        if (b.empty()) break;
        const size_t from = r.Below(b.size()),
                     len = 1 + r.Below(std::min<size_t>(64, b.size() - from));
        b.insert(at, b.substr(from, len));
        break;
      }
      case 7: {  // a token spliced in
        const char* t = kTokens[r.Below(std::size(kTokens))];
        const size_t len = *t == '\0' ? 1 : std::strlen(t);
        b.insert(at, t, len);
        break;
      }
      default: {  // a run of digits overwritten with a large or negative number
        const char* t = kTokens[r.Below(9)];
        for (size_t i = 0; t[i] != '\0' && at + i < b.size(); ++i) b[at + i] = t[i];
        break;
      }
    }
  }
  return b;
}

// What is running, for the crash and hang reports (set before each input).
char g_current[512];
double g_hang_seconds = 10;

void Report(const char* what) {
  const ssize_t n1 = ::write(2, what, std::strlen(what));
  const ssize_t n2 = ::write(2, g_current, std::strlen(g_current));
  (void)n1, (void)n2;
}

void OnSignal(int sig) {
  Report(sig == SIGALRM ? "\nfuzz: HANG (over --hang-seconds) on " : "\nfuzz: CRASH on ");
  if (sig == SIGALRM) ::_exit(1);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

void OnTerminate() {
  Report("\nfuzz: an exception escaped the target on ");
  std::abort();
}

void Run(const std::string& bytes, const std::string& what) {
  std::snprintf(g_current, sizeof g_current, "%s\n", what.c_str());
  ::alarm(static_cast<unsigned>(g_hang_seconds) + 1);
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  ::alarm(0);
}

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  out->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return true;
}

int Usage() {
  std::fprintf(stderr,
               "usage: fuzz_NAME [--mutations N] [--seconds S] [--hang-seconds H] "
               "[--save SEED:K FILE] SEED_FILE_OR_FOLDER...\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t mutations = 20000;
  double seconds = 3;
  std::string save_what, save_file;
  std::vector<std::string> paths;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--mutations" && i + 1 < argc) {
      mutations = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--seconds" && i + 1 < argc) {
      seconds = std::strtod(argv[++i], nullptr);
    } else if (a == "--hang-seconds" && i + 1 < argc) {
      g_hang_seconds = std::strtod(argv[++i], nullptr);
    } else if (a == "--save" && i + 2 < argc) {
      save_what = argv[++i];
      save_file = argv[++i];
    } else if (!a.empty() && a[0] == '-') {
      return Usage();
    } else {
      paths.push_back(a);
    }
  }
  std::vector<Seed> seeds;
  for (const std::string& p : paths) {
    std::vector<std::string> files;
    if (std::filesystem::is_directory(p)) {
      for (const auto& e : std::filesystem::directory_iterator(p)) {
        if (e.is_regular_file()) files.push_back(e.path().string());
      }
      std::sort(files.begin(), files.end());
    } else {
      files.push_back(p);
    }
    for (const std::string& f : files) {
      Seed s{std::filesystem::path(f).filename().string(), {}};
      if (!ReadFile(f, &s.bytes)) {
        std::fprintf(stderr, "fuzz: cannot read seed %s\n", f.c_str());
        return 2;
      }
      seeds.push_back(std::move(s));
    }
  }
  if (seeds.empty()) {
    std::fprintf(stderr, "fuzz: no seed inputs under the paths given\n");
    return Usage();
  }
  if (!save_what.empty()) {
    const size_t colon = save_what.rfind(':');
    if (colon == std::string::npos) return Usage();
    const std::string name = save_what.substr(0, colon);
    const uint64_t k = std::strtoull(save_what.c_str() + colon + 1, nullptr, 10);
    for (size_t i = 0; i < seeds.size(); ++i) {
      if (seeds[i].name != name) continue;
      std::ofstream out(save_file, std::ios::binary);
      out << Mutate(seeds[i].bytes, i, k);
      return out ? 0 : 1;
    }
    std::fprintf(stderr, "fuzz: no seed named %s\n", name.c_str());
    return 2;
  }
  std::set_terminate(OnTerminate);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGALRM}) ::signal(sig, OnSignal);

  for (const Seed& s : seeds) Run(s.bytes, "seed " + s.name + " as given");
  const auto start = std::chrono::steady_clock::now();
  uint64_t done = 0;
  for (; done < mutations; ++done) {
    if ((done & 63) == 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > seconds) {
      break;
    }
    const size_t i = done % seeds.size();
    const uint64_t k = done / seeds.size();
    const std::string what = "seed " + seeds[i].name + " mutation " + std::to_string(k) +
                             " (keep it: --save " + seeds[i].name + ":" + std::to_string(k) +
                             " FILE)";
    Run(Mutate(seeds[i].bytes, i, k), what);
  }
  std::printf("fuzz: %zu seeds and %llu mutations in %.1f s, no crash, hang or escaped exception\n",
              seeds.size(), static_cast<unsigned long long>(done),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return 0;
}
