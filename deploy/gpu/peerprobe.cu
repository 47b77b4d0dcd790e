// peerprobe: what makes a batch of 10,000 small GPU0 -> GPU1 peer copies
// take ~5 ms in one process and ~9 ms in another (docs/samehost.md: "the
// copy engines' own time ... is bimodal"). It times one
// cuMemcpyBatchAsync of N blocks at random gapped slots under each
// condition that differs between b2b-bench's raw yardstick and the daemon's
// same-host path, interleaved round by round so that drift hits all alike:
//   raw        source cudaMalloc'd here, destination cudaMalloc'd here on GPU1
//   ipc        destination allocated by another process, opened through IPC
//   syncmem    + CU_POINTER_ATTRIBUTE_SYNC_MEMOPS on the source (as the daemon)
//   dmabuf     + the source exported as a dma-buf (as the daemon, for verbs)
//   streamK    the ipc case on the K-th of 8 streams made in a row
//   pull       raw's copies queued on a GPU1 stream (the destination's side)
//   primed     one 64 KiB peer copy queued just before, on the same stream
//   split2     the batch in two halves on two streams
//   ipc-parK   the batch in K parts queued at once by K threads on K streams
//   raw-parK   the same with the peer's own pointers (peer access, no IPC)
//   pull-par4  raw-par4 queued on GPU1's streams by threads with GPU1 current
//   ipc1-par4  ipc-par4 to the handle opened again with GPU1 current
//   staged     gather to pinned host (one batch), scatter to GPU1 (one batch)
//   hostwalk   staged, the scatter in primed chunks of 256 (the daemon's H2D)
//   overlap    the ipc case with cudaMemcpyFlagPreferOverlapWithCompute
//   anyorder   ... with cudaMemcpySrcAccessOrderAny; anyoverlap: both
//   idle2/idle20  the ipc case after the GPUs idled 2 or 20 ms (power states)
//   cover+walk     one device-to-host copy of the source's covering range, then
//                  host-to-device per block in primed chunks of 256, on GPU0
//   cover+walk4    the same, the chunks over four GPU0 streams
//   cover+walkd1   the second hop on a GPU1 stream, into GPU1's own allocation
//   cover+walk4d1  ... over four GPU1 streams
// With "host" as the third argument it times host <-> GPU0 batches instead
// (one GPU is enough): one call of N scattered copies from registered host
// memory (as the daemon's mappings) or from cudaMallocHost, in primed
// chunks of 256 (the daemon's host-to-device path) or not, under each
// attribute, queued by one thread or by 2 or 4 at once (one stream each),
// and device-to-host likewise.
// Each line: the condition, its median, min and max, the CPU time of the
// enqueue call alone (median), and every sample (ms).
// Build: nvcc -O2 -o peerprobe peerprobe.cu -lcuda -lnvidia-ml   Run: ./peerprobe [blocks] [rounds] [peer|host]
#include <cuda.h>
#include <cuda_runtime.h>
#include <nvml.h>
#include <thread>
#include <utility>
#include <atomic>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>
#include <algorithm>
#include <chrono>
#include <random>
#include <string>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)
#define CKD(x) do { CUresult e_ = (x); if (e_ != CUDA_SUCCESS) { const char *s_ = ""; cuGetErrorString(e_, &s_); fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, s_); exit(1); } } while (0)

// attrFlags and attrOrder are the batch's attributes (what the daemon
// passes: flags 0, source order STREAM); some conditions change them.
static unsigned attrFlags = 0;
static cudaMemcpySrcAccessOrder attrOrder = cudaMemcpySrcAccessOrderStream;

static cudaError_t batch(void **d, void **s, size_t *n, size_t cnt, cudaStream_t st) {
	cudaMemcpyAttributes a;
	memset(&a, 0, sizeof a);
	a.srcAccessOrder = attrOrder;
	a.flags = attrFlags;
	size_t idx = 0;
#if CUDART_VERSION >= 13000
	return cudaMemcpyBatchAsync(d, (const void **)s, n, cnt, &a, &idx, 1, st);
#else
	size_t fail = 0;
	return cudaMemcpyBatchAsync(d, s, n, cnt, &a, &idx, 1, &fail, st);
#endif
}

