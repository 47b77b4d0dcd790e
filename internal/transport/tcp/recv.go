package tcp

import (
	"bufio"
	"bytes"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memguard"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/staging"
	"github.com/b2bd/b2bd/internal/transport"
)

// Receiving side.

// session tracks the batches of one sending conn (all its streams), so the
// receiver knows when every stream's share of a batch has landed. It also
// holds each batch's pin on its destination, from the batch's first frame on
// any stream until every stream's share is done (landed, refused or cut
// off), so that the destination cannot be deregistered mid-batch.
type session struct {
	live    int
	batches map[uint64]progress
	conns   map[net.Conn]struct{} // the session's streams, for fence
	// fenced: the sender cut a Write off and asked for a fence; no frame
	// is placed any more. placing is held (read) by every frame's
	// placement, so that fence can wait for those in progress.
	fenced  atomic.Bool
	placing sync.RWMutex
	// hold fires at the earliest time by which a batch holding a pin must
	// end (progress.holdUntil): then holdExpired fences the session if
	// that batch is still there (a stopped sender sends no fence of its
	// own), so its streams end and the pins go. Under t.mu.
	hold *time.Timer
}

// reholdLocked sets s's hold timer to its pinned batches' earliest end.
// t.mu held.
func (t *Transport) reholdLocked(s *session) {
	var v int64
	for _, p := range s.batches {
		if p.release != nil && p.holdUntil != 0 && (v == 0 || p.holdUntil < v) {
			v = p.holdUntil
		}
	}
	switch {
	case v == 0:
		if s.hold != nil {
			s.hold.Stop()
		}
	case s.hold == nil:
		s.hold = time.AfterFunc(time.Until(time.Unix(0, v)), func() { t.holdExpired(s) })
	default:
		s.hold.Reset(time.Until(time.Unix(0, v)))
	}
}

// holdExpired fences s if a batch past its hold still pins its
// destination; else it sets the timer anew.
func (t *Transport) holdExpired(s *session) {
	t.mu.Lock()
	if s.fenced.Load() { // its streams are closing: the pins go with them
		t.mu.Unlock()
		return
	}
	now := time.Now().UnixNano()
	for b, p := range s.batches {
		if p.release != nil && p.holdUntil != 0 && p.holdUntil <= now {
			t.log.Warn("a batch's sender sent nothing more past its time: its streams are closed and the batch's destination let go",
				"batch", b, "key", fmt.Sprintf("%#x", p.key), "grace", holdGrace)
			t.fenceLocked(s)
			return
		}
	}
	t.reholdLocked(s)
	t.mu.Unlock()
}

// maxHoldMS caps what a sender may ask for (a day): a larger value is
// not a deadline anyone means.
const maxHoldMS = 24 * 3600 * 1000

// holdGrace is how long past its sender's time a batch may hold its
// destination: the sender's own cut-off fences it well within.
var holdGrace = 5 * time.Second

// fence stops the sending conn connID for good: no byte of it is placed
// once fence returns. It marks the session fenced, closes its streams (a
// placement waiting for payload fails at once) and waits for the
// placements in progress to end. A frame read later (its stream stalled
// in Pin, say) sees the mark and is dropped. The sender's Write answers
// its caller only after this returned (conn.fence), so a cut-off batch
// never lands behind the caller's back.
func (t *Transport) fence(connID uint64) {
	t.mu.Lock()
	s := t.sessions[connID]
	if s == nil {
		// Every stream already ended, or none was let in yet: a stream of
		// the conn whose hello is still queued must not start placing
		// after this answer, so the fenced session stays a while, empty,
		// and refuses it (serve). Hellos wait at most helloTimeout.
		s = &session{batches: map[uint64]progress{}, conns: map[net.Conn]struct{}{}}
		s.fenced.Store(true)
		t.sessions[connID] = s
		t.forgetLater(connID, s)
		t.mu.Unlock()
		return
	}
	t.fenceLocked(s)
}

// fenceLocked fences s (fence): t.mu is held, and let go.
func (t *Transport) fenceLocked(s *session) {
	s.fenced.Store(true)
	for c := range s.conns {
		c.Close()
	}
	t.mu.Unlock()
	s.placing.Lock()
	s.placing.Unlock() //nolint:staticcheck // a barrier: every placement begun before the mark ended
}

