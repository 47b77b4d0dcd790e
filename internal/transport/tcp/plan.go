package tcp

import (
	"encoding/binary"
	"fmt"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memory"
)

// plan is a host batch's wire work, built once: the split into one share per
// stream, the frames of each share with their header and segment table
// already encoded, and each frame's write list as source ranges and staged
// runs. Sending it only patches the batch number into the headers, copies
// the small blocks into the stream's staging buffer and writes. An ad hoc
// Write builds one into the conn's scratch plan (reused, no allocation); a
// prepared batch keeps its own.
type plan struct {
	key     uint64
	streams uint32   // shares used (the header's stream count)
	shares  []span   // per share: its frames, [lo,hi) of frames
	frames  []pframe // every share's frames, in order
	hdr     []byte   // every frame's header and segment table, concatenated
	pieces  []piece  // every frame's write list after its header
	copies  []copyOp // every frame's small blocks to stage
	segs    uint64   // blocks
	bytes   uint64
	// used is the batch the frames were built from: the caller's, or it
	// with blocks over a frame's payload cut into pieces (split, reused).
	used  desc.Batch
	split desc.Batch
	// A read plan (read.go): built from the swapped batch, so used.Src are
	// our offsets; the destination and the peer's region name.
	read     bool
	readMem  memory.Memory
	readName string
}

type span struct{ lo, hi int }

// pframe is one frame: its header and table hdr[hdrLo:hdrHi], its write list
// pieces[pc.lo:pc.hi], its staging copies copies[cp.lo:cp.hi] and its blocks
// [blk.lo, blk.hi) of the batch (for error messages).
type pframe struct {
	hdrLo, hdrHi int
	pc, cp, blk  span
}

// piece is one iovec of a frame: n bytes at off in the source, or, staged,
// at off in the stream's staging buffer.
type piece struct {
	off, n uint64
	staged bool
}

// copyOp stages n bytes of the source at src into the staging buffer at at.
type copyOp struct{ src, at, n uint64 }

// reset empties p keeping its capacity.
func (p *plan) reset() {
	*p = plan{shares: p.shares[:0], frames: p.frames[:0], hdr: p.hdr[:0], pieces: p.pieces[:0], copies: p.copies[:0],
		split: desc.Batch{Src: p.split.Src[:0], Dst: p.split.Dst[:0], Len: p.split.Len[:0]}}
}

// minShareBlocks is the blocks per extra stream (see build).
const minShareBlocks = 2048

// planLimits are the conn's parameters a plan is built with.
type planLimits struct {
	streams    int    // streams available
	minShare   uint64 // bytes per extra stream
	frameBytes uint64 // payload per frame
	smallCap   uint64 // a stream's staging buffer
}

// checkBounds makes sure every block lies inside the source (srcLen bytes)
// and the destination (dstSize; 0: unknown), so that building and sending a
// plan can never slice past memory.
func checkBounds(b *desc.Batch, srcLen, dstSize uint64) error {
	if len(b.Dst) != len(b.Src) || len(b.Len) != len(b.Src) {
		return fmt.Errorf("%w: tcp: batch has %d sources, %d destinations and %d lengths", errs.ErrInvalidArgument, len(b.Src), len(b.Dst), len(b.Len))
	}
	for i, n := range b.Len {
		if n == 0 {
			return fmt.Errorf("%w: tcp: block %d has length 0", errs.ErrInvalidArgument, i)
		}
		if s := b.Src[i]; s > srcLen || n > srcLen-s {
			return fmt.Errorf("%w: tcp: block %d source [%d,+%d) is outside the %d-byte region", errs.ErrInvalidArgument, i, s, n, srcLen)
		}
		if d := b.Dst[i]; dstSize != 0 && (d > dstSize || n > dstSize-d) {
			return fmt.Errorf("%w: tcp: block %d destination [%d,+%d) is outside the %d-byte region", errs.ErrInvalidArgument, i, d, n, dstSize)
		}
	}
	return nil
}

// build fills p (reset first) with b's work for key.
func (p *plan) build(b *desc.Batch, key uint64, lim planLimits) {
	p.reset()
	b = p.splitLarge(b, lim.frameBytes)
	p.used = *b
	n := b.N()
	p.key, p.segs = key, uint64(n)
	if n == 0 {
		return
	}
	total := b.Bytes()
	p.bytes = total
	// Another stream per minShare bytes, or per minShareBlocks blocks: many
	// small blocks cost CPU per block (the sender's gather, the receiver's
	// scatter), which more streams spread over more cores, while the bytes
	// alone would keep them on one.
	use := int(max(total/max(lim.minShare, 1), uint64(n/minShareBlocks)))
	use = max(1, min(use, lim.streams, n))
	p.streams = uint32(use)
	// Split [0,n) into `use` contiguous shares of about total/use bytes.
	lo, acc := 0, uint64(0)
	for i := 0; i < use; i++ {
		hi := n
		if i < use-1 {
			target := total * uint64(i+1) / uint64(use)
			hi = lo
			for hi < n-(use-1-i) && (acc < target || hi == lo) {
				acc += b.Len[hi]
				hi++
			}
		}
		f0 := len(p.frames)
		p.share(b, lo, hi, lim)
		p.shares = append(p.shares, span{f0, len(p.frames)})
		lo = hi
	}
}

