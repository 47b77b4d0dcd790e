package local

import (
	"context"
	"errors"
	"fmt"

	"github.com/b2bd/b2bd/gpudirect"
	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/memguard"
	"github.com/b2bd/b2bd/internal/staging"
)

// Small GPU blocks into host memory go through the source GPU's stage: one
// device-to-host copy per covering range (through gaps of up to the
// stage's gap, in source order) into the pinned buffer, then the CPU
// copies each block out. A batched copy costs about the same per copy up
// to 16 KiB, so 10,000 scattered blocks took ~10 ms as one copy each at
// every size from 128 B to 16 KiB (H200), against TCP's ~2 ms at 128 B,
// whose sender reads covering ranges too. Staged, the same batches took
// 2.6 ms at 128 B, 5.3 at 1 KiB, 6.1 at 4 KiB and 7.6 at 8 KiB, but 12.9
// at 16 KiB, where the CPU's copies cost more than the copy engine's
// (docs/samehost.md). So larger blocks, and blocks too far apart to share
// a range, stay direct copies into the (registered) destination.

// toHostMaxBlock is the largest mean block staged, and toHostMerge how many
// blocks a first-hop copy must carry on average for the stage to be taken.
const (
	toHostMaxBlock = 8 << 10
	toHostMerge    = 4
)

// errNotMerged says a batch's blocks lie too far apart to share first-hop
// copies: the caller copies it directly.
var errNotMerged = errors.New("samehost: blocks too far apart to stage")

// copyToHost moves b from device memory at srcBase into the host memory
// dst through s. While the CPU copies chunk k out of one half of the
// buffer (in up to shares parts on pool's workers, each under a fault guard:
// dst maps a file its owner may shrink), the copy engine fills the other
// half with chunk k+1. It looks at ctx between chunks. It returns
// errNotMerged, having copied nothing, where staging would not pay.
func copyToHost(ctx context.Context, cu gpudirect.Interface, s *stage, srcBase uint64, dst []byte, b *desc.Batch, pool *hostPool, shares int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if lo, span, ok := oneRange(b, uint64(len(s.buf))); ok && s.chunk == 0 { // a set chunk forces the plan (tests, measurements)
		return s.toHostOneRange(ctx, cu, srcBase, lo, span, dst, b, pool, shares)
	}
	// Planned at buffer offsets: the CPU's copies read s.buf by offset,
	// the copy engine's write at addresses (made so below).
	p := s.planFor(b, srcBase, 0, 0)
	if len(p.InLen)*toHostMerge > b.N() {
		return errNotMerged
	}
	host := s.host()
	for j := range p.InHost {
		p.InHost[j] += host
	}
	n := len(p.InEnds)
	done := func(k int) *gpudirect.Event { return s.done[k%2][0] }
	queue := func(k int) error {
		lo := 0
		if k > 0 {
			lo = p.InEnds[k-1]
		}
		hi := p.InEnds[k]
		if err := cu.MemcpyBatchAsync(s.d2h, p.InHost[lo:hi], p.InSrc[lo:hi], p.InLen[lo:hi]); err != nil {
			return fmt.Errorf("samehost: staged copy to host memory, device-to-host hop of %d copies on device %d: %w", hi-lo, s.dev, staging.DomainError(err))
		}
		if err := cu.EventRecord(done(k), s.d2h); err != nil {
			return fmt.Errorf("samehost: staged copy to host memory, mark the device-to-host hop on device %d: %w", s.dev, staging.DomainError(err))
		}
		return nil
	}
	var err error
	if n > 0 {
		err = queue(0)
	}
	outLo := 0
	for k := 0; k < n && err == nil; k++ {
		if e := cu.EventSynchronize(done(k)); e != nil {
			err = fmt.Errorf("samehost: staged copy to host memory, device-to-host hop on device %d: %w", s.dev, staging.DomainError(e))
			break
		}
		// Half (k+1)%2 was emptied by the CPU in round k-1.
		if k+1 < n {
			if err = ctx.Err(); err != nil {
				err = fmt.Errorf("samehost: staged copy to host memory cut off after %d of %d chunks: %w", k, n, err)
				break
			}
			if err = queue(k + 1); err != nil {
				break
			}
		}
		outHi := p.OutEnds[k]
		s.out = desc.Batch{Src: p.OutHost[outLo:outHi], Dst: p.OutDst[outLo:outHi], Len: p.OutLen[outLo:outHi]}
		if k := min(shares, int(s.out.Bytes()/MinSplit)); pool != nil && k > 1 && s.out.N() > 1 {
			err = pool.run(ctx, dst, s.buf, &s.out, k)
		} else {
			err = copyHost(ctx, dst, s.buf, &s.out, 0, s.out.N())
		}
		outLo = outHi
	}
	s.out = desc.Batch{}
	if err != nil {
		// A copy still queued must not write the buffer once it is let go.
		_ = cu.StreamSynchronize(s.d2h)
	}
	return err
}

