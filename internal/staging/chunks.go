package staging

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
// (one copy beats many for dense small blocks: staging.PlanRead's cost
// model); the second hop is always per block (or piece of a block), so no
// destination gap is written.
type ChunkPlan struct {
	InSrc, InHost, InLen    []uint64
	OutDst, OutHost, OutLen []uint64
	InEnds, OutEnds         []int
	read                    Plan
}

// MinStagedChunks is how many chunks a batch is cut into at least (when it
// has the bytes for it), so that the two hops overlap even for a batch that
// fits one half.
const MinStagedChunks = 4

// MinStagedChunk is the smallest chunk worth its own pair of copy calls.
const MinStagedChunk = 256 << 10

// ChunkBytes is the chunk size for a batch of total bytes through halves of
// half bytes: at most half, at least MinStagedChunk, and small enough for
// MinStagedChunks chunks.
func ChunkBytes(total, half uint64) uint64 {
	c := (total + MinStagedChunks - 1) / MinStagedChunks
	c = max(c, MinStagedChunk)
	return max(min(c, half), 1)
}

func (p *ChunkPlan) reset() {
	p.InSrc, p.InHost, p.InLen = p.InSrc[:0], p.InHost[:0], p.InLen[:0]
	p.OutDst, p.OutHost, p.OutLen = p.OutDst[:0], p.OutHost[:0], p.OutLen[:0]
	p.InEnds, p.OutEnds = p.InEnds[:0], p.OutEnds[:0]
}

// PlanStaged fills p (reusing its arrays) for the blocks srcBase+src[i] ->
// dstBase+dst[i] of lens[i] bytes, in chunks of at most chunk bytes of the
// buffer, alternating between the halves at hostBase and hostBase+half.
// chunk is clamped to [1, half]. Where every block fits a chunk, each
// chunk's first hop is planned by PlanRead (a covering copy for dense small
// blocks); a block larger than a chunk is cut into pieces (PlanChunks).
func PlanStaged(p *ChunkPlan, srcBase, dstBase uint64, src, dst, lens []uint64, hostBase, half, chunk uint64) {
	chunk = max(min(chunk, half), 1)
	for _, n := range lens {
		if n > chunk || n == 0 {
			PlanChunks(p, srcBase, dstBase, src, dst, lens, hostBase, half, chunk)
			return
		}
	}
	p.reset()
	for lo, k := 0, 0; lo < len(lens); k++ {
		n := PlanRead(&p.read, src[lo:], lens[lo:], chunk)
		h := hostBase + uint64(k%2)*half
		for _, op := range p.read.Ops {
			p.InSrc = append(p.InSrc, srcBase+op.Dev)
			p.InHost = append(p.InHost, h+op.Host)
			p.InLen = append(p.InLen, op.Len)
		}
		for i := 0; i < n; i++ {
			p.OutDst = append(p.OutDst, dstBase+dst[lo+i])
			p.OutHost = append(p.OutHost, h+p.read.HostOff[i])
			p.OutLen = append(p.OutLen, lens[lo+i])
		}
		p.InEnds = append(p.InEnds, len(p.InLen))
		p.OutEnds = append(p.OutEnds, len(p.OutLen))
		lo += n
	}
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
