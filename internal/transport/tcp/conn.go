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
	"sync"
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
	if p.TCP.Addr == "" || len(p.TCP.Token) != 16 {
		return nil, fmt.Errorf("%w: tcp: peer %s offered no TCP data address or session token", errs.ErrUnavailable, p.Address)
	}
	addr, err := dataAddress(p.Address, p.TCP.Addr)
	if err != nil {
		return nil, err
	}
	var idb [8]byte
	if _, err := rand.Read(idb[:]); err != nil {
		return nil, fmt.Errorf("tcp: conn id: %w", err)
	}
	c := &conn{t: t, id: binary.LittleEndian.Uint64(idb[:]), addr: addr, quit: make(chan struct{}), staged: make(chan staged, 1)}
	var d interface {
		DialContext(context.Context, string, string) (net.Conn, error)
	} = &net.Dialer{}
	if t.cfg.TLS != nil {
		d = &tls.Dialer{Config: t.cfg.TLS.ClientFor(addr)}
	}
	for i := 0; i < t.cfg.Streams; i++ {
		nc, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("%w: tcp: dial data stream %d to %s: %w", errs.ErrUnavailable, i, addr, err)
		}
		if tc, ok := nc.(*net.TCPConn); ok {
			_ = tc.SetNoDelay(true)
		}
		s := newStream(c, nc, t.cfg.FrameBytes)
		c.streams = append(c.streams, s)
		if err := s.hello(ctx, p.TCP.Token, c.id, t.cfg.Streams, i); err != nil {
			c.Close()
			return nil, fmt.Errorf("%w: tcp: hello on data stream %d to %s: %w", errs.ErrUnavailable, i, addr, err)
		}
		go s.loop()
	}
	return c, nil
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
	t       *Transport
	id      uint64
	addr    string
	streams []*stream

	mu     sync.Mutex // one batch at a time on a conn
	batch  uint64
	errMu  sync.Mutex
	broken error
	once   sync.Once
	quit   chan struct{} // closed by Close: stream workers exit
	staged chan staged   // writeStaged's next round (Write holds mu)
	// results of the streams in the current batch (reused, no allocation)
	results []error
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

// Write sends the batch's segments over up to len(streams) streams, split by
// bytes, and waits for every stream's ack.
func (c *conn) Write(ctx context.Context, src transport.Registration, dst transport.RemoteRegion, b *desc.Batch) (transport.Stats, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.Err(); err != nil {
		// The cause is an earlier batch's (maybe its source's fault): named,
		// not wrapped, so that it does not classify this batch.
		return transport.Stats{}, fmt.Errorf("%w: tcp: connection to %s is broken: %v", errs.ErrUnavailable, c.addr, err)
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

// writeHost sends blocks of host memory src.
func (c *conn) writeHost(ctx context.Context, src []byte, dst transport.RemoteRegion, b *desc.Batch) (transport.Stats, error) {
	n := b.N()
	if n == 0 {
		return transport.Stats{}, nil
	}
	total := b.Bytes()
	use := int(total / uint64(c.t.cfg.MinShareBytes))
	use = max(1, min(use, len(c.streams), n))
	c.batch++

	// Split [0,n) into `use` contiguous shares of about total/use bytes.
	deadline, _ := ctx.Deadline()
	lo, acc, posted := 0, uint64(0), 0
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
		select {
		case c.streams[i].jobs <- job{batch: c.batch, key: dst.Key.Key, streams: uint32(use), src: src, b: b, lo: lo, hi: hi, deadline: deadline}:
			posted++
		case <-c.quit:
		}
		lo = hi
	}
	var frames uint64
	var first error
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
			if r.err != nil && first == nil {
				first = r.err
			}
			results = append(results, r.err)
			i++
		case <-ctx.Done():
			if !cancelled {
				cancelled = true
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
			c.fail(first)
		}
		if cancelled || ctx.Err() != nil {
			return transport.Stats{}, fmt.Errorf("tcp: batch %d to %s: %w", c.batch, c.addr, ctx.Err())
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
			return transport.Stats{}, fmt.Errorf("tcp: batch %d to %s: %w", c.batch, c.addr, context.DeadlineExceeded)
		}
		return transport.Stats{}, fmt.Errorf("%w: tcp: batch %d to %s cut off: %w", errs.ErrAborted, c.batch, c.addr, first)
	}
	return transport.Stats{Segments: uint64(n), WorkRequests: frames}, nil
}

type job struct {
	batch    uint64
	key      uint64
	streams  uint32
	src      []byte
	b        *desc.Batch
	lo, hi   int
	deadline time.Time
}

