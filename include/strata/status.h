// Status and Result<T>: how every Strata library call reports failure.
//
// A Status is OK or carries a code, a message a user can act on, and where known the errno
// and the path/offset it concerns. Library code never throws; it returns [[nodiscard]]
// Status or Result<T>. Both are plain values: safe to copy and to move between threads.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace strata {

enum class StatusCode : uint8_t {
  kOk = 0,
  kInvalidArgument,
  kNotFound,
  kIOError,
  kNoSpace,
  kOutOfMemory,
  kCorruption,
  kNotSupported,
  kCuda,
  kComm,
  kTimeout,
  kAborted,
};

inline const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "InvalidArgument";
    case StatusCode::kNotFound:
      return "NotFound";
    case StatusCode::kIOError:
      return "IOError";
    case StatusCode::kNoSpace:
      return "NoSpace";
    case StatusCode::kOutOfMemory:
      return "OutOfMemory";
    case StatusCode::kCorruption:
      return "Corruption";
    case StatusCode::kNotSupported:
      return "NotSupported";
    case StatusCode::kCuda:
      return "Cuda";
    case StatusCode::kComm:
      return "Comm";
    case StatusCode::kTimeout:
      return "Timeout";
    case StatusCode::kAborted:
      return "Aborted";
  }
  return "Unknown";
}

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) {
    if (code != StatusCode::kOk)
      rep_ = std::make_shared<Rep>(Rep{code, std::move(message), 0, {}, std::nullopt});
  }

  static Status OK() { return Status(); }
  static Status InvalidArgument(std::string m) {
    return {StatusCode::kInvalidArgument, std::move(m)};
  }
  static Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
  static Status IOError(std::string m) { return {StatusCode::kIOError, std::move(m)}; }
  static Status NoSpace(std::string m) { return {StatusCode::kNoSpace, std::move(m)}; }
  static Status OutOfMemory(std::string m) { return {StatusCode::kOutOfMemory, std::move(m)}; }
  static Status Corruption(std::string m) { return {StatusCode::kCorruption, std::move(m)}; }
  static Status NotSupported(std::string m) { return {StatusCode::kNotSupported, std::move(m)}; }
  static Status Cuda(std::string m) { return {StatusCode::kCuda, std::move(m)}; }
  static Status Comm(std::string m) { return {StatusCode::kComm, std::move(m)}; }
  static Status Timeout(std::string m) { return {StatusCode::kTimeout, std::move(m)}; }
  static Status Aborted(std::string m) { return {StatusCode::kAborted, std::move(m)}; }

  // An IOError (or NoSpace for ENOSPC/EDQUOT) from a failed system call; `what` names the
  // operation and the object ("pwrite /nvme0/strata.0 at offset 4096").
  static Status FromErrno(int err, std::string what) {
    StatusCode code = (err == ENOSPC || err == EDQUOT) ? StatusCode::kNoSpace
                      : (err == ENOENT)                ? StatusCode::kNotFound
                      : (err == ENOMEM)                ? StatusCode::kOutOfMemory
                      : (err == EINVAL)                ? StatusCode::kInvalidArgument
                                                       : StatusCode::kIOError;
    Status s(code, std::move(what) + ": " + std::strerror(err));
    return s.WithErrno(err);
  }

  bool ok() const { return rep_ == nullptr; }
  StatusCode code() const { return rep_ ? rep_->code : StatusCode::kOk; }
  const std::string& message() const {
    static const std::string kEmpty;
    return rep_ ? rep_->message : kEmpty;
  }
  int err_no() const { return rep_ ? rep_->err_no : 0; }
  const std::string& path() const {
    static const std::string kEmpty;
    return rep_ ? rep_->path : kEmpty;
  }
  std::optional<uint64_t> offset() const { return rep_ ? rep_->offset : std::nullopt; }

  // Decorators: attach context. No effect on an OK status.
  Status& WithErrno(int e) {
    if (rep_) Mutable().err_no = e;
    return *this;
  }
  Status& WithPath(std::string p) {
    if (rep_) Mutable().path = std::move(p);
    return *this;
  }
  Status& WithOffset(uint64_t off) {
    if (rep_) Mutable().offset = off;
    return *this;
  }
  // Prefixes the message with the caller's context: "loading block 3: <message>".
  Status& Annotate(std::string_view context) {
    if (rep_) Mutable().message = std::string(context) + ": " + rep_->message;
    return *this;
  }

  bool IsNoSpace() const { return code() == StatusCode::kNoSpace; }
  bool IsCorruption() const { return code() == StatusCode::kCorruption; }
  bool IsNotSupported() const { return code() == StatusCode::kNotSupported; }

  // "Corruption: checksum mismatch in extent 12 [path=/nvme/strata.0 offset=8192 errno=5]"
  std::string ToString() const {
    if (ok()) return "OK";
    std::string s = std::string(StatusCodeName(rep_->code)) + ": " + rep_->message;
    // Appends only: GCC 12 warns (-Wrestrict, a false positive) on a string prepended to.
    std::string ctx;
    auto add = [&ctx](const char* key, const std::string& value) {
      if (!ctx.empty()) ctx += ' ';
      ctx.append(key).append(value);
    };
    if (!rep_->path.empty()) add("path=", rep_->path);
    if (rep_->offset) add("offset=", std::to_string(*rep_->offset));
    if (rep_->err_no) add("errno=", std::to_string(rep_->err_no));
    if (!ctx.empty()) s.append(" [").append(ctx).append("]");
    return s;
  }

 private:
  struct Rep {
    StatusCode code;
    std::string message;
    int err_no = 0;
    std::string path;
    std::optional<uint64_t> offset;
  };
  Rep& Mutable() {
    if (rep_.use_count() > 1) rep_ = std::make_shared<Rep>(*rep_);
    return *rep_;
  }
  std::shared_ptr<Rep> rep_;  // null when OK
};

// Result<T>: a T or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT: implicit by design
    if (std::get<Status>(v_).ok()) v_ = Status::InvalidArgument("Result built from an OK Status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  // REQUIRES: ok()
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

#define STRATA_CONCAT_INNER_(a, b) a##b
#define STRATA_CONCAT_(a, b) STRATA_CONCAT_INNER_(a, b)

// Returns the status from the enclosing function when `expr` is not OK.
#define STRATA_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::strata::Status strata_status_ = (expr);        \
    if (!strata_status_.ok()) return strata_status_; \
  } while (0)

// `lhs = value of expr`, or returns its status. lhs may declare: STRATA_ASSIGN_OR_RETURN(auto x,
// F());
#define STRATA_ASSIGN_OR_RETURN(lhs, expr) \
  STRATA_ASSIGN_OR_RETURN_IMPL_(STRATA_CONCAT_(strata_result_, __LINE__), lhs, expr)
#define STRATA_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()

}  // namespace strata
