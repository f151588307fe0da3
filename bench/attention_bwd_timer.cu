// Checks and times the "hopper" attention backward variant directly:
//   cmake --build build --target attention_bwd_timer
//   build/attention_bwd_timer check [filter]   # edge cases: every element of dq, dk, dv against an fp64
//                                              # host reference; deterministic runs repeated bit-identical
//   build/attention_bwd_timer time [filter]    # the target workloads: median of CUDA-event timings
// The forward (the "hopper" attention variant) makes O and LSE; dO is uniform in [-1, 1) like the
// inputs; dq, dk, dv are poisoned (NaN) before every run. Effective FLOPs of the backward = 2.5 x
// those of the forward (FlashAttention's convention: 4 * D * unmasked score elements, x 2.5).
#include <functional>

#include "attention_problem.cuh"

const AttentionVariant& forward() { return hopper_variant(find_attention_variant("hopper")); }
const AttentionBackwardVariant& backward() { return hopper_variant(find_attention_backward_variant("hopper")); }

// A forward problem (q, k, v, O, LSE on the device; O and LSE from the forward kernel) plus dO and
// the gradient outputs.
struct BwdProblem {
  Problem P;
  uint16_t *g_o = nullptr, *g_q = nullptr, *g_k = nullptr, *g_v = nullptr;
  int64_t nq = 0, nk = 0;
  AttentionBackwardArgs args;
};

BwdProblem make_bwd(const Case& c, uint32_t seed, bool deterministic) {
  BwdProblem B;
  B.P = make_problem(c, seed);
  B.nq = int64_t(c.b) * c.hq * c.sq * c.d;
  B.nk = int64_t(c.b) * c.hkv * c.skv * c.d;
  SPARSEK_CHECK_CUDA(cudaMalloc(&B.g_o, std::max<int64_t>(B.nq, 1) * 2));
  SPARSEK_CHECK_CUDA(cudaMalloc(&B.g_q, std::max<int64_t>(B.nq, 1) * 2));
  SPARSEK_CHECK_CUDA(cudaMalloc(&B.g_k, std::max<int64_t>(B.nk, 1) * 2));
  SPARSEK_CHECK_CUDA(cudaMalloc(&B.g_v, std::max<int64_t>(B.nk, 1) * 2));
  const DType dt = c.bf16 ? DType::bf16 : DType::f16;
  fill_uniform(B.g_o, dt, B.nq, seed * 3 + 4);
  AttentionBackwardArgs& a = B.args;
  a.forward = B.P.args;
  a.dout = Tensor4View::packed(B.g_o, dt, Memory::device, c.b, c.hq, c.sq, c.d);
  a.dq = Tensor4View::packed(B.g_q, dt, Memory::device, c.b, c.hq, c.sq, c.d);
  a.dk = Tensor4View::packed(B.g_k, dt, Memory::device, c.b, c.hkv, c.skv, c.d);
  a.dv = Tensor4View::packed(B.g_v, dt, Memory::device, c.b, c.hkv, c.skv, c.d);
  a.deterministic = deterministic;
  return B;
}

void free_bwd(BwdProblem& B) {
  for (void* p :
       {static_cast<void*>(B.g_o), static_cast<void*>(B.g_q), static_cast<void*>(B.g_k), static_cast<void*>(B.g_v)})
    cudaFree(p);
  free_problem(B.P);
}

// "" when both variants can run the problem, else the reason.
std::string why_not(const BwdProblem& B) {
  std::string why = forward().why_not(B.P.args);
  if (why.empty()) why = backward().why_not(B.args);
  return why;
}

void run_forward(const BwdProblem& B) {
  Options o;
  auto state = forward().prepare(B.P.args, o);
  forward().run(B.P.args, o, state.get());
  SPARSEK_CHECK_CUDA(cudaDeviceSynchronize());
}

std::vector<uint16_t> download(const uint16_t* d, int64_t n) {
  std::vector<uint16_t> h(size_t(std::max<int64_t>(n, 0)));
  if (n > 0) SPARSEK_CHECK_CUDA(cudaMemcpy(h.data(), d, size_t(n) * 2, cudaMemcpyDeviceToHost));
  return h;
}

