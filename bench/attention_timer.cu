// Checks and times the "hopper" attention variant directly:
//   cmake --build build --target attention_timer
//   build/attention_timer check [filter]   # edge cases, every output row against an fp64 host reference
//   build/attention_timer time [filter]    # the target workloads: median of CUDA-event timings (timing.hpp)
// Inputs are uniform [-1, 1) from a hash (never zero); outputs are poisoned (NaN) before each run.
// Effective FLOPs = 4 * D * (unmasked score elements), counted on the host from the layout.
#include "attention_problem.cuh"

const AttentionVariant& hopper() { return hopper_variant(find_attention_variant("hopper")); }

// Every row (or rows of `every`-th item) against the fp64 reference. Returns the number of failures.
int check(const Case& c, uint32_t seed) {
  Problem P = make_problem(c, seed);
  const std::string why = hopper().why_not(P.args);
  if (!why.empty()) {
    std::printf("%-34s UNSUPPORTED: %s\n", c.name.c_str(), why.c_str());
    free_problem(P);
    return 1;
  }
  const int64_t nq = int64_t(c.b) * c.hq * c.sq * c.d, nk = int64_t(c.b) * c.hkv * c.skv * c.d;
  P.q.resize(size_t(nq));
  P.k.resize(size_t(nk));
  P.v.resize(size_t(nk));
  SPARSEK_CHECK_CUDA(cudaMemcpy(P.q.data(), P.dq, size_t(nq) * 2, cudaMemcpyDeviceToHost));
  SPARSEK_CHECK_CUDA(cudaMemcpy(P.k.data(), P.dk, size_t(nk) * 2, cudaMemcpyDeviceToHost));
  SPARSEK_CHECK_CUDA(cudaMemcpy(P.v.data(), P.dv, size_t(nk) * 2, cudaMemcpyDeviceToHost));
  Options o;
  auto state = hopper().prepare(P.args, o);
  std::vector<uint16_t> out(static_cast<size_t>(nq)), first;
  std::vector<float> lse(size_t(c.b) * c.hq * c.sq), first_lse;
  int fails = 0;
  double max_err = 0, max_lse_err = 0;
  for (int rep = 0; rep < 2; ++rep) {
    SPARSEK_CHECK_CUDA(cudaMemset(P.dout, 0xff, size_t(std::max<int64_t>(nq, 1)) * 2));  // NaN poison
    SPARSEK_CHECK_CUDA(cudaMemset(P.dlse, 0xff, lse.size() * 4));
    hopper().run(P.args, o, state.get());
    SPARSEK_CHECK_CUDA(cudaDeviceSynchronize());
    SPARSEK_CHECK_CUDA(cudaMemcpy(out.data(), P.dout, size_t(nq) * 2, cudaMemcpyDeviceToHost));
    SPARSEK_CHECK_CUDA(cudaMemcpy(lse.data(), P.dlse, lse.size() * 4, cudaMemcpyDeviceToHost));
    if (rep == 0) {
      first = out;
      first_lse = lse;
    } else if (std::memcmp(first.data(), out.data(), out.size() * 2) != 0 ||
               std::memcmp(first_lse.data(), lse.data(), lse.size() * 4) != 0) {
      std::printf("%-34s FAIL: repeated run differs\n", c.name.c_str());
      ++fails;
    }
  }
  const double scale = c.scale > 0 ? c.scale : 1.0 / std::sqrt(double(c.d));
  const int G = c.hq / c.hkv;
  std::vector<std::pair<int, bool>> blocks;
  std::vector<double> sc, acc(size_t(c.d));
  for (int b = 0; b < c.b; ++b)
    for (int h = 0; h < c.hq; ++h)
      for (int i = 0; i < P.L.mq; ++i) {
        row_blocks(P, b, h, i, blocks);
        for (int qi = i * c.block; qi < std::min(c.sq, (i + 1) * c.block); ++qi) {
          const int64_t qo = ((int64_t(b) * c.hq + h) * c.sq + qi) * c.d;
          sc.clear();
          std::vector<int> keys;
          double mx = -INFINITY;
          for (auto [j, full] : blocks)
            for (int kj = j * c.block; kj < std::min(c.skv, (j + 1) * c.block); ++kj) {
              if (c.causal && !full && kj > qi) continue;
              const int64_t ko = ((int64_t(b) * c.hkv + h / G) * c.skv + kj) * c.d;
              double s = 0;
              for (int e = 0; e < c.d; ++e)
                s += double(to_f(P.q[size_t(qo + e)], c.bf16)) * double(to_f(P.k[size_t(ko + e)], c.bf16));
              sc.push_back(s * scale);
              keys.push_back(kj);
              mx = std::max(mx, s * scale);
            }
          double sum = 0;
          std::fill(acc.begin(), acc.end(), 0.0);
          for (size_t t = 0; t < sc.size(); ++t) {
            const double p = std::exp(sc[t] - mx);
            sum += p;
            const int64_t vo = ((int64_t(b) * c.hkv + h / G) * c.skv + keys[t]) * c.d;
            for (int e = 0; e < c.d; ++e) acc[size_t(e)] += p * double(to_f(P.v[size_t(vo + e)], c.bf16));
          }
          const double ref_lse = sc.empty() ? -INFINITY : mx + std::log(sum);
          const float got_lse = lse[size_t((int64_t(b) * c.hq + h) * c.sq + qi)];
          const bool lse_ok = sc.empty() ? (std::isinf(got_lse) && got_lse < 0)
                                         : std::fabs(double(got_lse) - ref_lse) <= 2e-3 * (1 + std::fabs(ref_lse));
          if (!sc.empty()) max_lse_err = std::max(max_lse_err, std::fabs(double(got_lse) - ref_lse));
          bool row_ok = lse_ok;
          for (int e = 0; e < c.d; ++e) {
            const double ref = sc.empty() ? 0.0 : acc[size_t(e)] / sum;
            const float got = to_f(out[size_t(qo + e)], c.bf16);
            const double err = std::fabs(double(got) - ref);
            if (!(err <= 2e-2 * (1 + std::fabs(ref)))) row_ok = false;  // NaN fails too
            if (err == err) max_err = std::max(max_err, err);
          }
          if (!row_ok && fails < 5) {
            std::printf("%-34s FAIL: b=%d h=%d row %d (block %d, %zu keys): lse %g vs %g, O[0] %g vs %g\n",
                        c.name.c_str(), b, h, qi, i, sc.size(), double(got_lse), ref_lse,
                        double(to_f(out[size_t(qo)], c.bf16)), sc.empty() ? 0.0 : acc[0] / sum);
          }
          if (!row_ok) ++fails;
        }
      }
  std::printf("%-34s %s (max |O err| %.2e, max |lse err| %.2e, flops %.3g)\n", c.name.c_str(),
              fails ? "FAIL" : "ok", max_err, max_lse_err, P.flops);
  free_problem(P);
  return fails;
}