// forgetLater drops the fenced, empty session s once no stream of its
// conn can still be waiting to be let in. t.mu is held.
func (t *Transport) forgetLater(connID uint64, s *session) {
	time.AfterFunc(2*helloTimeout, func() {
		t.mu.Lock()
		if t.sessions[connID] == s && s.live == 0 {
			delete(t.sessions, connID)
		}
		t.mu.Unlock()
	})
}

// placeHook, when set (tests only), runs between a write frame's last
// check of the reset mark and its placement: a receiver preempted there.
// It gets the stream's reset mark, to wait for a reset.
var placeHook atomic.Pointer[func(*resetMark)]

// helloTimeout bounds the wait for an inbound connection's hello.
const helloTimeout = 10 * time.Second

type progress struct {
	done  int
	segs  uint64
	bytes uint64
	// The batch's pin on its destination (release == nil: none yet).
	key     uint64
	mem     memory.Memory
	release func()
	// failed: some stream's share was refused or cut off; the batch is not
	// reported as landed.
	failed bool
	// holdUntil: unix ns by which the batch must end (0: its sender said
	// no time).
	holdUntil int64
}

func (t *Transport) acceptLoop() {
	defer t.wg.Done()
	for {
		c, err := t.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			t.log.Warn("accept", "error", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			c.Close()
			return
		}
		t.inbound[c] = struct{}{}
		t.wg.Add(1)
		t.mu.Unlock()
		go func() {
			defer t.wg.Done()
			handedOff := t.serve(c)
			t.mu.Lock()
			delete(t.inbound, c)
			t.mu.Unlock()
			if !handedOff {
				c.Close()
			}
		}()
	}
}

type recvErr struct {
	status uint32
	err    error
}

func (e *recvErr) Error() string { return e.err.Error() }

