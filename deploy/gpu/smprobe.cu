// smprobe: the occupancy proof that b2bd's copies use no SMs (gpu-check's
// second proof, independent of ncu, which does not list the kernels the
// driver runs for same-device copies).
//
// On every GPU given, a persistent "spin" kernel holds every SM slot: gridDim
// = SMs x max resident blocks per SM, blockDim = max threads per SM / max
// blocks per SM, so both the block and the thread slots of every SM are
// full. Each block spins on %globaltimer for --ms milliseconds and records
// the largest gap between two of its reads: another context time-sliced
// onto the SMs (a kernel from another process) stalls every block for its
// time slice, seen as a gap; copy engines stall nothing.
//
// Driven over stdin/stdout (deploy/gpu/smprobe.py) so that the driver can
// start a b2bd batch the moment every block is resident:
//   at start:  "ready dev=D sms=N blocks_per_sm=B threads=T grid=G" per GPU, then "ready"
//   "spin":    launches the spin on every GPU, waits until every block runs,
//              prints "spinning T0" (CLOCK_MONOTONIC seconds), launches the
//              in-process positive control (a 1-block kernel on another stream
//              of GPU 0, which must wait for the spin: every slot is taken),
//              and when all ended prints
//              "done launched=T spin_end=T control_launched=T control_done=T resident=0|1
//               maxgap_us=F gap_blocks=N blocks=N gaps=DEV/BLOCK@OFF:LEN,..."
//              (spin_end: the first GPU's spin end, as the host saw it;
//              gap_blocks: blocks whose largest gap was at least --gap-us;
//              gaps: the first gaps >= --gap-us of the first and last block of
//              each GPU, offset from the block's start and length in us).
//              The in-process control is launched at mid-spin, after the half
//              in which a batch must end.
//   "quit"
// Build: nvcc -O2 -o smprobe smprobe.cu     Run: ./smprobe [--ms 400] [--devices 0,1] [--gap-us 100]
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <vector>
#include <string>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "smprobe: %s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)

static double mono() { struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts); return ts.tv_sec + ts.tv_nsec * 1e-9; }

__device__ __forceinline__ unsigned long long gtimer() { unsigned long long t; asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t)); return t; }

#define KGAPS 16
// Each block spins for ns and keeps its largest gap between two timer reads
// and (thread 0) the first KGAPS gaps of at least thr ns: start offset from
// the block's start and length, in microseconds.
__global__ void spin(unsigned long long ns, unsigned long long thr, unsigned int *started, unsigned long long *maxgap, unsigned int *gaps) {
	unsigned long long t0 = gtimer(), last = t0, mx = 0;
	unsigned int ng = 0;
	if (threadIdx.x == 0) { atomicAdd(started, 1u); __threadfence_system(); }
	__syncthreads();
	last = gtimer(); // the start-up atomics over PCIe are not a stall
	for (;;) {
		unsigned long long t = gtimer(), g = t - last;
		if (g > mx) mx = g;
		if (g >= thr && threadIdx.x == 0 && ng < KGAPS) {
			gaps[(blockIdx.x * KGAPS + ng) * 2] = (unsigned int)((last - t0) / 1000);
			gaps[(blockIdx.x * KGAPS + ng) * 2 + 1] = (unsigned int)(g / 1000);
			ng++;
		}
		last = t;
		if (t - t0 >= ns) break;
	}
	if (threadIdx.x == 0) { maxgap[blockIdx.x] = mx; for (unsigned int i = ng; i < KGAPS; i++) gaps[(blockIdx.x * KGAPS + i) * 2 + 1] = 0; }
}

__global__ void control(int *p) { if (p) *p += 1; }

struct Dev {
	int id, sms, bps, threads, grid;
	cudaStream_t spin, ctl;
	cudaEvent_t spinDone, ctlDone;
	unsigned int *started_h, *started_d;
	unsigned long long *gap_d;
	unsigned int *gl_d;
	std::vector<unsigned long long> gap_h;
	std::vector<unsigned int> gl_h;
};

