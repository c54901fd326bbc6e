// Rank discovery, rendezvous specs and the comm timeout (comm/rank_env.cc): no ranks start.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "strata/comm.h"

namespace strata {
namespace {

using namespace std::chrono_literals;

EnvLookup MapEnv(std::map<std::string, std::string> m) {
  return [m = std::move(m)](std::string_view name) -> std::optional<std::string> {
    auto it = m.find(std::string(name));
    if (it == m.end()) return std::nullopt;
    return it->second;
  };
}

TEST(RankInfoFromEnv, ReadsTorchrunOpenMpiAndSlurm) {
  auto t = RankInfoFromEnv(
      MapEnv({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}}));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->rank, 3);
  EXPECT_EQ(t->world_size, 8);
  EXPECT_EQ(t->local_rank, 1);
  EXPECT_EQ(t->local_world_size, 2);
  EXPECT_EQ(t->source, "torchrun");

  auto o = RankInfoFromEnv(MapEnv({{"OMPI_COMM_WORLD_RANK", "2"},
                                   {"OMPI_COMM_WORLD_SIZE", "4"},
                                   {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}}));
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->rank, 2);
  EXPECT_EQ(o->world_size, 4);
  EXPECT_EQ(o->local_world_size, 4);
  EXPECT_EQ(o->source, "Open MPI");

  auto s = RankInfoFromEnv(MapEnv({{"SLURM_PROCID", "5"},
                                   {"SLURM_NTASKS", "6"},
                                   {"SLURM_LOCALID", "1"},
                                   {"SLURM_NTASKS_PER_NODE", "2(x3)"}}));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->rank, 5);
  EXPECT_EQ(s->local_rank, 1);
  EXPECT_EQ(s->local_world_size, 6);  // "2(x3)" is not a plain number
  EXPECT_EQ(s->source, "Slurm");

  // torchrun's variables win over the launcher's underneath.
  auto both = RankInfoFromEnv(
      MapEnv({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}}));
  ASSERT_TRUE(both.ok());
  EXPECT_EQ(both->source, "torchrun");
  EXPECT_EQ(both->world_size, 1);
}

TEST(RankInfoFromEnv, ReportsMissingAndInconsistentValues) {
  auto none = RankInfoFromEnv(MapEnv({}));
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find("RANK"), std::string::npos);

  auto no_size = RankInfoFromEnv(MapEnv({{"RANK", "0"}}));
  EXPECT_EQ(no_size.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(no_size.status().message().find("WORLD_SIZE"), std::string::npos);

  auto out_of_range = RankInfoFromEnv(MapEnv({{"RANK", "4"}, {"WORLD_SIZE", "4"}}));
  EXPECT_EQ(out_of_range.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(out_of_range.status().message().find("RANK=4"), std::string::npos);

  auto not_int = RankInfoFromEnv(MapEnv({{"RANK", "1x"}, {"WORLD_SIZE", "4"}}));
  EXPECT_EQ(not_int.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(not_int.status().message().find("RANK='1x'"), std::string::npos);

  auto no_local = RankInfoFromEnv(MapEnv({{"RANK", "1"}, {"WORLD_SIZE", "4"}}));
  EXPECT_EQ(no_local.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(no_local.status().message().find("LOCAL_RANK"), std::string::npos);

  auto bad_local = RankInfoFromEnv(
      MapEnv({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "2"}}));
  EXPECT_EQ(bad_local.status().code(), StatusCode::kInvalidArgument);

  auto zero = RankInfoFromEnv(MapEnv({{"RANK", "0"}, {"WORLD_SIZE", "0"}}));
  EXPECT_EQ(zero.status().code(), StatusCode::kInvalidArgument);

  auto single = RankInfoFromEnv(MapEnv({{"RANK", "0"}, {"WORLD_SIZE", "1"}}));
  ASSERT_TRUE(single.ok());
  EXPECT_EQ(single->local_rank, 0);
}

TEST(ParseRendezvous, AcceptsFileAndRedisAndRejectsTheRest) {
  auto f = ParseRendezvous("file:/shared/run7");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->kind, RendezvousSpec::Kind::kFile);
  EXPECT_EQ(f->path, "/shared/run7");
  EXPECT_EQ(f->ToString(), "file:/shared/run7");

  auto r = ParseRendezvous("redis:head-node:6379");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->kind, RendezvousSpec::Kind::kRedis);
  EXPECT_EQ(r->host, "head-node");
  EXPECT_EQ(r->port, 6379);
  EXPECT_EQ(r->prefix, "");
  EXPECT_EQ(r->ToString(), "redis://head-node:6379");

  auto v6 = ParseRendezvous("redis:[fe80::1]:7000");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->host, "fe80::1");
  EXPECT_EQ(v6->port, 7000);
  EXPECT_EQ(v6->ToString(), "redis://[fe80::1]:7000");

  // The URL form: a port by default, and the run's key prefix (which may hold slashes).
  auto u = ParseRendezvous("redis://head-node:7001/job42/step0");
  ASSERT_TRUE(u.ok()) << u.status().ToString();
  EXPECT_EQ(u->host, "head-node");
  EXPECT_EQ(u->port, 7001);
  EXPECT_EQ(u->prefix, "job42/step0");
  EXPECT_EQ(u->ToString(), "redis://head-node:7001/job42/step0");
  auto d = ParseRendezvous("redis://10.0.0.1/run");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->host, "10.0.0.1");
  EXPECT_EQ(d->port, 6379);
  EXPECT_EQ(d->prefix, "run");
  auto u6 = ParseRendezvous("redis://[::1]:7002/p");
  ASSERT_TRUE(u6.ok()) << u6.status().ToString();
  EXPECT_EQ(u6->host, "::1");
  EXPECT_EQ(u6->port, 7002);
  EXPECT_EQ(u6->prefix, "p");
  EXPECT_EQ(u6->ToString(), "redis://[::1]:7002/p");

  for (const char* bad :
       {"", "file:", "/tmp/x", "tcp:host:1", "redis:host", "redis::6379", "redis:host:0",
        "redis:host:65536", "redis:host:12x", "redis:[::1:5", "redis://", "redis:///p",
        "redis://h:0/p", "redis://h:x/p", "redis://[::1/p"}) {
    auto b = ParseRendezvous(bad);
    EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(b.status().message().find("file:DIR"), std::string::npos) << bad;
  }
}

