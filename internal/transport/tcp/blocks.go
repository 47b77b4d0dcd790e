package tcp

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/layout"
	"github.com/b2bd/b2bd/internal/memguard"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/transport"
)

var _ transport.Conn = (*conn)(nil)

// pipeWindow is how many batches a stream sends ahead of their acks: the
// acks (at most maxAckMsg bytes each with a refusal's text) then always
// fit the sender's socket buffer, so the receiver never blocks on them.
const pipeWindow = 16

// blockChunk is how many runs a stream expands at a time: 10 KiB of runs,
// which stay in the first-level cache between expansion and framing.
const blockChunk = 256

// Block requests are streamed (docs/kv.md, "Expansion"): the caller only
// cuts the request into stretches (runs of groups sharing a region pair;
// each one batch of the wire protocol) and their shares, in O(groups),
// without expanding a run. Each stream then expands its own shares, chunk
// by chunk, straight into frames: the first frame leaves once its own runs
// are expanded, and the per-block work of the rest overlaps the wire,
// spread over the streams. The receiver needs nothing new: batches are
// numbered, and each share is acked as it ends.

// blockState is a conn's block-request memory, reused (c.mu held).
type blockState struct {
	stretches []bstretch
	shares    []bshare
	job       blockJob
}

// bstretch is groups [g0,g1) of the pair, with one (source region,
// destination region) pair: one batch, in `streams` shares.
type bstretch struct {
	g0, g1               int
	runs                 int
	bytes                uint64
	streams              uint32
	srcRegion, dstRegion uint32
	key                  uint64 // the peer's region: a write's key, a pull's read token
	local                memory.Memory
	remoteSize           uint64 // 0: unknown
	remoteName           string
}

// bshare is runs [lo,hi) of stretch k, counted from the stretch's start.
type bshare struct{ k, lo, hi int }

// blockJob is one block request as the streams see it: share q is stream
// q % streams's.
type blockJob struct {
	pair      *layout.Pair
	ids       layout.IDs
	stretches []bstretch
	shares    []bshare
	base      uint64 // stretch k is batch base+k
	streams   int
	lim       planLimits
	read      bool
	deadline  time.Time // the request's, for the frames' holdMS
}

// streamBlocks is a stream's block-request memory: the chunk of runs it
// expanded, the frame it is filling, and that frame's wire work.
type streamBlocks struct {
	runs []layout.Run
	fb   desc.Batch // a write: Src ours, Dst the peer's; a pull: swapped
	fp   plan
	rhdr []byte // a pull's request
}

// pipeErr is a stream's failure in batch base+k.
type pipeErr struct {
	k   int
	err error
}

func (e *pipeErr) Error() string { return e.err.Error() }
func (e *pipeErr) Unwrap() error { return e.err }

// writeBlocks is the kind's block-id write (Handlers.WriteBlocks): every stretch of the
// request is one batch of the wire protocol (one key per batch), and the
// streams expand and send their shares of all of them back to back,
// reading the acks pipeWindow behind, so a request of 160 stretches costs
// one round trip, not 160, and no run is expanded before the first frame
// leaves. Any failure fails the conn, because acks of later batches may
// still be on their way (as a cut-off Write does); GPU sources take the
// generic path (staging).
func (c *conn) writeBlocks(ctx context.Context, w *transport.Blocks, sc *transport.BlockScratch) (st transport.Stats, err error) {
	for _, s := range w.Local {
		if m := s.Memory(); m.Kind != memory.Host || (m.Host == nil && m.Len > 0) {
			return transport.WriteStretches(ctx, c.Write, w, sc)
		}
	}
	waited, err := c.lockCtx(ctx)
	if err != nil {
		return transport.Stats{}, err
	}
	defer c.unlock()
	defer func() { st.Post += waited }()
	if err := c.Err(); err != nil {
		return transport.Stats{}, c.brokenBefore(err)
	}
	t0 := time.Now()
	bs := &c.blocks
	if err := bs.cut(w.Pair, w.IDs, len(w.Local), len(w.Remote)); err != nil {
		return transport.Stats{}, err
	}
	for k := range bs.stretches {
		st := &bs.stretches[k]
		d := &w.Remote[st.dstRegion]
		st.local, st.key, st.remoteSize, st.remoteName = w.Local[st.srcRegion].Memory(), d.Key.Key, d.Size, d.Name
	}
	if err := bs.checkExtents(w.Pair, false); err != nil {
		// A region smaller than its layout says: check every run, the
		// slow way, so that a run outside it is refused before a byte
		// leaves (the others are still sent, streamed).
		sc.Expand(w)
		if err := checkRuns(sc, false, func(r *layout.Run) (uint64, uint64) {
			return w.Local[r.SrcRegion].Memory().Len, w.Remote[r.DstRegion].Size
		}); err != nil {
			return transport.Stats{}, err
		}
	}
	st, err = c.runBlocks(ctx, w.Pair, w.IDs, false, t0)
	bs.release()
	return st, err
}

