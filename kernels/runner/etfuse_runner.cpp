// etfuse_runner: run one method of an ExecuTorch program (.pte) the way an
// application does, through the C++ Module API of the ExecuTorch SDK, and
// report its latency.
//
//   etfuse_runner model.pte [--input i.bin ...] [--output-dir d]
//                 [--iterations N] [--threads T] [--warmup W] [--method forward]
//   etfuse_runner llm.pte --generate N [--prompt 1,2,3] [--threads T]
//
// stdout, one line each:
//   input <i>: dtype=<name> sizes=[...] source=<file|random>
//   latency_ms min=<> median=<> mean=<> iterations=<N> threads=<T>
//   output <i>: dtype=<name> sizes=[...]
//
// --generate N decodes N tokens greedily from a KV-cache LLM, as executorch's
// llama export writes one: forward(tokens int64 [1, T], input_pos int64 [1])
// -> float logits [1, V] or [1, T, V] (the last row is the next token's). The
// prompt (token ids, default 1) goes in as one call when T may be its length
// (a dynamic sequence length), else one token per call; then each step feeds
// the previous step's argmax at the next position. The program is read into
// memory at load (ProgramInMemory: on 2 MB pages where Linux gives them), so
// the first prefill does not page in the weights and a decode step, which
// streams every weight once, does not walk the page tables every 4 KB. It prints
//   prefill tokens=<P> ms=<> tokens_per_s=<> threads=<T>
//   decode tokens=<N> ms=<> tokens_per_s=<>
//   generated: <id> <id> ...
//   memory peak_rss_kib=<> (Linux: the process's VmHWM, program and caches included)
//
// Any failure is ONE line on stderr, `etfuse_runner: error: ...`, and exit
// status 2 (usage) or 1 (everything else), also when the runtime aborts.
// The runtime's own log: info and debug lines are dropped; error lines are
// held back while the program loads, the method loads and the method runs,
// folded into that one line on failure and printed on success; a fatal line
// goes into the abort's error line. ETFUSE_RUNNER_VERBOSE=1 passes every
// runtime log line straight through.

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <executorch/extension/data_loader/buffer_data_loader.h>
#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor_ptr.h>
#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/core/error.h>
#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/core/exec_aten/util/scalar_type_util.h>
#include <executorch/runtime/executor/method_meta.h>
#include <executorch/runtime/executor/program.h>
#include <executorch/runtime/kernel/operator_registry.h>
#include <executorch/runtime/platform/platform.h>
#include <executorch/runtime/platform/runtime.h>

// The thread pool. The wheel's SDK ships libexecutorch_threadpool.so (and the
// CMake package turns on ET_USE_THREADPOOL when it does) but not its header,
// threadpool.h, so the two entry points used here are declared by hand when
// the header is absent. Only non-virtual member functions are called, through
// a pointer the library hands out, so nothing depends on the class layout;
// the declarations match the exported symbols
//   executorch::extension::threadpool::get_threadpool()
//   executorch::extension::threadpool::ThreadPool::get_thread_count() const
//   executorch::extension::threadpool::ThreadPool::_unsafe_reset_threadpool(unsigned int)
#if defined(ET_USE_THREADPOOL)
#if __has_include(<executorch/extension/threadpool/threadpool.h>)
#include <executorch/extension/threadpool/threadpool.h>
#else
namespace executorch::extension::threadpool {
class ThreadPool final {
 public:
  ThreadPool() = delete;
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  size_t get_thread_count() const;
  bool _unsafe_reset_threadpool(uint32_t num_threads);
};
ThreadPool* get_threadpool();
} // namespace executorch::extension::threadpool
#endif
#define ETFUSE_RUNNER_HAS_THREADPOOL 1
#else
#define ETFUSE_RUNNER_HAS_THREADPOOL 0
#endif

