// `sparsek_distributed_bench --op attention`: context-parallel attention (plan_distributed_attention)
// on 1, 2 and 4 ranks against attention() + attention_backward() of the whole sequence on one GPU,
// in the same process on the same inputs:
//   B = 1, Hq = Hkv = 16, D = 128, bf16, 128x128 blocks, causal top-k 12.5% (causal_topk.hpp),
//   S = 262144 unless --s says otherwise.
//   build/sparsek_distributed_bench --op attention [--s S --heads H --reps R]
// A rank count runs over NCCL, one rank per GPU, when as many GPUs answer. Otherwise its ranks all
// run on GPU 0 in this process (transfers as device copies, every rank's work on one stream, one
// after another): that row shows what the split adds to the work (two calls instead of one, the
// merge, packing and the dk/dv sums), not a speed-up, and says so.
// Per rank count: plan, one warm-up forward and backward (they plan the ranks' local calls), then R
// timed forwards and R timed backwards; a run's time is the slowest rank's (CUDA events on each
// rank's stream), the median is printed. The last rank's o is compared with the whole problem's
// (bit-identical expected with one rank); the K/V bytes each rank receives are printed beside ring
// attention's, and the most memory a rank holds (its shards and its plan's buffers; the one-GPU row:
// the whole problem's tensors). The attention calls' own workspaces are not counted.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "causal_topk.hpp"
#include "core/nccl.hpp"
#include "sparsek/distributed.hpp"
#include "timing.hpp"

using namespace sparsek;

int distributed_attention_main(int argc, char** argv);