// The fp64 reference (cpu/oracle.hpp: attention_backward_oracle) on host copies of the problem:
// gradients, the magnitudes of their terms (mag: the kernel rounds P and dS to the input dtype
// before the products, as FlashAttention does, and takes Delta from the rounded O, so its
// first-order rounding error is at most u * mag, u = 2^-8 for bf16, 2^-11 for f16), and which
// query rows / keys are live. Where few keys carry a row (the first queries of a causal diagonal
// block), mag is far above the output's rms and a near-zero element can legitimately miss a
// tolerance relative to rms alone.
AttentionBackwardReference reference(const BwdProblem& B, std::vector<uint16_t>& q, std::vector<uint16_t>& k,
                                     std::vector<uint16_t>& v, std::vector<uint16_t>& g) {
  const Case& c = B.P.c;
  const DType dt = c.bf16 ? DType::bf16 : DType::f16;
  // o, lse, dq, dk, dv: host placeholders the argument checks want (the reference reads none).
  std::vector<uint16_t> o(size_t(B.nq)), gq(size_t(B.nq)), gk(size_t(B.nk)), gv(size_t(B.nk));
  std::vector<float> lse(size_t(int64_t(c.b) * c.hq * c.sq));
  AttentionBackwardArgs a = B.args;
  AttentionArgs& f = a.forward;
  auto host = [&](std::vector<uint16_t>& x, int h, int s) {
    return Tensor4View::packed(x.data(), dt, Memory::host, c.b, h, s, c.d);
  };
  f.q = host(q, c.hq, c.sq), f.k = host(k, c.hkv, c.skv), f.v = host(v, c.hkv, c.skv), f.o = host(o, c.hq, c.sq);
  f.lse = lse.data();
  a.dout = host(g, c.hq, c.sq), a.dq = host(gq, c.hq, c.sq), a.dk = host(gk, c.hkv, c.skv), a.dv = host(gv, c.hkv, c.skv);
  AttentionLayout& l = f.layout;
  l.memory = Memory::host;
  l.kv_num_blocks = B.P.L.num.data();
  l.kv_indices = B.P.L.idx.data();
  if (c.full) {
    l.full_kv_num_blocks = B.P.L.fnum.data();
    l.full_kv_indices = B.P.L.fidx.data();
  }
  return attention_backward_oracle(a);
}

// Every element: |got - ref| <= tol * (|ref| + rms(ref)) + u * mag (the rounding bound above); rows
// that attend nothing / keys nobody attends must be exactly 0. Returns the failures; reports the
// largest error over rms.
int compare(const char* case_name, const char* what, const std::vector<uint16_t>& got, const std::vector<double>& ref,
            const std::vector<double>& mag, const std::vector<char>& live_rows, int d, bool bf16, double& worst) {
  double ss = 0;
  for (double r : ref) ss += r * r;
  const double rms = ref.empty() ? 0 : std::sqrt(ss / double(ref.size()));
  const double tol = bf16 ? 2e-2 : 1e-2;
  const double u = bf16 ? 1.0 / 256 : 1.0 / 2048;  // unit roundoff of the operands
  int fails = 0;
  worst = 0;
  for (size_t x = 0; x < ref.size(); ++x) {
    const double gv = double(to_f(got[x], bf16));
    const bool live = live_rows[x / size_t(d)] != 0;
    const double err = std::fabs(gv - ref[x]);
    const bool ok = live ? err <= tol * (std::fabs(ref[x]) + rms) + u * mag[x] : gv == 0.0;  // NaN fails both
    if (live && rms > 0 && err == err) worst = std::max(worst, err / rms);
    if (!ok) {
      if (fails < 4)
        std::printf("%-36s FAIL: %s[%zu] (row %zu, col %zu%s) = %g, reference %g\n", case_name, what, x, x / size_t(d),
                    x % size_t(d), live ? "" : ", must be exactly 0", gv, ref[x]);
      ++fails;
    }
  }
  return fails;
}

