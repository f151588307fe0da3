// Paged decode attention on its target workload: 32 requests x 32k tokens of context, Hq 32 /
// Hkv 8, D 128, bf16, pages of 64 tokens in shuffled physical order, 12.5% of each KV head's pages
// selected (the newest always), 1 and 4 new tokens per request. For each: the time of run() (the
// split kernel and the combine, for each GPU variant: CUDA cores and mma.sync; median of timed runs, the stream held), the bytes of the selected
// K and V pages, the read floor = those bytes / the HBM read bandwidth that a streaming read kernel
// measures in this process (not the data-sheet peak), and the ratio. The same over the whole
// context (no selection) is printed beside it. Outputs are checked finite (correctness is the GPU
// tests' job: tests/gpu/test_decode.cpp). Then page selection at the same shape: select_pages()
// (against the read floor of the page summaries) and update_page_summaries(), each over the decode's
// time on the selection select_pages() made.
//   cmake --build build --target decode_timer && build/decode_timer [requests] [context]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "sparsek/decode.hpp"
#include "read_floor.hpp"
#include "timer.cuh"

using namespace sparsek;

namespace {

double median_us(const std::function<void(int)>& call) {
  return 1000.0 * timing::median(timing::time_gpu(call, 5, 50, 1));
}

template <class T>
T* dev_alloc(size_t n) {
  T* p = nullptr;
  SPARSEK_CHECK_CUDA(cudaMalloc(&p, n * sizeof(T)));
  return p;
}

int timer_main(int argc, char** argv) {
  const int B = argc > 1 ? std::atoi(argv[1]) : 32;
  const int context = argc > 2 ? std::atoi(argv[2]) : 32768;
  const int Hq = 32, Hkv = 8, D = 128, ps = 64;
  const double frac = 0.125;
  cudaDeviceProp prop{};
  SPARSEK_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  std::printf("%s, %d SMs; decode: %d requests x %d tokens, Hq %d / Hkv %d, D %d, bf16, page %d\n", prop.name, sms, B,
              context, Hq, Hkv, D, ps);

  // The HBM read bandwidth: 1 GB read once (20x the L2), best of a few launches (the read kernel
  // `sparsek bench --op decode` uses: read_floor.hpp).
  const size_t rbytes = size_t(1) << 30;
  const double bw = double(rbytes) / (timing::read_floor(rbytes, 5, 50).us * 1e-6);  // bytes / s
  std::printf("HBM read bandwidth (measured, 1 GB streaming read): %.2f TB/s\n", bw / 1e12);

  // The cache: every request's pages, shuffled over the physical pages.
  const int pages_per = (context + ps - 1) / ps, max_pages = pages_per, pages = B * pages_per;
  const size_t cache_elems = size_t(pages) * ps * Hkv * D;
  void* k = dev_alloc<uint16_t>(cache_elems);
  void* v = dev_alloc<uint16_t>(cache_elems);
  bench::fill_uniform(k, DType::bf16, int64_t(cache_elems), 1);
  bench::fill_uniform(v, DType::bf16, int64_t(cache_elems), 2);
  std::mt19937_64 rng(7);
  std::vector<int32_t> perm(static_cast<size_t>(pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> seq(static_cast<size_t>(B), context);
  // Selection: kmax = 12.5% of the pages; the newest page and kmax - 1 others, sorted.
  const int kmax = std::max(1, int(std::lround(frac * pages_per)));
  std::vector<int32_t> sel(size_t(B) * Hkv * kmax), cnt(size_t(B) * Hkv, kmax);
  for (int r = 0; r < B * Hkv; ++r) {
    std::vector<int32_t> all(static_cast<size_t>(pages_per - 1));
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    all.resize(size_t(kmax - 1));
    all.push_back(pages_per - 1);
    std::sort(all.begin(), all.end());
    std::copy(all.begin(), all.end(), sel.begin() + size_t(r) * kmax);
  }
  auto upload = [](const std::vector<int32_t>& h) {
    int32_t* d = dev_alloc<int32_t>(h.size());
    SPARSEK_CHECK_CUDA(cudaMemcpy(d, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
    return d;
  };
  int32_t *d_pt = upload(perm), *d_seq = upload(seq), *d_sel = upload(sel), *d_cnt = upload(cnt);

  for (int n : {1, 4}) {
    const int T = B * n;
    std::vector<int32_t> cu(size_t(B) + 1);
    for (int b = 0; b <= B; ++b) cu[size_t(b)] = b * n;
    int32_t* d_cu = upload(cu);
    void* q = dev_alloc<uint16_t>(size_t(T) * Hq * D);
    void* o = dev_alloc<uint16_t>(size_t(T) * Hq * D);
    float* lse = dev_alloc<float>(size_t(T) * Hq);
    bench::fill_uniform(q, DType::bf16, int64_t(T) * Hq * D, 3);
    DecodeArgs a;
    a.q = TokensView::packed(q, DType::bf16, Memory::device, T, Hq, D);
    a.o = TokensView::packed(o, DType::bf16, Memory::device, T, Hq, D);
    a.k = PagedCacheView::packed(k, DType::bf16, Memory::device, pages, ps, Hkv, D);
    a.v = PagedCacheView::packed(v, DType::bf16, Memory::device, pages, ps, Hkv, D);
    a.lse = lse;
    a.page_table = d_pt, a.seq_lens = d_seq, a.cu_seqlens_q = d_cu;
    a.batch = B, a.max_pages = max_pages;
    a.index_memory = Memory::device;
    for (bool selected : {true, false}) {
      DecodeArgs x = a;
      if (selected) x.sel_indices = d_sel, x.sel_counts = d_cnt, x.sel_kmax = kmax;
      validate(x, true);
      std::vector<uint16_t> first_o;  // the first variant's O, to compare the second's with
      for (const char* variant : {"cuda", "cuda_mma"}) {
        Options opt;
        opt.variant = variant;
        const DecodePlan p = plan(x, opt);
        const double us = median_us([&](int) { run(p, x); });
        // Finite outputs (every row sees keys here).
        std::vector<float> l(size_t(T) * Hq);
        SPARSEK_CHECK_CUDA(cudaMemcpy(l.data(), lse, l.size() * 4, cudaMemcpyDeviceToHost));
        const bool finite = std::all_of(l.begin(), l.end(), [](float f) { return std::isfinite(f); });
        std::vector<uint16_t> ob(size_t(T) * Hq * D);
        SPARSEK_CHECK_CUDA(cudaMemcpy(ob.data(), o, ob.size() * 2, cudaMemcpyDeviceToHost));
        double diff = 0;  // max |O - the first variant's O|
        if (first_o.empty()) first_o = ob;
        for (size_t i = 0; i < ob.size(); ++i)
          diff = std::max(diff, double(std::fabs(bench::to_f(ob[i], true) - bench::to_f(first_o[i], true))));
        const double kv_bytes =
            double(B) * Hkv * (selected ? kmax : pages_per) * ps * D * 2.0 /*bytes*/ * 2.0 /*K and V*/;
        const double floor_us = kv_bytes / bw * 1e6;
        std::printf("%-8s new tokens %d, %s: %.1f us; K/V read %.1f MB, read floor %.1f us; ratio %.2fx; %d KV "
                    "chunks, workspace %.1f MB; LSE %s; max |O - cuda's O| %.3g\n",
                    variant, n, selected ? "12.5% of pages selected" : "whole context (no selection)", us,
                    kv_bytes / 1e6, floor_us, us / floor_us, p.kv_splits(), p.workspace_bytes() / 1e6,
                    finite ? "finite" : "NOT FINITE", diff);
      }
    }
    {
      // Page selection at this shape: every page's summary once, then per step the update of the
      // new tokens' pages and the selection (sink 1, local 1, top-k: kmax pages in all), timed apart
      // and against the decode that reads the selection it makes.
      void* sums = dev_alloc<uint16_t>(size_t(pages) * Hkv * 2 * D);
      int32_t* g_sel = dev_alloc<int32_t>(size_t(B) * Hkv * kmax);
      int32_t* g_cnt = dev_alloc<int32_t>(size_t(B) * Hkv);
      PageSelectArgs sa;
      sa.q = a.q, sa.k = a.k, sa.summaries = sums;
      sa.page_table = d_pt, sa.seq_lens = d_seq, sa.cu_seqlens_q = d_cu;
      sa.batch = B, sa.max_pages = max_pages, sa.index_memory = Memory::device;
      sa.sel_indices = g_sel, sa.sel_counts = g_cnt, sa.sel_kmax = kmax;
      sa.sink = 1, sa.local = 1, sa.topk = std::max(0, kmax - 2);
      sa.all_pages = true;
      update_page_summaries(sa);
      sa.all_pages = false;
      Options unchecked;
      unchecked.check_indices = false;
      const double upd_us = median_us([&](int) { update_page_summaries(sa, unchecked); });
      const double sel_us = median_us([&](int) { select_pages(sa, unchecked); });
      DecodeArgs x = a;
      x.sel_indices = g_sel, x.sel_counts = g_cnt, x.sel_kmax = kmax;
      validate(x, true);  // the GPU's selection is a valid one
      Options mma;
      mma.variant = "cuda_mma";
      const DecodePlan p = plan(x, mma);
      const double dec_us = median_us([&](int) { run(p, x); });
      const double sum_bytes = double(B) * Hkv * pages_per * 2.0 * D * 2.0;
      std::printf("page selection, new tokens %d: select %.1f us (summaries %.1f MB, read floor %.1f us; %.2fx), "
                  "update %.1f us; decode (cuda_mma) on that selection %.1f us; select / decode %.3f, "
                  "(select + update) / decode %.3f\n",
                  n, sel_us, sum_bytes / 1e6, sum_bytes / bw * 1e6, sel_us / (sum_bytes / bw * 1e6), upd_us, dec_us,
                  sel_us / dec_us, (sel_us + upd_us) / dec_us);
      for (void* ptr : {sums, (void*)g_sel, (void*)g_cnt}) SPARSEK_CHECK_CUDA(cudaFree(ptr));
    }
    SPARSEK_CHECK_CUDA(cudaFree(q));
    SPARSEK_CHECK_CUDA(cudaFree(o));
    SPARSEK_CHECK_CUDA(cudaFree(lse));
    SPARSEK_CHECK_CUDA(cudaFree(d_cu));
  }
  for (void* ptr : {k, v, (void*)d_pt, (void*)d_seq, (void*)d_sel, (void*)d_cnt})
    SPARSEK_CHECK_CUDA(cudaFree(ptr));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return bench::run_timer("decode_timer", [&] { return timer_main(argc, argv); });
}