// Redis AUTH in the URL (issue 45): ":secret@127.0.0.1" was taken for the host.
TEST(ParseRendezvous, PasswordAndUserInTheUrlNeverShowInMessages) {
  auto p = ParseRendezvous("redis://:s3cret@127.0.0.1:7003/run");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->host, "127.0.0.1");
  EXPECT_EQ(p->port, 7003);
  EXPECT_EQ(p->prefix, "run");
  EXPECT_EQ(p->user, "");
  EXPECT_EQ(p->password, "s3cret");
  EXPECT_EQ(p->ToString(), "redis://:***@127.0.0.1:7003/run");

  // An ACL user; '@' and '/' escaped in the password, a raw '@' taken up to the last one.
  auto u = ParseRendezvous("redis://alice:p%40ss%2Fword@[::1]/p");
  ASSERT_TRUE(u.ok()) << u.status().ToString();
  EXPECT_EQ(u->user, "alice");
  EXPECT_EQ(u->password, "p@ss/word");
  EXPECT_EQ(u->host, "::1");
  EXPECT_EQ(u->port, 6379);
  EXPECT_EQ(u->ToString(), "redis://alice:***@[::1]:6379/p");
  auto raw = ParseRendezvous("redis://bob:a@b@head:7004");
  ASSERT_TRUE(raw.ok()) << raw.status().ToString();
  EXPECT_EQ(raw->user, "bob");
  EXPECT_EQ(raw->password, "a@b");
  EXPECT_EQ(raw->host, "head");
  auto user_only = ParseRendezvous("redis://carol@head/p");
  ASSERT_TRUE(user_only.ok());
  EXPECT_EQ(user_only->user, "carol");
  EXPECT_EQ(user_only->password, "");

  for (const char* bad : {"redis://:@head/p", "redis://:pw%4@head/p", "redis://:topsecret@/p",
                          "redis://:topsecret@head:99999/p"}) {
    auto b = ParseRendezvous(bad);
    EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(b.status().message().find("topsecret"), std::string::npos)
        << "the password leaked: " << b.status().ToString();
  }
}

TEST(CommTimeoutFromEnv, ParsesSecondsAndRejectsGarbage) {
  ::setenv("STRATA_COMM_TIMEOUT", "2.5", 1);
  auto t = CommTimeoutFromEnv();
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->count(), 2500);
  ::setenv("STRATA_COMM_TIMEOUT", "soon", 1);
  EXPECT_EQ(CommTimeoutFromEnv().status().code(), StatusCode::kInvalidArgument);
  ::setenv("STRATA_COMM_TIMEOUT", "-1", 1);
  EXPECT_EQ(CommTimeoutFromEnv().status().code(), StatusCode::kInvalidArgument);
  ::unsetenv("STRATA_COMM_TIMEOUT");
  auto d = CommTimeoutFromEnv();
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->count(), 300000);
}

}  // namespace
}  // namespace strata