int check(const Case& c, uint32_t seed, bool deterministic) {
  const std::string name = c.name + (deterministic ? "" : " [atomic]");
  BwdProblem B = make_bwd(c, seed, deterministic);
  const std::string why = why_not(B);
  if (!why.empty()) {
    std::printf("%-36s UNSUPPORTED: %s\n", name.c_str(), why.c_str());
    free_bwd(B);
    return 1;
  }
  run_forward(B);
  Options o;
  auto state = backward().prepare(B.args, o);
  std::vector<uint16_t> gq, gk, gv, fq, fk, fv;
  int fails = 0;
  for (int rep = 0; rep < 2; ++rep) {
    SPARSEK_CHECK_CUDA(cudaMemset(B.g_q, 0xff, size_t(std::max<int64_t>(B.nq, 1)) * 2));  // NaN poison
    SPARSEK_CHECK_CUDA(cudaMemset(B.g_k, 0xff, size_t(std::max<int64_t>(B.nk, 1)) * 2));
    SPARSEK_CHECK_CUDA(cudaMemset(B.g_v, 0xff, size_t(std::max<int64_t>(B.nk, 1)) * 2));
    backward().run(B.args, o, state.get());
    SPARSEK_CHECK_CUDA(cudaDeviceSynchronize());
    gq = download(B.g_q, B.nq);
    gk = download(B.g_k, B.nk);
    gv = download(B.g_v, B.nk);
    if (rep == 0) {
      fq = gq, fk = gk, fv = gv;
    } else if (deterministic && (fq != gq || fk != gk || fv != gv)) {
      std::printf("%-36s FAIL: repeated run differs (dq %s, dk %s, dv %s)\n", name.c_str(),
                  fq == gq ? "same" : "DIFFERS", fk == gk ? "same" : "DIFFERS", fv == gv ? "same" : "DIFFERS");
      ++fails;
    }
  }
  std::vector<uint16_t> hq = download(B.P.dq, B.nq), hk = download(B.P.dk, B.nk), hv = download(B.P.dv, B.nk),
                        hg = download(B.g_o, B.nq);
  const AttentionBackwardReference R = reference(B, hq, hk, hv, hg);
  double wq = 0, wk = 0, wv = 0;
  fails += compare(name.c_str(), "dq", gq, R.dq, R.mag_dq, R.q_live, c.d, c.bf16, wq);
  fails += compare(name.c_str(), "dk", gk, R.dk, R.mag_dk, R.k_live, c.d, c.bf16, wk);
  fails += compare(name.c_str(), "dv", gv, R.dv, R.mag_dv, R.k_live, c.d, c.bf16, wv);
  int empty_q = 0, empty_k = 0;
  for (char x : R.q_live) empty_q += !x;
  for (char x : R.k_live) empty_k += !x;
  std::printf("%-36s %s (max err / rms: dq %.1e dk %.1e dv %.1e; empty rows %d, empty keys %d)\n", name.c_str(),
              fails ? "FAIL" : "ok", wq, wk, wv, empty_q, empty_k);
  free_bwd(B);
  return fails ? 1 : 0;
}

// Median ms of 30 runs after 5 warm-up runs.
double median_ms(const std::function<void()>& fn) {
  const std::vector<double> ms = timing::time_gpu([&](int) { fn(); }, 5, 30, 1);
  SPARSEK_CHECK_CUDA(cudaGetLastError());
  return timing::median(ms);
}

void time_case(const Case& c, bool deterministic) {
  const std::string name = c.name + (deterministic ? "" : " [atomic]");
  BwdProblem B = make_bwd(c, 7, deterministic);
  const std::string why = why_not(B);
  if (!why.empty()) {
    std::printf("%-44s UNSUPPORTED: %s\n", name.c_str(), why.c_str());
    free_bwd(B);
    return;
  }
  Options o;
  auto fstate = forward().prepare(B.P.args, o);
  auto bstate = backward().prepare(B.args, o);
  const double fwd = median_ms([&] { forward().run(B.P.args, o, fstate.get()); });
  const double bwd = median_ms([&] { backward().run(B.args, o, bstate.get()); });
  const double flops = 2.5 * B.P.flops;
  std::printf("%-44s bwd %8.3f ms %7.1f eff TFLOPS | fwd %.3f ms, fwd+bwd %.3f ms\n", name.c_str(), bwd,
              flops / (bwd * 1e9), fwd, fwd + bwd);
  free_bwd(B);
}

