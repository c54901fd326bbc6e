#include "strata/status.h"

#include <gtest/gtest.h>

#include "strata/env.h"

namespace strata {
namespace {

TEST(StatusTest, OkByDefault) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.ToString(), "OK");
}

TEST(StatusTest, CarriesContext) {
  Status s = Status::FromErrno(ENOSPC, "pwrite /x/strata.0");
  s.WithPath("/x/strata.0").WithOffset(8192);
  EXPECT_EQ(s.code(), StatusCode::kNoSpace);
  EXPECT_EQ(s.err_no(), ENOSPC);
  EXPECT_EQ(s.path(), "/x/strata.0");
  EXPECT_EQ(s.ToString().find("NoSpace: pwrite /x/strata.0"), 0u) << s.ToString();
  EXPECT_NE(s.ToString().find("offset=8192"), std::string::npos);
  // The whole text: message, then the context in brackets, space-separated.
  EXPECT_EQ(s.ToString(), "NoSpace: " + s.message() + " [path=/x/strata.0 offset=8192 errno=" +
                              std::to_string(ENOSPC) + "]");
  Status only_offset = Status::IOError("short read");
  only_offset.WithOffset(0);
  EXPECT_EQ(only_offset.ToString(), "IOError: short read [offset=0]");
}

TEST(StatusTest, CopiesDoNotShareAnnotations) {
  Status a = Status::IOError("read failed");
  Status b = a;
  b.Annotate("block 3");
  EXPECT_EQ(a.message(), "read failed");
  EXPECT_EQ(b.message(), "block 3: read failed");
}

Result<int> Half(int x) {
  if (x % 2) return Status::InvalidArgument("odd");
  return x / 2;
}

Status Quarter(int x, int* out) {
  STRATA_ASSIGN_OR_RETURN(int h, Half(x));
  STRATA_ASSIGN_OR_RETURN(*out, Half(h));
  return Status::OK();
}

TEST(StatusTest, ResultAndMacros) {
  int q = 0;
  EXPECT_TRUE(Quarter(8, &q).ok());
  EXPECT_EQ(q, 2);
  Status s = Quarter(6, &q);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
}

TEST(EnvTest, DefaultsAndOverrides) {
  unsetenv("STRATA_CPU_ISA");
  EXPECT_EQ(EnvGet("STRATA_CPU_ISA"), "auto");
  setenv("STRATA_CPU_ISA", "scalar", 1);
  EXPECT_EQ(EnvGet("STRATA_CPU_ISA"), "scalar");
  unsetenv("STRATA_CPU_ISA");
  EXPECT_EQ(EnvGet("STRATA_NOT_DECLARED"), "");
}

}  // namespace
}  // namespace strata