// parallel runs fn(j) for j in [0, k) on k threads, each with dev current:
// k parts of one batch queued at once on k streams (the driver's enqueue of
// small copies is CPU-bound: see h2d-held).
template <class F> static void parallel(int k, int dev, F fn) {
	std::vector<std::thread> ts;
	for (int j = 0; j < k; j++) ts.emplace_back([=] { CK(cudaSetDevice(dev)); fn(j); });
	for (auto &t : ts) t.join();
}

static double ms_since(std::chrono::steady_clock::time_point t0) {
	return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

struct Cond {
	std::string name;
	std::vector<double> total, enq;
	std::vector<unsigned> clk, gen; // GPU0's SM clock (MHz) and PCIe generation just before
};

// The GPU's state just before a batch: its SM clock and PCIe link
// generation both drop while it idles.
static nvmlDevice_t nvdev;
static bool nvok;
static void gpuState(unsigned *clk, unsigned *gen) {
	*clk = *gen = 0;
	if (!nvok) return;
	nvmlDeviceGetClockInfo(nvdev, NVML_CLOCK_SM, clk);
	nvmlDeviceGetCurrPcieLinkGeneration(nvdev, gen);
}

static void report(size_t S, int N, std::vector<Cond> &cs) {
	printf("\n%zu B x %d        median      min      max  enqueue | samples (ms) | SM MHz/PCIe gen before each\n", S, N);
	for (auto &c : cs) {
		std::vector<double> t = c.total, e = c.enq;
		std::sort(t.begin(), t.end()); std::sort(e.begin(), e.end());
		printf("%-14s %8.3f %8.3f %8.3f %8.3f |", c.name.c_str(), t[t.size() / 2], t.front(), t.back(), e[e.size() / 2]);
		for (double x : c.total) printf(" %.2f", x);
		printf(" |");
		for (size_t i = 0; i < c.clk.size(); i++) printf(" %u/%u", c.clk[i], c.gen[i]);
		printf("\n");
	}
	fflush(stdout);
}

// hostdev times host <-> GPU0 batches (see the top).
static int hostdev(int N, int R) {
	const size_t maxS = 4096, slots = 2 * (size_t)N, region = slots * maxS;
	CK(cudaSetDevice(0));
	char *dev, *pinned, *primerD, *primerH;
	CK(cudaMalloc(&dev, region)); CK(cudaMallocHost(&pinned, region));
	CK(cudaMalloc(&primerD, 65536)); CK(cudaMallocHost(&primerH, 65536));
	char *reg = (char *)aligned_alloc(4096, region);
	memset(reg, 1, region);
	CK(cudaHostRegister(reg, region, cudaHostRegisterPortable));
	cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
	cudaStream_t hs[4];
	for (auto &x : hs) CK(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking));
	char *primerD4; CK(cudaMalloc(&primerD4, 4 * 65536));
	unsigned *flag; CK(cudaHostAlloc(&flag, 64, cudaHostAllocMapped));
	CUdeviceptr flagDev; CKD(cuMemHostGetDevicePointer(&flagDev, flag, 0));
	std::vector<double> held;
	printf("peerprobe host: %d blocks, %d rounds, GPU0\n", N, R);
	std::mt19937_64 rng(7);
	for (size_t S : {(size_t)128, (size_t)4096}) {
		std::vector<size_t> a(slots), b(slots);
		for (size_t i = 0; i < slots; i++) a[i] = b[i] = i;
		std::shuffle(a.begin(), a.end(), rng); std::shuffle(b.begin(), b.end(), rng);
		std::vector<size_t> ns(N, S);
		std::vector<void *> hR(N), hP(N), d(N);
		for (int i = 0; i < N; i++) { hR[i] = reg + a[i] * S; hP[i] = pinned + a[i] * S; d[i] = dev + b[i] * S; }
		std::vector<Cond> cs;
		auto run = [&](size_t ci, const char *name, auto enqueue) {
			if (cs.size() <= ci) cs.push_back(Cond{name, {}, {}, {}, {}});
			unsigned clk, gen;
			gpuState(&clk, &gen);
			cs[ci].clk.push_back(clk); cs[ci].gen.push_back(gen);
			auto t0 = std::chrono::steady_clock::now();
			enqueue();
			double e = ms_since(t0);
			CK(cudaStreamSynchronize(st));
			cs[ci].total.push_back(ms_since(t0));
			cs[ci].enq.push_back(e);
		};
		auto with = [&](unsigned f, cudaMemcpySrcAccessOrder o, auto fn) {
			attrFlags = f; attrOrder = o; fn(); attrFlags = 0; attrOrder = cudaMemcpySrcAccessOrderStream;
		};
		auto primed = [&](std::vector<void *> &dst, std::vector<void *> &src) {
			for (int c0 = 0; c0 < N; c0 += 256) {
				CK(cudaMemcpyAsync(primerD, primerH, 65536, cudaMemcpyDefault, st));
				CK(batch(dst.data() + c0, src.data() + c0, ns.data(), std::min(256, N - c0), st));
			}
		};
		const cudaMemcpySrcAccessOrder S0 = cudaMemcpySrcAccessOrderStream, SA = cudaMemcpySrcAccessOrderAny;
		const unsigned OV = cudaMemcpyFlagPreferOverlapWithCompute;
		for (int r = -1; r < R; r++) {
			size_t ci = 0;
			run(ci++, "h2d-reg", [&] { CK(batch(d.data(), hR.data(), ns.data(), N, st)); });
			run(ci++, "h2d-reg-primed", [&] { primed(d, hR); });
			run(ci++, "h2d-pin", [&] { CK(batch(d.data(), hP.data(), ns.data(), N, st)); });
			run(ci++, "h2d-pin-primed", [&] { primed(d, hP); });
			run(ci++, "h2d-overlap", [&] { with(OV, S0, [&] { CK(batch(d.data(), hR.data(), ns.data(), N, st)); }); });
			run(ci++, "h2d-any", [&] { with(0, SA, [&] { CK(batch(d.data(), hR.data(), ns.data(), N, st)); }); });
			run(ci++, "h2d-anyoverlap", [&] { with(OV, SA, [&] { CK(batch(d.data(), hR.data(), ns.data(), N, st)); }); });
			run(ci++, "h2d-primed-ov", [&] { with(OV, S0, [&] { primed(d, hR); }); });
			run(ci++, "h2d-primed-any", [&] { with(0, SA, [&] { primed(d, hR); }); });
			// The stream held on a host flag while the copies are queued: the
			// enqueue alone is the driver's CPU time (unless its queue fills,
			// then it waits for the release, 40 ms on).
			run(ci++, "h2d-held", [&] {
				*flag = 0;
				CKD(cuStreamWaitValue32((CUstream)st, flagDev, 1, CU_STREAM_WAIT_VALUE_GEQ));
				std::thread rel([&] { std::this_thread::sleep_for(std::chrono::milliseconds(40)); *(volatile unsigned *)flag = 1; });
				auto t0 = std::chrono::steady_clock::now();
				primed(d, hR);
				held.push_back(ms_since(t0));
				rel.join();
			});
			for (int k : {2, 4}) {
				char nm[24]; snprintf(nm, sizeof nm, "h2d-primed-par%d", k);
				run(ci++, strdup(nm), [&] {
					parallel(k, 0, [&](int j) {
						int lo = N * j / k, hi = N * (j + 1) / k;
						for (int c0 = lo; c0 < hi; c0 += 256) {
							CK(cudaMemcpyAsync(primerD4 + j * 65536, primerH, 65536, cudaMemcpyDefault, hs[j]));
							CK(batch(d.data() + c0, hR.data() + c0, ns.data(), std::min(256, hi - c0), hs[j]));
						}
					});
					for (int j = 0; j < k; j++) CK(cudaStreamSynchronize(hs[j]));
				});
				snprintf(nm, sizeof nm, "d2h-par%d", k);
				run(ci++, strdup(nm), [&] {
					parallel(k, 0, [&](int j) {
						int lo = N * j / k, hi = N * (j + 1) / k;
						CK(batch(hR.data() + lo, d.data() + lo, ns.data(), hi - lo, hs[j]));
					});
					for (int j = 0; j < k; j++) CK(cudaStreamSynchronize(hs[j]));
				});
			}
			run(ci++, "d2h-reg", [&] { CK(batch(hR.data(), d.data(), ns.data(), N, st)); });
			run(ci++, "d2h-pin", [&] { CK(batch(hP.data(), d.data(), ns.data(), N, st)); });
			run(ci++, "d2h-overlap", [&] { with(OV, S0, [&] { CK(batch(hR.data(), d.data(), ns.data(), N, st)); }); });
			run(ci++, "d2h-any", [&] { with(0, SA, [&] { CK(batch(hR.data(), d.data(), ns.data(), N, st)); }); });
			run(ci++, "d2h-anyoverlap", [&] { with(OV, SA, [&] { CK(batch(hR.data(), d.data(), ns.data(), N, st)); }); });
			if (r < 0) for (auto &c : cs) { c.total.clear(); c.enq.clear(); c.clk.clear(); c.gen.clear(); }
		}
		report(S, N, cs);
		std::sort(held.begin(), held.end());
		if (!held.empty()) printf("h2d-held: the primed batch's enqueue alone, stream held: median %.3f ms, min %.3f, max %.3f (40: it waited for the release)\n", held[held.size() / 2], held.front(), held.back());
		held.clear();
	}
	return 0;
}