namespace {

struct Opts {
  int64_t s = 262144, heads = 16;
  int reps = 5;
};

// A [1, H, S, D] bf16 device tensor on device `dev`.
struct DevTensor {
  int dev = 0;
  void* p = nullptr;
  size_t bytes = 0;
  DevTensor(int d, size_t n) : dev(d), bytes(n) {
    SPARSEK_CHECK_CUDA(cudaSetDevice(d));
    SPARSEK_CHECK_CUDA(cudaMalloc(&p, std::max<size_t>(n, 16)));
    SPARSEK_CHECK_CUDA(cudaMemset(p, 0xFF, n));  // poison
  }
  ~DevTensor() {
    cudaSetDevice(dev);
    cudaFree(p);
  }
  DevTensor(const DevTensor&) = delete;
  DevTensor& operator=(const DevTensor&) = delete;
};

// Rows [r0, r1) of every head of a whole [1, H, S, D] tensor into a packed shard (any device).
void copy_rows(const DevTensor& whole, int64_t s, int64_t h, int64_t d, int64_t r0, int64_t r1, DevTensor& shard) {
  if (r1 == r0) return;
  const size_t row = size_t(d) * 2;
  SPARSEK_CHECK_CUDA(cudaMemcpy2D(shard.p, size_t(r1 - r0) * row, static_cast<char*>(whole.p) + size_t(r0) * row, size_t(s) * row,
                                  size_t(r1 - r0) * row, size_t(h), cudaMemcpyDefault));
}

float bf16(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

int distributed_attention_main(int argc, char** argv) {
  Opts o;
  for (int i = 0; i + 1 < argc; i += 2) {
    const std::string f = argv[i], v = argv[i + 1];
    if (f == "--s") o.s = std::atoll(v.c_str());
    else if (f == "--heads") o.heads = std::atoll(v.c_str());
    else if (f == "--reps") o.reps = std::max(1, std::atoi(v.c_str()));
    else {
      std::fprintf(stderr, "unknown flag '%s' (flags of --op attention: --s --heads --reps)\n", f.c_str());
      return 2;
    }
  }
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus < 1) {
    std::printf("no GPU answers: nothing to time\n");
    return 0;
  }
  try {
    const int64_t S = o.s, H = o.heads, D = 128, nb = (S + 127) / 128;
    const size_t tbytes = size_t(H * S * D) * 2;
    const bench::CausalTopk l = bench::causal_topk(H, nb, 0.125, uint64_t(S));
    cudaDeviceProp prop{};
    SPARSEK_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    std::printf("context-parallel attention: %s x%d; B = 1, Hq = Hkv = %lld, S = %lld, D = 128, bf16, 128x128 blocks, "
                "causal top-k 12.5%%; median of %d\n",
                prop.name, gpus, (long long)H, (long long)S, o.reps);
    // The whole problem on GPU 0: inputs random, outputs poisoned.
    SPARSEK_CHECK_CUDA(cudaSetDevice(0));
    DevTensor q(0, tbytes), k(0, tbytes), v(0, tbytes), out(0, tbytes), dout(0, tbytes), dq(0, tbytes), dk(0, tbytes),
        dv(0, tbytes), lse(0, size_t(H * S) * 4);
    {
      std::vector<uint16_t> h(size_t(H * S * D));
      uint32_t x = 2024;
      for (DevTensor* t : {&q, &k, &v, &dout}) {
        for (auto& e : h) {
          x = x * 1664525u + 1013904223u;
          e = uint16_t(0x3c00 + ((x >> 13) & 0x3ff)) ^ uint16_t((x >> 7) & 0x8000);  // bf16 in +-[0.0078, 0.0156)
        }
        SPARSEK_CHECK_CUDA(cudaMemcpy(t->p, h.data(), tbytes, cudaMemcpyHostToDevice));
      }
    }
    auto view = [&](const DevTensor& t, int64_t rows) {
      return Tensor4View::packed(t.p, DType::bf16, Memory::device, 1, H, rows, D);
    };
    AttentionArgs whole;
    whole.q = view(q, S), whole.k = view(k, S), whole.v = view(v, S), whole.o = view(out, S);
    whole.lse = static_cast<float*>(lse.p), whole.causal = true;
    DevTensor dnum(0, l.num.size() * 4), didx(0, l.idx.size() * 4);
    SPARSEK_CHECK_CUDA(cudaMemcpy(dnum.p, l.num.data(), dnum.bytes, cudaMemcpyHostToDevice));
    SPARSEK_CHECK_CUDA(cudaMemcpy(didx.p, l.idx.data(), didx.bytes, cudaMemcpyHostToDevice));
    whole.layout = l.view;
    whole.layout.kv_num_blocks = static_cast<const int32_t*>(dnum.p), whole.layout.kv_indices = static_cast<const int32_t*>(didx.p);
    whole.layout.memory = Memory::device;
    AttentionBackwardArgs wb;
    wb.forward = whole, wb.dout = view(dout, S), wb.dq = view(dq, S), wb.dk = view(dk, S), wb.dv = view(dv, S);
    cudaStream_t s0 = nullptr;
    SPARSEK_CHECK_CUDA(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
    const AttentionPlan pf = plan(whole);
    const AttentionBackwardPlan pb = plan(wb);
    const double t1f = timing::median(timing::time_gpu([&](int) { run(pf, whole, s0); }, 1, o.reps, 1, 1, s0));
    const double t1b = timing::median(timing::time_gpu([&](int) { run(pb, wb, s0); }, 1, o.reps, 1, 1, s0));
    std::printf("%-26s %5s %10s %10s %10s %8s %15s %12s %12s %12s\n", "", "ranks", "fwd ms", "bwd ms", "step ms", "speedup",
                "last rank o", "recv MB max", "ring MB max", "mem GB max");
    std::printf("%-26s %5d %10.3f %10.3f %10.3f %8s %15s %12s %12s %12.1f\n", "attention (one GPU)", 1, t1f, t1b, t1f + t1b,
                "1.00", "-", "-", "-", double(9 * tbytes + size_t(H * S) * 4) / 1e9);
    std::vector<uint16_t> want(tbytes / 2);
    SPARSEK_CHECK_CUDA(cudaMemcpy(want.data(), out.p, tbytes, cudaMemcpyDeviceToHost));
    whole.layout = l.view;  // the distributed plan reads the layout on the host

    for (int n : {1, 2, 4}) {
      const bool nccl_mode = n <= gpus;
      std::vector<ncclComm*> comms;
      std::vector<DistributedAttentionPlan> plans;
      if (nccl_mode) {
        const nccl::Api& api = nccl::api();
        comms.assign(size_t(n), nullptr);
        std::vector<int> devs(static_cast<size_t>(n));
        for (int i = 0; i < n; ++i) devs[size_t(i)] = i;
        nccl::check(api.CommInitAll(comms.data(), n, devs.data()), "ncclCommInitAll");
        plans = plan_distributed_attention(whole, comms);
      } else {
        plans = plan_distributed_attention(whole, n);
      }
      {
        std::vector<std::unique_ptr<DevTensor>> t;  // per rank: q k v o lse dout dq dk dv
        std::vector<AttentionArgs> fa;
        std::vector<AttentionBackwardArgs> ba;
        std::vector<void*> streams;
        std::vector<cudaEvent_t> start(static_cast<size_t>(n)), stop(static_cast<size_t>(n));
        double recv_max = 0, ring_max = 0, mem_max = 0;
        for (int r = 0; r < n; ++r) {
          const int dev = nccl_mode ? r : 0;
          const auto& p = plans[size_t(r)];
          const int64_t q0 = p.q_row_begin(), q1 = p.q_row_end(), k0 = p.kv_row_begin(), k1 = p.kv_row_end();
          recv_max = std::max(recv_max, p.recv_bytes()), ring_max = std::max(ring_max, p.ring_bytes());
          const size_t qb = size_t(H * (q1 - q0) * D) * 2, kb = size_t(H * (k1 - k0) * D) * 2;
          // This rank's memory: its shards (q k v o dout dq dk dv, lse) and the plan's buffers.
          mem_max = std::max(mem_max, double(5 * qb + 4 * kb + size_t(H * (q1 - q0)) * 4 + p.workspace_bytes()));
          for (size_t b : {qb, kb, kb, qb, size_t(H * (q1 - q0)) * 4, qb, qb, kb, kb}) t.push_back(std::make_unique<DevTensor>(dev, b));
          const size_t b = size_t(r) * 9;
          copy_rows(q, S, H, D, q0, q1, *t[b]), copy_rows(k, S, H, D, k0, k1, *t[b + 1]);
          copy_rows(v, S, H, D, k0, k1, *t[b + 2]), copy_rows(dout, S, H, D, q0, q1, *t[b + 5]);
          AttentionArgs a;
          a.q = view(*t[b], q1 - q0), a.k = view(*t[b + 1], k1 - k0), a.v = view(*t[b + 2], k1 - k0);
          a.o = view(*t[b + 3], q1 - q0), a.lse = static_cast<float*>(t[b + 4]->p);
          fa.push_back(a);
          AttentionBackwardArgs g;
          g.forward = a, g.dout = view(*t[b + 5], q1 - q0), g.dq = view(*t[b + 6], q1 - q0);
          g.dk = view(*t[b + 7], k1 - k0), g.dv = view(*t[b + 8], k1 - k0);
          ba.push_back(g);
          SPARSEK_CHECK_CUDA(cudaSetDevice(dev));
          cudaStream_t st = s0;  // in this process: every rank on one stream
          if (nccl_mode) SPARSEK_CHECK_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
          streams.push_back(st);
          SPARSEK_CHECK_CUDA(cudaEventCreate(&start[size_t(r)]));
          SPARSEK_CHECK_CUDA(cudaEventCreate(&stop[size_t(r)]));
        }
        auto timed = [&](auto&& f) {
          std::vector<double> ms;
          for (int rep = 0; rep < o.reps; ++rep) {
            for (int r = 0; r < n; ++r) {
              SPARSEK_CHECK_CUDA(cudaSetDevice(nccl_mode ? r : 0));
              SPARSEK_CHECK_CUDA(cudaEventRecord(start[size_t(r)], static_cast<cudaStream_t>(streams[size_t(r)])));
            }
            f();
            double worst = 0;
            for (int r = 0; r < n; ++r) {
              SPARSEK_CHECK_CUDA(cudaSetDevice(nccl_mode ? r : 0));
              SPARSEK_CHECK_CUDA(cudaEventRecord(stop[size_t(r)], static_cast<cudaStream_t>(streams[size_t(r)])));
              SPARSEK_CHECK_CUDA(cudaEventSynchronize(stop[size_t(r)]));
              float e = 0;
              SPARSEK_CHECK_CUDA(cudaEventElapsedTime(&e, start[size_t(r)], stop[size_t(r)]));
              worst = std::max(worst, double(e));
            }
            ms.push_back(worst);
          }
          SPARSEK_CHECK_CUDA(cudaSetDevice(0));
          return timing::median(ms);
        };
        run(plans, fa, streams);  // warm-up: plans the ranks' local calls
        run_backward(plans, ba, streams);
        const double tf = timed([&] { run(plans, fa, streams); });
        const double tb = timed([&] { run_backward(plans, ba, streams); });
        // The last rank's o (under causal it merges both parts) against the whole problem's rows.
        const auto& pl = plans.back();
        const int64_t rows = pl.q_row_end() - pl.q_row_begin();
        std::vector<uint16_t> got(size_t(H * rows * D));
        SPARSEK_CHECK_CUDA(cudaSetDevice(nccl_mode ? n - 1 : 0));
        SPARSEK_CHECK_CUDA(cudaMemcpy(got.data(), t[size_t(n - 1) * 9 + 3]->p, got.size() * 2, cudaMemcpyDeviceToHost));
        SPARSEK_CHECK_CUDA(cudaSetDevice(0));
        double diff = 0;
        bool same = true;
        for (int64_t h = 0; h < H; ++h)
          for (int64_t e = 0; e < rows * D; ++e) {
            const uint16_t a = got[size_t(h * rows * D + e)], b = want[size_t((h * S + pl.q_row_begin()) * D + e)];
            same = same && a == b;
            diff = std::max(diff, double(std::fabs(bf16(a) - bf16(b))));
          }
        char cmp[32];
        if (same) std::snprintf(cmp, sizeof cmp, "bit-identical");
        else std::snprintf(cmp, sizeof cmp, "max |d| %.1e", diff);
        const std::string label = nccl_mode ? "NCCL, one rank per GPU" : "one GPU, ranks serial";
        char speedup[16] = "-";
        if (nccl_mode) std::snprintf(speedup, sizeof speedup, "%.2f", (t1f + t1b) / (tf + tb));
        std::printf("%-26s %5d %10.3f %10.3f %10.3f %8s %15s %12.1f %12.1f %12.1f\n", label.c_str(), n, tf, tb, tf + tb, speedup,
                    cmp, recv_max / 1e6, ring_max / 1e6, mem_max / 1e9);
        std::fflush(stdout);
        for (int r = 0; r < n; ++r) {
          cudaSetDevice(nccl_mode ? r : 0);
          cudaEventDestroy(start[size_t(r)]), cudaEventDestroy(stop[size_t(r)]);
          if (nccl_mode) cudaStreamDestroy(static_cast<cudaStream_t>(streams[size_t(r)]));
        }
        cudaSetDevice(0);
      }
      plans.clear();
      for (ncclComm* c : comms) nccl::api().CommDestroy(c);
      // (NCCL may leave another device current; the next row's in-process plans are made on the
      // current device, which must be the one of the shards and the stream: GPU 0.)
      SPARSEK_CHECK_CUDA(cudaSetDevice(0));
    }
    std::printf("(speedup: the one-GPU attention's step time over this one; rows run serially on one GPU show the "
                "split's added work instead, no speed-up)\n");
    cudaStreamDestroy(s0);
  } catch (const Error& e) {
    std::fprintf(stderr, "sparsek error (%s): %s\n", to_string(e.status()), e.what());
    return 1;
  }
  return 0;
}