namespace {

using executorch::aten::ScalarType;
using executorch::extension::Module;
using executorch::extension::TensorPtr;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using executorch::runtime::MethodMeta;
using executorch::runtime::Program;
using executorch::runtime::Tag;
using executorch::runtime::TensorInfo;

constexpr const char* kProgramName = "etfuse_runner";
constexpr const char* kUsage =
    "usage: etfuse_runner model.pte [--input i.bin ...] [--output-dir d] "
    "[--iterations N] [--threads T] [--warmup W] [--method forward]\n"
    "       etfuse_runner model.pte --generate N [--prompt 1,2,3] "
    "[--threads T] [--method forward]";

// ---------------------------------------------------------------------------
// Failures: thrown anywhere, reported once by main().

struct Failure {
  int exit_code; // 2: usage, 1: everything else
  std::string message;
};

[[noreturn]] void usage_error(const std::string& message) {
  throw Failure{2, message + " (" + kUsage + ")"};
}

[[noreturn]] void fail(const std::string& message) {
  throw Failure{1, message};
}

void print_error_line(const std::string& message) {
  std::fflush(stdout);
  std::string line = message;
  std::replace(line.begin(), line.end(), '\n', ' ');
  std::fprintf(stderr, "%s: error: %s\n", kProgramName, line.c_str());
  std::fflush(stderr);
}

// ---------------------------------------------------------------------------
// Runtime log routing. The runtime reports the reason for most failures in its
// own log (for example "Missing operator: [0] aten::add.out"), so while the
// program and the method load, log lines are captured rather than printed:
// a failure then folds the last runtime error into its one line, a success
// prints what was captured. Outside those phases lines pass straight through.

struct LogLine {
  et_pal_log_level_t level;
  std::string text; // "<file>:<line>] <message>"
  std::string message;
};

struct LogState {
  bool capture = false;
  bool verbose = false; // ETFUSE_RUNNER_VERBOSE: never capture
  std::vector<LogLine> captured;
  std::string last_error; // last kError / kFatal message, any phase
};

LogState& log_state() {
  static LogState state;
  return state;
}

void print_log_line(et_pal_log_level_t level, const std::string& text) {
  std::fprintf(stderr, "%c executorch:%s\n", static_cast<char>(level),
               text.c_str());
}

void on_runtime_log(et_timestamp_t /*timestamp*/, et_pal_log_level_t level,
                    const char* filename, const char* /*function*/,
                    size_t line, const char* message, size_t length) {
  LogState& state = log_state();
  std::string msg(message, strnlen(message, length));
  while (!msg.empty() && (msg.back() == '\n' || msg.back() == '\r' ||
                          msg.back() == ' ')) {
    msg.pop_back();
  }
  const char* file = filename ? filename : "?";
  const char* base = std::strrchr(file, '/');
  std::string text = std::string(base ? base + 1 : file) + ":" +
                     std::to_string(line) + "] " + msg;
  if (level == kError || level == kFatal) {
    state.last_error = msg;
  }
  // Info and debug lines (the thread pool's cpuinfo probing, "Resetting
  // threadpool to N threads", ...) are noise around a benchmark line.
  if ((level == kInfo || level == kDebug) && !state.verbose) {
    return;
  }
  // A fatal line comes right before an abort, whose one error line carries it.
  if (level == kFatal && !state.verbose) {
    return;
  }
  if (state.capture && !state.verbose) {
    if (state.captured.size() < 1000) {
      state.captured.push_back({level, std::move(text), std::move(msg)});
    }
    return;
  }
  print_log_line(level, text);
}

[[noreturn]] void on_runtime_abort() {
  // An ET_CHECK failed somewhere in the runtime or a kernel. Say so in the
  // usual one line instead of dumping core.
  const std::string& why = log_state().last_error;
  print_error_line(std::string("the ExecuTorch runtime aborted") +
                   (why.empty() ? "" : ": " + why));
  std::_Exit(1);
}

// RAII: capture runtime log lines for the lifetime of the scope.
class LogCapture {
 public:
  LogCapture() {
    log_state().capture = true;
    log_state().captured.clear();
  }
  ~LogCapture() {
    log_state().capture = false;
  }
  // On success: show what the runtime said, as it would have without us.
  void release() {
    LogState& state = log_state();
    state.capture = false;
    for (const LogLine& line : state.captured) {
      print_log_line(line.level, line.text);
    }
    state.captured.clear();
  }
  // What the runtime said while capturing, for the one error line: its first
  // error (usually the cause), plus the line naming the failing instruction
  // when that came later. "" when it logged no error.
  static std::string errors_summary() {
    std::string first, instruction;
    for (const LogLine& line : log_state().captured) {
      if (line.level != kError && line.level != kFatal) continue;
      if (first.empty()) {
        first = line.message;
      } else if (instruction.empty() &&
                 line.message.find("failed at instruction") !=
                     std::string::npos) {
        instruction = line.message;
      }
    }
    return instruction.empty() ? first : first + "; " + instruction;
  }
};

void install_pal() {
  const char* verbose = std::getenv("ETFUSE_RUNNER_VERBOSE");
  log_state().verbose = verbose && *verbose && std::strcmp(verbose, "0") != 0;
  executorch::runtime::register_pal(executorch::runtime::PalImpl::create(
      /*init=*/nullptr, /*abort=*/on_runtime_abort,
      /*current_ticks=*/nullptr, /*ticks_to_ns_multiplier=*/nullptr,
      /*emit_log_message=*/on_runtime_log, /*allocate=*/nullptr,
      /*free=*/nullptr, __FILE__));
  executorch::runtime::runtime_init();
}

std::string runtime_detail(const char* what, Error error) {
  std::string detail = std::string(what) + ": " +
                       executorch::runtime::to_string(error);
  std::string said = LogCapture::errors_summary();
  if (!said.empty()) {
    detail += " (runtime: " + said + ")";
  }
  return detail;
}

// ---------------------------------------------------------------------------
// Command line.

struct Options {
  std::string model;
  std::vector<std::string> inputs;
  std::string output_dir;
  long iterations = 10;
  long warmup = 1;
  long threads = 0; // 0: leave the thread pool as it is
  std::string method = "forward";
  long generate = 0; // > 0: an LLM's greedy decode loop instead of timed runs
  std::vector<int64_t> prompt = {1};
};

std::vector<int64_t> parse_tokens(const std::string& value) {
  std::vector<int64_t> tokens;
  size_t start = 0;
  while (start <= value.size()) {
    size_t comma = value.find(',', start);
    if (comma == std::string::npos) comma = value.size();
    const std::string item = value.substr(start, comma - start);
    errno = 0;
    char* end = nullptr;
    long long parsed = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || errno == ERANGE || parsed < 0) {
      usage_error("--prompt takes token ids >= 0 separated by commas, got '" +
                  value + "'");
    }
    tokens.push_back(static_cast<int64_t>(parsed));
    start = comma + 1;
  }
  return tokens;
}

long parse_count(const std::string& option, const std::string& value,
                 long min_value) {
  errno = 0;
  char* end = nullptr;
  long parsed = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || errno == ERANGE ||
      parsed < min_value || parsed > 1000000000L) {
    usage_error(option + " takes an integer >= " + std::to_string(min_value) +
                ", got '" + value + "'");
  }
  return parsed;
}

