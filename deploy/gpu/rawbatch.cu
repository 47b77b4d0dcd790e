// rawbatch: the yardstick for the same-host path. 10,000 blocks at random
// gapped slots, GPU0 -> GPU1 (GPU0 -> GPU0 with one GPU), copy engines only;
// best of 5 per size, per candidate strategy:
//   batch    one cudaMemcpyBatchAsync of every block (what b2bd's local path issues)
//   loop     one cudaMemcpyAsync per block
//   stage    staging through pinned host memory: a batched D2H gather into one
//            contiguous buffer, then a batched H2D scatter (two copies a block)
//   cover    only when the destination is ONE contiguous run (so no destination
//            gap can be overwritten): one D2H copy of the source's covering
//            range, a CPU gather of the blocks, one H2D copy
// Build: nvcc -O2 -o rawbatch rawbatch.cu     Run: ./rawbatch [blocks]
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
#include <algorithm>
#include <random>
#include <chrono>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)

static cudaError_t batch(void **d, void **s, size_t *n, size_t cnt, cudaStream_t st) {
	cudaMemcpyAttributes a;
	memset(&a, 0, sizeof a);
	a.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
	size_t idx = 0;
#if CUDART_VERSION >= 13000
	return cudaMemcpyBatchAsync(d, (const void **)s, n, cnt, &a, &idx, 1, st);
#else
	size_t fail = 0;
	return cudaMemcpyBatchAsync(d, s, n, cnt, &a, &idx, 1, &fail, st);
#endif
}

int main(int argc, char **argv) {
	int N = argc > 1 ? atoi(argv[1]) : 10000;
	int ndev = 0;
	CK(cudaGetDeviceCount(&ndev));
	int sd = 0, dd = ndev > 1 ? 1 : 0;
	size_t sizes[] = {128, 4096, 65536, 262144, 2097152};
	CK(cudaSetDevice(sd));
	if (dd != sd) { int can = 0; CK(cudaDeviceCanAccessPeer(&can, sd, dd)); if (can) CK(cudaDeviceEnablePeerAccess(dd, 0)); }
	cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
	printf("rawbatch: %d blocks, GPU%d -> GPU%d, best of 5 (ms)\n", N, sd, dd);
	printf("%-8s %9s %9s %9s | %12s %9s   %s\n", "block", "batch", "loop", "stage", "batch-contig", "cover", "(right: destination one contiguous run)");
	std::mt19937_64 rng(42);
	for (size_t S : sizes) {
		size_t slots = 2 * (size_t)N, region = slots * S;
		char *src, *dst, *host;
		CK(cudaSetDevice(sd)); CK(cudaMalloc(&src, region));
		CK(cudaSetDevice(dd)); CK(cudaMalloc(&dst, region));
		CK(cudaSetDevice(sd));
		bool stage = S <= 262144; // staging needs region-sized pinned buffers
		if (stage) CK(cudaMallocHost(&host, region)); else host = nullptr;
		std::vector<size_t> a(slots), b(slots);
		for (size_t i = 0; i < slots; i++) a[i] = b[i] = i;
		std::shuffle(a.begin(), a.end(), rng); std::shuffle(b.begin(), b.end(), rng);
		std::sort(a.begin(), a.begin() + N);
		std::vector<void *> ds(N), ss(N), hs(N), ds2(N), cs(N);
		std::vector<size_t> ns(N, S);
		for (int i = 0; i < N; i++) { ss[i] = src + a[i] * S; ds[i] = dst + b[i] * S; hs[i] = host + (size_t)i * S; cs[i] = dst + (size_t)i * S; }
		auto best = [&](auto f) { double bst = 1e30; for (int r = 0; r < 6; r++) { auto t0 = std::chrono::steady_clock::now(); f(); CK(cudaStreamSynchronize(st));
			double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(); if (r > 0) bst = std::min(bst, ms); } return bst; };
		double tb = best([&] { CK(batch(ds.data(), ss.data(), ns.data(), N, st)); });
		double tl = best([&] { for (int i = 0; i < N; i++) CK(cudaMemcpyAsync(ds[i], ss[i], S, cudaMemcpyDefault, st)); });
		double tbc = best([&] { CK(batch(cs.data(), ss.data(), ns.data(), N, st)); });
		double ts = -1, tc = -1;
		if (stage) ts = best([&] { CK(batch(hs.data(), ss.data(), ns.data(), N, st)); CK(batch(ds.data(), hs.data(), ns.data(), N, st)); });
		size_t lo = a[0] * S, hi = a[N - 1] * S + S;
		if (stage) tc = best([&] {
			CK(cudaMemcpyAsync(host, src + lo, hi - lo, cudaMemcpyDefault, st)); CK(cudaStreamSynchronize(st));
			static char *gbuf = nullptr; static size_t gcap = 0;
			if (gcap < (size_t)N * S) { if (gbuf) cudaFreeHost(gbuf); CK(cudaMallocHost(&gbuf, (size_t)N * S)); gcap = (size_t)N * S; }
			for (int i = 0; i < N; i++) memcpy(gbuf + (size_t)i * S, host + (a[i] * S - lo), S);
			CK(cudaMemcpyAsync(dst, gbuf, (size_t)N * S, cudaMemcpyDefault, st)); });
		printf("%-8zu %9.3f %9.3f %9.3f | %12.3f %9.3f\n", S, tb, tl, ts, tbc, tc);
		fflush(stdout);
		if (host) CK(cudaFreeHost(host)); CK(cudaFree(src)); CK(cudaSetDevice(dd)); CK(cudaFree(dst)); CK(cudaSetDevice(sd));
	}
	return 0;
}