// serve runs an inbound data connection; handedOff: c went to another
// owner (a gRPC client on the wrong port), which closes it.
func (t *Transport) serve(c net.Conn) (handedOff bool) {
	log := t.log.With("remote", c.RemoteAddr().String())
	var hello [helloLen]byte
	_ = c.SetReadDeadline(time.Now().Add(helloTimeout))
	// The first 4 bytes alone tell a gRPC client (the HTTP/2 preface) from
	// a hello, before waiting for the rest of either.
	if _, err := io.ReadFull(c, hello[:len(http2Prefix)]); err != nil {
		log.Warn("data connection closed before its hello", "error", err)
		return false
	}
	if string(hello[:len(http2Prefix)]) == http2Prefix {
		log.Info("a gRPC client dialled the data port; answering that the peer port is another")
		_ = c.SetReadDeadline(time.Time{})
		t.serveWrongPort(c, bytes.Clone(hello[:len(http2Prefix)]))
		return true
	}
	if _, err := io.ReadFull(c, hello[len(http2Prefix):]); err != nil {
		log.Warn("data connection closed before its hello", "error", err)
		return false
	}
	le := binary.LittleEndian
	magic := le.Uint32(hello[0:])
	if (magic != helloMagic && magic != fenceMagic) || le.Uint32(hello[4:]) != version ||
		subtle.ConstantTimeCompare(hello[8:24], t.token[:]) != 1 {
		log.Warn("data connection refused: bad magic, version or session token")
		return false
	}
	connID, streams := le.Uint64(hello[24:]), int(le.Uint32(hello[32:]))
	if magic == fenceMagic {
		_ = c.SetReadDeadline(time.Time{})
		t.fence(connID)
		var done [welcomeLen]byte
		le.PutUint32(done[0:], welcomeMagic)
		_ = c.SetWriteDeadline(time.Now().Add(10 * time.Second))
		_, _ = c.Write(done[:])
		return false
	}
	if streams <= 0 || streams > 256 {
		log.Warn("data connection refused: bad stream count", "streams", streams)
		return false
	}
	var welcome [welcomeLen]byte
	le.PutUint32(welcome[0:], welcomeMagic)
	if _, err := c.Write(welcome[:]); err != nil {
		return false
	}
	_ = c.SetReadDeadline(time.Time{})

	t.mu.Lock()
	s := t.sessions[connID]
	if s == nil {
		s = &session{batches: map[uint64]progress{}, conns: map[net.Conn]struct{}{}}
		t.sessions[connID] = s
	}
	if s.fenced.Load() {
		t.mu.Unlock()
		log.Warn("data connection refused: its sending conn was fenced")
		return false
	}
	s.live++
	s.conns[c] = struct{}{}
	t.mu.Unlock()
	defer func() {
		var releases []func()
		t.mu.Lock()
		delete(s.conns, c)
		if s.live--; s.live == 0 {
			if s.fenced.Load() {
				// A stream welcomed but not yet counted must not
				// start a fresh session after the fence (fence).
				t.forgetLater(connID, s)
			} else {
				delete(t.sessions, connID)
			}
			if s.hold != nil {
				s.hold.Stop()
			}
			// The sender's conn is gone: its unfinished batches never
			// complete, so their pins go now.
			for b, p := range s.batches {
				if p.release != nil {
					releases = append(releases, p.release)
				}
				delete(s.batches, b)
			}
		}
		t.mu.Unlock()
		for _, release := range releases {
			release()
		}
	}()

	// A small read buffer: small blocks are copied out of it (one syscall for
	// many), blocks of 64 KiB and more are read straight into the region.
	_, direct := c.(*net.TCPConn)
	lw := newLowWater(c)
	r := &receiver{t: t, c: c, lw: lw, direct: direct, br: bufio.NewReaderSize(lw, recvBuf), s: s, table: make([]byte, maxSegsPerFrame*segLen)}
	defer r.releaseStager()
	// A stream that ends inside a share cut that batch off: count its share
	// as done (failed), so the batch's pin goes once the other streams are
	// done too, not only when the whole session ends.
	defer func() {
		if r.inShare {
			r.finish(r.batch, int(r.streams), false)
		}
	}()
	for {
		err := r.frame()
		if err == nil {
			continue
		}
		var re *recvErr
		if errors.As(err, &re) {
			// A broken frame leaves the stream out of step: say why, then close.
			log.Warn("data connection closed after a malformed frame", "error", re.err)
			batch := uint64(0)
			if r.inShare {
				batch = r.batch
				r.finish(r.batch, int(r.streams), false)
				r.inShare = false
			}
			r.ack(re.status, batch, 0, re.err.Error())
			return false
		}
		if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
			log.Debug("data connection ended", "error", err)
		}
		return false
	}
}

type receiver struct {
	t *Transport
	// out is where a pull's response is copied from the source region
	// before it is sent (read.go), grown on first use.
	out []byte
	// outv is the response's write list: a field, so that WriteTo's
	// pointer receiver does not make a local escape per answer.
	// (WriteTo consumes it: it is refilled from outa.)
	outv net.Buffers
	outa [2][]byte
	c    net.Conn
	// direct: c is plain TCP, whose Read leaves p to the kernel (never
	// touched in Go); under TLS, reads go through br.
	direct bool
	// lw reads c for br and for straight reads, setting the socket's
	// low-water mark for each.
	lw    *lowWater
	br    *bufio.Reader
	s     *session
	hdr   [headerLen]byte
	ackb  [ackLen + maxAckMsg]byte
	table []byte
	// share: what this stream placed of the current batch so far.
	segs, bytes uint64
	// inShare: a frame of batch (of streams streams) was read and its last
	// frame was not yet.
	inShare bool
	batch   uint64
	streams uint32
	// largeFrames: the last frame's blocks averaged directRead or more, so
	// the next frame's header and table are read without read-ahead (which
	// would pull up to recvBuf bytes of its payload through a second copy).
	largeFrames bool
	// unchecked: bytes copied into regions since the last look at the
	// clock (copyChecked).
	unchecked int
	// refused: this batch was refused (stale key, range outside the region);
	// the rest of its frames are read and dropped so that the stream stays in
	// step, and the last one is answered with the refusal.
	refused *recvErr
	// GPU destinations: a pinned buffer held for the connection's life, and
	// the frame's table decoded for the batched host-to-device copy.
	stager             *staging.Stager
	offs, lens, hostOf []uint64
}