// readBlocks is the kind's block-id read (Handlers.ReadBlocks), the mirror of writeBlocks
// over pull requests (read.go): each stream expands its shares chunk by
// chunk into request frames, one outstanding at a time, and places each
// answer straight into our region. GPU destinations take the generic path.
func (c *conn) readBlocks(ctx context.Context, r *transport.Blocks, sc *transport.BlockScratch) (st transport.Stats, err error) {
	for _, d := range r.Local {
		if m := d.Memory(); m.Kind != memory.Host || (m.Host == nil && m.Len > 0) {
			return transport.ReadStretches(ctx, c.Read, r, sc)
		}
	}
	waited, err := c.lockCtx(ctx)
	if err != nil {
		return transport.Stats{}, err
	}
	defer c.unlock()
	defer func() { st.Post += waited }()
	if err := c.Err(); err != nil {
		return transport.Stats{}, c.brokenBefore(err)
	}
	t0 := time.Now()
	bs := &c.blocks
	if err := bs.cut(r.Pair, r.IDs, len(r.Remote), len(r.Local)); err != nil {
		return transport.Stats{}, err
	}
	for k := range bs.stretches {
		st := &bs.stretches[k]
		s := &r.Remote[st.srcRegion]
		st.local, st.key, st.remoteSize, st.remoteName = r.Local[st.dstRegion].Memory(), s.Key.Key, s.Size, s.Name
	}
	if err := bs.checkExtents(r.Pair, true); err != nil {
		sc.Expand(r)
		if err := checkRuns(sc, true, func(run *layout.Run) (uint64, uint64) {
			return r.Remote[run.SrcRegion].Size, r.Local[run.DstRegion].Memory().Len
		}); err != nil {
			return transport.Stats{}, err
		}
	}
	st, err = c.runBlocks(ctx, r.Pair, r.IDs, true, t0)
	bs.release()
	return st, err
}

// cut fills bs.stretches with p's groups for ids: consecutive groups of
// one (source region, destination region) pair make one stretch, as
// BlockScratch.StretchEnd cuts the expanded runs.
func (bs *blockState) cut(p *layout.Pair, ids layout.IDs, nsrc, ndst int) error {
	bs.stretches = bs.stretches[:0]
	for g := 0; g < p.NumGroups(); g++ {
		sr, dr := p.GroupRegions(g)
		runs, bytes := p.GroupRuns(ids, g), p.GroupBytes(ids, g)
		if k := len(bs.stretches) - 1; k >= 0 && bs.stretches[k].srcRegion == sr && bs.stretches[k].dstRegion == dr {
			st := &bs.stretches[k]
			st.g1, st.runs, st.bytes = g+1, st.runs+runs, st.bytes+bytes
			continue
		}
		if int(sr) >= nsrc || int(dr) >= ndst {
			return &transport.StretchError{Group: uint32(g), SrcRegion: sr, DstRegion: dr,
				Err: fmt.Errorf("%w: tcp: segment group %d names region (source %d, destination %d) beyond the %d sources and %d destinations given", errs.ErrInvalidArgument, g, sr, dr, nsrc, ndst)}
		}
		bs.stretches = append(bs.stretches, bstretch{g0: g, g1: g + 1, runs: runs, bytes: bytes, srcRegion: sr, dstRegion: dr})
	}
	return nil
}

// checkExtents checks every group's extent against the memory on both
// sides (a pull's source is the peer's region; a write's destination of
// size 0 is unknown, and the receiver checks it): then no run can fall
// outside, whatever the ids. O(groups).
func (bs *blockState) checkExtents(p *layout.Pair, read bool) error {
	for k := range bs.stretches {
		st := &bs.stretches[k]
		srcLen, dstLen := st.local.Len, st.remoteSize
		if read {
			srcLen, dstLen = st.remoteSize, st.local.Len
		}
		dstKnown := read || dstLen != 0
		for g := st.g0; g < st.g1; g++ {
			se, de := p.GroupEnds(g)
			if se > srcLen || dstKnown && de > dstLen {
				return errExtent
			}
		}
	}
	return nil
}

var errExtent = errors.New("tcp: a segment group reaches beyond its region")

