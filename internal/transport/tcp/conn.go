package tcp

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memguard"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/staging"
	"github.com/b2bd/b2bd/internal/transport"
)

// Connect dials the peer's data listener with Config.Streams connections.
func (t *Transport) Connect(ctx context.Context, p transport.Peer) (transport.Conn, error) {
	ep, err := parseAdvert(p.Advert)
	if err != nil {
		return nil, fmt.Errorf("tcp: peer %s: %w", p.Address, err)
	}
	if ep.GetDataAddress() == "" || len(ep.GetSessionToken()) != 16 {
		return nil, fmt.Errorf("%w: tcp: peer %s offered no TCP data address or session token", errs.ErrUnavailable, p.Address)
	}
	addr, err := dataAddress(p.Address, ep.GetDataAddress())
	if err != nil {
		return nil, err
	}
	var idb [8]byte
	if _, err := rand.Read(idb[:]); err != nil {
		return nil, fmt.Errorf("tcp: conn id: %w", err)
	}
	var d interface {
		DialContext(context.Context, string, string) (net.Conn, error)
	} = &net.Dialer{}
	if t.cfg.TLS != nil {
		d = &tls.Dialer{Config: t.cfg.TLS.ClientFor(addr)}
	}
	c := &conn{t: t, id: binary.LittleEndian.Uint64(idb[:]), addr: addr, mu: make(chan struct{}, 1), quit: make(chan struct{}), staged: make(chan staged, 1),
		smallCap: min(t.cfg.FrameBytes, maxSegsPerFrame*copyBelow), dialer: d, token: ep.GetSessionToken()}
	c.Handlers = transport.Handlers{Write: c.write, Read: c.read, WriteBlocks: c.writeBlocks, ReadBlocks: c.readBlocks}
	// The streams connect side by side: one after another, each dial and
	// hello waited for a busy peer's accept in turn, and a connection
	// took 10-37 ms to a loaded daemon on two cores, a batch's wait.
	c.streams = make([]*stream, t.cfg.Streams)
	// The first failure is the one reported: it cancels the others.
	var first error
	var firstMu sync.Mutex
	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for i := range c.streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := c.dialStream(dctx, i)
			if err != nil {
				firstMu.Lock()
				if first == nil {
					first = err
				}
				firstMu.Unlock()
				cancel()
			}
			c.streams[i] = s
		}()
	}
	wg.Wait()
	if err := first; err != nil {
		c.closeDialed()
		return nil, err
	}
	for _, s := range c.streams {
		go s.loop()
	}
	return c, nil
}

