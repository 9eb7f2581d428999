// NcclCore on GPUs, without LibTorch: all-reduce and broadcast on raw device buffers, ordering
// after a producer stream and before a consumer stream (at world size 1 too, with an
// out-of-place all-reduce behind a slow producer, and controls showing that a missing wait gives
// wrong numbers), argument errors. Needs one GPU per
// rank; built everywhere the core builds (compile-and-link proof), registered only for GPU runs.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "mllm/core/error.h"
#include "mllm/distributed/nccl/nccl_core.h"

using mllm::nccl::DataType;
using mllm::nccl::NcclCore;
using mllm::nccl::RedOp;

namespace {

int g_rank = 0, g_world = 1;
NcclCore* g_core = nullptr;

template <typename T>
T* device_copy(const std::vector<T>& host, cudaStream_t s = nullptr) {
  T* d = nullptr;
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), host.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, s),
            cudaSuccess);
  return d;
}

template <typename T>
std::vector<T> host_copy(const T* d, size_t n) {
  std::vector<T> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

}  // namespace

TEST(NcclCore, WorldMatchesLauncher) {
  const char* want = std::getenv("MLLM_TEST_WORLD_SIZE");
  ASSERT_TRUE(want) << "run through ctest (mpirun)";
  EXPECT_EQ(g_world, std::atoi(want));
  EXPECT_EQ(g_core->world_size(), g_world);
  EXPECT_EQ(g_core->rank(), g_rank);
}

TEST(NcclCore, AllReduceOps) {
  const int n = g_world, r = g_rank;
  std::vector<float> v = {static_cast<float>(r + 1), -1.0f * r, 0.5f};
  float* d = device_copy(v);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  g_core->all_reduce(d, 3, DataType::kFloat32, RedOp::kSum, nullptr)->synchronize(60, "sum");
  auto h = host_copy(d, 3);
  EXPECT_EQ(h[0], n * (n + 1) / 2.0f);
  EXPECT_EQ(h[1], -n * (n - 1) / 2.0f);
  EXPECT_EQ(h[2], 0.5f * n);
  cudaFree(d);

  std::vector<double> a = {static_cast<double>(r)};
  double* da = device_copy(a);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  g_core->all_reduce(da, 1, DataType::kFloat64, RedOp::kAvg, nullptr)->synchronize(60, "avg");
  EXPECT_DOUBLE_EQ(host_copy(da, 1)[0], (n - 1) / 2.0);
  cudaFree(da);

  std::vector<int64_t> m = {static_cast<int64_t>(r), -static_cast<int64_t>(r)};
  int64_t* dm = device_copy(m);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  g_core->all_reduce(dm, 2, DataType::kInt64, RedOp::kMax, nullptr)->synchronize(60, "max");
  auto hm = host_copy(dm, 2);
  EXPECT_EQ(hm[0], n - 1);
  EXPECT_EQ(hm[1], 0);
  cudaFree(dm);
}

TEST(NcclCore, OrderedAfterProducerAndBeforeConsumerStream) {
  // The producer writes on its own stream and nobody synchronises before the all-reduce: only
  // the event ordering makes NCCL read the new values. The result is read back on the same
  // stream after block_stream(), again without a host sync in between.
  const size_t count = 1 << 22;  // 16 MiB: long enough to expose a missing dependency
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), count * sizeof(float)), cudaSuccess);
  std::vector<float> ones(count, 1.0f * (g_rank + 1));
  ASSERT_EQ(cudaMemcpyAsync(d, ones.data(), count * sizeof(float), cudaMemcpyHostToDevice, s),
            cudaSuccess);
  auto ev = g_core->all_reduce(d, count, DataType::kFloat32, RedOp::kSum, s);
  ev->block_stream(s);
  std::vector<float> out(count);
  ASSERT_EQ(cudaMemcpyAsync(out.data(), d, count * sizeof(float), cudaMemcpyDeviceToHost, s),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_TRUE(ev->done());
  const float want = g_world * (g_world + 1) / 2.0f;
  EXPECT_EQ(out.front(), want);
  EXPECT_EQ(out[count / 2], want);
  EXPECT_EQ(out.back(), want);
  cudaFree(d);
  cudaStreamDestroy(s);
}

