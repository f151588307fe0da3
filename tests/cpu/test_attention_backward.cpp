// The Hopper attention backward's refusals: bad arguments are named before any device query, so
// these run on any machine (the kernel itself is checked by bench/attention_bwd_timer.cu on a GPU).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "core/device.hpp"
#include "plan/backends.hpp"

namespace sparsek {
namespace {

// Views over a fake, 16-byte aligned device address: why_not never dereferences them.
AttentionBackwardArgs valid_args() {
  void* dev = reinterpret_cast<void*>(uintptr_t(1) << 20);
  static float lse = 0.f;
  AttentionBackwardArgs a;
  AttentionArgs& f = a.forward;
  f.q = Tensor4View::packed(dev, DType::bf16, Memory::device, 2, 4, 256, 128);
  f.k = Tensor4View::packed(dev, DType::bf16, Memory::device, 2, 2, 384, 128);
  f.v = f.k;
  f.o = f.q;
  f.lse = &lse;
  f.layout.q_blocks = 2;
  f.layout.kmax = 3;
  a.dout = a.dq = f.q;
  a.dk = a.dv = f.k;
  return a;
}

std::string why_not(const AttentionBackwardArgs& a) { return hopper_attention_backward_variants().at(0).why_not(a); }

TEST(AttentionBackwardHopper, NamesTheBadArgument) {
  AttentionBackwardArgs a = valid_args();
  a.forward.lse = nullptr;
  EXPECT_NE(why_not(a).find("lse"), std::string::npos) << why_not(a);

  a = valid_args();
  a.dq.s = 255;
  EXPECT_NE(why_not(a).find("dq must have q's shape [2, 4, 256, 128], got [2, 4, 255, 128]"), std::string::npos)
      << why_not(a);

  a = valid_args();
  a.dk.dtype = DType::f16;
  EXPECT_NE(why_not(a).find("dk must have k's dtype"), std::string::npos) << why_not(a);

  a = valid_args();
  a.dv.memory = Memory::host;
  EXPECT_NE(why_not(a).find("dv must be in device memory"), std::string::npos) << why_not(a);

  a = valid_args();
  a.dout.stride_s = 130;  // 260 bytes: not a multiple of 16
  a.dout.stride_h = 130 * 256;
  a.dout.stride_b = 130 * 256 * 4;
  EXPECT_NE(why_not(a).find("dout's sequence stride must be a multiple of 16 bytes"), std::string::npos) << why_not(a);

  a = valid_args();
  a.forward.k.h = a.forward.v.h = a.dk.h = a.dv.h = 3;  // 4 query heads over 3
  EXPECT_NE(why_not(a).find("multiple of the key/value heads"), std::string::npos) << why_not(a);

  a = valid_args();
  a.forward.q.d = a.forward.k.d = a.forward.v.d = a.forward.o.d = a.dout.d = a.dq.d = a.dk.d = a.dv.d = 96;
  EXPECT_NE(why_not(a).find("D=96"), std::string::npos) << why_not(a);
}

TEST(AttentionBackwardHopper, ValidArgumentsReachTheDeviceChecks) {
  const std::string why = why_not(valid_args());
  const DeviceInfo& d = device_info();
  if (!d.available) {
    EXPECT_NE(why.find("no CUDA device"), std::string::npos) << why;
  } else if (d.cc_major != 9 || d.cc_minor != 0) {
    EXPECT_NE(why.find("needs an sm_90a GPU"), std::string::npos) << why;
  }
}

}  // namespace
}  // namespace sparsek
