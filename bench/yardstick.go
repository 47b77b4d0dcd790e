package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"time"

	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// Yardstick is a plain TCP loopback stream that b2bd's TCP transport is
// compared with: what one connection on this machine moves with large writes
// and no per-block work at all.
type Yardstick struct {
	GBps   float64 // best trial
	Bytes  uint64  // per trial
	Trials int
	// SrcBytes and DstBytes are the memory the stream reads from and writes
	// into, cycled through: a 4 MiB buffer stays in the CPU's caches, a
	// region as large as the bench's does not.
	SrcBytes, DstBytes uint64
}

// Yardstick kinds (--yardstick).
const (
	// YardstickCached streams from a 4 MiB buffer into another: the best a
	// TCP connection on this host can do, with the data in cache.
	YardstickCached = "cached"
	// YardstickStream streams from the bench's source region into its
	// destination region (embedded mode), as b2bd must: every byte comes
	// from and goes to DRAM. This is the one the ratio is taken against.
	YardstickStream = "stream"
	// YardstickRaw (GPU memory, rawcopy.go) copies each batch's own blocks
	// with one cuMemcpyBatchAsync from the bench: the copy engines' floor,
	// interleaved with the batches.
	YardstickRaw = "raw"
)

// yardstickChunk is the size of each write and read: large enough that
// syscall cost vanishes.
const yardstickChunk = 4 << 20

// YardstickBytes picks the stream length: the largest batch of blocks of
// 256 KiB and up (the sizes compared with it), at least 1 GiB so the result
// is stable, at most 8 GiB to keep the run short.
func YardstickBytes(plans []SizePlan) uint64 {
	var biggest uint64
	for _, p := range plans {
		if p.BlockBytes >= RatioMinBlock {
			biggest = max(biggest, p.BlockBytes*uint64(p.Blocks))
		}
	}
	return min(max(biggest, 1<<30), 8<<30)
}

// MeasureTCPLoopback streams bytes over one TCP connection on 127.0.0.1 from
// a 4 MiB buffer into another, trials times, and returns the best rate.
func MeasureTCPLoopback(ctx context.Context, bytes uint64, trials int) (Yardstick, error) {
	src := make([]byte, yardstickChunk)
	FillRandom(src, 0x5eed)
	return MeasureTCPStream(ctx, src, make([]byte, yardstickChunk), bytes, trials)
}

