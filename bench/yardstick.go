package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
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
// trials times, and returns the best rate. The writer sends src in 4 MiB
// writes, front to back and round again; the reader reads into dst the same
// way, so with buffers larger than the caches every byte crosses DRAM twice,
// as a daemon's does. Each trial ends when the reader has every byte and has
// said so, so the rate counts delivery, not buffering.
func MeasureTCPStream(ctx context.Context, src, dst []byte, bytes uint64, trials int) (Yardstick, error) {
	if len(src) == 0 || len(dst) == 0 {
		return Yardstick{}, errors.New("yardstick: empty source or destination buffer")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return Yardstick{}, fmt.Errorf("yardstick: listen: %w", err)
	}
	defer ln.Close()
	readerDone := make(chan error, 1)
	go func() { readerDone <- yardstickReader(ln, dst, bytes, trials) }()

	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", ln.Addr().String())
	if err != nil {
		return Yardstick{}, fmt.Errorf("yardstick: dial: %w", err)
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	best := time.Duration(0)
	var ack [1]byte
	off := 0
	for t := 0; t < trials; t++ {
		start := time.Now()
		for left := bytes; left > 0; {
			if off >= len(src) {
				off = 0
			}
			n := min(left, uint64(yardstickChunk), uint64(len(src)-off))
			if _, err := c.Write(src[off : off+int(n)]); err != nil {
				return Yardstick{}, yardstickErr(ctx, "write", err)
			}
			off += int(n)
			left -= n
		}
		if _, err := io.ReadFull(c, ack[:]); err != nil {
			return Yardstick{}, yardstickErr(ctx, "wait for the reader", err)
		}
		if el := time.Since(start); best == 0 || el < best {
			best = el
		}
	}
	if err := <-readerDone; err != nil {
		return Yardstick{}, err
	}
	return Yardstick{GBps: GBps(bytes, best), Bytes: bytes, Trials: trials, SrcBytes: uint64(len(src)), DstBytes: uint64(len(dst))}, nil
}

func yardstickErr(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("yardstick: %w", ctx.Err())
	}
	return fmt.Errorf("yardstick: %s: %w", what, err)
}

// yardstickReader accepts one connection and, per trial, reads bytes bytes
// into buf (front to back and round again) and answers with one byte.
func yardstickReader(ln net.Listener, buf []byte, bytes uint64, trials int) error {
	c, err := ln.Accept()
	if err != nil {
		return fmt.Errorf("yardstick: accept: %w", err)
	}
	defer c.Close()
	off := 0
	for t := 0; t < trials; t++ {
		for left := bytes; left > 0; {
			if off >= len(buf) {
				off = 0
			}
			want := min(left, uint64(yardstickChunk), uint64(len(buf)-off))
			n, err := c.Read(buf[off : off+int(want)])
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