// checkRuns checks every expanded run of sc against its regions' sizes
// (sizes: source, destination; checkBounds' rules), naming the first stretch with a run outside.
func checkRuns(sc *transport.BlockScratch, read bool, sizes func(*layout.Run) (uint64, uint64)) error {
	for from := 0; from < len(sc.Runs); {
		to := sc.StretchEnd(from)
		r := &sc.Runs[from]
		srcLen, dstLen := sizes(r)
		b := desc.Batch{Src: sc.Src[from:to], Dst: sc.Dst[from:to], Len: sc.Len[from:to]}
		var err error
		if read {
			err = checkBounds(&desc.Batch{Src: b.Dst, Dst: b.Src, Len: b.Len}, dstLen, srcLen)
		} else {
			err = checkBounds(&b, srcLen, dstLen)
		}
		if err != nil {
			return &transport.StretchError{Group: r.Group, SrcRegion: r.SrcRegion, DstRegion: r.DstRegion, Err: err}
		}
		from = to
	}
	return nil
}

// release drops the request's references (c.mu held).
func (bs *blockState) release() {
	for k := range bs.stretches {
		bs.stretches[k].local, bs.stretches[k].remoteName = memory.Memory{}, ""
	}
	bs.job = blockJob{}
}

// deal cuts each stretch into shares, as plan.build splits a batch:
// another stream per lim.minShare bytes or per minShareBlocks runs, split
// by runs (the runs of a group are alike).
func (bs *blockState) deal(lim planLimits) {
	bs.shares = bs.shares[:0]
	for k := range bs.stretches {
		st := &bs.stretches[k]
		use := int(max(st.bytes/max(lim.minShare, 1), uint64(st.runs/minShareBlocks)))
		use = max(1, min(use, lim.streams, st.runs))
		st.streams = uint32(use)
		for i := 0; i < use && st.runs > 0; i++ {
			bs.shares = append(bs.shares, bshare{k: k, lo: st.runs * i / use, hi: st.runs * (i + 1) / use})
		}
	}
}

