package local

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"unsafe"

	"github.com/b2bd/b2bd/gpudirect"
	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/staging"
)

// Same-device GPU batches (source and destination on one physical GPU) are
// staged through pinned host memory: the driver runs device-to-device
// copies within one GPU as kernels on the SMs, whatever the API (measured
// with a kernel holding every SM: deploy/gpu/smprobe.cu), while
// device-to-host and host-to-device copies run on the copy engines (the
// latter in primed chunks: gpudirect's cuda_shim.h says why). Each
// chunk goes device -> host (one batched copy on the D2H stream), then
// host -> device (one batched copy on the H2D stream of its buffer half),
// so the second hop of chunk k overlaps the first hop of chunk k+1. The
// first hop reads in source order, through gaps of up to gap bytes
// (staging.PlanStagedGap): small blocks scattered over a region cost a few
// large device-to-host copies, not one each, which made 128 B batches
// three times slower than TCP's (which covers the whole batch in one copy).

// stage is one device's staging buffer and streams, shared by every
// connection of the transport (a batch holds it for its copies).
type stage struct {
	mu   sync.Mutex
	dev  int
	buf  []byte
	d2h  *gpudirect.Stream
	h2d  [maxSplit]*gpudirect.Stream
	plan staging.ChunkPlan
	// gap is the widest source gap one first-hop copy reads through
	// (staging.MergeGap; tests and measurements vary it).
	gap uint64
	// chunk overrides staging.ChunkBytes where non-zero (measurements).
	chunk uint64
	// split is how many streams one chunk's second hop is spread over (1
	// to maxSplit; calibrate picks it).
	split int
	// done[h][j] is recorded on h2d[j] behind the last second-hop part
	// read from half h.
	done [2][maxSplit]*gpudirect.Event
	// note is what calibrate measured, for Status.
	note string
	// out is the second hop of one chunk of copyToHost, for the CPU.
	out desc.Batch
	// one is toHostOneRange's copy: its destination, source and size;
	// oneSrc its blocks' offsets in the buffer, for the CPU's shares.
	one    [3]uint64
	oneSrc []uint64
}

// routeStaged and routeDirect name a same-device batch's path in Status.
const (
	routeStaged = "same-GPU batches: staged through pinned host memory (device->host in source order, covering gaps, then host->device per block in primed chunks of 256: copy engines, 0 SMs)"
	routeDirect = "same-GPU batches: direct device copies (configured: the driver runs them on SMs)"
	routeCross  = "GPU-to-GPU batches: direct peer copies (copy engines, 0 SMs)"
	routeToHost = "GPU-to-host batches of small blocks: device->host covering copies into the stage, then the CPU"
)

// ensureStage allocates dev's staging buffer and streams once, when the
// first GPU region of dev registers: never in a batch. A failure is kept
// and reported by Status and by the same-device batches that needed it.
func (t *Transport) ensureStage(dev int) {
	if t.cfg.SameDeviceDirect || t.cfg.CUDA == nil {
		return
	}
	t.stageMu.Lock()
	defer t.stageMu.Unlock()
	if t.stages[dev] != nil || t.stageErr[dev] != nil {
		return
	}
	s, err := newStage(t.cfg.CUDA, dev, t.cfg.StageBytes)
	if err != nil {
		t.stageErr[dev] = err
		t.log.Warn("no staging buffer: same-device GPU batches on this device will be refused", "device", dev, "error", err)
		return
	}
	if err := s.calibrate(t.cfg.CUDA); err != nil {
		t.log.Warn("staging calibration failed: the second hop stays on one stream", "device", dev, "error", err)
	}
	t.stages[dev] = s
}

func newStage(cu gpudirect.Interface, dev, size int) (*stage, error) {
	size &^= 1
	buf, err := cu.HostAlloc(dev, size)
	if err != nil {
		return nil, fmt.Errorf("samehost: pinned staging buffer of %d bytes on device %d: %w", size, dev, staging.DomainError(err))
	}
	s := &stage{dev: dev, buf: buf, gap: staging.MergeGap, split: 1}
	for _, p := range s.streamSlots() {
		if *p, err = cu.StreamCreate(dev); err != nil {
			_ = s.close(cu)
			return nil, fmt.Errorf("samehost: staging stream on device %d: %w", dev, staging.DomainError(err))
		}
	}
	for _, p := range s.eventSlots() {
		if *p, err = cu.EventCreate(dev); err != nil {
			_ = s.close(cu)
			return nil, fmt.Errorf("samehost: staging event on device %d: %w", dev, staging.DomainError(err))
		}
	}
	return s, nil
}