// meta is where a frame's header and table are read from: the buffer,
// which reads ahead into the payload so that small blocks cost one system
// call for many; or, after a frame of large blocks with nothing buffered,
// the connection itself, so that the payload is read once, straight into
// the region.
func (r *receiver) meta() io.Reader {
	if r.direct && r.largeFrames && r.br.Buffered() == 0 {
		return r.lw
	}
	return r.br
}

func (r *receiver) releaseStager() {
	if r.stager != nil {
		r.t.cfg.Staging.Put(r.stager)
		r.stager = nil
	}
}

func (r *receiver) frame() error {
	if _, err := io.ReadFull(r.meta(), r.hdr[:]); err != nil {
		return err
	}
	var h frameHeader
	if !h.parse(r.hdr[:]) {
		return &recvErr{statusBadFrame, fmt.Errorf("tcp: frame has bad magic %#x", binary.LittleEndian.Uint32(r.hdr[:]))}
	}
	if h.segs == 0 || h.segs > maxSegsPerFrame || h.payload > maxPayload || h.streams == 0 || h.streams > 256 {
		return &recvErr{statusBadFrame, fmt.Errorf("tcp: frame of %d segments and %d bytes is outside the limits (%d, %d)", h.segs, h.payload, maxSegsPerFrame, maxPayload)}
	}
	if h.flags&flagRead != 0 {
		if r.inShare {
			return &recvErr{statusBadFrame, fmt.Errorf("tcp: read request inside the share of batch %d", r.batch)}
		}
		return r.serveRead(&h)
	}
	if r.inShare && (h.batch != r.batch || h.streams != r.streams) {
		return &recvErr{statusBadFrame, fmt.Errorf("tcp: frame of batch %d (%d streams) inside the share of batch %d (%d streams)", h.batch, h.streams, r.batch, r.streams)}
	}
	r.inShare, r.batch, r.streams = true, h.batch, h.streams
	_ = r.c.SetReadDeadline(time.Now().Add(frameTimeout))
	defer r.c.SetReadDeadline(time.Time{})
	table := r.table[:int(h.segs)*segLen]
	r.largeFrames = h.payload/uint64(h.segs) >= directRead
	if _, err := io.ReadFull(r.meta(), table); err != nil {
		return err
	}
	if r.refused == nil {
		consumed, err := r.place(&h, table)
		if err != nil { // declared here, re escapes only on this (rare) path
			var re *recvErr
			if !errors.As(err, &re) {
				return err
			}
			r.refused = re
			r.t.log.Warn("batch refused", "batch", h.batch, "error", re.err)
		}
		if r.refused != nil && !consumed {
			if _, err := io.CopyN(io.Discard, r.br, int64(h.payload)); err != nil {
				return err
			}
		}
	} else if _, err := io.CopyN(io.Discard, r.br, int64(h.payload)); err != nil {
		return err
	}
	if r.refused == nil {
		r.segs += uint64(h.segs)
		r.bytes += h.payload
	}
	if h.flags&flagLast == 0 {
		return nil
	}
	r.inShare = false
	if re := r.refused; re != nil {
		r.refused, r.segs, r.bytes = nil, 0, 0
		r.finish(h.batch, int(h.streams), false)
		return r.ack(re.status, h.batch, 0, re.err.Error())
	}
	// finish releases the batch's pin if this was its last share: once the
	// sender has every ack, the destination may be deregistered at once.
	r.finish(h.batch, int(h.streams), true)
	err := r.ack(statusOK, h.batch, r.bytes, "")
	r.segs, r.bytes = 0, 0
	return err
}