// runBlocks deals bs's stretches to the streams as consecutive batches and
// waits for every stream; see run, whose outcomes it mirrors. Stats.Plan
// is the time from start to the first job handed to a stream, Stats.Post
// the longest a stream spent expanding, framing and staging (its socket
// writes and waits are the wire). c.mu is held.
func (c *conn) runBlocks(ctx context.Context, p *layout.Pair, ids layout.IDs, read bool, start time.Time) (transport.Stats, error) {
	bs := &c.blocks
	lim := c.limits()
	if read {
		lim.frameBytes = min(lim.frameBytes, maxReadFrame)
	}
	bs.deal(lim)
	var segs uint64
	for k := range bs.stretches {
		segs += uint64(bs.stretches[k].runs)
	}
	use := min(len(c.streams), len(bs.shares))
	if use == 0 {
		return transport.Stats{Plan: time.Since(start)}, nil
	}
	bj := &bs.job
	deadline, _ := ctx.Deadline()
	*bj = blockJob{pair: p, ids: ids, stretches: bs.stretches, shares: bs.shares, base: c.batch + 1, streams: use, lim: lim, read: read, deadline: deadline}
	c.batch += uint64(len(bs.stretches))
	postStart := time.Now()
	posted := 0
	for i := 0; i < use; i++ {
		select {
		case c.streams[i].jobs <- job{batch: bj.base, blocks: bj, share: i, deadline: deadline}:
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
	// Later batches' acks (a pull's answers) may be unread on some stream:
	// the conn cannot carry another batch, whatever the failure was; and
	// what the receiver already holds of the cut-off batches must not land
	// once we answer.
	c.cutOff(ctx, first, fmt.Sprintf("%d..%d", bj.base, c.batch))
	return transport.Stats{}, bs.stretchErr(c.classify(ctx, first, cancelled, bj.base, read))
}

// classify turns a stream's failure into the error WriteBlocks or
// ReadBlocks returns, keeping the stretch (pipeErr) it happened in.
func (c *conn) classify(ctx context.Context, first error, cancelled bool, base uint64, read bool) error {
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
	var refused *ackError
	switch {
	case cancelled || ctx.Err() != nil:
		return wrap(fmt.Errorf("tcp: block batches %d..%d to %s: %w%s", base, c.batch, c.addr, ctx.Err(), c.cutNote(read)))
	case memguard.IsFault(first):
		return wrap(fmt.Errorf("tcp: block batches %d..%d to %s: %w", base, c.batch, c.addr, first))
	case errors.As(first, &refused):
		return wrap(refused)
	case errors.Is(first, errs.ErrInvalidArgument):
		return first
	case errors.Is(first, os.ErrDeadlineExceeded):
		return wrap(fmt.Errorf("tcp: block batches %d..%d to %s: %w%s", base, c.batch, c.addr, context.DeadlineExceeded, c.cutNote(read)))
	}
	return wrap(fmt.Errorf("%w: tcp: block batches %d..%d to %s cut off: %w", errs.ErrAborted, base, c.batch, c.addr, first))
}

// stretchErr names the stretch a failure happened in (apart, so that the
// success path allocates nothing).
func (bs *blockState) stretchErr(err error) error {
	var pe *pipeErr
	if errors.As(err, &pe) && pe.k >= 0 && pe.k < len(bs.stretches) {
		st := &bs.stretches[pe.k]
		return &transport.StretchError{Group: uint32(st.g0), SrcRegion: st.srcRegion, DstRegion: st.dstRegion, Err: err}
	}
	return err
}

// sendBlocks runs the stream's shares of j.blocks: a write's are sent back
// to back, reading acks pipeWindow behind, then the rest; a pull's are
// requested frame by frame.
func (s *stream) sendBlocks(j *job) result {
	bj := j.blocks
	last := bj.base + uint64(len(bj.stretches)) - 1
	_ = s.nc.SetDeadline(j.deadline)
	if cut := s.c.cut.Load(); cut >= bj.base && cut <= last { // cancelled before the deadline above was set
		_ = s.nc.SetDeadline(time.Unix(1, 0))
	}
	if bj.read {
		s.ensureRx()
	}
	var r result
	var q [pipeWindow]int // stretches awaiting their ack, oldest at qh
	qh, qn := 0, 0
	for x := j.share; x < len(bj.shares); x += bj.streams {
		sh := bj.shares[x]
		if qn == pipeWindow {
			if err := s.readAck(bj.base + uint64(q[qh])); err != nil {
				r.err = &pipeErr{k: q[qh], err: err}
				return r
			}
			qh, qn = (qh+1)%pipeWindow, qn-1
		}
		if err := s.shareBlocks(bj, sh, &r); err != nil {
			r.err = &pipeErr{k: sh.k, err: err}
			return r
		}
		if !bj.read {
			q[(qh+qn)%pipeWindow] = sh.k
			qn++
		}
	}
	for ; qn > 0; qh, qn = (qh+1)%pipeWindow, qn-1 {
		if err := s.readAck(bj.base + uint64(q[qh])); err != nil {
			r.err = &pipeErr{k: q[qh], err: err}
			return r
		}
	}
	return r
}

// shareBlocks expands share sh chunk by chunk and sends it frame by frame:
// every run is checked against both regions before it joins a frame, and
// runs over a frame's payload are cut. The time spent outside the socket
// is r.post.
func (s *stream) shareBlocks(bj *blockJob, sh bshare, r *result) error {
	st := &bj.stretches[sh.k]
	batch := bj.base + uint64(sh.k)
	b := &s.blk
	b.fb = desc.Batch{Src: b.fb.Src[:0], Dst: b.fb.Dst[:0], Len: b.fb.Len[:0]}
	srcLen, dstLen := st.local.Len, st.remoteSize
	if bj.read {
		srcLen, dstLen = st.remoteSize, st.local.Len
	}
	dstKnown := bj.read || dstLen != 0 // a write's destination size may be unknown (0)
	fmax := bj.lim.frameBytes
	cur := bj.pair.Seek(bj.ids, st.g0, sh.lo)
	left := sh.hi - sh.lo
	var payload uint64
	tb := time.Now()
	for left > 0 {
		b.runs = bj.pair.ExpandFrom(b.runs[:0], bj.ids, &cur, min(left, blockChunk))
		if len(b.runs) == 0 {
			return fmt.Errorf("tcp: block batch %d: expansion ended %d runs early", batch, left)
		}
		left -= len(b.runs)
		for i := range b.runs {
			run := &b.runs[i]
			so, do, n := run.SrcOff, run.DstOff, run.Len
			if n == 0 || so > srcLen || n > srcLen-so || dstKnown && (do > dstLen || n > dstLen-do) {
				return fmt.Errorf("%w: tcp: run of entry %d (source [%d,+%d) of %d bytes, destination [%d,+%d) of %d bytes) is outside its regions",
					errs.ErrInvalidArgument, run.First, so, n, srcLen, do, n, dstLen)
			}
			for n > 0 {
				k := min(n, fmax)
				if len(b.fb.Len) == maxSegsPerFrame || (payload > 0 && payload+k > fmax) {
					if err := s.blockFrame(bj, st, batch, false, payload, r, &tb); err != nil {
						return err
					}
					payload = 0
				}
				if bj.read { // the frame is built swapped: Src ours
					b.fb.Src, b.fb.Dst = append(b.fb.Src, do), append(b.fb.Dst, so)
				} else {
					b.fb.Src, b.fb.Dst = append(b.fb.Src, so), append(b.fb.Dst, do)
				}
				b.fb.Len = append(b.fb.Len, k)
				payload += k
				so, do, n = so+k, do+k, n-k
			}
		}
	}
	return s.blockFrame(bj, st, batch, true, payload, r, &tb)
}

// blockFrame sends the frame in s.blk.fb (one frame's worth: the caller
// cut it) and empties it: a write's frame with its payload, or a pull's
// request, whose answer it then places. *tb is when the stream's own work
// on it began; the socket's time is not post.
func (s *stream) blockFrame(bj *blockJob, st *bstretch, batch uint64, last bool, payload uint64, r *result, tb *time.Time) error {
	b := &s.blk
	fb := &b.fb
	defer func() { b.fb = desc.Batch{Src: fb.Src[:0], Dst: fb.Dst[:0], Len: fb.Len[:0]} }()
	if bj.read {
		return s.pullFrame(st, batch, last, payload, r, tb)
	}
	fp := &b.fp
	fp.reset()
	fp.key, fp.streams = st.key, st.streams
	fp.share(fb, 0, fb.N(), bj.lim)
	fr := &fp.frames[0]
	hdr := fp.hdr[fr.hdrLo:fr.hdrHi]
	le := binary.LittleEndian
	le.PutUint64(hdr[8:], batch)
	le.PutUint64(hdr[40:], holdMSAt(bj.deadline))
	if !last {
		le.PutUint32(hdr[4:], 0)
	}
	var werr error
	src := st.local.Host
	ferr := memguard.Do(memguard.Source, func() {
		s.frame(fp, fr, src, hdr)
		r.post += time.Since(*tb)
		_, werr = s.bufs.WriteTo(s.nc)
	})
	*tb = time.Now()
	if ferr == nil && werr != nil && memguard.IsFault(werr) {
		ferr = memguard.Syscall(memguard.Source, "writev", werr)
	}
	if ferr != nil {
		return fmt.Errorf("source memory (%d bytes) of batch %d: %w", len(src), batch, ferr)
	}
	if werr != nil {
		return werr
	}
	r.frames++
	return nil
}

// pullFrame sends the request for the frame in s.blk.fb (Src our offsets,
// Dst the peer's), reads its answer and places it in our region.
func (s *stream) pullFrame(st *bstretch, batch uint64, last bool, payload uint64, r *result, tb *time.Time) error {
	fb := &s.blk.fb
	n := fb.N()
	h := frameHeader{flags: flagRead, batch: batch, key: st.key, segs: uint32(n), streams: st.streams, payload: payload}
	if last {
		h.flags |= flagLast
	}
	hdr := grow(s.blk.rhdr[:0], headerLen+n*segLen)
	s.blk.rhdr = hdr
	h.put(hdr)
	table := s.rtable[:n*segLen]
	le := binary.LittleEndian
	for i := 0; i < n; i++ {
		t := headerLen + i*segLen
		le.PutUint64(hdr[t:], fb.Dst[i])
		le.PutUint64(hdr[t+8:], fb.Len[i])
		le.PutUint64(table[i*segLen:], fb.Src[i])
		le.PutUint64(table[i*segLen+8:], fb.Len[i])
	}
	// The request's write is wire, as a write's frames are: a small
	// header never waits for the socket, and what the call takes beyond
	// that is the peer, woken by it, taking this core while it already
	// answers (0.4 ms at p90 on two cores), time the answer overlaps.
	r.post += time.Since(*tb)
	_, err := s.nc.Write(hdr)
	if err != nil {
		return err
	}
	r.frames++
	if err := s.readAnswer(batch, &h, st.remoteName); err != nil {
		return err
	}
	_, err = s.rx.placeIn(&h, table, st.local)
	*tb = time.Now()
	if err != nil {
		var re *recvErr
		if errors.As(err, &re) {
			err = re.err
		}
		return fmt.Errorf("destination of batch %d: %w", batch, err)
	}
	return nil
}

// ensureRx makes the stream's receiver for pulled bytes on its first pull.
func (s *stream) ensureRx() {
	if s.rx == nil {
		_, direct := s.nc.(*net.TCPConn)
		lw := newLowWater(s.nc)
		s.rx = &receiver{t: s.c.t, c: s.nc, lw: lw, direct: direct, br: bufio.NewReaderSize(lw, recvBuf)}
		s.rtable = make([]byte, maxSegsPerFrame*segLen)
	}
}
