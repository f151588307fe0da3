// `--op attention` is context-parallel attention (distributed_attention.cpp); otherwise (or with
// `--op dsd`):
// The distributed DSD on 1, 2, 4 ranks (one process, one rank per visible GPU, communicators from
// ncclCommInitAll through the library's NCCL loader), on the same problem for every rank count:
//   A 65536 x 8192 in 128x128 blocks, 12.5% stored (uniform rows, and power-law rows of the same
//   nnzb), B 8192 x 8192, C 65536 x 8192, fp16 in and out.
//   build/sparsek_distributed_bench [--op dsd] [--m M --k K --n N --block BM --density D --reps R]
// Per rank count: plan once, 3 warm-up runs, then R timed runs. A run's time is the slowest rank's
// (CUDA events on each rank's stream around the run); the median is reported as effective TFLOPS
// (2 * nnzb * bm * bk * N / time), the speed-up over one rank and the scaling efficiency
// (speed-up / ranks). The product is timed without the all-gather; a second plan with the
// all-gather gives its cost separately (time with it minus time without). Rank 0's rows of C are
// checked against the one-rank result (bit for bit: row splitting is not turned off here, so a
// mismatch is reported, not fatal).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "sparsek/distributed.hpp"
#include "timing.hpp"
#include "tools_internal.hpp"

using namespace sparsek;

namespace {

struct Args {
  int64_t m = 65536, k = 8192, n = 8192;
  int block = 128;
  double density = 0.125;
  int reps = 20;
};

// One rank's operands on its device (A's values and B random, C poisoned).
struct RankData {
  int device = 0;
  void *rp = nullptr, *ci = nullptr, *val = nullptr, *b = nullptr, *c = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  GemmArgs g;
  RankData(int dev, const BsrMatrix& a, const std::vector<uint16_t>& hb, int64_t n) : device(dev) {
    SPARSEK_CHECK_CUDA(cudaSetDevice(dev));
    auto up = [](void** d, const void* h, size_t bytes) {
      SPARSEK_CHECK_CUDA(cudaMalloc(d, std::max<size_t>(bytes, 16)));
      if (bytes) SPARSEK_CHECK_CUDA(cudaMemcpy(*d, h, bytes, cudaMemcpyHostToDevice));
    };
    up(&rp, a.row_ptr().data(), a.row_ptr().size() * 4);
    up(&ci, a.col_idx().data(), a.col_idx().size() * 4);
    up(&val, a.value_bytes().data(), a.value_bytes().size());
    up(&b, hb.data(), hb.size() * 2);
    SPARSEK_CHECK_CUDA(cudaMalloc(&c, size_t(a.rows()) * n * 2));
    SPARSEK_CHECK_CUDA(cudaMemset(c, 0xff, size_t(a.rows()) * n * 2));
    SPARSEK_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    SPARSEK_CHECK_CUDA(cudaEventCreate(&start));
    SPARSEK_CHECK_CUDA(cudaEventCreate(&stop));
    g.kind = OpKind::dsd;
    g.sparse = a.view();
    g.sparse.row_ptr = static_cast<const int32_t*>(rp);
    g.sparse.col_idx = static_cast<const int32_t*>(ci);
    g.sparse.values = val;
    g.sparse.memory = Memory::device;
    g.b = DenseView{b, a.cols(), n, n, Layout::row_major, DType::f16, Memory::device};
    g.c = DenseView{c, a.rows(), n, n, Layout::row_major, DType::f16, Memory::device};
  }
  ~RankData() {
    cudaSetDevice(device);
    for (void* p : {rp, ci, val, b, c}) cudaFree(p);
    cudaStreamDestroy(stream);
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
};

// Median over reps of the slowest rank's time of one run(plans), in ms (events on every rank's
// stream, which time_gpu(), one stream's timing, does not do).
double time_runs(const std::vector<DistributedPlan>& plans, std::vector<std::unique_ptr<RankData>>& ranks, int reps) {
  std::vector<GemmArgs> args;
  std::vector<void*> streams;
  for (auto& r : ranks) {
    args.push_back(r->g);
    streams.push_back(r->stream);
  }
  for (int i = 0; i < 3; ++i) run(plans, args, streams);
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    for (auto& r : ranks) {
      SPARSEK_CHECK_CUDA(cudaSetDevice(r->device));
      SPARSEK_CHECK_CUDA(cudaEventRecord(r->start, r->stream));
    }
    run(plans, args, streams);
    double slowest = 0;
    for (auto& r : ranks) {
      SPARSEK_CHECK_CUDA(cudaSetDevice(r->device));
      SPARSEK_CHECK_CUDA(cudaEventRecord(r->stop, r->stream));
    }
    for (auto& r : ranks) {
      SPARSEK_CHECK_CUDA(cudaSetDevice(r->device));
      SPARSEK_CHECK_CUDA(cudaEventSynchronize(r->stop));
      float ms = 0;
      SPARSEK_CHECK_CUDA(cudaEventElapsedTime(&ms, r->start, r->stop));
      slowest = std::max(slowest, double(ms));
    }
    t.push_back(slowest);
  }
  return timing::median(t);
}

std::vector<uint8_t> rank0_rows(const RankData& r, const DistributedPlan& p, int64_t n, int bm) {
  std::vector<uint8_t> h(size_t((p.row_end() - p.row_begin()) * bm * n * 2));
  SPARSEK_CHECK_CUDA(cudaSetDevice(r.device));
  const char* rows = static_cast<char*>(r.c) + p.row_begin() * bm * n * 2;
  SPARSEK_CHECK_CUDA(cudaMemcpy(h.data(), rows, h.size(), cudaMemcpyDeviceToHost));
  return h;
}

}  // namespace