int timer_main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "check";
  const std::string filter = argc > 2 ? argv[2] : "";
  // The filter is a substring of the printed name ("[atomic]" included).
  auto matches = [&](const Case& c, bool det) {
    return filter.empty() || (c.name + (det ? "" : " [atomic]")).find(filter) != std::string::npos;
  };
  std::vector<std::pair<Case, bool>> cases;  // (case, deterministic)
  if (mode == "check") {
    auto add = [&](const char* name, auto edit, bool det = true) {
      Case c;
      c.name = name;
      edit(c);
      cases.push_back({c, det});
    };
    add("d128 b128 bf16 50%", [](Case&) {});
    add("d128 b128 fp16 50%", [](Case& c) { c.bf16 = false; });
    add("d64 b128 bf16", [](Case& c) { c.d = 64; });
    add("d128 b64 bf16", [](Case& c) { c.block = 64; });
    add("d64 b64 fp16", [](Case& c) {
      c.d = 64;
      c.block = 64;
      c.bf16 = false;
    });
    add("dense layout", [](Case& c) { c.density = 1.0; });
    add("causal", [](Case& c) {
      c.causal = true;
      c.density = 0.7;
      c.sq = c.skv = 512;
    });
    add("causal + full blocks", [](Case& c) {
      c.causal = true;
      c.full = true;
      c.density = 1.0;
      c.sq = c.skv = 512;
    });
    add("full blocks, not causal", [](Case& c) { c.full = true; });
    add("tails sq=300 skv=200", [](Case& c) {
      c.sq = 300;
      c.skv = 200;
      c.density = 1.0;
    });
    add("tails causal sq=skv=333", [](Case& c) {
      c.sq = c.skv = 333;
      c.causal = true;
      c.density = 1.0;
    });
    add("tails b64 d64 sq=97 skv=150", [](Case& c) {
      c.sq = 97;
      c.skv = 150;
      c.block = 64;
      c.d = 64;
    });
    add("empty rows + kmax extra", [](Case& c) {
      c.empty_rows = true;
      c.kmax_extra = 3;
      c.sq = c.skv = 640;
    });
    add("empty key columns", [](Case& c) {
      c.sq = 128;
      c.skv = 1024;
      c.density = 0.25;
    });
    add("GQA 4/2, layout per q head", [](Case& c) {
      c.hq = 4;
      c.hkv = 2;
    });
    add("GQA 8/2, layout per kv head", [](Case& c) {
      c.hq = 8;
      c.hkv = 2;
      c.layout_heads = 2;
    });
    add("GQA 8/2 d64 b64 causal", [](Case& c) {
      c.hq = 8;
      c.hkv = 2;
      c.d = 64;
      c.block = 64;
      c.causal = true;
      c.density = 0.6;
    });
    add("MQA 4/1, broadcast layout", [](Case& c) {
      c.hq = 4;
      c.hkv = 1;
      c.layout_heads = 1;
      c.layout_batch = 1;
      c.b = 2;
    });
    add("batch 3, scale 0.3", [](Case& c) {
      c.b = 3;
      c.scale = 0.3f;
    });
    add("long columns 4096 queries", [](Case& c) {
      c.sq = 4096;
      c.skv = 256;
      c.density = 1.0;
      c.hq = c.hkv = 1;
    });
    add("long rows 4096 keys", [](Case& c) {
      c.sq = 256;
      c.skv = 4096;
      c.density = 1.0;
      c.hq = c.hkv = 1;
    });
    add("no keys at all (density 0)", [](Case& c) { c.density = 0.0; });
    add(
        "d128 b128 bf16 50%", [](Case&) {}, false);
    add(
        "GQA 8/2, layout per kv head",
        [](Case& c) {
          c.hq = 8;
          c.hkv = 2;
          c.layout_heads = 2;
        },
        false);
    add(
        "d64 b128 bf16", [](Case& c) { c.d = 64; }, false);
    int fails = 0;
    for (const auto& [c, det] : cases)
      if (matches(c, det)) fails += check(c, 11, det);
    std::printf("%d failure(s)\n", fails);
    return fails ? 1 : 0;
  }
  auto add = [&](const char* name, auto edit, bool det = true) {
    Case c;
    c.name = name;
    c.b = 1, c.hq = c.hkv = 16, c.sq = c.skv = 16384, c.d = 128, c.density = 0.125;
    edit(c);
    cases.push_back({c, det});
  };
  add("bwd D128 12.5%", [](Case&) {});
  add(
      "bwd D128 12.5%", [](Case&) {}, false);
  add("bwd D128 dense layout", [](Case& c) { c.density = 1.0; });
  add("bwd D64 12.5%", [](Case& c) { c.d = 64; });
  add("bwd D128 25%", [](Case& c) { c.density = 0.25; });
  add("bwd D128 causal top-k 12.5%", [](Case& c) {
    c.causal = true;
    c.density = 0.125 * 2;
  });
  add("bwd GQA 16/2 12.5%", [](Case& c) { c.hkv = 2; });
  add("bwd D128 12.5% fp16", [](Case& c) { c.bf16 = false; });
  add("bwd D128 64x64 blocks 12.5%", [](Case& c) { c.block = 64; });
  for (const auto& [c, det] : cases)
    if (matches(c, det)) time_case(c, det);
  return 0;
}

int main(int argc, char** argv) {
  return bench::run_timer("attention_bwd_timer", [&] { return timer_main(argc, argv); });
}
