package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// Yardstick is the plain TCP loopback stream that b2bd's TCP transport is
// compared with: what one connection on this machine moves with large writes
// and no per-block work at all.
type Yardstick struct {
	GBps   float64 // best trial
	Bytes  uint64  // per trial
	Trials int
}

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

// MeasureTCPLoopback streams bytes over one TCP connection on 127.0.0.1,
// trials times, and returns the best rate. Each trial ends when the reader
// has every byte and has said so, so the rate counts delivery, not buffering.
func MeasureTCPLoopback(ctx context.Context, bytes uint64, trials int) (Yardstick, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return Yardstick{}, fmt.Errorf("yardstick: listen: %w", err)
	}
	defer ln.Close()
	readerDone := make(chan error, 1)
	go func() { readerDone <- yardstickReader(ln, bytes, trials) }()

	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", ln.Addr().String())
	if err != nil {
		return Yardstick{}, fmt.Errorf("yardstick: dial: %w", err)
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	buf := make([]byte, yardstickChunk)
	FillRandom(buf, 0x5eed)
	best := time.Duration(0)
	var ack [1]byte
	for t := 0; t < trials; t++ {
		start := time.Now()
		for left := bytes; left > 0; {
			n := min(left, uint64(len(buf)))
			if _, err := c.Write(buf[:n]); err != nil {
				return Yardstick{}, yardstickErr(ctx, "write", err)
			}
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
	return Yardstick{GBps: GBps(bytes, best), Bytes: bytes, Trials: trials}, nil
}

func yardstickErr(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("yardstick: %w", ctx.Err())
	}
	return fmt.Errorf("yardstick: %s: %w", what, err)
}

// yardstickReader accepts one connection and, per trial, reads bytes bytes
// and answers with one byte.
func yardstickReader(ln net.Listener, bytes uint64, trials int) error {
	c, err := ln.Accept()
	if err != nil {
		return fmt.Errorf("yardstick: accept: %w", err)
	}
	defer c.Close()
	buf := make([]byte, yardstickChunk)
	for t := 0; t < trials; t++ {
		for left := bytes; left > 0; {
			n, err := c.Read(buf[:min(left, uint64(len(buf)))])
			if err != nil {
				if errors.Is(err, io.EOF) {
					return fmt.Errorf("yardstick: stream ended %d bytes short", left)
				}
				return fmt.Errorf("yardstick: read: %w", err)
			}
			left -= uint64(n)
		}
		if _, err := c.Write([]byte{1}); err != nil {
			return fmt.Errorf("yardstick: ack: %w", err)
		}
	}
	return nil
}