int main(int argc, char **argv) {
	int N = argc > 1 ? atoi(argv[1]) : 10000;
	int R = argc > 2 ? atoi(argv[2]) : 9;
	nvok = nvmlInit_v2() == NVML_SUCCESS && nvmlDeviceGetHandleByIndex_v2(0, &nvdev) == NVML_SUCCESS;
	if (argc > 3 && strcmp(argv[3], "host") == 0) return hostdev(N, R);
	size_t sizes[] = {128, 4096};
	const size_t maxS = 4096, slots = 2 * (size_t)N, region = slots * maxS;

	// The destination's owner: another process, as the peer daemon is.
	int up[2], down[2];
	if (pipe(up) || pipe(down)) { perror("pipe"); return 1; }
	pid_t child = fork();
	if (child == 0) {
		close(up[0]); close(down[1]);
		void *p; cudaIpcMemHandle_t h;
		CK(cudaSetDevice(1)); CK(cudaMalloc(&p, region)); CK(cudaIpcGetMemHandle(&h, p));
		if (write(up[1], &h, sizeof h) != (ssize_t)sizeof h) _exit(1);
		char c; while (read(down[0], &c, 1) > 0) {}
		_exit(0);
	}
	close(up[1]); close(down[0]);
	cudaIpcMemHandle_t h;
	if (read(up[0], &h, sizeof h) != (ssize_t)sizeof h) { fprintf(stderr, "peerprobe: no IPC handle from the child\n"); return 1; }

	int ndev = 0; CK(cudaGetDeviceCount(&ndev));
	if (ndev < 2) { fprintf(stderr, "peerprobe: needs two GPUs (%d)\n", ndev); return 1; }
	CK(cudaSetDevice(1)); char *dstLocal; CK(cudaMalloc(&dstLocal, region));
	cudaStream_t pull; CK(cudaStreamCreateWithFlags(&pull, cudaStreamNonBlocking));
	CK(cudaSetDevice(0));
	int can = 0; CK(cudaDeviceCanAccessPeer(&can, 0, 1));
	if (can) CK(cudaDeviceEnablePeerAccess(1, 0));
	CK(cudaSetDevice(1)); if (can) CK(cudaDeviceEnablePeerAccess(0, 0)); CK(cudaSetDevice(0));
	char *dstIPC; CK(cudaIpcOpenMemHandle((void **)&dstIPC, h, cudaIpcMemLazyEnablePeerAccess));
	// The same handle opened with GPU1 current (as a daemon imports a
	// client's GPU1 tensor): refused, or another pointer, or the same one.
	CK(cudaSetDevice(1));
	char *dstIPC1 = nullptr;
	cudaError_t e1 = cudaIpcOpenMemHandle((void **)&dstIPC1, h, cudaIpcMemLazyEnablePeerAccess);
	CK(cudaSetDevice(0));
	printf("peerprobe: the handle opened again with GPU1 current: %s, %p (with GPU0 current: %p)\n", cudaGetErrorString(e1), (void *)dstIPC1, (void *)dstIPC);
	if (e1 != cudaSuccess) { (void)cudaGetLastError(); dstIPC1 = dstIPC; }
	char *srcPlain, *srcSync, *srcDmabuf, *host, *primerD, *primerH, *peer64;
	CK(cudaMalloc(&srcPlain, region)); CK(cudaMalloc(&srcSync, region)); CK(cudaMalloc(&srcDmabuf, region));
	CK(cudaMalloc(&primerD, 65536)); CK(cudaMallocHost(&primerH, 65536)); CK(cudaSetDevice(1)); CK(cudaMalloc(&peer64, 65536)); CK(cudaSetDevice(0));
	CK(cudaMallocHost(&host, (size_t)N * maxS));
	char *cover, *primerD1; CK(cudaMallocHost(&cover, region));
	CK(cudaSetDevice(1)); CK(cudaMalloc(&primerD1, 65536)); CK(cudaSetDevice(0));
	unsigned one = 1;
	CKD(cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, (CUdeviceptr)srcSync));
	CKD(cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, (CUdeviceptr)srcDmabuf));
	int dmafd = -1;
	CUresult dr = cuMemGetHandleForAddressRange(&dmafd, (CUdeviceptr)srcDmabuf, region, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
	printf("peerprobe: %d blocks, %d rounds, peer access %d, dma-buf export %s\n", N, R, can, dr == CUDA_SUCCESS ? "ok" : "refused");
	cudaStream_t st[8], s2, d1[4];
	CK(cudaSetDevice(1));
	for (int i = 0; i < 4; i++) CK(cudaStreamCreateWithFlags(&d1[i], cudaStreamNonBlocking));
	CK(cudaSetDevice(0));
	for (int i = 0; i < 8; i++) CK(cudaStreamCreateWithFlags(&st[i], cudaStreamNonBlocking));
	CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));

	unsigned *flag; CK(cudaHostAlloc(&flag, 64, cudaHostAllocMapped));
	CUdeviceptr flagDev; CKD(cuMemHostGetDevicePointer(&flagDev, flag, 0));
	std::vector<double> held;
	std::mt19937_64 rng(42);
	for (size_t S : sizes) {
		std::vector<size_t> a(slots), b(slots);
		for (size_t i = 0; i < slots; i++) a[i] = b[i] = i;
		std::shuffle(a.begin(), a.end(), rng); std::shuffle(b.begin(), b.end(), rng);
		std::vector<size_t> ns(N, S);
		auto ptrs = [&](char *base, std::vector<size_t> &slot) { std::vector<void *> v(N); for (int i = 0; i < N; i++) v[i] = base + slot[i] * S; return v; };
		std::vector<void *> sP = ptrs(srcPlain, a), sS = ptrs(srcSync, a), sD = ptrs(srcDmabuf, a);
		std::vector<void *> dL = ptrs(dstLocal, b), dI = ptrs(dstIPC, b), dI1 = ptrs(dstIPC1, b), hs(N);
		for (int i = 0; i < N; i++) hs[i] = host + (size_t)i * S;

		size_t lo = *std::min_element(a.begin(), a.begin() + N) * S, hi = *std::max_element(a.begin(), a.begin() + N) * S + S;
		std::vector<void *> cv(N);
		for (int i = 0; i < N; i++) cv[i] = cover + (a[i] * S - lo);
		// walk: the second hop of cover+walk*, chunks of 256 behind a primer,
		// round robin over k streams on GPU0 (to the IPC mapping) or GPU1.
		auto walk = [&](int k, bool onGPU1) {
			for (int c0 = 0, j = 0; c0 < N; c0 += 256, j++) {
				int c = std::min(256, N - c0);
				cudaStream_t s = onGPU1 ? d1[j % k] : st[j % k];
				CK(cudaMemcpyAsync(onGPU1 ? primerD1 : primerD, primerH, 65536, cudaMemcpyDefault, s));
				CK(batch((onGPU1 ? dL.data() : dI.data()) + c0, cv.data() + c0, ns.data(), c, s));
			}
		};
		auto coverWalk = [&](int k, bool onGPU1) {
			CK(cudaMemcpyAsync(cover, srcPlain + lo, hi - lo, cudaMemcpyDefault, st[0]));
			CK(cudaStreamSynchronize(st[0]));
			if (onGPU1) CK(cudaSetDevice(1));
			walk(k, onGPU1);
			if (onGPU1) CK(cudaSetDevice(0));
		};
		std::vector<cudaStream_t> st4 = {st[1], st[2], st[3]}, d14 = {d1[1], d1[2], d1[3]};
		std::vector<Cond> cs;
		auto run = [&](size_t ci, const char *name, cudaStream_t s, std::vector<cudaStream_t> wait, auto enqueue) {
			if (cs.size() <= ci) cs.push_back(Cond{name, {}, {}, {}, {}});
			unsigned clk, gen;
			gpuState(&clk, &gen);
			cs[ci].clk.push_back(clk); cs[ci].gen.push_back(gen);
			auto t0 = std::chrono::steady_clock::now();
			enqueue();
			double e = ms_since(t0);
			CK(cudaStreamSynchronize(s));
			for (cudaStream_t w : wait) CK(cudaStreamSynchronize(w));
			cs[ci].total.push_back(ms_since(t0));
			cs[ci].enq.push_back(e);
		};
		for (int r = -1; r < R; r++) { // round -1 warms every condition
			size_t ci = 0;
			run(ci++, "raw", st[0], {}, [&] { CK(batch(dL.data(), sP.data(), ns.data(), N, st[0])); });
			run(ci++, "ipc-held", st[0], {}, [&] {
				*flag = 0;
				CKD(cuStreamWaitValue32((CUstream)st[0], flagDev, 1, CU_STREAM_WAIT_VALUE_GEQ));
				std::thread rel([&] { std::this_thread::sleep_for(std::chrono::milliseconds(40)); *(volatile unsigned *)flag = 1; });
				auto t0 = std::chrono::steady_clock::now();
				CK(batch(dI.data(), sP.data(), ns.data(), N, st[0]));
				held.push_back(ms_since(t0));
				rel.join();
			});
			run(ci++, "ipc", st[0], {}, [&] { CK(batch(dI.data(), sP.data(), ns.data(), N, st[0])); });
			run(ci++, "syncmem", st[0], {}, [&] { CK(batch(dI.data(), sS.data(), ns.data(), N, st[0])); });
			run(ci++, "dmabuf", st[0], {}, [&] { CK(batch(dI.data(), sD.data(), ns.data(), N, st[0])); });
			for (int k = 1; k < 8; k++) {
				char nm[24]; snprintf(nm, sizeof nm, "stream%d", k);
				run(ci++, strdup(nm), st[k], {}, [&] { CK(batch(dI.data(), sP.data(), ns.data(), N, st[k])); });
			}
			run(ci++, "pull", pull, {}, [&] { CK(cudaSetDevice(1)); CK(batch(dL.data(), sP.data(), ns.data(), N, pull)); CK(cudaSetDevice(0)); });
			run(ci++, "primed", st[0], {}, [&] { CK(cudaMemcpyAsync(peer64, primerD, 65536, cudaMemcpyDefault, st[0])); CK(batch(dI.data(), sP.data(), ns.data(), N, st[0])); });
			// In parts: to the IPC mapping, then to the peer's own pointers
			// (its cudaMalloc, reached by peer access), as a daemon's batch
			// between its own regions on two GPUs.
			for (const auto &set : {std::pair{"ipc", &dI}, std::pair{"raw", &dL}}) {
				std::vector<void *> *dst = set.second;
				for (int k : {2, 4}) {
					char nm[24]; snprintf(nm, sizeof nm, "%s-par%d", set.first, k);
					std::vector<cudaStream_t> w(st + 1, st + k);
					run(ci++, strdup(nm), st[0], w, [&] {
						parallel(k, 0, [&](int j) {
							int lo = N * j / k, hi = N * (j + 1) / k;
							CK(batch(dst->data() + lo, sP.data() + lo, ns.data(), hi - lo, st[j]));
						});
					});
				}
			}
			// Peer copies queued on GPU1's streams (the destination's
			// context), GPU0's buffer the foreign pointer.
			{
				std::vector<cudaStream_t> w(d1 + 1, d1 + 4);
				run(ci++, "pull-par4", d1[0], w, [&] {
					parallel(4, 1, [&](int j) {
						int lo = N * j / 4, hi = N * (j + 1) / 4;
						CK(batch(dL.data() + lo, sP.data() + lo, ns.data(), hi - lo, d1[j]));
					});
				});
				std::vector<cudaStream_t> w0(st + 1, st + 4);
				run(ci++, "ipc1-par4", st[0], w0, [&] {
					parallel(4, 0, [&](int j) {
						int lo = N * j / 4, hi = N * (j + 1) / 4;
						CK(batch(dI1.data() + lo, sP.data() + lo, ns.data(), hi - lo, st[j]));
					});
				});
			}
			run(ci++, "split2", st[0], {s2}, [&] { int h2 = N / 2; CK(batch(dI.data(), sP.data(), ns.data(), h2, st[0])); CK(batch(dI.data() + h2, sP.data() + h2, ns.data(), N - h2, s2)); });
			run(ci++, "staged", st[0], {}, [&] { CK(batch(hs.data(), sP.data(), ns.data(), N, st[0])); CK(batch(dI.data(), hs.data(), ns.data(), N, st[0])); });
			run(ci++, "hostwalk", st[0], {}, [&] {
				CK(batch(hs.data(), sP.data(), ns.data(), N, st[0]));
				for (int lo = 0; lo < N; lo += 256) {
					int c = std::min(256, N - lo);
					CK(cudaMemcpyAsync(peer64, primerH, 65536, cudaMemcpyDefault, st[0]));
					CK(batch(dI.data() + lo, hs.data() + lo, ns.data(), c, st[0]));
				}
			});
			auto with = [&](unsigned f, cudaMemcpySrcAccessOrder o) {
				attrFlags = f; attrOrder = o;
				CK(batch(dI.data(), sP.data(), ns.data(), N, st[0]));
				attrFlags = 0; attrOrder = cudaMemcpySrcAccessOrderStream;
			};
			run(ci++, "overlap", st[0], {}, [&] { with(cudaMemcpyFlagPreferOverlapWithCompute, cudaMemcpySrcAccessOrderStream); });
			run(ci++, "anyorder", st[0], {}, [&] { with(0, cudaMemcpySrcAccessOrderAny); });
			run(ci++, "anyoverlap", st[0], {}, [&] { with(cudaMemcpyFlagPreferOverlapWithCompute, cudaMemcpySrcAccessOrderAny); });
			run(ci++, "cover+walk", st[0], {}, [&] { coverWalk(1, false); });
			run(ci++, "cover+walk4", st[0], st4, [&] { coverWalk(4, false); });
			run(ci++, "cover+walkd1", d1[0], {}, [&] { coverWalk(1, true); });
			run(ci++, "cover+walk4d1", d1[0], d14, [&] { coverWalk(4, true); });
			usleep(2000);
			run(ci++, "idle2", st[0], {}, [&] { CK(batch(dI.data(), sP.data(), ns.data(), N, st[0])); });
			usleep(20000);
			run(ci++, "idle20", st[0], {}, [&] { CK(batch(dI.data(), sP.data(), ns.data(), N, st[0])); });
			if (r < 0) for (auto &c : cs) { c.total.clear(); c.enq.clear(); c.clk.clear(); c.gen.clear(); }
		}
		report(S, N, cs);
		std::sort(held.begin(), held.end());
		if (!held.empty()) printf("ipc-held: the batch's enqueue alone, stream held: median %.3f ms, min %.3f, max %.3f (40: it waited for the release)\n", held[held.size() / 2], held.front(), held.back());
		held.clear();
	}
	close(down[1]);
	waitpid(child, nullptr, 0);
	return 0;
}