func (s *stage) close(cu gpudirect.Interface) error {
	var err error
	for _, p := range s.eventSlots() {
		if e := *p; e != nil {
			if x := cu.EventDestroy(e); x != nil && err == nil {
				err = x
			}
		}
	}
	for _, p := range s.streamSlots() {
		if st := *p; st != nil {
			if e := cu.StreamDestroy(st); e != nil && err == nil {
				err = e
			}
		}
	}
	if s.buf != nil {
		if e := cu.HostFree(s.dev, s.buf); e != nil && err == nil {
			err = e
		}
		s.buf = nil
	}
	return staging.DomainError(err)
}

// stageFor is dev's stage, or why there is none.
func (t *Transport) stageFor(dev int) (*stage, error) {
	t.stageMu.Lock()
	defer t.stageMu.Unlock()
	if s := t.stages[dev]; s != nil {
		return s, nil
	}
	if err := t.stageErr[dev]; err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("samehost: no staging buffer on device %d: no GPU region of that device is registered with this daemon", dev)
}

// routes says which path a same-device and a cross-device GPU batch take.
func (t *Transport) routes() string {
	if t.cfg.CUDA == nil {
		return ""
	}
	if t.cfg.SameDeviceDirect {
		return "; " + routeDirect + "; " + routeCross + t.hostRoute()
	}
	return "; " + routeStaged + t.stageNotes() + "; " + routeCross + "; " + routeToHost + t.hostRoute()
}

// stageNotes is each staged device's calibration, in device order.
func (t *Transport) stageNotes() string {
	t.stageMu.Lock()
	defer t.stageMu.Unlock()
	devs := slices.Sorted(maps.Keys(t.stages))
	var b strings.Builder
	for _, d := range devs {
		if n := t.stages[d].note; n != "" {
			fmt.Fprintf(&b, " [GPU %d: %s]", d, n)
		}
		for _, n := range t.cfg.CUDA.DeviceNotes(d) {
			fmt.Fprintf(&b, " [GPU %d: %s]", d, n)
		}
	}
	return b.String()
}

// host is where the stage's buffer starts.
func (s *stage) host() uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(s.buf)))) }

// planFor plans b through the buffer's halves, whose first byte is at
// hostBase in the plan (its address, or 0 for offsets), in s.chunk
// chunks (ChunkBytes' where 0). s.mu is held.
func (s *stage) planFor(b *desc.Batch, srcBase, dstBase, hostBase uint64) *staging.ChunkPlan {
	half := uint64(len(s.buf) / 2)
	chunk := s.chunk
	if chunk == 0 {
		chunk = staging.ChunkBytes(b.Bytes(), half)
	}
	staging.PlanStagedGap(&s.plan, srcBase, dstBase, b.Src, b.Dst, b.Len, hostBase, half, chunk, s.gap)
	return &s.plan
}

