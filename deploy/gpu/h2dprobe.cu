// h2dprobe: which host-to-device scatter of many small blocks runs on the
// copy engines only? Driven by h2dprobe.py beside smprobe (another process
// holding every SM): a copy the driver runs as a kernel time-slices the
// other context onto the SMs, which smprobe sees as stalls.
//
// 10,000 blocks of one size at random gapped slots, copied with the driver
// API (what b2bd calls), one of these variants:
//   batch          cuMemcpyBatchAsync, srcAccessOrder STREAM (b2bd's call)
//   batch_any      ... srcAccessOrder ANY
//   batch_api      ... srcAccessOrder DURING_API_CALL
//   batch_overlap  ... STREAM + CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE
//   batch_hint     ... STREAM + location hints (src host, dst device 0)
//   batch_c16      cuMemcpyBatchAsync of 16 copies a call
//   batch_c256     cuMemcpyBatchAsync of 256 copies a call
//   loop           cuMemcpyAsync per block, one stream (b2bd's loop path)
//   loop_htod      cuMemcpyHtoDAsync_v2 per block, one stream
//   loop2, loop4   cuMemcpyAsync per block, split over 2 / 4 streams
//   cN             cuMemcpyBatchAsync of N copies a call (c256 = batch_c256)
//   pre_X, dpre_X  a 64 KiB H2D (pre) or D2H (dpre) copy first on the stream, then X
//   gate_X         the stream first waits for a 4 MiB H2D copy on another stream, then X
//   single         one copy only (is one small copy on an idle stream enough?)
//   event          control: an event record and a sync, no copy
// Scenarios:
//   h2d    pinned host (random slots) -> device (random slots)
//   stage  device -> contiguous pinned (one batch, D2H), then the variant
//          contiguous pinned -> device (the same-GPU staged second hop)
//   d2h    device (random slots) -> pinned host (random slots)
// stdin: "run SCEN VARIANT SIZE REPS" -> "result best_ms=F median_ms=F"
// (REPS timed runs after one warm-up; with REPS=1 no warm-up), "quit".
// Build: nvcc -O2 -o h2dprobe h2dprobe.cu -lcuda
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <vector>
#include <algorithm>
#include <random>
#include <string>

#define CK(x) do { CUresult e_ = (x); if (e_ != CUDA_SUCCESS) { const char *s_ = ""; cuGetErrorName(e_, &s_); fprintf(stderr, "h2dprobe: %s:%d %s: %s\n", __FILE__, __LINE__, #x, s_); printf("error %s\n", s_); fflush(stdout); return e_; } } while (0)

static double mono() { struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts); return ts.tv_sec + ts.tv_nsec * 1e-9; }

static const int N = 10000;
static const size_t MAXS = 65536;
static CUstream st[4];
static CUevent ev;
static CUdeviceptr dreg, sreg, scratchD; // 2*N*MAXS each; 4 MiB
static char *hreg, *hcont;     // pinned: 2*N*MAXS gapped, N*MAXS contiguous
static std::vector<CUdeviceptr> dsts, srcs, hsrcs, hcon, dsrcs, hdsts;
static std::vector<size_t> lens;

static CUresult batch(CUdeviceptr *d, CUdeviceptr *s, size_t *n, size_t cnt, int order, unsigned flags, bool hint, CUstream stream) {
	CUmemcpyAttributes a;
	memset(&a, 0, sizeof a);
	a.srcAccessOrder = (CUmemcpySrcAccessOrder)order;
	a.flags = flags;
	if (hint) {
		a.srcLocHint.type = CU_MEM_LOCATION_TYPE_HOST;
		a.dstLocHint.type = CU_MEM_LOCATION_TYPE_DEVICE;
		a.dstLocHint.id = 0;
	}
	size_t idx = 0;
#if CUDA_VERSION >= 13000
	return cuMemcpyBatchAsync(d, s, n, cnt, &a, &idx, 1, stream);
#else
	size_t fail = 0;
	return cuMemcpyBatchAsync(d, s, n, cnt, &a, &idx, 1, &fail, stream);
#endif
}

