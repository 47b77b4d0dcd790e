package staging

// Same-device copies (GPU memory to GPU memory of ONE device) are run by the
// CUDA driver as kernels on the SMs, whatever the API (batched, with the
// prefer-overlap flag, peer copies, per block, one contiguous copy: measured
// on an H100 with a kernel holding every SM, issue 21). Device-to-host and
// host-to-device copies run on the copy engines. So a same-device batch is
// staged: each block goes device -> pinned host buffer -> device, two
// copy-engine hops. ChunkPlan cuts a batch into chunks that fit one half of
// a staging buffer, so that the second hop of one chunk overlaps the first
// hop of the next (they use different copy engines).

// ChunkPlan is a batch cut into pieces (a block, or part of a block that
// straddles a chunk's end). Piece j copies Len[j] bytes from the device
// address Src[j] to the host address Host[j] (first hop), then from Host[j]
// to the device address Dst[j] (second hop). Chunk k is the pieces
// [Ends[k-1], Ends[k]) (Ends[-1] = 0); its pieces lie in half k%2 of the
// buffer, packed from the half's start.
type ChunkPlan struct {
	Src, Dst, Host, Len []uint64
	Ends                []int
}

// MinStagedChunks is how many chunks a batch is cut into at least (when it
// has the bytes for it), so that the two hops overlap even for a batch that
// fits one half.
const MinStagedChunks = 4

// MinStagedChunk is the smallest chunk worth its own pair of copy calls.
const MinStagedChunk = 256 << 10

// ChunkBytes is the chunk size PlanChunks uses for a batch of total bytes
// through halves of half bytes: at most half, at least MinStagedChunk, and
// small enough for MinStagedChunks chunks.
func ChunkBytes(total, half uint64) uint64 {
	c := (total + MinStagedChunks - 1) / MinStagedChunks
	c = max(c, MinStagedChunk)
	return max(min(c, half), 1)
}

// PlanChunks fills p (reusing its arrays) with the pieces of the blocks
// srcBase+src[i] -> dstBase+dst[i] of lens[i] bytes, in block order, in
// chunks of at most chunk bytes alternating between the buffer halves at
// hostBase and hostBase+half. chunk must be in [1, half]; a zero-length
// block yields no piece.
func PlanChunks(p *ChunkPlan, srcBase, dstBase uint64, src, dst, lens []uint64, hostBase, half, chunk uint64) {
	p.Src, p.Dst, p.Host, p.Len, p.Ends = p.Src[:0], p.Dst[:0], p.Host[:0], p.Len[:0], p.Ends[:0]
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
				p.Ends = append(p.Ends, len(p.Len))
				k, used = k+1, 0
			}
			take := min(n, chunk-used)
			p.Src = append(p.Src, s)
			p.Dst = append(p.Dst, d)
			p.Host = append(p.Host, hostBase+uint64(k%2)*half+used)
			p.Len = append(p.Len, take)
			used += take
			s, d, n = s+take, d+take, n-take
		}
	}
	if used > 0 {
		p.Ends = append(p.Ends, len(p.Len))
	}
}