// oneRangeBytes is the most payload copyToHost moves with one covering
// copy (toHostOneRange): the CPU copies it out (in shares of MinSplit on
// the connection's threads), and a sort and a chunk plan would cost more
// than they save (10,000 x 128 B: the plan's radix sort and arrays against
// one 2.5 MB copy; at 256 B to 1 KiB the chunk plan was 4-24% slower than
// TCP, whose sender reads one covering range too).
const oneRangeBytes = 16 << 20

// oneRange is [lo, lo+span), the source range covering b's blocks, where
// one copy of it is the way: b's payload at most oneRangeBytes, the range
// within the buffer (size) and at most toHostMerge times the payload.
func oneRange(b *desc.Batch, size uint64) (lo, span uint64, ok bool) {
	total := b.Bytes()
	if b.N() == 0 || total > oneRangeBytes {
		return 0, 0, false
	}
	lo, hi := b.Src[0], b.Src[0]+b.Len[0]
	for i := 1; i < b.N(); i++ {
		lo, hi = min(lo, b.Src[i]), max(hi, b.Src[i]+b.Len[i])
	}
	span = hi - lo
	return lo, span, span <= size && span <= toHostMerge*total
}

// toHostOneRange copies the source's [lo, lo+span) into the buffer's start
// in one device-to-host copy, then each block out of it with the CPU,
// under a fault guard: in up to shares parts on pool's workers where the
// payload has MinSplit bytes a part.
func (s *stage) toHostOneRange(ctx context.Context, cu gpudirect.Interface, srcBase, lo, span uint64, dst []byte, b *desc.Batch, pool *hostPool, shares int) error {
	s.one[0], s.one[1], s.one[2] = s.host(), srcBase+lo, span
	if err := cu.MemcpyBatchAsync(s.d2h, s.one[0:1], s.one[1:2], s.one[2:3]); err != nil {
		_ = cu.StreamSynchronize(s.d2h)
		return fmt.Errorf("samehost: staged copy to host memory, one device-to-host copy of %d bytes on device %d: %w", span, s.dev, staging.DomainError(err))
	}
	if err := cu.StreamSynchronize(s.d2h); err != nil {
		return fmt.Errorf("samehost: staged copy to host memory, device-to-host copy on device %d: %w", s.dev, staging.DomainError(err))
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("samehost: staged copy to host memory cut off: %w", err)
	}
	buf := s.buf[:span]
	if k := min(shares, int(b.Bytes()/MinSplit)); pool != nil && k > 1 {
		n := b.N()
		if cap(s.oneSrc) < n {
			s.oneSrc = make([]uint64, n)
		}
		src := s.oneSrc[:n]
		for i := range src {
			src[i] = b.Src[i] - lo
		}
		s.out = desc.Batch{Src: src, Dst: b.Dst, Len: b.Len}
		err := pool.run(ctx, dst, buf, &s.out, k)
		s.out = desc.Batch{}
		return err
	}
	return memguard.DoCopy(dst, buf, func() {
		for i := range b.Len {
			n, at := b.Len[i], b.Src[i]-lo
			copy(dst[b.Dst[i]:b.Dst[i]+n], buf[at:at+n])
		}
	})
}
