package tcp

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memguard"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/transport"
)

var _ transport.BlockWriter = (*conn)(nil)

// pipeWindow is how many batches a stream sends ahead of their acks: the
// acks (at most maxAckMsg bytes each with a refusal's text) then always
// fit the sender's socket buffer, so the receiver never blocks on them.
const pipeWindow = 16

// blockState is a conn's block-write memory, reused (c.mu held): one
// plan per stretch, the stretch's source memory and first run.
type blockState struct {
	plans []plan
	srcs  [][]byte
	from  []int
	pipe  pipeJob
}

// pipeJob is one block write's batches, one per stretch, numbered from
// base: each stream sends its share of every batch in order, up to
// pipeWindow ahead of the acks, then reads the rest of the acks.
type pipeJob struct {
	plans []plan
	srcs  [][]byte
	base  uint64
}

// pipeErr is a stream's failure in batch base+k.
type pipeErr struct {
	k   int
	err error
}

func (e *pipeErr) Error() string { return e.err.Error() }
func (e *pipeErr) Unwrap() error { return e.err }

// WriteBlocks implements transport.BlockWriter: every stretch of the
// request is one batch of the wire protocol (one key per batch), planned
// up front; the streams send all of them back to back and read the acks
// at the end (pipeWindow ahead), so a request of 160 stretches costs one
// round trip, not 160. The receiver needs nothing new: it tracks batches
// by number and acks each share as it ends. Any failure fails the conn,
// because acks of later batches may still be on their way (as a cut-off
// Write does); GPU sources take the generic path (staging).
func (c *conn) WriteBlocks(ctx context.Context, w *transport.BlockWrite, sc *transport.BlockScratch) (transport.Stats, error) {
	for _, s := range w.Src {
		if s.Memory().Kind != memory.Host {
			return transport.WriteStretches(ctx, c, w, sc)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.Err(); err != nil {
		return transport.Stats{}, fmt.Errorf("%w: tcp: connection to %s is broken: %v", errs.ErrUnavailable, c.addr, err)
	}
	t0 := time.Now()
	sc.Expand(w)
	bs := &c.blocks
	lim := c.limits()
	k := 0
	for from := 0; from < len(sc.Runs); k++ {
		to := sc.StretchEnd(from)
		r := &sc.Runs[from]
		fail := func(err error) error {
			return &transport.StretchError{Group: r.Group, SrcRegion: r.SrcRegion, DstRegion: r.DstRegion, Err: err}
		}
		if int(r.SrcRegion) >= len(w.Src) || int(r.DstRegion) >= len(w.Dst) {
			return transport.Stats{}, fail(fmt.Errorf("%w: tcp: run %d names region (source %d, destination %d) beyond those given", errs.ErrInvalidArgument, from, r.SrcRegion, r.DstRegion))
		}
		src, dst := w.Src[r.SrcRegion].Memory().Host, &w.Dst[r.DstRegion]
		b := desc.Batch{Src: sc.Src[from:to], Dst: sc.Dst[from:to], Len: sc.Len[from:to]}
		if err := checkBounds(&b, uint64(len(src)), dst.Size); err != nil {
			return transport.Stats{}, fail(err)
		}
		if k == len(bs.plans) {
			bs.plans, bs.srcs, bs.from = append(bs.plans, plan{}), append(bs.srcs, nil), append(bs.from, 0)
		}
		bs.plans[k].build(&b, dst.Key.Key, lim)
		bs.srcs[k], bs.from[k] = src, from
		from = to
	}
	st, err := c.runPipe(ctx, bs.plans[:k], bs.srcs[:k], t0)
	clear(bs.srcs[:k])
	for i := range bs.plans[:k] {
		bs.plans[i].trim()
	}
	if err != nil {
		err = bs.stretchErr(err, sc, k)
	}
	return st, err
}

// stretchErr names the stretch a pipelined failure happened in (apart, so
// that the success path allocates nothing).
func (bs *blockState) stretchErr(err error, sc *transport.BlockScratch, k int) error {
	var pe *pipeErr
	if errors.As(err, &pe) && pe.k < k {
		r := &sc.Runs[bs.from[pe.k]]
		return &transport.StretchError{Group: r.Group, SrcRegion: r.SrcRegion, DstRegion: r.DstRegion, Err: err}
	}
	return err
}

// runPipe sends the plans as consecutive batches over the streams and
// waits for every stream; see run, whose outcomes it mirrors. c.mu is held.
func (c *conn) runPipe(ctx context.Context, plans []plan, srcs [][]byte, start time.Time) (transport.Stats, error) {
	use := 0
	var segs uint64
	for i := range plans {
		use = max(use, len(plans[i].shares))
		segs += plans[i].segs
	}
	if use == 0 {
		return transport.Stats{Plan: time.Since(start)}, nil
	}
	pj := &c.blocks.pipe
	pj.plans, pj.srcs, pj.base = plans, srcs, c.batch+1
	c.batch += uint64(len(plans))
	defer func() { *pj = pipeJob{} }()
	deadline, _ := ctx.Deadline()
	postStart := time.Now()
	posted := 0
	for i := 0; i < use; i++ {
		select {
		case c.streams[i].jobs <- job{batch: pj.base, pipe: pj, share: i, deadline: deadline}:
			posted++
		case <-c.quit:
		}
		if posted <= i {
			break
		}
	}
	var frames uint64
	var first error
	var post time.Duration
	if posted < use {
		first = net.ErrClosed
	}
	cancelled := false
	for i := 0; i < posted; {
		select {
		case r := <-c.streams[i].done:
			frames += r.frames
			post = max(post, r.post)
			if r.err != nil && first == nil {
				first = r.err
			}
			i++
		case <-ctx.Done():
			if !cancelled {
				cancelled = true
				c.cut.Store(c.batch) // the job's last batch
				for _, s := range c.streams {
					_ = s.nc.SetDeadline(time.Unix(1, 0))
				}
			}
		}
	}
	if first == nil {
		return transport.Stats{Segments: segs, WorkRequests: frames, Plan: postStart.Sub(start), Post: post}, nil
	}
	// Later batches' acks may be unread on some stream: the conn cannot
	// carry another batch, whatever the failure was; and what the receiver
	// already holds of the cut-off batches must not land once we answer.
	c.fail(first)
	if ferr := c.fence(); ferr != nil {
		c.t.log.Warn("tcp: cut-off block batches could not be fenced; the receiver stops placing them at its frame timeout", "batches", fmt.Sprintf("%d..%d", pj.base, c.batch), "peer", c.addr, "error", ferr)
	}
	var pe *pipeErr
	k := -1
	if errors.As(first, &pe) {
		k = pe.k
	}
	wrap := func(err error) error {
		if k >= 0 {
			return &pipeErr{k: k, err: err}
		}
		return err
	}
	switch {
	case cancelled || ctx.Err() != nil:
		return transport.Stats{}, wrap(fmt.Errorf("tcp: block batches %d..%d to %s: %w", pj.base, c.batch, c.addr, ctx.Err()))
	case memguard.IsFault(first):
		return transport.Stats{}, wrap(fmt.Errorf("tcp: block batches %d..%d to %s: %w", pj.base, c.batch, c.addr, first))
	}
	var refused *ackError
	if errors.As(first, &refused) {
		return transport.Stats{}, wrap(refused)
	}
	if errors.Is(first, os.ErrDeadlineExceeded) {
		return transport.Stats{}, wrap(fmt.Errorf("tcp: block batches %d..%d to %s: %w", pj.base, c.batch, c.addr, context.DeadlineExceeded))
	}
	return transport.Stats{}, wrap(fmt.Errorf("%w: tcp: block batches %d..%d to %s cut off: %w", errs.ErrAborted, pj.base, c.batch, c.addr, first))
}

// sendPipe sends the stream's share of every batch of j.pipe, reading
// acks pipeWindow behind, then the rest. Its frame loop is send's.
func (s *stream) sendPipe(j *job) result {
	pj := j.pipe
	last := pj.base + uint64(len(pj.plans)) - 1
	_ = s.nc.SetDeadline(j.deadline)
	if cut := s.c.cut.Load(); cut >= pj.base && cut <= last { // cancelled before the deadline above was set
		_ = s.nc.SetDeadline(time.Unix(1, 0))
	}
	var r result
	var q [pipeWindow]int // plan indices awaiting their ack, oldest at qh
	qh, qn := 0, 0
	for k := range pj.plans {
		p := &pj.plans[k]
		if j.share >= len(p.shares) {
			continue
		}
		if qn == pipeWindow {
			if err := s.readAck(pj.base + uint64(q[qh])); err != nil {
				r.err = &pipeErr{k: q[qh], err: err}
				return r
			}
			qh, qn = (qh+1)%pipeWindow, qn-1
		}
		batch := pj.base + uint64(k)
		src := pj.srcs[k]
		sh := p.shares[j.share]
		for f := sh.lo; f < sh.hi; f++ {
			fr := &p.frames[f]
			hdr := p.hdr[fr.hdrLo:fr.hdrHi]
			binary.LittleEndian.PutUint64(hdr[8:], batch)
			var werr error
			t0 := time.Now()
			ferr := memguard.Do(memguard.Source, func() {
				s.frame(p, fr, src, hdr)
				r.post += time.Since(t0)
				_, werr = s.bufs.WriteTo(s.nc)
			})
			if ferr == nil && werr != nil && memguard.IsFault(werr) {
				ferr = memguard.Syscall(memguard.Source, "writev", werr)
			}
			if ferr != nil {
				r.err = &pipeErr{k: k, err: fmt.Errorf("source memory of segments %d..%d: %w", fr.blk.lo, fr.blk.hi-1, ferr)}
				return r
			}
			if werr != nil {
				r.err = &pipeErr{k: k, err: werr}
				return r
			}
			r.frames++
		}
		q[(qh+qn)%pipeWindow] = k
		qn++
	}
	for ; qn > 0; qh, qn = (qh+1)%pipeWindow, qn-1 {
		if err := s.readAck(pj.base + uint64(q[qh])); err != nil {
			r.err = &pipeErr{k: q[qh], err: err}
			return r
		}
	}
	return r
}