// splitLarge returns b, or, when a block is longer than max (merging
// makes such blocks of adjacent ones), b with those blocks cut into pieces
// of at most max bytes in p.split: a frame never carries more than the
// receiver's limit (maxPayload; a pull's server, maxReadFrame).
func (p *plan) splitLarge(b *desc.Batch, max uint64) *desc.Batch {
	if max == 0 {
		return b
	}
	over := false
	for _, l := range b.Len {
		if l > max {
			over = true
			break
		}
	}
	if !over {
		return b
	}
	s := &p.split
	for i, l := range b.Len {
		for at := uint64(0); at < l; at += max {
			k := min(max, l-at)
			s.Src, s.Dst, s.Len = append(s.Src, b.Src[i]+at), append(s.Dst, b.Dst[i]+at), append(s.Len, k)
		}
	}
	return s
}

// share adds the frames of blocks [lo,hi): up to frameBytes of payload and
// maxSegsPerFrame segments each.
func (p *plan) share(b *desc.Batch, lo, hi int, lim planLimits) {
	le := binary.LittleEndian
	for i := lo; i < hi; {
		k, payload := i, uint64(0)
		for k < hi && k-i < maxSegsPerFrame && (payload == 0 || payload+b.Len[k] <= lim.frameBytes) {
			payload += b.Len[k]
			k++
		}
		h := frameHeader{key: p.key, segs: uint32(k - i), streams: p.streams, payload: payload}
		if k == hi {
			h.flags = flagLast
		}
		f := pframe{hdrLo: len(p.hdr), pc: span{len(p.pieces), 0}, cp: span{len(p.copies), 0}, blk: span{i, k}}
		p.hdr = grow(p.hdr, headerLen+(k-i)*segLen)
		hdr := p.hdr[f.hdrLo:]
		h.put(hdr)
		// Small blocks are copied into the staging buffer, in runs that get
		// one iovec each; others are written from the source. Neighbouring
		// ranges (source-contiguous copies, pieces) are coalesced.
		var small uint64
		runStart := -1 // offset of the current staged run in the staging buffer
		for x := i; x < k; x++ {
			off, n := b.Src[x], b.Len[x]
			t := headerLen + (x-i)*segLen
			le.PutUint64(hdr[t:], b.Dst[x])
			le.PutUint64(hdr[t+8:], n)
			if n < copyBelow && small+n <= lim.smallCap {
				if runStart < 0 {
					runStart = int(small)
				}
				if c := len(p.copies) - 1; c >= f.cp.lo && p.copies[c].src+p.copies[c].n == off && p.copies[c].at+p.copies[c].n == small {
					p.copies[c].n += n
				} else {
					p.copies = append(p.copies, copyOp{src: off, at: small, n: n})
				}
				small += n
				continue
			}
			if runStart >= 0 {
				p.pieces = append(p.pieces, piece{off: uint64(runStart), n: small - uint64(runStart), staged: true})
				runStart = -1
			}
			if c := len(p.pieces) - 1; c >= f.pc.lo && !p.pieces[c].staged && p.pieces[c].off+p.pieces[c].n == off {
				p.pieces[c].n += n
			} else {
				p.pieces = append(p.pieces, piece{off: off, n: n})
			}
		}
		if runStart >= 0 {
			p.pieces = append(p.pieces, piece{off: uint64(runStart), n: small - uint64(runStart), staged: true})
		}
		f.hdrHi, f.pc.hi, f.cp.hi = len(p.hdr), len(p.pieces), len(p.copies)
		p.frames = append(p.frames, f)
		i = k
	}
}

// grow extends b by n bytes (their content is overwritten by the caller).
func grow(b []byte, n int) []byte {
	if len(b)+n <= cap(b) {
		return b[:len(b)+n]
	}
	nb := make([]byte, len(b)+n, 2*cap(b)+n)
	copy(nb, b)
	return nb
}

// maxScratchSegs: a conn keeps its ad hoc scratch plan between batches only
// up to this many blocks, so one huge batch does not pin its tables forever.
const maxScratchSegs = 1 << 17

// trim drops a scratch plan's buffers after a huge batch.
func (p *plan) trim() {
	p.used = desc.Batch{}
	if cap(p.hdr) > maxScratchSegs*segLen*2 || cap(p.copies) > maxScratchSegs || cap(p.pieces) > maxScratchSegs || cap(p.split.Src) > maxScratchSegs {
		*p = plan{}
	}
}
