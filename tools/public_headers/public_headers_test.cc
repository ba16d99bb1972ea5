// Each public header (API.md) compiles on its own: see the *_h.cc files of this package.
#include "gtest/gtest.h"

namespace torchlens {
int capture_header_compiles();
int trace_header_compiles();
int render_header_compiles();
int validate_header_compiles();
int intervene_header_compiles();

namespace {

TEST(PublicHeadersTest, EachCompilesAlone) {
  EXPECT_EQ(capture_header_compiles() + trace_header_compiles() + render_header_compiles() +
                validate_header_compiles() + intervene_header_compiles(),
            0);
}

}  // namespace
}  // namespace torchlens