Options parse_args(int argc, char** argv) {
  Options options;
  bool have_model = false;
  bool options_done = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (options_done || arg.size() < 2 || arg[0] != '-') {
      if (have_model) {
        usage_error("unexpected argument '" + arg + "' (one model only)");
      }
      options.model = arg;
      have_model = true;
      continue;
    }
    if (arg == "--") {
      options_done = true;
      continue;
    }
    if (arg == "-h" || arg == "--help") {
      std::printf("%s\n", kUsage);
      std::exit(0);
    }
    // --name value, or --name=value.
    std::string name = arg;
    std::string value;
    bool inline_value = false;
    size_t eq = arg.find('=');
    if (arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      inline_value = true;
    }
    static const std::set<std::string> kKnown = {
        "--input",   "--output-dir", "--iterations", "--threads",
        "--warmup",  "--method",     "--generate",   "--prompt"};
    if (kKnown.count(name) == 0) {
      usage_error("unknown option '" + name + "'");
    }
    if (!inline_value) {
      if (i + 1 >= argc) {
        usage_error("option " + name + " needs a value");
      }
      value = argv[++i];
    }
    if (name == "--input") {
      options.inputs.push_back(value);
    } else if (name == "--output-dir") {
      if (value.empty()) {
        usage_error("option --output-dir needs a value");
      }
      options.output_dir = value;
    } else if (name == "--iterations") {
      options.iterations = parse_count(name, value, 1);
    } else if (name == "--warmup") {
      options.warmup = parse_count(name, value, 0);
    } else if (name == "--threads") {
      options.threads = parse_count(name, value, 1);
    } else if (name == "--method") {
      if (value.empty()) {
        usage_error("option --method needs a value");
      }
      options.method = value;
    } else if (name == "--generate") {
      options.generate = parse_count(name, value, 1);
    } else if (name == "--prompt") {
      options.prompt = parse_tokens(value);
    }
  }
  if (!have_model) {
    usage_error("no model given");
  }
  if (options.generate > 0 &&
      (!options.inputs.empty() || !options.output_dir.empty())) {
    usage_error("--generate feeds the tokens itself and writes no outputs: "
                "it takes no --input or --output-dir");
  }
  return options;
}

// ---------------------------------------------------------------------------
// Small helpers.

std::string dtype_name(ScalarType type) {
  switch (type) {
    case ScalarType::Byte: return "uint8";
    case ScalarType::Char: return "int8";
    case ScalarType::Short: return "int16";
    case ScalarType::Int: return "int32";
    case ScalarType::Long: return "int64";
    case ScalarType::Half: return "float16";
    case ScalarType::Float: return "float32";
    case ScalarType::Double: return "float64";
    case ScalarType::ComplexHalf: return "complex32";
    case ScalarType::ComplexFloat: return "complex64";
    case ScalarType::ComplexDouble: return "complex128";
    case ScalarType::Bool: return "bool";
    case ScalarType::BFloat16: return "bfloat16";
    case ScalarType::UInt16: return "uint16";
    case ScalarType::UInt32: return "uint32";
    case ScalarType::UInt64: return "uint64";
    default: break;
  }
  return executorch::runtime::toString(type);
}

template <typename Sizes>
std::string sizes_string(const Sizes& sizes) {
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (i > 0) {
      out += ", ";
    }
    out += std::to_string(sizes[i]);
  }
  return out + "]";
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) {
      out += (i + 1 == items.size()) ? " and " : ", ";
    }
    out += items[i];
  }
  return out;
}

std::string errno_text() {
  return std::strerror(errno);
}

// Reads a whole file, or at most `limit` bytes of it.
bool read_file(const std::string& path, std::vector<uint8_t>* out,
               size_t limit = SIZE_MAX) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return false;
  }
  in.seekg(0, std::ios::end);
  std::streamoff size = in.tellg();
  in.seekg(0, std::ios::beg);
  if (size < 0) {
    return false;
  }
  size_t n = std::min<size_t>(static_cast<size_t>(size), limit);
  out->resize(n);
  if (n > 0 && !in.read(reinterpret_cast<char*>(out->data()), n)) {
    return false;
  }
  return true;
}

uint64_t read_le(const uint8_t* p, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) {
    v |= static_cast<uint64_t>(p[i]) << (8 * i);
  }
  return v;
}

// ---------------------------------------------------------------------------
// --generate's program, read into anonymous memory aligned to 2 MB and marked
// MADV_HUGEPAGE (Linux's transparent huge pages, where enabled: "madvise" or
// "always"). A decode step streams every weight once; from a file mapping in
// 4 KB pages it misses the TLB every 4 KB and the hardware prefetchers stop at
// each page's end (an 8da4w 1B decode read its weights at about two thirds of
// the rate 2 MB pages give). Elsewhere it is the same read into memory. The
// Module reads it through a BufferDataLoader, which hands out pointers into it:
// it outlives the Module.
class ProgramInMemory {
 public:
  explicit ProgramInMemory(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    struct stat st;
    if (fd < 0 || ::fstat(fd, &st) != 0) {
      fail("cannot open " + path + ": " + errno_text());
    }
    size_ = static_cast<size_t>(st.st_size);
    constexpr size_t kHuge = size_t(1) << 21;
    mapped_ = (size_ + 2 * kHuge - 1) / kHuge * kHuge;  // room to align the start
    void* p = ::mmap(nullptr, mapped_, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      fail("cannot allocate " + std::to_string(size_) + " bytes for " + path +
           ": " + errno_text());
    }
    base_ = static_cast<uint8_t*>(p);
    data_ = base_ + (kHuge - reinterpret_cast<uintptr_t>(base_) % kHuge) % kHuge;
#if defined(MADV_HUGEPAGE)
    ::madvise(data_, size_, MADV_HUGEPAGE);  // a hint: without THP, 4 KB pages
#endif
    for (size_t done = 0; done < size_;) {
      const ssize_t n = ::pread(fd, data_ + done, size_ - done, static_cast<off_t>(done));
      if (n <= 0) {
        const std::string why = n < 0 ? errno_text() : "it ended early";
        ::close(fd);
        fail("cannot read " + path + ": " + why);
      }
      done += static_cast<size_t>(n);
    }
    ::close(fd);
  }
  ~ProgramInMemory() { ::munmap(base_, mapped_); }
  ProgramInMemory(const ProgramInMemory&) = delete;
  ProgramInMemory& operator=(const ProgramInMemory&) = delete;
  std::unique_ptr<executorch::extension::BufferDataLoader> loader() const {
    return std::make_unique<executorch::extension::BufferDataLoader>(data_, size_);
  }

 private:
  uint8_t* base_ = nullptr;
  uint8_t* data_ = nullptr;
  size_t size_ = 0, mapped_ = 0;
};

// The .pte file, before the runtime sees it: exists, is an ExecuTorch
// flatbuffer (identifier "ET12" at bytes 4..8), and is as long as its
// extended header says it should be.

