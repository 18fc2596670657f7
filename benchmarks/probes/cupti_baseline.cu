// CUPTI activity tracing from C++, no Python: the baseline for benchmarks/probes/cupti_probe.py.
// Launch cost of empty kernels untraced / traced / traced while another thread flushes every 3 ms, and the cost of
// one non-forced flush. Build: nvcc -O2 -std=c++17 cupti_baseline.cu -I<cupti include> -L<cupti lib> -lcupti
#include <cuda_runtime.h>
#include <cupti.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

static std::atomic<size_t> g_records{0}, g_kernels{0}, g_buffers{0};
static std::atomic<long long> g_cb_ns{0};

static double now_us() {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static void CUPTIAPI buffer_requested(uint8_t **buf, size_t *size, size_t *max_records) {
    *size = 4 << 20;
    *buf = static_cast<uint8_t *>(aligned_alloc(8, *size));
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t *buf, size_t, size_t valid) {
    double t0 = now_us();
    CUpti_Activity *rec = nullptr;
    g_buffers++;
    while (cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) {
        g_records++;
        if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) g_kernels++;
    }
    free(buf);
    g_cb_ns += static_cast<long long>((now_us() - t0) * 1e3);
}

__global__ void empty_kernel() {}

static double launch_us(int n, cudaStream_t s) {
    double t0 = now_us();
    for (int i = 0; i < n; i++) empty_kernel<<<1, 1, 0, s>>>();
    double per = (now_us() - t0) / n;
    cudaStreamSynchronize(s);
    return per;
}

#define CHECK(call)                                                                          \
    do {                                                                                     \
        CUptiResult r_ = (call);                                                             \
        if (r_ != CUPTI_SUCCESS) {                                                           \
            const char *m_ = nullptr;                                                        \
            cuptiGetResultString(r_, &m_);                                                   \
            std::printf("%s failed: %s\n", #call, m_ ? m_ : "?");                            \
            return 1;                                                                        \
        }                                                                                    \
    } while (0)

int main(int argc, char **argv) {
    int n = argc > 1 ? std::atoi(argv[1]) : 4000;
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    launch_us(100, s);
    double base = launch_us(n, s);
    CHECK(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
    CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
    double traced = launch_us(n, s);
    cudaDeviceSynchronize();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    double t0 = now_us();
    CHECK(cuptiActivityFlushAll(0));
    double flush_us = now_us() - t0;
    size_t flushed = g_kernels.load();
    long long cb_ns = g_cb_ns.load();

    std::atomic<bool> stop{false};
    std::atomic<int> flushes{0};
    std::thread poller([&] {
        while (!stop) {
            cuptiActivityFlushAll(0);
            flushes++;
            std::this_thread::sleep_for(std::chrono::milliseconds(3));
        }
    });
    double polled = launch_us(n, s);
    stop = true;
    poller.join();
    cudaDeviceSynchronize();
    CHECK(cuptiActivityFlushAll(1));
    CHECK(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
    std::printf("C++ CUPTI baseline, %d empty kernels a loop: launch untraced %.2f us, traced %.2f us, traced while a "
                "thread flushes every 3 ms %.2f us (%d flushes); one flush of %zu kernel records %.1f us (%.1f us "
                "in the callback); total records %zu in %zu buffers\n",
                n, base, traced, polled, flushes.load(), flushed, flush_us, cb_ns / 1e3, g_records.load(),
                g_buffers.load());
    return 0;
}