// MeasureTCPStream streams bytes over one TCP connection on 127.0.0.1,
// trials times, and returns the best rate (see YardstickLink.Trial).
func MeasureTCPStream(ctx context.Context, src, dst []byte, bytes uint64, trials int) (ys Yardstick, err error) {
	l, err := OpenYardstick(ctx, src, dst)
	if err != nil {
		return Yardstick{}, err
	}
	defer func() {
		if cerr := l.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	best := time.Duration(0)
	for t := 0; t < trials; t++ {
		el, err := l.Trial(ctx, bytes)
		if err != nil {
			return Yardstick{}, err
		}
		if best == 0 || el < best {
			best = el
		}
	}
	return Yardstick{GBps: GBps(bytes, best), Bytes: bytes, Trials: trials, SrcBytes: uint64(len(src)), DstBytes: uint64(len(dst))}, nil
}

// YardstickLink is one TCP loopback connection, set up once and kept for
// many trials, so that a trial times only the stream: the bench interleaves
// its trials with b2bd's timed batches of the same bytes.
type YardstickLink struct {
	ln       net.Listener
	c        net.Conn
	src, dst []byte
	want     chan uint64   // a trial's length, to the reader
	done     chan error    // the reader's end
	dead     chan struct{} // closed when the reader has returned
	closed   bool
}

// OpenYardstick connects a writer streaming from src with a reader writing
// into dst over one TCP connection on 127.0.0.1.
func OpenYardstick(ctx context.Context, src, dst []byte) (*YardstickLink, error) {
	if len(src) == 0 || len(dst) == 0 {
		return nil, errors.New("yardstick: empty source or destination buffer")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("yardstick: listen: %w", err)
	}
	l := &YardstickLink{ln: ln, src: src, dst: dst, want: make(chan uint64, 1), done: make(chan error, 1), dead: make(chan struct{})}
	go func() {
		l.done <- yardstickReader(ln, dst, l.want)
		close(l.dead)
	}()
	var d net.Dialer
	if l.c, err = d.DialContext(ctx, "tcp", ln.Addr().String()); err != nil {
		close(l.want)
		_ = ln.Close()
		<-l.done
		return nil, fmt.Errorf("yardstick: dial: %w", err)
	}
	return l, nil
}

// Trial streams bytes from the front of src into the front of dst (round
// again when bytes exceeds a buffer) in 4 MiB writes, and returns the time
// from the first write to the reader's acknowledgement that it holds every
// byte: delivery, not buffering. With buffers larger than the caches every
// byte crosses DRAM twice, as a daemon's does.
func (l *YardstickLink) Trial(ctx context.Context, bytes uint64) (time.Duration, error) {
	if l.closed {
		return 0, errors.New("yardstick: trial on a closed link")
	}
	if bytes == 0 {
		return 0, errors.New("yardstick: trial of 0 bytes")
	}
	stop := context.AfterFunc(ctx, func() { _ = l.c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	var ack [1]byte
	start := time.Now()
	select {
	case l.want <- bytes:
	case <-l.dead:
		return 0, errors.New("yardstick: the reader has stopped")
	case <-ctx.Done():
		return 0, fmt.Errorf("yardstick: %w", ctx.Err())
	}
	off := 0
	for left := bytes; left > 0; {
		if off >= len(l.src) {
			off = 0
		}
		n := min(left, uint64(yardstickChunk), uint64(len(l.src)-off))
		if _, err := l.c.Write(l.src[off : off+int(n)]); err != nil {
			return 0, yardstickErr(ctx, "write", err)
		}
		off += int(n)
		left -= n
	}
	if _, err := io.ReadFull(l.c, ack[:]); err != nil {
		return 0, yardstickErr(ctx, "wait for the reader", err)
	}
	return time.Since(start), nil
}

// Close ends the connection and waits for the reader; idempotent.
func (l *YardstickLink) Close() error {
	if l.closed {
		return nil
	}
	l.closed = true
	close(l.want)
	// Closed before waiting: a reader stuck in the middle of a trial that
	// was cut short (its writer stopped by the context) then sees EOF.
	_ = l.c.Close()
	err := <-l.done
	_ = l.ln.Close()
	return err
}

func yardstickErr(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("yardstick: %w", ctx.Err())
	}
	return fmt.Errorf("yardstick: %s: %w", what, err)
}

// yardstickReader accepts one connection and, per length received on want,
// reads that many bytes into the front of buf (round again past its end)
// and answers with one byte. It returns when want is closed or on an error,
// closing the connection so that the writer stops too.
func yardstickReader(ln net.Listener, buf []byte, want <-chan uint64) error {
	c, err := ln.Accept()
	if err != nil {
		return fmt.Errorf("yardstick: accept: %w", err)
	}
	defer c.Close()
	for bytes := range want {
		off := 0
		for left := bytes; left > 0; {
			if off >= len(buf) {
				off = 0
			}
			n, err := c.Read(buf[off : off+int(min(left, uint64(yardstickChunk), uint64(len(buf)-off)))])
			if err != nil {
				if errors.Is(err, io.EOF) {
					return fmt.Errorf("yardstick: stream ended %d bytes short", left)
				}
				return fmt.Errorf("yardstick: read: %w", err)
			}
			off += n
			left -= uint64(n)
		}
		if _, err := c.Write([]byte{1}); err != nil {
			return fmt.Errorf("yardstick: ack: %w", err)
		}
	}
	return nil
}

// measureYardsticks measures the one-off cached yardstick (--yardstick
// cached, for context) and opens the connection of the yardstick that is
// interleaved with each size's timed batches: from the bench's source region
// into, in embedded mode, the destination region mapped here. In two-host
// mode or with GPU memory it falls back to what it can reach and says so;
// with --yardstick cached alone, it streams 4 MiB buffers. The returned
// function closes what it opened.
func (r *runner) measureYardsticks(ctx context.Context, eps *endpoints, regions *regionPair, plans []SizePlan) (func() error, error) {
	var closers []func() error
	closeAll := func() error {
		var errs []error
		for i := len(closers) - 1; i >= 0; i-- {
			errs = append(errs, closers[i]())
		}
		return errors.Join(errs...)
	}
	if len(r.cfg.Yardsticks) == 0 {
		r.printf("yardstick  none (--yardstick none)\n")
		return closeAll, nil
	}
	if slices.Contains(r.cfg.Yardsticks, YardstickRaw) {
		cs, ok := regions.src.(*cudaSource)
		if !ok || regions.dstRegion.GetKind() != b2bv1.MemoryKind_MEMORY_KIND_CUDA {
			return closeAll, errors.New("--yardstick raw: both regions must be GPU memory")
		}
		raw, err := openRawCopy(cs, regions.dstRegion)
		if err != nil {
			return closeAll, err
		}
		r.raw, closers = raw, append(closers, raw.Close)
		r.printf("yardstick  raw: one cuMemcpyBatchAsync of each write batch's own blocks, cuda:%d -> cuda:%d, from the bench, next to every batch of every mode (over_raw_copy)\n",
			cs.dev, regions.dstRegion.GetCudaDevice())
		if int32(cs.dev) == regions.dstRegion.GetCudaDevice() {
			r.printf("           one GPU: the driver runs these copies as kernels (SMs); the daemons stage through host memory instead\n")
		}
	}
	if !slices.Contains(r.cfg.Yardsticks, YardstickStream) && !slices.Contains(r.cfg.Yardsticks, YardstickCached) {
		return closeAll, nil
	}
	bytes := YardstickBytes(plans)
	if r.cfg.yardstickBytes != 0 {
		bytes = r.cfg.yardstickBytes
	}
	const trials = 3
	if slices.Contains(r.cfg.Yardsticks, YardstickCached) {
		r.bar.set("measuring the TCP loopback yardstick (cached buffers)")
		ys, err := MeasureTCPLoopback(ctx, bytes, trials)
		if err != nil {
			return closeAll, err
		}
		r.report.YardstickCached = &YardstickOut{
			Kind: "tcp loopback, 1 connection, 4 MiB writes from and into 4 MiB buffers (in cache), once before the sweep",
			GBps: ys.GBps, Bytes: ys.Bytes, Trials: ys.Trials, SrcBytes: ys.SrcBytes, DstBytes: ys.DstBytes,
		}
		r.printf("yardstick  cached, for context only: plain TCP on 127.0.0.1, 1 connection, 4 MiB writes, 4 MiB buffers: %.2f GB/s (best of %d x %s, once before the sweep)\n",
			ys.GBps, ys.Trials, formatGiB(ys.Bytes))
	}
	anyCompared := false
	for _, p := range plans {
		anyCompared = anyCompared || p.BlockBytes >= RatioMinBlock
	}
	if !anyCompared {
		return closeAll, nil
	}
	var src, dst []byte
	var from, into string
	if hs, ok := regions.src.(hostSource); ok && slices.Contains(r.cfg.Yardsticks, YardstickStream) {
		src, from = hs.r.Bytes[:regions.bytes], "the source region"
	} else {
		src, from = make([]byte, yardstickChunk), "a 4 MiB buffer"
		FillRandom(src, 0x5eed)
		if slices.Contains(r.cfg.Yardsticks, YardstickStream) {
			from += " (the source is GPU memory)"
		}
	}
	if eps.pair != nil && regions.dstRegion != nil && slices.Contains(r.cfg.Yardsticks, YardstickStream) {
		if m, err := eps.dst.MapHostRegion(ctx, regions.dstRegion); err == nil {
			closers = append(closers, m.Unmap)
			dst, into = m.Bytes, "the destination region"
		}
	}
	if dst == nil {
		dst, into = make([]byte, yardstickChunk), "a 4 MiB buffer"
		if slices.Contains(r.cfg.Yardsticks, YardstickStream) {
			into += " (the destination region is not mapped here)"
		}
	}
	link, err := OpenYardstick(ctx, src, dst)
	if err != nil {
		return closeAll, err
	}
	closers = append(closers, link.Close)
	r.yard = link
	kind := fmt.Sprintf("tcp loopback, 1 connection kept open, 4 MiB writes from %s into %s; per size from %s, one trial of the batch's bytes next to each batch (T B, B T, ...)",
		from, into, FormatBytes(RatioMinBlock))
	r.report.Yardstick = &YardstickOut{Kind: kind, SrcBytes: uint64(len(src)), DstBytes: uint64(len(dst)), Trials: r.cfg.Iters, Interleaved: true}
	r.printf("yardstick  'vs TCP': plain TCP on 127.0.0.1, 1 connection, 4 MiB writes from %s into %s, one trial of the batch's bytes next to each batch (T B, B T, ...)\n", from, into)
	r.printf("           (from %s up), in the same run: the median of b2bd's timed batches over the median of the trials\n", FormatBytes(RatioMinBlock))
	return closeAll, nil
}