void check_program_file(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    fail("cannot open " + path + ": " + errno_text());
  }
  if (S_ISDIR(st.st_mode)) {
    fail("cannot open " + path + ": it is a directory");
  }
  std::vector<uint8_t> head;
  if (!read_file(path, &head, 64)) {
    fail("cannot read " + path + ": " + errno_text());
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (head.size() < 8) {
    fail(path + " is not an ExecuTorch program (" +
         std::to_string(file_size) + " bytes, too short for a flatbuffer)");
  }
  if (std::memcmp(head.data() + 4, "ET12", 4) != 0) {
    if (head[4] == 'E' && head[5] == 'T' && std::isdigit(head[6]) &&
        std::isdigit(head[7])) {
      fail(path + " is an ExecuTorch program of another format version (" +
           std::string(head.begin() + 4, head.begin() + 8) +
           "); this runtime reads ET12");
    }
    fail(path + " is not an ExecuTorch program (no \"ET12\" flatbuffer "
         "identifier at bytes 4..8)");
  }
  // Extended header: "eh00", u32 length, u64 program_size,
  // u64 segment_base_offset[, u64 segment_data_size].
  if (head.size() >= 32 && std::memcmp(head.data() + 8, "eh00", 4) == 0) {
    const uint64_t header_length = read_le(head.data() + 12, 4);
    const uint64_t program_size = read_le(head.data() + 16, 8);
    const uint64_t segment_base = read_le(head.data() + 24, 8);
    uint64_t needed = program_size;
    if (header_length >= 32 && head.size() >= 40) {
      const uint64_t segment_size = read_le(head.data() + 32, 8);
      if (segment_size > 0) {
        needed = std::max(needed, segment_base + segment_size);
      }
    }
    if (file_size < needed) {
      fail(path + " is truncated: its header says " + std::to_string(needed) +
           " bytes, the file has " + std::to_string(file_size));
    }
  }
}

// ---------------------------------------------------------------------------
// A minimal, bounds-checked flatbuffer walk over the program, for the one
// thing the runtime API does not expose: a method's operator table
// (Program.execution_plan[i].operators[j].{name, overload}). Used only to
// explain a failed load.

