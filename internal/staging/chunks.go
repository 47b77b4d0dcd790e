package staging

import (
	"math/bits"
	"slices"
)

// Same-device copies (GPU memory to GPU memory of ONE device) are run by the
// CUDA driver as kernels on the SMs, whatever the API (batched, with the
// prefer-overlap flag, peer copies, per block, one contiguous copy: measured
// on an H100 with a kernel holding every SM). Device-to-host and
// host-to-device copies run on the copy engines. So a same-device batch is
// staged: each block goes device -> pinned host buffer -> device, two
// copy-engine hops. ChunkPlan cuts a batch into chunks that fit one half of
// a staging buffer, so that the second hop of one chunk overlaps the first
// hop of the next (they use different copy engines).

// ChunkPlan is a batch cut into chunks that each fit one half of the
// staging buffer. The first hop copies InLen[j] bytes from the device address
// InSrc[j] to the host address InHost[j]; the second hop copies OutLen[j]
// bytes from OutHost[j] to the device address OutDst[j]. Chunk k is first-hop
// copies [InEnds[k-1], InEnds[k]) and second-hop copies [OutEnds[k-1],
// OutEnds[k]) (index -1 is 0); they lie in half k%2 of the buffer. A
// first-hop copy may cover several source blocks and the gaps between them
// (one copy beats many for small blocks: MergeGap); the second hop is always
// per block (or piece of a block), so no destination gap is written.
type ChunkPlan struct {
	InSrc, InHost, InLen    []uint64
	OutDst, OutHost, OutLen []uint64
	InEnds, OutEnds         []int
	order, spare            []int32
}

// MinStagedChunks is how many chunks a batch is cut into at least (when it
// has the bytes for it), so that the two hops overlap even for a batch that
// fits one half.
const MinStagedChunks = 4

// MinStagedChunk is the smallest chunk a staging buffer's half may hold.
const MinStagedChunk = 256 << 10

// OverlapChunk is the smallest chunk ChunkBytes plans. A chunk costs a
// synchronised device-to-host call and a host-to-device call of its own,
// and the overlap it buys is the first hop's bytes: at 10,000 x 128 B (a
// 2.5 MB covering read) one chunk took 4.7 ms, three 5.4 ms and eight
// 6.5 ms, while at 4 KiB eight chunks of 10 MB beat three of 32 MiB (7.7
// against 11.5 ms; H200, the local kind's TestGPUStagedSameDevice).
const OverlapChunk = 4 << 20

// ChunkBytes is the chunk size for a batch of total bytes through halves of
// half bytes: at most half, at least OverlapChunk, and small enough for
// MinStagedChunks chunks.
func ChunkBytes(total, half uint64) uint64 {
	c := (total + MinStagedChunks - 1) / MinStagedChunks
	c = max(c, OverlapChunk)
	return max(min(c, half), 1)
}

func (p *ChunkPlan) reset() {
	p.InSrc, p.InHost, p.InLen = p.InSrc[:0], p.InHost[:0], p.InLen[:0]
	p.OutDst, p.OutHost, p.OutLen = p.OutDst[:0], p.OutHost[:0], p.OutLen[:0]
	p.InEnds, p.OutEnds = p.InEnds[:0], p.OutEnds[:0]
}

// MergeGap is the widest source gap a first-hop copy reads through rather
// than start another copy: reading g gap bytes costs g/pcieBytesPS, another
// copy in the batch perBlockCopy, so gaps under their product are cheaper to
// read (8 KB with the constants in plan.go).
const MergeGap = uint64(perBlockCopy * pcieBytesPS)

// PlanStaged fills p (reusing its arrays) for the blocks srcBase+src[i] ->
// dstBase+dst[i] of lens[i] bytes, in chunks of at most chunk bytes of the
// buffer, alternating between the halves at hostBase and hostBase+half.
// chunk is clamped to [1, half]. It is PlanStagedGap with MergeGap.
func PlanStaged(p *ChunkPlan, srcBase, dstBase uint64, src, dst, lens []uint64, hostBase, half, chunk uint64) {
	PlanStagedGap(p, srcBase, dstBase, src, dst, lens, hostBase, half, chunk, MergeGap)
}