// hold returns the destination of the frame's batch, pinned for the whole
// batch: the first frame of the batch on any of the session's streams pins
// it, and finish releases it once every stream's share is done.
func (r *receiver) hold(h *frameHeader) (memory.Memory, error) {
	t, s := r.t, r.s
	t.mu.Lock()
	p := s.batches[h.batch]
	t.mu.Unlock()
	if p.release == nil {
		mem, release, err := t.in.Pin(transport.TCP, h.key)
		if err != nil {
			return memory.Memory{}, err
		}
		t.mu.Lock()
		p = s.batches[h.batch]
		if p.release == nil {
			p.key, p.mem, p.release = h.key, mem, release
			if h.holdMS > 0 {
				p.holdUntil = time.Now().Add(time.Duration(min(h.holdMS, maxHoldMS))*time.Millisecond + holdGrace).UnixNano()
			}
			s.batches[h.batch] = p
			if p.holdUntil != 0 {
				t.reholdLocked(s)
			}
			release = nil
		}
		t.mu.Unlock()
		if release != nil { // another stream pinned it meanwhile
			release()
		}
	}
	if p.key != h.key {
		return memory.Memory{}, fmt.Errorf("%w: key %#x differs from the key %#x of the batch's earlier frames", errs.ErrInvalidArgument, h.key, p.key)
	}
	return p.mem, nil
}

// place validates the frame's table against the pinned destination, then
// reads every segment straight into it. A *recvErr refuses the batch;
// consumed says whether the payload was read off the stream regardless.
func (r *receiver) place(h *frameHeader, table []byte) (consumed bool, _ error) {
	mem, err := r.hold(h)
	if err != nil {
		return false, &recvErr{statusBadKey, fmt.Errorf("tcp: batch %d: destination: %w", h.batch, err)}
	}
	return r.placeIn(h, table, mem)
}

// placeIn validates the frame's table (destination offset, length) against
// mem, then reads the frame's payload off the stream straight into mem: a
// peer's write frame into a pinned region here, or a pull's response into
// the puller's own region (read.go).
func (r *receiver) placeIn(h *frameHeader, table []byte, mem memory.Memory) (consumed bool, _ error) {
	if mem.Kind == memory.CUDA && r.t.cfg.Staging == nil {
		return false, &recvErr{statusUnsupported, fmt.Errorf("tcp: batch %d: destination is %s memory and this daemon has no CUDA driver", h.batch, mem.Kind)}
	}
	le := binary.LittleEndian
	var sum uint64
	for i := 0; i < int(h.segs); i++ {
		off, n := le.Uint64(table[i*segLen:]), le.Uint64(table[i*segLen+8:])
		if n == 0 || off > mem.Len || n > mem.Len-off {
			return false, &recvErr{statusBadRange, fmt.Errorf("tcp: batch %d: segment %d [%d,+%d) is outside the %d-byte destination", h.batch, i, off, n, mem.Len)}
		}
		sum += n
	}
	if sum != h.payload {
		return false, fmt.Errorf("tcp: batch %d: segments total %d bytes, header says %d", h.batch, sum, h.payload)
	}
	// No byte is placed once the sender fenced this session (fence). A
	// pull's response is placed by the puller's own stream (no session):
	// its Read returns only after that stream stopped.
	if r.s != nil {
		r.s.placing.RLock()
		defer r.s.placing.RUnlock()
		if r.s.fenced.Load() {
			return false, &recvErr{statusFenced, fmt.Errorf("tcp: batch %d: the sender cut it off (fenced); not placed", h.batch)}
		}
	}
	// Nor once the sender reset the stream (reset.go): it answered its
	// caller already, maybe long ago if this process was stopped, and the
	// fence may not have come yet. What follows checks again between reads.
	if r.lw.reset.reset(true) {
		return false, fmt.Errorf("tcp: batch %d: %w", h.batch, errReset)
	}
	if h := placeHook.Load(); h != nil {
		(*h)(r.lw.reset)
	}
	if mem.Kind == memory.CUDA {
		return r.placeDevice(h, table, mem)
	}
	// The destination's memory belongs to a client that may truncate its
	// file: a copy out of the read buffer faults in Go, a read(2) straight
	// into the region fails with EFAULT. Bytes are counted as they are
	// consumed off the stream (see read), so that after a fault the rest of
	// the frame is drained exactly and the stream stays in step; the batch is
	// then refused with statusDataLoss.
	var (
		seg        int
		done, got  uint64 // payload bytes consumed by whole segments; of segment seg
		rerr, ferr error
	)
	//
	// Segments that lie whole in the read buffer are copied out of a view of
	// it (Peek) in a tight loop, and the view is consumed (Discard) only
	// before the next read and after the frame: pend counts the bytes placed
	// from the view and not yet consumed, so that done+got is always the
	// payload placed, and after a fault pend bytes are consumed first.
	var pend int
	ferr = memguard.Do(memguard.Destination, func() {
		var view []byte
		for seg = 0; seg < int(h.segs); seg++ {
			off, n := le.Uint64(table[seg*segLen:]), le.Uint64(table[seg*segLen+8:])
			dst := mem.Host[off : off+n]
			if n <= uint64(len(view)-pend) {
				// Copied in pieces, the reset mark read between them
				// (after a stop, always): a receiver stopped mid-copy
				// places at most one piece once it runs again.
				if r.unchecked+int(n) < copyPiece { // a small block: no look yet
					copy(dst, view[pend:])
					r.unchecked += int(n)
					pend += int(n)
					done += n
					continue
				}
				k, err := r.copyChecked(dst, view[pend:])
				pend += k
				if err != nil {
					rerr = err
					return
				}
				done += n
				continue
			}
			if pend > 0 {
				_, _ = r.br.Discard(pend)
				pend = 0
			}
			view = nil
			for got = 0; got < n; {
				k, err := r.read(dst[got:], n >= directRead)
				got += uint64(k)
				if err != nil {
					rerr = err
					return
				}
			}
			got = 0
			done += n
			// The next segments may lie in what the read buffered.
			if b := r.br.Buffered(); b > 0 {
				view, _ = r.br.Peek(b)
			}
		}
		if pend > 0 {
			_, _ = r.br.Discard(pend)
			pend = 0
		}
	})
	if ferr == nil && rerr != nil && memguard.IsFault(rerr) {
		ferr = memguard.Syscall(memguard.Destination, "read", rerr)
	}
	if ferr != nil {
		off, n := le.Uint64(table[seg*segLen:]), le.Uint64(table[seg*segLen+8:])
		if pend > 0 {
			_, _ = r.br.Discard(pend)
		}
		if _, err := io.CopyN(io.Discard, r.br, int64(h.payload-done-got)); err != nil {
			return true, err
		}
		return true, &recvErr{statusDataLoss, fmt.Errorf("tcp: batch %d: destination region (key %#x, %d bytes) segment %d [%d,+%d): %w", h.batch, h.key, mem.Len, seg, off, n, ferr)}
	}
	if rerr == io.EOF {
		rerr = io.ErrUnexpectedEOF
	}
	return true, rerr
}