class FlatbufferView {
 public:
  FlatbufferView(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  bool u32(size_t pos, uint32_t* out) const {
    if (pos > size_ || size_ - pos < 4) return false;
    *out = static_cast<uint32_t>(read_le(data_ + pos, 4));
    return true;
  }
  bool u16(size_t pos, uint16_t* out) const {
    if (pos > size_ || size_ - pos < 2) return false;
    *out = static_cast<uint16_t>(read_le(data_ + pos, 2));
    return true;
  }
  // Follows the uoffset stored at `pos`.
  bool deref(size_t pos, size_t* out) const {
    uint32_t rel;
    if (!u32(pos, &rel) || rel == 0) return false;
    if (pos + rel >= size_) return false;
    *out = pos + rel;
    return true;
  }
  // Position of field `index` of the table at `table`; false if absent.
  bool field(size_t table, unsigned index, size_t* out) const {
    uint32_t soffset_bits;
    if (!u32(table, &soffset_bits)) return false;
    const int64_t vtable =
        static_cast<int64_t>(table) - static_cast<int32_t>(soffset_bits);
    if (vtable < 0 || static_cast<uint64_t>(vtable) >= size_) return false;
    uint16_t vtable_size, offset;
    if (!u16(vtable, &vtable_size)) return false;
    if (4u + 2u * index + 2u > vtable_size) return false;
    if (!u16(vtable + 4 + 2 * index, &offset) || offset == 0) return false;
    *out = table + offset;
    return *out < size_;
  }
  // A table-valued field, as the table's position.
  bool table_field(size_t table, unsigned index, size_t* out) const {
    size_t pos;
    return field(table, index, &pos) && deref(pos, out);
  }
  bool string_field(size_t table, unsigned index, std::string* out) const {
    size_t pos, str;
    uint32_t length;
    out->clear();
    if (!field(table, index, &pos)) return true; // absent: empty
    if (!deref(pos, &str) || !u32(str, &length)) return false;
    if (size_ - str - 4 < length) return false;
    out->assign(reinterpret_cast<const char*>(data_ + str + 4), length);
    return true;
  }
  // A vector-of-tables field, as the tables' positions.
  bool tables_field(size_t table, unsigned index,
                    std::vector<size_t>* out) const {
    size_t pos, vec;
    uint32_t length;
    out->clear();
    if (!field(table, index, &pos)) return true; // absent: empty
    if (!deref(pos, &vec) || !u32(vec, &length)) return false;
    if ((size_ - vec - 4) / 4 < length) return false;
    for (uint32_t i = 0; i < length; ++i) {
      size_t element;
      if (!deref(vec + 4 + 4 * static_cast<size_t>(i), &element)) return false;
      out->push_back(element);
    }
    return true;
  }

 private:
  const uint8_t* data_;
  size_t size_;
};

// The operator names of `method` ("ns::op.overload"), in table order. False
// when the file cannot be read or parsed.
bool read_operator_names(const std::string& path, const std::string& method,
                         std::vector<std::string>* names) {
  std::vector<uint8_t> head;
  if (!read_file(path, &head, 40)) return false;
  size_t limit = SIZE_MAX;
  if (head.size() >= 24 && std::memcmp(head.data() + 8, "eh00", 4) == 0) {
    limit = static_cast<size_t>(read_le(head.data() + 16, 8));
  }
  std::vector<uint8_t> bytes;
  if (!read_file(path, &bytes, limit)) return false;
  FlatbufferView fb(bytes.data(), bytes.size());
  size_t program;
  if (!fb.deref(0, &program)) return false;
  std::vector<size_t> plans;
  if (!fb.tables_field(program, /*execution_plan=*/1, &plans)) return false;
  for (size_t plan : plans) {
    std::string name;
    if (!fb.string_field(plan, /*name=*/0, &name)) return false;
    if (name != method) continue;
    std::vector<size_t> operators;
    if (!fb.tables_field(plan, /*operators=*/6, &operators)) return false;
    for (size_t op : operators) {
      std::string op_name, overload;
      if (!fb.string_field(op, 0, &op_name) ||
          !fb.string_field(op, 1, &overload)) {
        return false;
      }
      names->push_back(overload.empty() ? op_name : op_name + "." + overload);
    }
    return true;
  }
  return false;
}

bool kernel_registered(const std::string& name) {
  if (executorch::runtime::registry_has_op_function(name.c_str())) {
    return true;
  }
  // registry_has_op_function without tensor metadata only finds a fallback
  // kernel; one registered for specific dtypes still counts as linked.
  for (const auto& kernel : executorch::runtime::get_registered_kernels()) {
    if (kernel.name_ != nullptr && name == kernel.name_) {
      return true;
    }
  }
  return false;
}

std::string missing_ops_hint(const std::string& ns) {
  if (ns == "etfuse") {
    return "a selective build left it out: add it with "
           "-DETFUSE_SELECT_OPS_LIST=... or list the model in "
           "-DETFUSE_SELECT_OPS_MODEL";
  }
  if (ns == "quantized_decomposed") return "link executorch::kernels_quantized";
  if (ns == "aten" || ns == "dim_order_ops") {
    return "link executorch::kernels_optimized";
  }
  if (ns == "torchao") return "link executorch::kernels_torchao";
  return "link the kernel library that registers it";
}

std::string backend_hint(const std::string& id) {
  static const std::map<std::string, std::string> kTargets = {
      {"XnnpackBackend", "executorch::backend_xnnpack"},
      {"QnnBackend", "executorch::backend_qnn"},
      {"OpenvinoBackend", "executorch::backend_openvino"},
      {"CoreMLBackend", "executorch::backend_coreml"},
      {"MLXBackend", "executorch::backend_mlx"},
      {"CudaBackend", "executorch::backend_cuda"},
  };
  auto it = kTargets.find(id);
  return it == kTargets.end() ? "link the library that registers it"
                              : "link " + it->second;
}

// Why did load_method fail? Names the operators and backends the program
// needs and this binary lacks; "" when that is not the reason.
std::string explain_missing(const Options& options, const MethodMeta& meta) {
  std::vector<std::string> clauses;

  std::vector<std::string> backends;
  for (size_t i = 0; i < meta.num_backends(); ++i) {
    auto name = meta.get_backend_name(i);
    if (name.ok() && *name != nullptr &&
        executorch::runtime::get_backend_class(*name) == nullptr) {
      backends.push_back(*name);
    }
  }
  for (const std::string& id : backends) {
    clauses.push_back("delegates to backend " + id +
                      ", which this runner was built without (" +
                      backend_hint(id) + ")");
  }

  std::vector<std::string> ops;
  if (read_operator_names(options.model, options.method, &ops)) {
    // Group by namespace, keeping first-seen order, each op once.
    std::vector<std::string> order;
    std::map<std::string, std::vector<std::string>> by_ns;
    std::set<std::string> seen;
    for (const std::string& op : ops) {
      if (!seen.insert(op).second || kernel_registered(op)) continue;
      size_t colons = op.find("::");
      std::string ns = colons == std::string::npos ? "" : op.substr(0, colons);
      if (by_ns.count(ns) == 0) order.push_back(ns);
      by_ns[ns].push_back(op);
    }
    std::stable_partition(order.begin(), order.end(),
                          [](const std::string& ns) { return ns == "etfuse"; });
    for (const std::string& ns : order) {
      const auto& names = by_ns[ns];
      clauses.push_back("calls " + join(names) + ", which this runner was " +
                        "built without (" + missing_ops_hint(ns) + ")");
    }
  }
  if (clauses.empty()) return "";
  std::string text = options.model + " " + clauses[0];
  for (size_t i = 1; i < clauses.size(); ++i) {
    text += "; it also " + clauses[i];
  }
  return text;
}

// ---------------------------------------------------------------------------
// Inputs: read from raw files or made up.

// Heap memory with alignment and slack past the end (XNNPACK may read a few
// bytes beyond a tensor).
class AlignedBuffer {
 public:
  explicit AlignedBuffer(size_t size) : storage_(size + 2 * kAlign, 0) {
    auto address = reinterpret_cast<uintptr_t>(storage_.data());
    offset_ = (kAlign - address % kAlign) % kAlign;
    size_ = size;
  }
  uint8_t* data() { return storage_.data() + offset_; }
  size_t size() const { return size_; }

 private:
  static constexpr size_t kAlign = 64;
  std::vector<uint8_t> storage_;
  size_t offset_ = 0;
  size_t size_ = 0;
};

template <typename T, typename Gen>
void fill_uniform(uint8_t* bytes, size_t count, Gen& gen) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  T* out = reinterpret_cast<T*>(bytes);
  for (size_t i = 0; i < count; ++i) out[i] = T(dist(gen));
}

template <typename T, typename Gen>
void fill_small_ints(uint8_t* bytes, size_t count, Gen& gen) {
  std::uniform_int_distribution<int> dist(0, 9);
  T* out = reinterpret_cast<T*>(bytes);
  for (size_t i = 0; i < count; ++i) out[i] = static_cast<T>(dist(gen));
}