int main(int argc, char **argv) {
	double ms = 400, gap_us = 100;
	std::vector<int> ids;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--ms") && i + 1 < argc) ms = atof(argv[++i]);
		else if (!strcmp(argv[i], "--gap-us") && i + 1 < argc) gap_us = atof(argv[++i]);
		else if (!strcmp(argv[i], "--devices") && i + 1 < argc) {
			for (char *s = strtok(argv[++i], ","); s; s = strtok(nullptr, ",")) ids.push_back(atoi(s));
		} else { fprintf(stderr, "usage: smprobe [--ms 400] [--devices 0,1] [--gap-us 100]\n"); return 2; }
	}
	if (ids.empty()) ids.push_back(0);
	setvbuf(stdout, nullptr, _IOLBF, 0);
	unsigned long long thr = (unsigned long long)(gap_us * 1000);
	std::vector<Dev> devs(ids.size());
	for (size_t k = 0; k < ids.size(); k++) {
		Dev &d = devs[k];
		d.id = ids[k];
		CK(cudaSetDevice(d.id));
		cudaDeviceProp p;
		CK(cudaGetDeviceProperties(&p, d.id));
		d.sms = p.multiProcessorCount;
		d.threads = p.maxThreadsPerMultiProcessor / p.maxBlocksPerMultiProcessor;
		CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&d.bps, spin, d.threads, 0));
		d.grid = d.sms * d.bps;
		CK(cudaStreamCreateWithFlags(&d.spin, cudaStreamNonBlocking));
		CK(cudaStreamCreateWithFlags(&d.ctl, cudaStreamNonBlocking));
		CK(cudaEventCreateWithFlags(&d.spinDone, cudaEventDisableTiming));
		CK(cudaEventCreateWithFlags(&d.ctlDone, cudaEventDisableTiming));
		CK(cudaHostAlloc(&d.started_h, sizeof(unsigned int), cudaHostAllocMapped));
		CK(cudaHostGetDevicePointer(&d.started_d, d.started_h, 0));
		CK(cudaMalloc(&d.gap_d, d.grid * sizeof(unsigned long long)));
		d.gap_h.resize(d.grid);
		CK(cudaMalloc(&d.gl_d, d.grid * KGAPS * 2 * sizeof(unsigned int)));
		d.gl_h.resize(d.grid * KGAPS * 2);
		// warm up both kernels (module load, first launch)
		spin<<<d.grid, d.threads, 0, d.spin>>>(1000000ull, thr, d.started_d, d.gap_d, d.gl_d);
		control<<<1, 1, 0, d.ctl>>>(nullptr);
		CK(cudaDeviceSynchronize());
		printf("ready dev=%d sms=%d blocks_per_sm=%d threads=%d grid=%d max_threads_per_sm=%d max_blocks_per_sm=%d name=\"%s\"\n",
			d.id, d.sms, d.bps, d.threads, d.grid, p.maxThreadsPerMultiProcessor, p.maxBlocksPerMultiProcessor, p.name);
	}
	printf("ready\n");
	char line[256];
	while (fgets(line, sizeof line, stdin)) {
		if (!strncmp(line, "quit", 4)) break;
		if (strncmp(line, "spin", 4)) { printf("error unknown command\n"); continue; }
		double launched = mono();
		for (Dev &d : devs) {
			CK(cudaSetDevice(d.id));
			*(volatile unsigned int *)d.started_h = 0;
			spin<<<d.grid, d.threads, 0, d.spin>>>((unsigned long long)(ms * 1e6), thr, d.started_d, d.gap_d, d.gl_d);
			CK(cudaGetLastError());
			CK(cudaEventRecord(d.spinDone, d.spin));
		}
		bool resident = true;
		double t0 = mono();
		for (Dev &d : devs)
			while (*(volatile unsigned int *)d.started_h < (unsigned)d.grid) {
				if (mono() - t0 > ms / 1000) { resident = false; break; }
			}
		double spinning = mono();
		printf("spinning %.6f\n", spinning);
		// The in-process control goes in at mid-spin: after the first half,
		// in which a batch must end, so that nothing it causes is blamed on
		// the batch.
		Dev &c = devs[0];
		while (mono() < spinning + ms / 2000) usleep(100);
		double ctlLaunched = mono();
		CK(cudaSetDevice(c.id));
		control<<<1, 1, 0, c.ctl>>>(nullptr);
		CK(cudaEventRecord(c.ctlDone, c.ctl));
		double spinEnd = 0, ctlDone = 0;
		std::vector<bool> ended(devs.size(), false);
		size_t left = devs.size();
		while (left > 0 || ctlDone == 0) {
			if (ctlDone == 0 && cudaEventQuery(c.ctlDone) == cudaSuccess) ctlDone = mono();
			for (size_t k = 0; k < devs.size(); k++)
				if (!ended[k] && cudaEventQuery(devs[k].spinDone) == cudaSuccess) {
					ended[k] = true; left--;
					if (k == 0) spinEnd = mono();
				}
			usleep(20);
		}
		double maxgap = 0;
		int gapBlocks = 0, blocks = 0;
		for (Dev &d : devs) {
			CK(cudaSetDevice(d.id));
			CK(cudaMemcpy(d.gap_h.data(), d.gap_d, d.grid * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
			CK(cudaMemcpy(d.gl_h.data(), d.gl_d, d.gl_h.size() * sizeof(unsigned int), cudaMemcpyDeviceToHost));
			for (unsigned long long g : d.gap_h) {
				double us = g / 1e3;
				if (us > maxgap) maxgap = us;
				if (us >= gap_us) gapBlocks++;
				blocks++;
			}
		}
		// gaps=off:len,... (us) of block 0 and of the last block of every GPU
		std::string gl;
		for (Dev &d : devs)
			for (int b : {0, d.grid - 1})
				for (int i = 0; i < KGAPS; i++) {
					unsigned int off = d.gl_h[(b * KGAPS + i) * 2], len = d.gl_h[(b * KGAPS + i) * 2 + 1];
					if (!len) break;
					char buf[64];
					snprintf(buf, sizeof buf, "%s%d/%d@%u:%u", gl.empty() ? "" : ",", d.id, b, off, len);
					gl += buf;
				}
		printf("done launched=%.6f spin_end=%.6f control_launched=%.6f control_done=%.6f resident=%d maxgap_us=%.1f gap_blocks=%d blocks=%d gaps=%s\n",
			launched, spinEnd, ctlLaunched, ctlDone, resident ? 1 : 0, maxgap, gapBlocks, blocks, gl.empty() ? "-" : gl.c_str());
	}
	return 0;
}