// PlanStagedGap plans the first hop in source order, whatever the batch's
// order: blocks whose sources lie at most gap bytes apart are read by one
// copy of the range that covers them (gaps included) into the chunk, so a
// batch of small blocks scattered over a region costs a few large
// device-to-host copies instead of one per block (a batched copy costs about
// the same per copy at 128 B as at 16 KiB). A block that does not fit what
// is left of a chunk starts the next one; a block larger than a chunk is cut
// into pieces. The second hop is per block (or piece), so no destination gap
// is written. gap 0 still merges blocks that touch or overlap in the source.
func PlanStagedGap(p *ChunkPlan, srcBase, dstBase uint64, src, dst, lens []uint64, hostBase, half, chunk, gap uint64) {
	p.reset()
	chunk = max(min(chunk, half), 1)
	order := p.sourceOrder(src, lens)
	var (
		used           uint64 // host bytes of the current chunk
		k              int    // current chunk
		open           bool   // a first-hop copy is being extended
		runSrc, runEnd uint64 // its source range (offsets)
		runHost        uint64 // its offset in the chunk
	)
	closeRun := func() {
		if open {
			p.InSrc = append(p.InSrc, srcBase+runSrc)
			p.InHost = append(p.InHost, hostBase+uint64(k%2)*half+runHost)
			p.InLen = append(p.InLen, runEnd-runSrc)
			open = false
		}
	}
	closeChunk := func() {
		closeRun()
		if len(p.OutLen) > 0 && (len(p.OutEnds) == 0 || p.OutEnds[len(p.OutEnds)-1] < len(p.OutLen)) {
			p.InEnds = append(p.InEnds, len(p.InLen))
			p.OutEnds = append(p.OutEnds, len(p.OutLen))
			k++
		}
		used = 0
	}
	out := func(d, off, n uint64) {
		p.OutDst = append(p.OutDst, dstBase+d)
		p.OutHost = append(p.OutHost, hostBase+uint64(k%2)*half+off)
		p.OutLen = append(p.OutLen, n)
	}
	for _, i := range order {
		s, d, n := src[i], dst[i], lens[i]
		if open && s >= runSrc && s <= runEnd+gap {
			if end := max(runEnd, s+n); runHost+(end-runSrc) <= chunk {
				out(d, runHost+(s-runSrc), n)
				runEnd = end
				used = runHost + (end - runSrc)
				continue
			}
		}
		for n > 0 {
			closeRun()
			if used == chunk || (used+n > chunk && n <= chunk) {
				closeChunk()
			}
			take := min(n, chunk-used)
			open, runSrc, runEnd, runHost = true, s, s+take, used
			out(d, used, take)
			used += take
			s, d, n = s+take, d+take, n-take
		}
	}
	closeChunk()
}

// sourceOrder is the indices of the non-empty blocks by source offset
// (stable), kept in p; a batch already in source order is not sorted. An LSD
// radix sort on the offsets' significant bits: a comparison sort of 10,000
// blocks cost more than the copies it saves.
func (p *ChunkPlan) sourceOrder(src, lens []uint64) []int32 {
	p.order = p.order[:0]
	sorted := true
	lo, hi := ^uint64(0), uint64(0)
	for i, n := range lens {
		if n == 0 {
			continue
		}
		if k := len(p.order); k > 0 && src[p.order[k-1]] > src[i] {
			sorted = false
		}
		lo, hi = min(lo, src[i]), max(hi, src[i])
		p.order = append(p.order, int32(i))
	}
	if sorted {
		return p.order
	}
	const digit = 11
	p.spare = slices.Grow(p.spare[:0], len(p.order))[:len(p.order)]
	a, b := p.order, p.spare
	for shift := 0; shift < bits.Len64(hi-lo); shift += digit {
		var count [1<<digit + 1]int
		for _, i := range a {
			count[(src[i]-lo)>>shift&(1<<digit-1)+1]++
		}
		for d := 1; d < len(count); d++ {
			count[d] += count[d-1]
		}
		for _, i := range a {
			d := (src[i] - lo) >> shift & (1<<digit - 1)
			b[count[d]] = i
			count[d]++
		}
		a, b = b, a
	}
	p.order, p.spare = a, b
	return p.order
}

// PlanChunks is PlanStaged with every block copied on its own in both hops,
// cut into pieces where it straddles a chunk's end; a zero-length block
// yields no copy.
func PlanChunks(p *ChunkPlan, srcBase, dstBase uint64, src, dst, lens []uint64, hostBase, half, chunk uint64) {
	p.reset()
	if chunk == 0 || chunk > half {
		chunk = half
	}
	if chunk == 0 {
		return
	}
	var used uint64 // bytes of the current chunk
	k := 0          // current chunk
	for i, n := range lens {
		s, d := srcBase+src[i], dstBase+dst[i]
		for n > 0 {
			if used == chunk {
				p.InEnds = append(p.InEnds, len(p.InLen))
				k, used = k+1, 0
			}
			take := min(n, chunk-used)
			h := hostBase + uint64(k%2)*half + used
			p.InSrc, p.InHost, p.InLen = append(p.InSrc, s), append(p.InHost, h), append(p.InLen, take)
			used += take
			s, d, n = s+take, d+take, n-take
			p.OutDst = append(p.OutDst, d-take)
		}
	}
	if used > 0 {
		p.InEnds = append(p.InEnds, len(p.InLen))
	}
	p.OutHost = append(p.OutHost, p.InHost...)
	p.OutLen = append(p.OutLen, p.InLen...)
	p.OutEnds = append(p.OutEnds, p.InEnds...)
}