void fill_random(ScalarType type, uint8_t* bytes, size_t nbytes,
                 std::mt19937& gen) {
  const size_t element = executorch::runtime::elementSize(type);
  const size_t count = element == 0 ? 0 : nbytes / element;
  switch (type) {
    case ScalarType::Float: fill_uniform<float>(bytes, count, gen); break;
    case ScalarType::Double: fill_uniform<double>(bytes, count, gen); break;
    case ScalarType::Half:
      fill_uniform<executorch::aten::Half>(bytes, count, gen);
      break;
    case ScalarType::BFloat16:
      fill_uniform<executorch::aten::BFloat16>(bytes, count, gen);
      break;
    case ScalarType::ComplexFloat:
      fill_uniform<float>(bytes, count * 2, gen);
      break;
    case ScalarType::ComplexDouble:
      fill_uniform<double>(bytes, count * 2, gen);
      break;
    case ScalarType::Byte: fill_small_ints<uint8_t>(bytes, count, gen); break;
    case ScalarType::Char: fill_small_ints<int8_t>(bytes, count, gen); break;
    case ScalarType::Short: fill_small_ints<int16_t>(bytes, count, gen); break;
    case ScalarType::Int: fill_small_ints<int32_t>(bytes, count, gen); break;
    case ScalarType::Long: fill_small_ints<int64_t>(bytes, count, gen); break;
    case ScalarType::UInt16: fill_small_ints<uint16_t>(bytes, count, gen); break;
    case ScalarType::UInt32: fill_small_ints<uint32_t>(bytes, count, gen); break;
    case ScalarType::UInt64: fill_small_ints<uint64_t>(bytes, count, gen); break;
    case ScalarType::Bool: {
      std::bernoulli_distribution dist(0.5);
      for (size_t i = 0; i < count; ++i) bytes[i] = dist(gen) ? 1 : 0;
      break;
    }
    default: // quantized and bit types: leave zero
      break;
  }
}

struct PreparedInputs {
  std::vector<std::unique_ptr<AlignedBuffer>> buffers;
  std::vector<TensorPtr> tensors;
  std::vector<EValue> values;
  std::vector<std::string> lines; // "input <i>: ...", printed once loaded
};

// Copies `path` into `dest`, which must be exactly `expected` bytes.
void load_input_file(const std::string& path, size_t index,
                     const std::string& what, size_t expected, uint8_t* dest) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    fail("cannot open input " + std::to_string(index) + " " + path + ": " +
         errno_text());
  }
  if (S_ISDIR(st.st_mode)) {
    fail("cannot open input " + std::to_string(index) + " " + path +
         ": it is a directory");
  }
  if (static_cast<uint64_t>(st.st_size) != expected) {
    fail("input " + std::to_string(index) + " (" + path + ") has " +
         std::to_string(st.st_size) + " bytes, expected " +
         std::to_string(expected) + " (" + what + ")");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in || (expected > 0 &&
              !in.read(reinterpret_cast<char*>(dest), expected))) {
    fail("cannot read input " + std::to_string(index) + " " + path + ": " +
         errno_text());
  }
}

PreparedInputs prepare_inputs(const Options& options, const MethodMeta& meta) {
  const size_t num_inputs = meta.num_inputs();
  if (options.inputs.size() > num_inputs) {
    usage_error("method '" + options.method + "' of " + options.model +
                " takes " + std::to_string(num_inputs) + " input(s), got " +
                std::to_string(options.inputs.size()) + " --input files");
  }
  PreparedInputs prepared;
  std::mt19937 gen(0x5eed);
  for (size_t i = 0; i < num_inputs; ++i) {
    const bool from_file = i < options.inputs.size();
    const std::string source = from_file ? options.inputs[i] : "random";
    auto describe = [&](const std::string& dtype, const std::string& sizes) {
      prepared.lines.push_back("input " + std::to_string(i) + ": dtype=" +
                               dtype + " sizes=" + sizes + " source=" + source);
    };
    auto tag = meta.input_tag(i);
    if (!tag.ok()) {
      fail("cannot read the type of input " + std::to_string(i) + ": " +
           executorch::runtime::to_string(tag.error()));
    }
    switch (*tag) {
      case Tag::Tensor: {
        auto info = meta.input_tensor_meta(i);
        if (!info.ok()) {
          fail("cannot read the meta of input " + std::to_string(i) + ": " +
               executorch::runtime::to_string(info.error()));
        }
        const ScalarType type = info->scalar_type();
        std::vector<executorch::aten::SizesType> sizes(info->sizes().begin(),
                                                       info->sizes().end());
        std::vector<executorch::aten::DimOrderType> dim_order(
            info->dim_order().begin(), info->dim_order().end());
        const size_t nbytes = info->nbytes();
        const std::string what = dtype_name(type) + " " + sizes_string(sizes);
        auto buffer = std::make_unique<AlignedBuffer>(nbytes);
        if (from_file) {
          load_input_file(source, i, what, nbytes, buffer->data());
        } else {
          fill_random(type, buffer->data(), nbytes, gen);
        }
        prepared.tensors.push_back(executorch::extension::make_tensor_ptr(
            sizes, buffer->data(), dim_order, /*strides=*/{}, type));
        prepared.values.emplace_back(*prepared.tensors.back());
        prepared.buffers.push_back(std::move(buffer));
        describe(dtype_name(type), sizes_string(sizes));
        break;
      }
      case Tag::Int: {
        int64_t value = std::uniform_int_distribution<int>(0, 9)(gen);
        if (from_file) {
          load_input_file(source, i, "int64 scalar", 8,
                          reinterpret_cast<uint8_t*>(&value));
        }
        prepared.values.emplace_back(value);
        describe("int64", "[]");
        break;
      }
      case Tag::Double: {
        double value = std::uniform_real_distribution<double>(-1, 1)(gen);
        if (from_file) {
          load_input_file(source, i, "float64 scalar", 8,
                          reinterpret_cast<uint8_t*>(&value));
        }
        prepared.values.emplace_back(value);
        describe("float64", "[]");
        break;
      }
      case Tag::Bool: {
        uint8_t byte = std::bernoulli_distribution(0.5)(gen) ? 1 : 0;
        if (from_file) {
          load_input_file(source, i, "bool scalar", 1, &byte);
        }
        prepared.values.emplace_back(byte != 0);
        describe("bool", "[]");
        break;
      }
      case Tag::None:
        if (from_file) {
          fail("input " + std::to_string(i) + " of method '" + options.method +
               "' is None and takes no --input file");
        }
        prepared.values.emplace_back();
        prepared.lines.push_back("input " + std::to_string(i) + ": none");
        break;
      default:
        fail("input " + std::to_string(i) + " of method '" + options.method +
             "' is a " + executorch::runtime::tag_to_string(*tag) +
             ", which this runner cannot feed");
    }
  }
  return prepared;
}