// copyv queues the N copies d[i] <- s[i] with variant v; syncs every stream.
static CUresult copyv(const std::string &v, CUdeviceptr *d, CUdeviceptr *s, size_t *n) {
	int ns = 1;
	if (v == "batch") CK(batch(d, s, n, N, CU_MEMCPY_SRC_ACCESS_ORDER_STREAM, 0, false, st[0]));
	else if (v == "batch_any") CK(batch(d, s, n, N, CU_MEMCPY_SRC_ACCESS_ORDER_ANY, 0, false, st[0]));
	else if (v == "batch_api") CK(batch(d, s, n, N, CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL, 0, false, st[0]));
	else if (v == "batch_overlap") CK(batch(d, s, n, N, CU_MEMCPY_SRC_ACCESS_ORDER_STREAM, CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE, false, st[0]));
	else if (v == "batch_hint") CK(batch(d, s, n, N, CU_MEMCPY_SRC_ACCESS_ORDER_STREAM, 0, true, st[0]));
	else if (v == "batch_c16" || v == "batch_c256") {
		int c = v == "batch_c16" ? 16 : 256;
		for (int i = 0; i < N; i += c) CK(batch(d + i, s + i, n + i, std::min(c, N - i), CU_MEMCPY_SRC_ACCESS_ORDER_STREAM, 0, false, st[0]));
	} else if (v == "loop") {
		for (int i = 0; i < N; i++) CK(cuMemcpyAsync(d[i], s[i], n[i], st[0]));
	} else if (v == "loop_htod") {
		for (int i = 0; i < N; i++) CK(cuMemcpyHtoDAsync(d[i], (const void *)s[i], n[i], st[0]));
	} else if (v == "loop2" || v == "loop4") {
		ns = v == "loop2" ? 2 : 4;
		for (int k = 0; k < ns; k++)
			for (int i = k * N / ns; i < (k + 1) * N / ns; i++) CK(cuMemcpyAsync(d[i], s[i], n[i], st[k]));
	} else if (v.rfind("pre_", 0) == 0 || v.rfind("gate_", 0) == 0 || v.rfind("dpre_", 0) == 0) {
		// Something on the copy engines first, so that the stream is busy
		// when the small copies arrive: pre_ a 64 KiB H2D copy on the
		// stream; dpre_ a 64 KiB D2H copy; gate_ the stream waits for a
		// 4 MiB H2D copy on another stream.
		std::string rest = v.substr(v.find('_') + 1);
		if (v[0] == 'p') CK(cuMemcpyHtoDAsync(scratchD, hcont, 65536, st[0]));
		else if (v[0] == 'd') CK(cuMemcpyDtoHAsync(hcont, scratchD, 65536, st[0]));
		else {
			CK(cuMemcpyHtoDAsync(scratchD, hcont, 4 << 20, st[3]));
			CK(cuEventRecord(ev, st[3]));
			CK(cuStreamWaitEvent(st[0], ev, 0));
		}
		CUresult rc = copyv(rest, d, s, n);
		if (rc != CUDA_SUCCESS) return rc;
		CK(cuStreamSynchronize(st[3]));
		return CUDA_SUCCESS;
	} else if (v[0] == 'c' && atoi(v.c_str() + 1) > 0) {
		int c = atoi(v.c_str() + 1);
		for (int i = 0; i < N; i += c) CK(batch(d + i, s + i, n + i, std::min(c, N - i), CU_MEMCPY_SRC_ACCESS_ORDER_STREAM, 0, false, st[0]));
	} else if (v == "single") {
		CK(cuMemcpyAsync(d[0], s[0], n[0], st[0]));
	} else if (v == "event") {
		CK(cuEventRecord(ev, st[0]));
	} else {
		printf("error unknown variant %s\n", v.c_str());
		return CUDA_ERROR_INVALID_VALUE;
	}
	for (int k = 0; k < ns; k++) CK(cuStreamSynchronize(st[k]));
	return CUDA_SUCCESS;
}