// read reads the next bytes of the stream into p, region memory, such that
// a fault on p never loses count of consumed bytes: a fault panics inside a
// copy that has not yet been counted as consumed (bufio and crypto/tls
// advance only after their copy), and a plaintext read(2) straight into p
// returns EFAULT having consumed nothing. bufio's own direct read is not
// used: it reads p's last byte after the read(2) consumed it, which faults
// with those bytes gone from the stream and not counted.
//
// large says p is (the rest of) a block of at least directRead bytes: its
// tail, however short, is read straight in too. Through the buffer, a tail
// left by a partial read(2) would fill the buffer with up to recvBuf bytes
// of the blocks after it, and each of those bytes would be copied twice.
// A straight read sets the socket's low-water mark to the rest of the block
// (lowWater.readBlock), so the reader wakes once per block.
func (r *receiver) read(p []byte, large bool) (int, error) {
	if r.direct && r.br.Buffered() == 0 && (large || len(p) >= directRead) {
		return r.lw.readBlock(p)
	}
	// Under the buffer's size: fill the buffer (lowWater.Read looks at the
	// reset mark after its read), then copy out piece by piece.
	if r.br.Buffered() == 0 {
		if _, err := r.br.Peek(1); err != nil {
			return 0, err
		}
	}
	view, _ := r.br.Peek(min(len(p), r.br.Buffered()))
	n, err := r.copyChecked(p, view)
	_, _ = r.br.Discard(n)
	return n, err
}

// copyPiece is the most a receiver places without a look at the clock:
// a receiver stopped (SIGSTOP, a paused VM) in the middle of a copy ends
// that piece when it runs again, then finds the time passed and reads the
// stream's reset mark before the next one.
const copyPiece = 16 << 10