// ---------------------------------------------------------------------------
// Threads.

long configure_threads(long requested) {
#if ETFUSE_RUNNER_HAS_THREADPOOL
  auto* pool = executorch::extension::threadpool::get_threadpool();
  if (pool == nullptr) {
    if (requested > 0) {
      fail("--threads " + std::to_string(requested) +
           ": the ExecuTorch thread pool could not be created");
    }
    return 1;
  }
  if (requested > 0 &&
      !pool->_unsafe_reset_threadpool(static_cast<uint32_t>(requested))) {
    fail("--threads " + std::to_string(requested) +
         ": the ExecuTorch thread pool refused the new size");
  }
  return static_cast<long>(pool->get_thread_count());
#else
  if (requested > 0) {
    fail("--threads: this runner was built without the ExecuTorch thread "
         "pool (ET_USE_THREADPOOL unset)");
  }
  return 1;
#endif
}

// ---------------------------------------------------------------------------
// Outputs.

void report_and_write_outputs(const Options& options,
                              const std::vector<EValue>& outputs) {
  if (!options.output_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(options.output_dir, ec);
    if (ec) {
      fail("cannot create output directory " + options.output_dir + ": " +
           ec.message());
    }
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    const EValue& value = outputs[i];
    const void* data = nullptr;
    size_t nbytes = 0;
    int64_t int_value = 0;
    double double_value = 0;
    uint8_t bool_value = 0;
    if (value.isTensor()) {
      const auto& tensor = value.toTensor();
      std::printf("output %zu: dtype=%s sizes=%s\n", i,
                  dtype_name(tensor.scalar_type()).c_str(),
                  sizes_string(tensor.sizes()).c_str());
      data = tensor.const_data_ptr();
      nbytes = tensor.nbytes();
    } else if (value.isInt()) {
      int_value = value.toInt();
      std::printf("output %zu: dtype=int64 sizes=[]\n", i);
      data = &int_value;
      nbytes = sizeof(int_value);
    } else if (value.isDouble()) {
      double_value = value.toDouble();
      std::printf("output %zu: dtype=float64 sizes=[]\n", i);
      data = &double_value;
      nbytes = sizeof(double_value);
    } else if (value.isBool()) {
      bool_value = value.toBool() ? 1 : 0;
      std::printf("output %zu: dtype=bool sizes=[]\n", i);
      data = &bool_value;
      nbytes = 1;
    } else {
      std::printf("output %zu: %s\n", i,
                  executorch::runtime::tag_to_string(value.tag));
      continue;
    }
    if (options.output_dir.empty()) continue;
    const std::string path = (std::filesystem::path(options.output_dir) /
                              ("output_" + std::to_string(i) + ".bin"))
                                 .string();
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    const auto size = static_cast<std::streamsize>(nbytes);
    if (!out ||
        (nbytes > 0 && !out.write(static_cast<const char*>(data), size))) {
      fail("cannot write " + path + ": " + errno_text());
    }
  }
}

// ---------------------------------------------------------------------------
// --generate: an LLM's greedy decode loop over its KV cache.

// The method must be forward(tokens int64 [1, T], input_pos int64 [1]) ->
// float logits; returns T, the most tokens one call takes.
long llm_max_tokens(const Options& options, const MethodMeta& meta) {
  auto bad = [&](const std::string& why) {
    fail("--generate: method '" + options.method + "' of " + options.model +
         " is not an LLM step forward(tokens int64 [1, T], input_pos int64 "
         "[1]) -> logits: " + why);
  };
  if (meta.num_inputs() != 2) {
    bad("it takes " + std::to_string(meta.num_inputs()) + " input(s)");
  }
  std::vector<std::vector<executorch::aten::SizesType>> sizes;
  for (size_t i = 0; i < 2; ++i) {
    auto tag = meta.input_tag(i);
    auto info = meta.input_tensor_meta(i);
    if (!tag.ok() || *tag != Tag::Tensor || !info.ok()) {
      bad("input " + std::to_string(i) + " is not a tensor");
    }
    if (info->scalar_type() != ScalarType::Long) {
      bad("input " + std::to_string(i) + " is " +
          dtype_name(info->scalar_type()));
    }
    sizes.emplace_back(info->sizes().begin(), info->sizes().end());
  }
  if (sizes[0].size() != 2 || sizes[0][0] != 1 || sizes[0][1] < 1) {
    bad("the tokens are " + sizes_string(sizes[0]));
  }
  if (sizes[1].size() != 1 || sizes[1][0] != 1) {
    bad("input_pos is " + sizes_string(sizes[1]));
  }
  return sizes[0][1];
}

// The next token: the argmax of the last row of float logits.
int64_t next_token(const Options& options, const std::vector<EValue>& outputs) {
  if (outputs.empty() || !outputs[0].isTensor() ||
      outputs[0].toTensor().scalar_type() != ScalarType::Float ||
      outputs[0].toTensor().dim() < 1) {
    fail("--generate: method '" + options.method + "' of " + options.model +
         " does not return float logits as its first output");
  }
  const auto& logits = outputs[0].toTensor();
  const int64_t vocab = logits.size(logits.dim() - 1);
  const float* last = logits.const_data_ptr<float>() + (logits.numel() - vocab);
  return std::max_element(last, last + vocab) - last;
}