static CUresult runOnce(const std::string &scen, const std::string &v) {
	if (scen == "h2d") return copyv(v, dsts.data(), hsrcs.data(), lens.data());
	if (scen == "d2h") return copyv(v, hdsts.data(), dsrcs.data(), lens.data());
	if (scen == "stage") {
		CK(batch(hcon.data(), dsrcs.data(), lens.data(), N, CU_MEMCPY_SRC_ACCESS_ORDER_STREAM, 0, false, st[0]));
		CK(cuStreamSynchronize(st[0]));
		return copyv(v, dsts.data(), hcon.data(), lens.data());
	}
	printf("error unknown scenario %s\n", scen.c_str());
	return CUDA_ERROR_INVALID_VALUE;
}

int main() {
	setvbuf(stdout, nullptr, _IOLBF, 0);
	CUdevice dev;
	CUcontext ctx;
	CK(cuInit(0));
	CK(cuDeviceGet(&dev, 0));
	CK(cuDevicePrimaryCtxRetain(&ctx, dev));
	CK(cuCtxSetCurrent(ctx));
	int drv = 0;
	cuDriverGetVersion(&drv);
	for (auto &s : st) CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	CK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
	size_t region = 2 * (size_t)N * MAXS;
	CK(cuMemAlloc(&dreg, region));
	CK(cuMemAlloc(&sreg, region));
	CK(cuMemAlloc(&scratchD, 4 << 20));
	CK(cuMemHostAlloc((void **)&hreg, region, CU_MEMHOSTALLOC_PORTABLE));
	CK(cuMemHostAlloc((void **)&hcont, (size_t)N * MAXS, CU_MEMHOSTALLOC_PORTABLE));
	memset(hreg, 1, region);
	memset(hcont, 2, (size_t)N * MAXS);
	printf("ready driver=%d cuda_h=%d\n", drv, CUDA_VERSION);
	std::mt19937_64 rng(42);
	char line[256];
	while (fgets(line, sizeof line, stdin)) {
		char scen[32], var[32];
		size_t S = 0;
		int reps = 0;
		if (!strncmp(line, "quit", 4)) break;
		if (sscanf(line, "run %31s %31s %zu %d", scen, var, &S, &reps) != 4 || S == 0 || S > MAXS || reps < 1) {
			printf("error bad command\n");
			continue;
		}
		size_t slots = 2 * (size_t)N;
		std::vector<size_t> a(slots), b(slots), c(slots);
		for (size_t i = 0; i < slots; i++) a[i] = b[i] = c[i] = i;
		std::shuffle(a.begin(), a.end(), rng);
		std::shuffle(b.begin(), b.end(), rng);
		std::shuffle(c.begin(), c.end(), rng);
		std::sort(a.begin(), a.begin() + N);
		dsts.resize(N); srcs.resize(N); hsrcs.resize(N); hcon.resize(N); dsrcs.resize(N); hdsts.resize(N);
		lens.assign(N, S);
		for (int i = 0; i < N; i++) {
			dsts[i] = dreg + b[i] * S;
			dsrcs[i] = sreg + a[i] * S;
			hsrcs[i] = (CUdeviceptr)(hreg + a[i] * S);
			hdsts[i] = (CUdeviceptr)(hreg + c[i] * S);
			hcon[i] = (CUdeviceptr)(hcont + (size_t)i * S);
		}
		std::string sc(scen), v(var);
		std::vector<double> t;
		bool bad = false;
		for (int r = 0; r < (reps > 1 ? reps + 1 : 1); r++) {
			double t0 = mono();
			if (runOnce(sc, v) != CUDA_SUCCESS) { bad = true; break; }
			if (reps == 1 || r > 0) t.push_back((mono() - t0) * 1e3);
		}
		if (bad) continue; // the error line was printed
		std::sort(t.begin(), t.end());
		printf("result best_ms=%.3f median_ms=%.3f\n", t[0], t[t.size() / 2]);
	}
	return 0;
}