namespace {
// A producer that is slow on purpose and needs no kernel: the stream first runs a host function
// that sleeps, then copies `value` into `dst`. Work ordered after this stream sees the new values
// only ~200 ms after it was queued; work that is not ordered after it sees the old ones.
void CUDART_CB sleep_200ms(void*) { std::this_thread::sleep_for(std::chrono::milliseconds(200)); }

void slow_fill(float* dst, const float* pinned_src, size_t count, cudaStream_t s) {
  ASSERT_EQ(cudaLaunchHostFunc(s, sleep_200ms, nullptr), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(dst, pinned_src, count * sizeof(float), cudaMemcpyHostToDevice, s),
            cudaSuccess);
}

struct OrderingRun {
  float first, last;  // what the consumer read from recv
};

// send := -1 and recv := -2 (settled), then: the slow producer writes rank + 1 into send on
// `producer`; an out-of-place sum all-reduce send -> recv is ordered after `order_after`; the
// consumer stream copies recv to the host, after the collective when `consumer_waits`.
OrderingRun run_ordering(cudaStream_t producer, cudaStream_t order_after, cudaStream_t consumer,
                         bool consumer_waits) {
  const size_t count = 1 << 20;
  float *send = nullptr, *recv = nullptr, *host_new = nullptr, *host_out = nullptr;
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&send), count * sizeof(float)), cudaSuccess);
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&recv), count * sizeof(float)), cudaSuccess);
  EXPECT_EQ(cudaMallocHost(reinterpret_cast<void**>(&host_new), count * sizeof(float)), cudaSuccess);
  EXPECT_EQ(cudaMallocHost(reinterpret_cast<void**>(&host_out), count * sizeof(float)), cudaSuccess);
  std::vector<float> old_send(count, -1.0f), old_recv(count, -2.0f);
  EXPECT_EQ(cudaMemcpy(send, old_send.data(), count * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(recv, old_recv.data(), count * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  for (size_t i = 0; i < count; ++i) host_new[i] = static_cast<float>(g_rank + 1);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  MPI_Barrier(MPI_COMM_WORLD);

  slow_fill(send, host_new, count, producer);
  auto ev = g_core->all_reduce(send, recv, count, DataType::kFloat32, RedOp::kSum, order_after);
  if (consumer_waits) ev->block_stream(consumer);
  EXPECT_EQ(cudaMemcpyAsync(host_out, recv, count * sizeof(float), cudaMemcpyDeviceToHost, consumer),
            cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(consumer), cudaSuccess);
  OrderingRun out{host_out[0], host_out[count - 1]};
  ev->synchronize(60, "ordering all_reduce");
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaFree(send);
  cudaFree(recv);
  cudaFreeHost(host_new);
  cudaFreeHost(host_out);
  return out;
}
}  // namespace

TEST(NcclCore, OutOfPlaceAllReduceOrderedAfterSlowProducerAndBeforeConsumer) {
  // Meaningful at world size 1 too: the out-of-place all-reduce copies send into recv, so a
  // collective that ran before the producer would deliver the old -1s, and a consumer that did
  // not wait would read recv's old -2s. Expected: the sum of rank + 1 over the ranks.
  cudaStream_t producer = nullptr, consumer = nullptr, idle = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&idle, cudaStreamNonBlocking), cudaSuccess);
  const float want = g_world * (g_world + 1) / 2.0f;
  OrderingRun ok = run_ordering(producer, producer, consumer, /*consumer_waits=*/true);
  EXPECT_EQ(ok.first, want);
  EXPECT_EQ(ok.last, want);
  // The controls: this test can fail. Ordered after an idle stream instead of the producer,
  // NCCL reads send before the producer rewrote it (every rank's -1); a consumer that does not
  // wait for the collective reads recv before NCCL wrote it (-2).
  OrderingRun early = run_ordering(producer, idle, consumer, /*consumer_waits=*/true);
  EXPECT_EQ(early.first, -1.0f * g_world) << "the NCCL stream did not run ahead of a slow producer "
                                              "it was not ordered after: this test cannot fail";
  OrderingRun unwaited = run_ordering(producer, producer, consumer, /*consumer_waits=*/false);
  EXPECT_EQ(unwaited.first, -2.0f) << "a consumer that does not wait saw the result anyway: this "
                                      "test cannot fail";
  cudaStreamDestroy(producer);
  cudaStreamDestroy(consumer);
  cudaStreamDestroy(idle);
}

TEST(NcclCore, BroadcastAndBadRoot) {
  std::vector<unsigned char> v(37, static_cast<unsigned char>(g_rank + 10));
  auto* d = device_copy(v);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  g_core->broadcast(d, v.size(), g_world - 1, nullptr)->synchronize(60, "broadcast");
  auto h = host_copy(d, v.size());
  EXPECT_EQ(h.front(), g_world - 1 + 10);
  EXPECT_EQ(h.back(), g_world - 1 + 10);
  EXPECT_THROW(g_core->broadcast(d, v.size(), g_world, nullptr), mllm::CommError);
  cudaFree(d);
}

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_world);
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_rank, MPI_INFO_NULL, &local);
  int local_rank = 0;
  MPI_Comm_rank(local, &local_rank);
  int rc = 1;
  try {
    NcclCore core(MPI_COMM_WORLD, local_rank);
    g_core = &core;
    rc = RUN_ALL_TESTS();
    g_core = nullptr;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", g_rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Comm_free(&local);
  MPI_Finalize();
  return rc;
}