int generate(const Options& options, Module& module, const MethodMeta& meta,
             long threads) {
  const long chunk = llm_max_tokens(options, meta);
  using Clock = std::chrono::steady_clock;
  auto ms_since = [](Clock::time_point start) {
    return std::chrono::duration<double, std::milli>(Clock::now() - start)
        .count();
  };
  // One call: tokens [1, n] at position pos; returns the next token.
  auto step = [&](const int64_t* tokens, size_t n, int64_t pos,
                  const char* phase) {
    auto ids = executorch::extension::make_tensor_ptr(
        {1, static_cast<executorch::aten::SizesType>(n)},
        std::vector<int64_t>(tokens, tokens + n));
    auto position =
        executorch::extension::make_tensor_ptr({1}, std::vector<int64_t>{pos});
    auto result = module.execute(options.method,
                                 std::vector<EValue>{*ids, *position});
    if (!result.ok()) {
      fail(std::string("method '") + options.method + "' of " + options.model +
           " failed during " + phase + " at position " + std::to_string(pos) +
           ": " + runtime_detail("execute", result.error()));
    }
    return next_token(options, *result);
  };

  LogCapture capture;
  const std::vector<int64_t>& prompt = options.prompt;
  const auto prefill_start = Clock::now();
  int64_t token = 0;
  for (size_t i = 0; i < prompt.size(); i += static_cast<size_t>(chunk)) {
    const size_t n = std::min(prompt.size() - i, static_cast<size_t>(chunk));
    token = step(prompt.data() + i, n, static_cast<int64_t>(i), "the prefill");
  }
  const double prefill_ms = ms_since(prefill_start);
  std::vector<int64_t> generated = {token};
  const auto decode_start = Clock::now();
  for (long k = 1; k < options.generate; ++k) {
    const int64_t pos = static_cast<int64_t>(prompt.size()) + k - 1;
    token = step(&token, 1, pos, "the decode");
    generated.push_back(token);
  }
  const double decode_ms = ms_since(decode_start);
  capture.release();

  const long steps = options.generate - 1;
  std::printf("prefill tokens=%zu ms=%.4f tokens_per_s=%.3f threads=%ld\n",
              prompt.size(), prefill_ms, 1000.0 * prompt.size() / prefill_ms,
              threads);
  std::printf("decode tokens=%ld ms=%.4f tokens_per_s=%.3f\n", steps,
              decode_ms, steps > 0 ? 1000.0 * steps / decode_ms : 0.0);
  std::string ids;
  for (int64_t id : generated) ids += " " + std::to_string(id);
  std::printf("generated:%s\n", ids.c_str());
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmHWM:", 0) == 0) {
      std::printf("memory peak_rss_kib=%ld\n", std::strtol(line.c_str() + 6, nullptr, 10));
    }
  }
  std::fflush(stdout);
  return 0;
}

// ---------------------------------------------------------------------------

int run(const Options& options) {
  check_program_file(options.model);
  const long threads = configure_threads(options.threads);

  // --generate: the program in memory at load (ProgramInMemory); otherwise mapped
  std::unique_ptr<ProgramInMemory> in_memory;
  if (options.generate > 0) in_memory = std::make_unique<ProgramInMemory>(options.model);
  Module module = in_memory ? Module(in_memory->loader()) : Module(options.model, Module::LoadMode::Mmap);
  {
    LogCapture capture;
    Error error = module.load(Program::Verification::InternalConsistency);
    if (error != Error::Ok) {
      fail(options.model + " could not be loaded, it may be truncated or "
           "corrupt: " + runtime_detail("Program::load", error));
    }
    capture.release();
  }

  auto names = module.method_names();
  if (!names.ok()) {
    fail("cannot list the methods of " + options.model + ": " +
         executorch::runtime::to_string(names.error()));
  }
  if (names->count(options.method) == 0) {
    std::vector<std::string> sorted(names->begin(), names->end());
    std::sort(sorted.begin(), sorted.end());
    std::string list;
    for (const auto& name : sorted) list += (list.empty() ? "" : ", ") + name;
    fail(options.model + " has no method '" + options.method +
         "' (it has: " + (list.empty() ? "none" : list) + ")");
  }
  auto meta = module.method_meta(options.method);
  if (!meta.ok()) {
    fail("cannot read method '" + options.method + "' of " + options.model +
         ": " + executorch::runtime::to_string(meta.error()));
  }

  PreparedInputs inputs;
  if (options.generate == 0) {
    inputs = prepare_inputs(options, *meta);
  }

  {
    LogCapture capture;
    Error error = module.load_method(options.method);
    if (error != Error::Ok) {
      std::string missing = explain_missing(options, *meta);
      if (!missing.empty()) fail(missing);
      fail("method '" + options.method + "' of " + options.model +
           " could not be loaded: " + runtime_detail("load_method", error));
    }
    capture.release();
  }
  if (options.generate > 0) {
    return generate(options, module, *meta, threads);
  }
  for (const std::string& line : inputs.lines) {
    std::printf("%s\n", line.c_str());
  }

  LogCapture capture; // until the runs are done
  auto run_once = [&](const char* phase) {
    auto result = module.execute(options.method, inputs.values);
    if (!result.ok()) {
      fail(std::string("method '") + options.method + "' of " + options.model +
           " failed during " + phase + ": " +
           runtime_detail("execute", result.error()));
    }
    return std::move(*result);
  };

  for (long i = 0; i < options.warmup; ++i) {
    run_once("warmup");
  }
  std::vector<double> times_ms;
  times_ms.reserve(static_cast<size_t>(options.iterations));
  std::vector<EValue> outputs;
  for (long i = 0; i < options.iterations; ++i) {
    const auto start = std::chrono::steady_clock::now();
    outputs = run_once("the timed runs");
    const auto stop = std::chrono::steady_clock::now();
    times_ms.push_back(
        std::chrono::duration<double, std::milli>(stop - start).count());
  }
  capture.release();

  std::vector<double> sorted = times_ms;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  const double median =
      n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
  double sum = 0;
  for (double t : times_ms) sum += t;
  std::printf("latency_ms min=%.4f median=%.4f mean=%.4f iterations=%ld "
              "threads=%ld\n",
              sorted.front(), median, sum / static_cast<double>(n),
              options.iterations, threads);
  report_and_write_outputs(options, outputs);
  std::fflush(stdout);
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  try {
    Options options = parse_args(argc, argv);
    install_pal();
    return run(options);
  } catch (const Failure& failure) {
    print_error_line(failure.message);
    return failure.exit_code;
  } catch (const std::exception& e) {
    print_error_line(e.what());
    return 1;
  } catch (...) {
    print_error_line("unexpected failure");
    return 1;
  }
}