int distributed_attention_main(int argc, char** argv);

int main(int argc, char** argv) {
  int first = 1;
  if (argc >= 3 && std::string(argv[1]) == "--op") {
    const std::string op = argv[2];
    if (op == "attention") return distributed_attention_main(argc - 3, argv + 3);
    if (op != "dsd") {
      std::fprintf(stderr, "unknown --op '%s' (dsd or attention)\n", op.c_str());
      return 2;
    }
    first = 3;
  }
  Args a;
  for (int i = first; i + 1 < argc; i += 2) {
    std::string f = argv[i], v = argv[i + 1];
    if (f == "--m") a.m = std::atoll(v.c_str());
    else if (f == "--k") a.k = std::atoll(v.c_str());
    else if (f == "--n") a.n = std::atoll(v.c_str());
    else if (f == "--block") a.block = std::atoi(v.c_str());
    else if (f == "--density") a.density = std::atof(v.c_str());
    else if (f == "--reps") a.reps = std::max(1, std::atoi(v.c_str()));
    else {
      std::fprintf(stderr, "unknown flag '%s' (flags: --m --k --n --block --density --reps)\n", f.c_str());
      return 2;
    }
  }
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus < 1) {
    std::printf("no GPU answers: nothing to time\n");
    return 0;
  }
  try {
    const nccl::Api& api = nccl::api();
    std::printf("NCCL %d (%s), %d GPU(s); A %lldx%lld in %dx%d blocks, %.2f%% stored, B %lldx%lld, fp16\n", api.version,
                api.library.c_str(), gpus, (long long)a.m, (long long)a.k, a.block, a.block, 100 * a.density,
                (long long)a.k, (long long)a.n);
    std::vector<uint16_t> hb(size_t(a.k * a.n));
    uint32_t s = 12345;
    for (auto& x : hb) {
      s = s * 1664525u + 1013904223u;
      x = float_to_half(float(int((s >> 9) % 17) - 8) / 8.f).bits;
    }
    std::printf("%-10s %5s %10s %9s %8s %10s %14s %s\n", "rows", "ranks", "time ms", "TFLOPS", "speedup", "efficiency",
                "all-gather ms", "rank 0 rows vs 1 rank");
    for (PatternKind kind : {PatternKind::fixed_k, PatternKind::power_law}) {
      BsrMatrix A = random_bsr(kind, a.m, a.k, a.block, a.block, a.density, DType::f16, 7);
      const double flops = 2.0 * A.nnzb() * a.block * a.block * a.n;
      double t1 = 0;
      std::vector<uint8_t> one;
      for (int n : {1, 2, 4}) {
        if (n > gpus) break;
        std::vector<ncclComm*> comms(size_t(n), nullptr);
        std::vector<int> devs(static_cast<size_t>(n));
        for (int i = 0; i < n; ++i) devs[size_t(i)] = i;
        nccl::check(api.CommInitAll(comms.data(), n, devs.data()), "ncclCommInitAll");
        {
          std::vector<std::unique_ptr<RankData>> ranks;
          std::vector<GemmArgs> args;
          for (int i = 0; i < n; ++i) {
            ranks.push_back(std::make_unique<RankData>(i, A, hb, a.n));
            args.push_back(ranks.back()->g);
          }
          SPARSEK_CHECK_CUDA(cudaSetDevice(0));
          DistributedOptions plain, gather;
          gather.all_gather = true;
          std::vector<DistributedPlan> p = plan_distributed(args, comms, plain);
          std::vector<DistributedPlan> pg = plan_distributed(args, comms, gather);
          const double t = time_runs(p, ranks, a.reps);
          std::vector<uint8_t> rows = rank0_rows(*ranks[0], p[0], a.n, a.block);
          const double tg = time_runs(pg, ranks, a.reps);
          if (n == 1) {
            t1 = t;
            one = rank0_rows(*ranks[0], p[0], a.n, a.block);
          }
          const bool same = rows.size() <= one.size() && std::memcmp(rows.data(), one.data(), rows.size()) == 0;
          char gather_text[32];
          std::snprintf(gather_text, sizeof gather_text, "%.3f", n > 1 ? tg - t : 0.0);
          std::printf("%-10s %5d %10.3f %9.1f %8.2f %9.1f%% %14s %s\n", to_string(kind), n, t, flops / t / 1e9,
                      t1 / t, 100 * t1 / t / n, gather_text, same ? "bit-identical" : "DIFFERENT");
          std::fflush(stdout);
        }
        for (ncclComm* c : comms) api.CommDestroy(c);
      }
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "sparsek error (%s): %s\n", to_string(e.status()), e.what());
    return 1;
  }
  return 0;
}