type result struct {
	frames uint64
	err    error
}

// stream is one data connection with its own worker goroutine and buffers,
// reused across batches so the data path does not allocate.
type stream struct {
	c     *conn
	nc    net.Conn
	jobs  chan job
	done  chan result
	hdr   []byte   // frame header + segment table
	small []byte   // staging for small blocks
	iov   [][]byte // vectored write list
	bufs  net.Buffers
	ackb  [ackLen + maxAckMsg]byte
}

func newStream(c *conn, nc net.Conn, frameBytes int) *stream {
	return &stream{
		c: c, nc: nc,
		jobs:  make(chan job),
		done:  make(chan result, 1),
		hdr:   make([]byte, headerLen+maxSegsPerFrame*segLen),
		small: make([]byte, 0, min(frameBytes, maxSegsPerFrame*copyBelow)),
		iov:   make([][]byte, 0, maxSegsPerFrame+1),
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
			f, err := s.send(j)
			s.done <- result{frames: f, err: err}
		case <-s.c.quit:
			return
		}
	}
}

// send writes the job's share as frames of up to FrameBytes payload and
// maxSegsPerFrame segments, then reads the receiver's ack.
func (s *stream) send(j job) (uint64, error) {
	_ = s.nc.SetDeadline(j.deadline)
	b, frameBytes := j.b, uint64(s.c.t.cfg.FrameBytes)
	var frames uint64
	for i := j.lo; i < j.hi; {
		// Pick the frame's segments.
		k, payload := i, uint64(0)
		for k < j.hi && k-i < maxSegsPerFrame && (payload == 0 || payload+b.Len[k] <= frameBytes) {
			payload += b.Len[k]
			k++
		}
		h := frameHeader{batch: j.batch, key: j.key, segs: uint32(k - i), streams: j.streams, payload: payload}
		if k == j.hi {
			h.flags = flagLast
		}
		hdr := s.hdr[:headerLen+(k-i)*segLen]
		h.put(hdr)
		// The source's memory belongs to a client that may truncate its
		// file: the staging copy (and TLS's encryption) fault in Go, the
		// writev with EFAULT. Either way the frame is cut short and the
		// stream out of step: the batch fails with DataLoss and the conn is
		// failed by Write, so the next batch gets a fresh one.
		var werr error
		ferr := memguard.Do(func() {
			s.frame(&j, i, k, hdr)
			_, werr = s.bufs.WriteTo(s.nc)
		})
		if ferr == nil && werr != nil && memguard.IsFault(werr) {
			ferr = fmt.Errorf("%w (%w): writev: %w", memguard.ErrFault, errs.ErrDataLoss, werr)
		}
		if ferr != nil {
			return frames, fmt.Errorf("source memory of segments %d..%d: %w", i, k-1, ferr)
		}
		if werr != nil {
			return frames, werr
		}
		frames++
		i = k
	}
	return frames, s.readAck(j.batch)
}

// frame fills the frame's segment table and its write list, blocks [i,k)
// of the job, into s.bufs; small blocks are copied into s.small.
func (s *stream) frame(j *job, i, k int, hdr []byte) {
	b := j.b
	le := binary.LittleEndian
	iov, small := append(s.iov[:0], hdr), s.small[:0]
	runStart := -1 // start of the current run of small blocks in `small`
	for x := i; x < k; x++ {
		off, n := b.Src[x], b.Len[x]
		le.PutUint64(hdr[headerLen+(x-i)*segLen:], b.Dst[x])
		le.PutUint64(hdr[headerLen+(x-i)*segLen+8:], n)
		if n < copyBelow && uint64(len(small))+n <= uint64(cap(small)) {
			if runStart < 0 {
				runStart = len(small)
			}
			small = append(small, j.src[off:off+n]...)
			continue
		}
		if runStart >= 0 {
			iov = append(iov, small[runStart:])
			runStart = -1
		}
		iov = append(iov, j.src[off:off+n])
	}
	if runStart >= 0 {
		iov = append(iov, small[runStart:])
	}
	s.bufs = iov // a field, so WriteTo's pointer receiver does not escape a local
}

// ackError is the receiver's refusal of a batch.
type ackError struct {
	status uint32
	msg    string
}

func (e *ackError) Error() string { return "tcp: receiver refused the batch: " + e.msg }

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
		return errs.ErrDataLoss
	default:
		return errs.ErrAborted
	}
}

func (s *stream) readAck(batch uint64) error {
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