// dialStream connects data stream i and says hello on it.
func (c *conn) dialStream(ctx context.Context, i int) (*stream, error) {
	nc, err := c.dialer.DialContext(ctx, "tcp", c.addr)
	if err != nil {
		return nil, fmt.Errorf("%w: tcp: dial data stream %d to %s: %w", errs.ErrUnavailable, i, c.addr, err)
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	s := newStream(c, nc)
	if err := s.hello(ctx, c.token, c.id, len(c.streams), i); err != nil {
		_ = nc.Close()
		return nil, fmt.Errorf("%w: tcp: hello on data stream %d to %s: %w", errs.ErrUnavailable, i, c.addr, err)
	}
	return s, nil
}

// closeDialed closes the streams a failed Connect opened (none of them
// runs its loop yet).
func (c *conn) closeDialed() {
	for _, s := range c.streams {
		if s != nil {
			_ = s.nc.Close()
		}
	}
	c.streams = nil
	c.Close()
}

// dataAddress fills in the host of an advertised data address that listens on
// all interfaces with the host we reached the peer's control plane at.
func dataAddress(peer, data string) (string, error) {
	host, port, err := net.SplitHostPort(data)
	if err != nil {
		return "", fmt.Errorf("%w: tcp: peer advertised data address %q: %v", errs.ErrUnavailable, data, err)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		ph, _, err := net.SplitHostPort(peer)
		if err != nil {
			return "", fmt.Errorf("%w: tcp: peer address %q: %v", errs.ErrInvalidArgument, peer, err)
		}
		host = ph
	}
	return net.JoinHostPort(host, port), nil
}

type conn struct {
	transport.Handlers
	t       *Transport
	id      uint64
	addr    string
	streams []*stream

	mu    chan struct{} // one batch at a time on a conn (lockCtx)
	batch uint64
	// cut is the batch a cancellation cut off: a stream worker that sets
	// its job's deadline after Write's past deadline re-cuts itself, so a
	// caller's cancel (no deadline) cannot be undone by that race.
	cut    atomic.Uint64
	errMu  sync.Mutex
	broken error
	once   sync.Once
	quit   chan struct{} // closed by Close: stream workers exit
	staged chan staged   // writeStaged's next round (Write holds mu)
	// results of the streams in the current batch (reused, no allocation)
	results []error
	// scratch is the ad hoc batch's plan, rebuilt by every Write (mu held).
	scratch plan
	// smallCap is each stream's staging buffer for small blocks.
	smallCap int
	// blocks is WriteBlocks' reusable memory (blocks.go).
	blocks blockState
	// dialer and token open the fence connection (fence).
	dialer interface {
		DialContext(context.Context, string, string) (net.Conn, error)
	}
	token []byte
	// fenceDone is closed when the fence's answer came or it failed (once
	// per conn; mu held); fenceOK says which.
	fenceDone chan struct{}
	fenceOK   atomic.Bool
	// cutAcked: the last cutOff saw the receiver's fence ack (mu held).
	cutAcked bool
}

// fenceTimeout bounds the fence's dial and the receiver's answer.
const fenceTimeout = 5 * time.Second

// fenceWait is the longest a cut-off batch's answer waits for the fence's
// ack, and fenceGrace how far past the caller's deadline that wait may
// reach: the answer to a caller whose deadline passed comes within
// deadline + fenceGrace plus scheduling, well inside what callers allow.
const (
	fenceWait  = 50 * time.Millisecond
	fenceGrace = 60 * time.Millisecond
)

// cutOff fails the conn after a batch was cut off mid-way (deadline,
// cancel, a failed stream). The streams are reset, so the receiver places
// none of their bytes once it sees the reset (reset.go), and the fence
// tells the receiver the conn is cut; its ack means no byte of the conn is
// placed any more, including one a receiver read in before the reset came.
// The answer waits for that ack a short bounded time (fenceWait, within
// fenceGrace of ctx's deadline): a receiver that is stopped or starved
// does not hold the caller, and the reset mark covers it. It reports
// whether the ack came (c.cutAcked, for cutNote). The next batch to the
// peer gets a fresh conn, whose streams are others. c.mu is held.
func (c *conn) cutOff(ctx context.Context, first error, batches string) {
	for _, s := range c.streams {
		_ = abort(s.nc)
	}
	c.fail(first)
	if c.fenceDone == nil {
		done := make(chan struct{})
		c.fenceDone = done
		go func() {
			defer close(done)
			if err := c.fence(); err != nil {
				c.t.log.Warn("tcp: cut-off batches could not be fenced; their streams were reset, which stops the receiver placing them", "batches", batches, "peer", c.addr, "error", err)
				return
			}
			c.fenceOK.Store(true)
		}()
	}
	wait := fenceWait
	if d, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(d.Add(fenceGrace)))
	}
	c.cutAcked = false
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-c.fenceDone:
		case <-t.C:
		}
	} else {
		select {
		case <-c.fenceDone:
		default:
		}
	}
	c.cutAcked = c.fenceOK.Load()
}