void time_case(const Case& c) {
  Problem P = make_problem(c, 7);
  const std::string why = hopper().why_not(P.args);
  if (!why.empty()) {
    std::printf("%-40s UNSUPPORTED: %s\n", c.name.c_str(), why.c_str());
    free_problem(P);
    return;
  }
  Options o;
  auto state = hopper().prepare(P.args, o);
  const std::vector<double> ms = timing::time_gpu([&](int) { hopper().run(P.args, o, state.get()); }, 5, 30, 1);
  SPARSEK_CHECK_CUDA(cudaGetLastError());
  const double med = timing::median(ms);
  std::printf("%-40s %8.3f ms  %7.1f eff TFLOPS  (min %.3f ms)\n", c.name.c_str(), med, P.flops / (med * 1e9),
              *std::min_element(ms.begin(), ms.end()));
  free_problem(P);
}

int timer_main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "check";
  const std::string filter = argc > 2 ? argv[2] : "";
  if (mode == "check") {
    std::vector<Case> cases;
    auto add = [&](const char* name, auto edit) {
      Case c;
      c.name = name;
      edit(c);
      cases.push_back(c);
    };
    add("d128 b128 bf16 50%", [](Case&) {});
    add("d128 b128 fp16 50%", [](Case& c) { c.bf16 = false; });
    add("d64 b128 bf16", [](Case& c) { c.d = 64; });
    add("d128 b64 bf16", [](Case& c) { c.block = 64; });
    add("d64 b64 fp16", [](Case& c) { c.d = 64; c.block = 64; c.bf16 = false; });
    add("dense layout", [](Case& c) { c.density = 1.0; });
    add("causal", [](Case& c) { c.causal = true; c.density = 0.7; c.sq = c.skv = 512; });
    add("causal + full blocks", [](Case& c) { c.causal = true; c.full = true; c.density = 1.0; c.sq = c.skv = 512; });
    add("full blocks, not causal", [](Case& c) { c.full = true; });
    add("tails sq=300 skv=200", [](Case& c) { c.sq = 300; c.skv = 200; c.density = 1.0; });
    add("tails causal sq=skv=333", [](Case& c) { c.sq = c.skv = 333; c.causal = true; c.density = 1.0; });
    add("tails b64 d64 sq=97 skv=150", [](Case& c) { c.sq = 97; c.skv = 150; c.block = 64; c.d = 64; });
    add("empty rows + kmax extra", [](Case& c) { c.empty_rows = true; c.kmax_extra = 3; c.sq = c.skv = 640; });
    add("GQA 4/2, layout per q head", [](Case& c) { c.hq = 4; c.hkv = 2; });
    add("GQA 8/2, layout per kv head", [](Case& c) { c.hq = 8; c.hkv = 2; c.layout_heads = 2; });
    add("MQA 4/1, broadcast layout", [](Case& c) { c.hq = 4; c.hkv = 1; c.layout_heads = 1; c.layout_batch = 1; c.b = 2; });
    add("batch 3, scale 0.3", [](Case& c) { c.b = 3; c.scale = 0.3f; });
    add("one query block, many items", [](Case& c) { c.hq = c.hkv = 40; c.b = 5; c.sq = 64; c.skv = 1024; c.density = 0.3; });
    add("long rows 4096 keys", [](Case& c) { c.sq = 256; c.skv = 4096; c.density = 1.0; c.hq = c.hkv = 1; });
    add("no keys at all (density 0)", [](Case& c) { c.density = 0.0; });
    int fails = 0;
    for (const Case& c : cases)
      if (filter.empty() || c.name.find(filter) != std::string::npos) fails += check(c, 11);
    std::printf("%d failure(s)\n", fails);
    return fails ? 1 : 0;
  }
  std::vector<Case> cases;
  auto add = [&](const char* name, auto edit) {
    Case c;
    c.name = name;
    c.b = 1, c.hq = c.hkv = 16, c.sq = c.skv = 16384, c.d = 128, c.density = 0.125;
    edit(c);
    cases.push_back(c);
  };
  add("fwd D128 12.5%", [](Case&) {});
  add("fwd D128 25%", [](Case& c) { c.density = 0.25; });
  add("fwd D128 6.25%", [](Case& c) { c.density = 0.0625; });
  add("fwd D128 3.125%", [](Case& c) { c.density = 0.03125; });
  add("fwd D128 dense layout", [](Case& c) { c.density = 1.0; });
  add("fwd D64 12.5%", [](Case& c) { c.d = 64; });
  add("fwd D128 causal top-k 12.5%", [](Case& c) { c.causal = true; c.density = 0.125 * 2; });
  add("fwd GQA 16/2 12.5%", [](Case& c) { c.hkv = 2; });
  add("fwd GQA 16/2 12.5% layout per kv head", [](Case& c) { c.hkv = 2; c.layout_heads = 2; });
  add("fwd D128 12.5% fp16", [](Case& c) { c.bf16 = false; });
  add("fwd D128 64x64 blocks 12.5%", [](Case& c) { c.block = 64; });
  for (const Case& c : cases)
    if (filter.empty() || c.name.find(filter) != std::string::npos) time_case(c);
  return 0;
}

int main(int argc, char** argv) {
  return bench::run_timer("attention_timer", [&] { return timer_main(argc, argv); });
}