// copyStaged moves b from srcBase to dstBase on one device through s, in
// chunks over the two buffer halves. It waits for every copy it queued,
// also after a failure, before the buffer or the destination is let go.
func copyStaged(ctx context.Context, cu gpudirect.Interface, s *stage, srcBase, dstBase uint64, b *desc.Batch) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.planFor(b, srcBase, dstBase, s.host())
	// pending[h][j]: a host-to-device part from half h queued on stream
	// h2d[j] may still run; s.done[h][j] is recorded behind it.
	var pending [2][maxSplit]bool
	wait := func(h int) error {
		var err error
		for j := range pending[h] {
			if !pending[h][j] {
				continue
			}
			pending[h][j] = false
			if e := cu.EventSynchronize(s.done[h][j]); e != nil && err == nil {
				err = fmt.Errorf("samehost: staged copy, host-to-device hop on device %d: %w", s.dev, staging.DomainError(e))
			}
		}
		return err
	}
	var err error
	inLo, outLo := 0, 0
	for k := range p.InEnds {
		inHi, outHi := p.InEnds[k], p.OutEnds[k]
		h := k % 2
		if err = wait(h); err != nil {
			break
		}
		if err = ctx.Err(); err != nil {
			err = fmt.Errorf("samehost: staged copy cut off after %d of %d chunks: %w", k, len(p.InEnds), err)
			break
		}
		if err = cu.MemcpyBatchAsync(s.d2h, p.InHost[inLo:inHi], p.InSrc[inLo:inHi], p.InLen[inLo:inHi]); err == nil {
			err = cu.StreamSynchronize(s.d2h)
		}
		if err != nil {
			err = fmt.Errorf("samehost: staged copy, device-to-host hop of %d copies on device %d: %w", inHi-inLo, s.dev, staging.DomainError(err))
			break
		}
		if err = s.queueH2D(cu, p, k, outLo, outHi, &pending[h]); err != nil {
			break
		}
		inLo, outLo = inHi, outHi
	}
	if err != nil {
		// A failed call may have queued part of its copies: wait for the
		// streams themselves, not only for what the events mark.
		for _, p := range s.streamSlots() {
			_ = cu.StreamSynchronize(*p)
		}
		return err
	}
	for h := range pending {
		if werr := wait(h); err == nil {
			err = werr
		}
	}
	return err
}

// maxSplit is the most streams one chunk's second hop is split over, and
// minPart the fewest copies a part of it gets (one primed call's worth).
const (
	maxSplit = 4
	minPart  = 256
)

// streamSlots and eventSlots are the stage's streams and events, to make
// and free them in one loop.
func (s *stage) streamSlots() []**gpudirect.Stream {
	out := []**gpudirect.Stream{&s.d2h}
	for j := range s.h2d {
		out = append(out, &s.h2d[j])
	}
	return out
}

func (s *stage) eventSlots() []**gpudirect.Event {
	var out []**gpudirect.Event
	for h := range s.done {
		for j := range s.done[h] {
			out = append(out, &s.done[h][j])
		}
	}
	return out
}

// parts is how many streams a second hop of n copies is split over.
func (s *stage) parts(n int) int {
	return max(1, min(s.split, maxSplit, n/minPart))
}

// queueH2D queues chunk k's second hop, copies [lo, hi) of p: on stream
// h2d[k%2], or split over s.split streams (where it has minPart copies a
// part), queued at once by the device's threads (gpudirect holds the parts'
// streams until all are queued: each primed chunk meets a pending primer);
// it records s.done behind each part and marks it pending. After a failure
// copyStaged waits for the streams themselves.
func (s *stage) queueH2D(cu gpudirect.Interface, p *staging.ChunkPlan, k, lo, hi int, pending *[maxSplit]bool) error {
	h, parts := k%2, s.parts(hi-lo)
	var ss [maxSplit]*gpudirect.Stream
	for j := 0; j < parts; j++ {
		ss[j] = s.h2d[(h+j)%maxSplit]
		pending[(h+j)%maxSplit] = true
	}
	var err error
	if parts > 1 {
		err = cu.MemcpyBatchAsyncParts(ss[:parts], p.OutDst[lo:hi], p.OutHost[lo:hi], p.OutLen[lo:hi])
	} else {
		err = cu.MemcpyBatchAsync(ss[0], p.OutDst[lo:hi], p.OutHost[lo:hi], p.OutLen[lo:hi])
	}
	if err != nil {
		return fmt.Errorf("samehost: staged copy, host-to-device hop of %d copies in %d part(s) on device %d: %w", hi-lo, parts, s.dev, staging.DomainError(err))
	}
	for j := 0; j < parts; j++ {
		st := (h + j) % maxSplit
		if err := cu.EventRecord(s.done[h][st], s.h2d[st]); err != nil {
			return fmt.Errorf("samehost: staged copy, mark the host-to-device hop on device %d: %w", s.dev, staging.DomainError(err))
		}
	}
	return nil
}