// cutNote tells the caller of a cut-off batch where its bytes may still be
// and whether the receiver confirmed it places none of them (cutOff).
func (c *conn) cutNote(read bool) string {
	if read {
		return " (this daemon stopped placing the answer before this reply; the peer's unsent bytes are dropped)"
	}
	if c.cutAcked {
		return " (the streams were reset and the receiver confirmed it places none of its bytes any more)"
	}
	return " (the streams were reset, and the receiver did not confirm in time that it stopped, being stopped, starved or unreachable: once it sees the reset it places no byte more; the copy (16 KiB at most) or the read it was entering as it stopped may still complete)"
}

// fence tells the receiver that this conn is cut off and waits for its
// word that it places no byte of it any more: closing the streams alone
// does not withdraw the frames already in the receiver's socket buffers,
// which a receiver stalled (in Pin, say) would place later. It runs in the
// background (cutOff), once. An error means the receiver could not be
// reached: a receiver that is gone places nothing either, one cut off from
// us stops at the streams' reset or its frame timeout.
func (c *conn) fence() error {
	ctx, cancel := context.WithTimeout(context.Background(), fenceTimeout)
	defer cancel()
	nc, err := c.dialer.DialContext(ctx, "tcp", c.addr)
	if err != nil {
		return fmt.Errorf("tcp: fence: dial %s: %w", c.addr, err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(fenceTimeout))
	var b [helloLen]byte
	le := binary.LittleEndian
	le.PutUint32(b[0:], fenceMagic)
	le.PutUint32(b[4:], version)
	copy(b[8:24], c.token)
	le.PutUint64(b[24:], c.id)
	if _, err := nc.Write(b[:]); err != nil {
		return fmt.Errorf("tcp: fence: %w", err)
	}
	var w [welcomeLen]byte
	if _, err := io.ReadFull(nc, w[:]); err != nil {
		return fmt.Errorf("tcp: fence: waiting for the receiver: %w", err)
	}
	if le.Uint32(w[0:]) != welcomeMagic || le.Uint32(w[4:]) != 0 {
		return errors.New("tcp: fence: the receiver refused it")
	}
	return nil
}

// anyUnclean: some stream failed otherwise than by a clean refusal.
func anyUnclean(errs []error) bool {
	for _, err := range errs {
		var refused *ackError
		if err != nil && !errors.As(err, &refused) {
			return true
		}
	}
	return false
}

func (c *conn) Err() error {
	c.errMu.Lock()
	defer c.errMu.Unlock()
	return c.broken
}

// brokenBefore is the error of a batch that found the conn broken by err
// (an earlier batch's failure) before it sent anything. The cause is
// named, not wrapped, so that it does not classify this batch.
func (c *conn) brokenBefore(err error) error {
	return fmt.Errorf("%w: %w: tcp: connection to %s is broken: %v", errs.ErrUnavailable, transport.ErrNotSent, c.addr, err)
}

func (c *conn) fail(err error) {
	c.errMu.Lock()
	if c.broken == nil {
		c.broken = err
	}
	c.errMu.Unlock()
	c.Close()
}

func (c *conn) Close() error {
	c.once.Do(func() {

		close(c.quit)
		for _, s := range c.streams {
			s.nc.Close()
		}
	})
	return nil
}

// lockCtx takes the conn for one batch unless ctx ends first: a batch
// queued behind another that waits on a stopped peer answers at its own
// deadline or cancel, not the other batch's. unlock lets it go.
//
// It returns how long the batch waited, which the batch's Stats count as
// post: a batch queued behind another was handed over late, and its wire
// is its own bytes only.
func (c *conn) lockCtx(ctx context.Context) (time.Duration, error) {
	select {
	case c.mu <- struct{}{}:
		return 0, nil
	default:
	}
	t := time.Now()
	select {
	case c.mu <- struct{}{}:
		return time.Since(t), nil
	case <-ctx.Done():
		return 0, fmt.Errorf("tcp: %w while waiting for the connection to %s, busy with another batch (the peer may be stopped): %w", ctx.Err(), c.addr, transport.ErrNotSent)
	}
}

func (c *conn) unlock() { <-c.mu }

// Write sends the batch's segments over up to len(streams) streams, split by
// bytes, and waits for every stream's ack.
func (c *conn) write(ctx context.Context, src transport.Registration, dst transport.RemoteRegion, b *desc.Batch) (st transport.Stats, err error) {
	waited, err := c.lockCtx(ctx)
	if err != nil {
		return transport.Stats{}, err
	}
	defer c.unlock()
	defer func() { st.Post += waited }()
	if err := c.Err(); err != nil {
		return transport.Stats{}, c.brokenBefore(err)
	}
	mem := src.Memory()
	if mem.Kind == memory.CUDA {
		return c.writeStaged(ctx, mem, dst, b)
	}
	return c.writeHost(ctx, mem.Host, dst, b)
}

// staged is one round of GPU blocks copied into a pinned buffer.
type staged struct {
	lo, n   int
	hostOff []uint64
	err     error
}

// writeStaged sends GPU blocks in rounds that fit a pinned buffer, with two
// buffers so that staging round k+1 overlaps sending round k.
func (c *conn) writeStaged(ctx context.Context, mem memory.Memory, dst transport.RemoteRegion, b *desc.Batch) (transport.Stats, error) {
	pool := c.t.cfg.Staging
	if pool == nil {
		return transport.Stats{}, fmt.Errorf("%w: tcp: source is %s memory and this daemon has no CUDA driver", errs.ErrFailedPrecondition, mem.Kind)
	}
	var st [2]*staging.Stager
	for i := range st {
		s, err := pool.Get(mem.Device)
		if err != nil {
			return transport.Stats{}, err
		}
		defer pool.Put(s)
		st[i] = s
	}
	stage := func(s *staging.Stager, lo int) staged {
		n, off, err := s.Read(mem, b.Src[lo:], b.Len[lo:])
		return staged{lo: lo, n: n, hostOff: off, err: err}
	}
	var total transport.Stats
	cur := stage(st[0], 0)
	for k := 0; ; k++ {
		if cur.err != nil {
			return total, cur.err
		}
		// One goroutine per round of up to a pinned buffer (64 MiB), so the
		// staging copy overlaps the send; the channel is the conn's, reused.
		next := c.staged
		end := cur.lo + cur.n
		if end < b.N() {
			go func() { next <- stage(st[(k+1)%2], end) }()
		}
		round := desc.Batch{Src: cur.hostOff[:cur.n], Dst: b.Dst[cur.lo:end], Len: b.Len[cur.lo:end]}
		s, err := c.writeHost(ctx, st[k%2].Buffer(), dst, &round)
		total.Segments += s.Segments
		total.WorkRequests += s.WorkRequests
		total.Plan += s.Plan
		total.Post += s.Post
		if err != nil {
			if end < b.N() {
				<-next // the copy in flight must finish before its buffer is reused
			}
			return total, err
		}
		if end >= b.N() {
			return total, nil
		}
		cur = <-next
	}
}

// writeHost sends blocks of host memory src: it builds the batch's plan in
// the conn's scratch plan (reused, so nothing is allocated), then runs it.
func (c *conn) writeHost(ctx context.Context, src []byte, dst transport.RemoteRegion, b *desc.Batch) (transport.Stats, error) {
	if b.N() == 0 {
		return transport.Stats{}, nil
	}
	t0 := time.Now()
	if err := checkBounds(b, uint64(len(src)), dst.Size); err != nil {
		return transport.Stats{}, err
	}
	c.scratch.build(b, dst.Key.Key, c.limits())
	st, err := c.run(ctx, &c.scratch, src, t0)
	c.scratch.trim()
	return st, err
}

func (c *conn) limits() planLimits {
	return planLimits{
		streams:    len(c.streams),
		minShare:   uint64(c.t.cfg.MinShareBytes),
		frameBytes: uint64(c.t.cfg.FrameBytes),
		smallCap:   uint64(c.smallCap),
	}
}

// run sends plan p of source memory src over its streams, one share per
// stream, and waits for every stream's ack. Stats.Plan is the time from
// start to the first post (for a prepared plan, pass the time of the call:
// near 0), Stats.Post the longest a stream spent handing its frames over
// (staging and write lists; see result.post). c.mu is held.
func (c *conn) run(ctx context.Context, p *plan, src []byte, start time.Time) (transport.Stats, error) {
	use := len(p.shares)
	if use == 0 {
		return transport.Stats{Plan: time.Since(start)}, nil
	}
	c.batch++
	deadline, _ := ctx.Deadline()
	postStart := time.Now()
	posted := 0
	for i := 0; i < use; i++ {
		select {
		case c.streams[i].jobs <- job{batch: c.batch, p: p, share: i, src: src, deadline: deadline}:
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
	results := c.results[:0]
	if posted < use {
		first = net.ErrClosed
		results = append(results, net.ErrClosed)
	}
	// Cancellation interrupts the streams through their deadlines; the
	// workers then report and we still collect every result.
	cancelled := false
	for i := 0; i < posted; {
		select {
		case r := <-c.streams[i].done:
			frames += r.frames
			post = max(post, r.post)
			if r.err != nil && first == nil {
				first = r.err
			}
			results = append(results, r.err)
			i++
		case <-ctx.Done():
			if !cancelled {
				cancelled = true
				c.cut.Store(c.batch)
				for _, s := range c.streams {
					_ = s.nc.SetDeadline(time.Unix(1, 0))
				}
			}
		}
	}
	c.results = results
	if first != nil {
		// A refusal leaves every stream in step (the receiver read the whole
		// batch); any other failure leaves a stream in an unknown state, and
		// it cannot carry the next batch.
		var refused *ackError
		if !errors.As(first, &refused) || cancelled || anyUnclean(results) {
			// Some stream's share was cut: what the receiver already holds
			// of it must not land once we answer.
			c.cutOff(ctx, first, strconv.FormatUint(c.batch, 10))
		}
		if cancelled || ctx.Err() != nil {
			return transport.Stats{}, fmt.Errorf("tcp: batch %d to %s: %w%s", c.batch, c.addr, ctx.Err(), c.cutNote(p.read))
		}
		for _, err := range results {
			if memguard.IsFault(err) {
				return transport.Stats{}, fmt.Errorf("tcp: batch %d to %s: %w", c.batch, c.addr, err)
			}
		}
		if refused != nil {
			return transport.Stats{}, refused
		}
		if errors.Is(first, os.ErrDeadlineExceeded) {
			return transport.Stats{}, fmt.Errorf("tcp: batch %d to %s: %w%s", c.batch, c.addr, context.DeadlineExceeded, c.cutNote(p.read))
		}
		return transport.Stats{}, fmt.Errorf("%w: tcp: batch %d to %s cut off: %w", errs.ErrAborted, c.batch, c.addr, first)
	}
	return transport.Stats{Segments: p.segs, WorkRequests: frames, Plan: postStart.Sub(start), Post: post}, nil
}

type job struct {
	blocks   *blockJob // a block request's batches (blocks.go); else one batch
	batch    uint64
	p        *plan
	share    int
	src      []byte
	deadline time.Time
}

type result struct {
	frames uint64
	// post: the time the stream spent handing its frames over: staging the
	// small blocks and laying out the write lists. The socket writes
	// themselves are the wire: on a blocked socket they wait for the receiver.
	post time.Duration
	err  error
}

// stream is one data connection with its own worker goroutine and buffers,
// reused across batches so the data path does not allocate.
type stream struct {
	c     *conn
	nc    net.Conn
	jobs  chan job
	done  chan result
	small []byte   // staging for small blocks, grown as frames need it (stagingSize)
	iov   [][]byte // vectored write list
	bufs  net.Buffers
	ackb  [ackLen + maxAckMsg]byte
	// rx places pulled bytes (read.go), made on the first pull; rtable is
	// its per-frame table.
	rx     *receiver
	rtable []byte
	// blk is the stream's part of block requests (blocks.go).
	blk streamBlocks
}

func newStream(c *conn, nc net.Conn) *stream {
	return &stream{
		c: c, nc: nc,
		jobs: make(chan job),
		done: make(chan result, 1),
		iov:  make([][]byte, 0, maxSegsPerFrame+1),
	}
}

func (s *stream) hello(ctx context.Context, token []byte, id uint64, streams, index int) error {
	var b [helloLen]byte
	le := binary.LittleEndian
	le.PutUint32(b[0:], helloMagic)
	le.PutUint32(b[4:], version)
	copy(b[8:24], token)
	le.PutUint64(b[24:], id)
	le.PutUint32(b[32:], uint32(streams))
	le.PutUint32(b[36:], uint32(index))
	dl := time.Now().Add(10 * time.Second)
	if d, ok := ctx.Deadline(); ok && d.Before(dl) {
		dl = d
	}
	_ = s.nc.SetDeadline(dl)
	defer s.nc.SetDeadline(time.Time{})
	// A cancelled caller cuts the hello short too, not only a deadline.
	stop := context.AfterFunc(ctx, func() { _ = s.nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := s.nc.Write(b[:]); err != nil {
		return err
	}
	var w [welcomeLen]byte
	if _, err := io.ReadFull(s.nc, w[:]); err != nil {
		return err
	}
	if le.Uint32(w[0:]) != welcomeMagic || le.Uint32(w[4:]) != 0 {
		return errors.New("peer refused the data connection")
	}
	return nil
}

func (s *stream) loop() {
	for {
		select {
		case j := <-s.jobs:
			var r result
			if j.blocks != nil {
				r = s.sendBlocks(&j)
			} else if j.p.read {
				r = s.pull(&j)
			} else {
				r = s.send(&j)
			}
			s.done <- r
		case <-s.c.quit:
			if s.rx != nil {
				s.rx.releaseStager()
			}
			return
		}
	}
}

// send writes the job's share of its plan, frame by frame, then reads the
// receiver's ack.
func (s *stream) send(j *job) result {
	_ = s.nc.SetDeadline(j.deadline)
	if s.c.cut.Load() == j.batch { // cancelled before the deadline above was set
		_ = s.nc.SetDeadline(time.Unix(1, 0))
	}
	p := j.p
	sh := p.shares[j.share]
	var r result
	for f := sh.lo; f < sh.hi; f++ {
		fr := &p.frames[f]
		hdr := p.hdr[fr.hdrLo:fr.hdrHi]
		binary.LittleEndian.PutUint64(hdr[8:], j.batch)
		binary.LittleEndian.PutUint64(hdr[40:], holdMSAt(j.deadline))
		// The source's memory belongs to a client that may truncate its
		// file: the staging copy (and TLS's encryption) fault in Go, the
		// writev with EFAULT. Either way the frame is cut short and the
		// stream out of step: the batch fails with DataLoss and the conn is
		// failed by Write, so the next batch gets a fresh one.
		var werr error
		t0 := time.Now()
		ferr := memguard.Do(memguard.Source, func() {
			s.frame(p, fr, j.src, hdr)
			r.post += time.Since(t0)
			_, werr = s.bufs.WriteTo(s.nc)
		})
		if ferr == nil && werr != nil && memguard.IsFault(werr) {
			ferr = memguard.Syscall(memguard.Source, "writev", werr)
		}
		if ferr != nil {
			r.err = fmt.Errorf("source memory of segments %d..%d: %w", fr.blk.lo, fr.blk.hi-1, ferr)
			return r
		}
		if werr != nil {
			r.err = werr
			return r
		}
		r.frames++
	}
	r.err = s.readAck(j.batch)
	return r
}

// frame stages the frame's small blocks and fills its write list into
// s.bufs.
func (s *stream) frame(p *plan, fr *pframe, src, hdr []byte) {
	if n := fr.cp.hi; n > fr.cp.lo {
		if last := p.copies[n-1]; uint64(len(s.small)) < last.at+last.n {
			s.small = make([]byte, stagingSize(last.at+last.n, s.c.smallCap))
		}
	}
	small := s.small
	for _, c := range p.copies[fr.cp.lo:fr.cp.hi] {
		copy(small[c.at:c.at+c.n], src[c.src:c.src+c.n])
	}
	iov := append(s.iov[:0], hdr)
	for _, pc := range p.pieces[fr.pc.lo:fr.pc.hi] {
		if pc.staged {
			iov = append(iov, small[pc.off:pc.off+pc.n])
		} else {
			iov = append(iov, src[pc.off:pc.off+pc.n])
		}
	}
	s.bufs = iov // a field, so WriteTo's pointer receiver does not escape a local
}

// stagingSize is the size of a stream's staging buffer that holds need
// bytes: a power of two from 64 KiB, at most limit (a frame's staged bytes
// never pass it). A stream's buffer grows as its frames need it, up to a few
// times, rather than taking limit (4 MiB, zeroed) at its connect: a conn's
// streams took 16 MiB and the connect 1.2 ms on an idle machine, most of it
// for pulls, which never stage.
func stagingSize(need uint64, limit int) int {
	n := uint64(64 << 10)
	for n < need {
		n *= 2
	}
	return int(max(min(n, uint64(limit)), need)) // never short of need, whatever the limit
}

// ackError is the receiver's refusal of a batch.
type ackError struct {
	status uint32
	msg    string
	// read: the peer refused a pull from its region named region.
	read   bool
	region string
}

func (e *ackError) Error() string {
	if e.read {
		return fmt.Sprintf("tcp: the peer refused the read of region %q: %s", e.region, e.msg)
	}
	return "tcp: receiver refused the batch: " + e.msg
}

// Unwrap maps the receiver's status to the domain error the caller reports.
func (e *ackError) Unwrap() error {
	switch e.status {
	case statusBadKey:
		return errs.ErrNotFound
	case statusBadRange:
		return errs.ErrInvalidArgument
	case statusUnsupported:
		return errs.ErrUnimplemented
	case statusDataLoss:
		if e.read { // the peer's region is a pull's source
			return memguard.At(memguard.Source)
		}
		return memguard.At(memguard.Destination) // DataLoss, on the destination's side
	default:
		return errs.ErrAborted
	}
}

func (s *stream) readAck(batch uint64) error {
	// A pull on this stream placed its answer with a low-water mark of up
	// to a block (lowWater.readBlock); a few-byte ack would never wake a
	// read under it.
	if s.rx != nil {
		if err := s.rx.lw.mark(1); err != nil {
			return err
		}
	}
	b := s.ackb[:ackLen]
	if _, err := io.ReadFull(s.nc, b); err != nil {
		return err
	}
	le := binary.LittleEndian
	if le.Uint32(b[0:]) != ackMagic {
		return fmt.Errorf("bad ack magic %#x", le.Uint32(b[0:]))
	}
	status, got, n := le.Uint32(b[4:]), le.Uint64(b[8:]), int(le.Uint32(b[24:]))
	if status != statusOK {
		n = min(n, maxAckMsg)
		msg := s.ackb[ackLen : ackLen+n]
		_, _ = io.ReadFull(s.nc, msg)
		return &ackError{status: status, msg: string(msg)}
	}
	if got != batch {
		return fmt.Errorf("ack for batch %d while waiting for %d", got, batch)
	}
	return nil
}