// copyChecked copies src into dst (region memory) in pieces of at most
// copyPiece bytes counted across calls (a frame of small blocks is many
// calls), reading the stream's reset mark between pieces when
// resetCheckEvery has passed;
// n is what was copied, errReset if the sender reset the stream.
func (r *receiver) copyChecked(dst, src []byte) (n int, _ error) {
	for n < len(dst) && n < len(src) {
		if r.unchecked >= copyPiece {
			r.unchecked = 0
			if r.lw.reset.reset(false) {
				return n, errReset
			}
		}
		k := copy(dst[n:min(len(dst), n+copyPiece-r.unchecked)], src[n:])
		n += k
		r.unchecked += k
	}
	return n, nil
}

// placeDevice reads the frame's payload into the pinned buffer, then copies
// every segment to the GPU in one batched copy-engine call. Writes are per
// segment, never a covering range: that would clobber the gaps.
func (r *receiver) placeDevice(h *frameHeader, table []byte, mem memory.Memory) (consumed bool, _ error) {
	if r.stager == nil {
		st, err := r.t.cfg.Staging.Get(mem.Device)
		if err != nil {
			return false, &recvErr{statusUnsupported, fmt.Errorf("tcp: batch %d: %w", h.batch, err)}
		}
		r.stager = st
	}
	buf := r.stager.Buffer()
	if h.payload > uint64(len(buf)) {
		return false, &recvErr{statusUnsupported, fmt.Errorf("tcp: batch %d: a %d-byte frame exceeds the %d-byte staging buffer", h.batch, h.payload, len(buf))}
	}
	if _, err := io.ReadFull(r.br, buf[:h.payload]); err != nil {
		return true, err
	}
	n := int(h.segs)
	r.offs, r.lens, r.hostOf = r.offs[:0], r.lens[:0], r.hostOf[:0]
	le := binary.LittleEndian
	var at uint64
	for i := 0; i < n; i++ {
		off, l := le.Uint64(table[i*segLen:]), le.Uint64(table[i*segLen+8:])
		r.offs, r.lens, r.hostOf = append(r.offs, off), append(r.lens, l), append(r.hostOf, at)
		at += l
	}
	if r.lw.reset.reset(true) {
		return true, fmt.Errorf("tcp: batch %d: %w", h.batch, errReset)
	}
	if err := r.stager.Write(mem, r.offs, r.lens, r.hostOf); err != nil {
		return true, &recvErr{statusUnsupported, fmt.Errorf("tcp: batch %d: copy to the GPU: %w", h.batch, err)}
	}
	return true, nil
}

// finish adds this stream's share to the batch (ok: placed; else refused or
// cut off). Once every stream's share is done it releases the batch's pin
// and, if every share was placed, reports the batch as landed.
func (r *receiver) finish(batch uint64, streams int, ok bool) {
	t := r.t
	t.mu.Lock()
	p := r.s.batches[batch]
	p.done++
	if ok {
		p.segs += r.segs
		p.bytes += r.bytes
	} else {
		p.failed = true
	}
	complete := p.done >= streams // the streams this batch used, not the session's
	if complete {
		delete(r.s.batches, batch)
		if p.holdUntil != 0 {
			t.reholdLocked(r.s)
		}
	} else {
		r.s.batches[batch] = p
	}
	t.mu.Unlock()
	if !complete {
		return
	}
	if p.release != nil {
		p.release()
	}
	if !p.failed {
		t.in.Landed(transport.TCP, p.segs, p.bytes)
	}
}

func (r *receiver) ack(status uint32, batch, bytes uint64, msg string) error {
	if len(msg) > maxAckMsg {
		msg = msg[:maxAckMsg]
	}
	b := r.ackb[:ackLen+len(msg)]
	le := binary.LittleEndian
	le.PutUint32(b[0:], ackMagic)
	le.PutUint32(b[4:], status)
	le.PutUint64(b[8:], batch)
	le.PutUint64(b[16:], bytes)
	le.PutUint32(b[24:], uint32(len(msg)))
	le.PutUint32(b[28:], 0)
	copy(b[ackLen:], msg)
	_ = r.c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	_, err := r.c.Write(b)
	_ = r.c.SetWriteDeadline(time.Time{})
	return err
}

// ensure interface conformance
var _ transport.Transport = (*Transport)(nil)
