package memtest

import (
	"context"
	"fmt"
	"sync"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/layout"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/transport"
)

// blockChunk is how many runs are expanded between copies: a few hundred
// stay in the first-level cache.
const blockChunk = 256

// blockPin is one destination region pinned for a block write, with what
// landed in it.
type blockPin struct {
	mem           []byte
	release       func()
	blocks, bytes uint64
}

// blockState is a conn's reusable block-write memory (block writes on a
// conn are serialised by bmu).
type blockState struct {
	bmu  sync.Mutex
	pins []blockPin
}

// writeBlocks is the kind's block-id write (Handlers.WriteBlocks): it expands the pair in
// chunks, pins each destination region on first use, copies every run and
// reports each region's landing at the end. It allocates nothing once its
// scratch has grown, under a ctx that cannot end (see pin). ctx is looked
// at between chunks, before any further byte is placed.
func (c *conn) writeBlocks(ctx context.Context, w *transport.Blocks, sc *transport.BlockScratch) (transport.Stats, error) {
	var st transport.Stats
	if err := c.Err(); err != nil {
		return st, err
	}
	c.bs.bmu.Lock()
	defer c.bs.bmu.Unlock()
	pins := c.bs.pins[:0]
	for range w.Remote {
		pins = append(pins, blockPin{})
	}
	c.bs.pins = pins
	defer func() {
		for i := range pins {
			if pins[i].release != nil {
				pins[i].release()
			}
			pins[i] = blockPin{}
		}
	}()
	var cur layout.Cursor
	for !cur.Done(w.Pair) {
		if err := ctx.Err(); err != nil {
			return st, fmt.Errorf("memtest: block write cut off: %w", err)
		}
		sc.Runs = w.Pair.ExpandFrom(sc.Runs[:0], w.IDs, &cur, blockChunk)
		for i := range sc.Runs {
			r := &sc.Runs[i]
			if int(r.SrcRegion) >= len(w.Local) || int(r.DstRegion) >= len(pins) {
				return st, &transport.StretchError{Group: r.Group, SrcRegion: r.SrcRegion, DstRegion: r.DstRegion,
					Err: fmt.Errorf("%w: memtest: run %d names region (source %d, destination %d) beyond those given", errs.ErrInvalidArgument, i, r.SrcRegion, r.DstRegion)}
			}
			p := &pins[r.DstRegion]
			if p.release == nil {
				d := w.Remote[r.DstRegion]
				m, release, err := c.pin(ctx, d.Key.Key)
				if err != nil {
					return st, &transport.StretchError{Group: r.Group, SrcRegion: r.SrcRegion, DstRegion: r.DstRegion,
						Err: fmt.Errorf("memtest: destination %q: %w", d.Name, err)}
				}
				p.mem, p.release = m.Host, release
			}
			src := w.Local[r.SrcRegion].Memory().Host
			if r.SrcOff > uint64(len(src)) || r.Len > uint64(len(src))-r.SrcOff || r.DstOff > uint64(len(p.mem)) || r.Len > uint64(len(p.mem))-r.DstOff {
				return st, &transport.StretchError{Group: r.Group, SrcRegion: r.SrcRegion, DstRegion: r.DstRegion,
					Err: fmt.Errorf("%w: memtest: run [%d,+%d) -> [%d,+%d) is outside the %d-byte source or the %d-byte destination", errs.ErrInvalidArgument, r.SrcOff, r.Len, r.DstOff, r.Len, len(src), len(p.mem))}
			}
			copy(p.mem[r.DstOff:r.DstOff+r.Len], src[r.SrcOff:r.SrcOff+r.Len])
			p.blocks++
			p.bytes += r.Len
			st.Segments++
		}
	}
	for i := range pins {
		if pins[i].release != nil {
			c.to.in.Landed(Kind, pins[i].blocks, pins[i].bytes)
			st.WorkRequests++
		}
	}
	return st, nil
}

// pin pins key on the receiver. A ctx that can end waits for Pin in a
// goroutine (as Write does), so that a stalled receiver is cut off and a
// late pin released; one that cannot (the benchmark's) calls Pin directly
// and allocates nothing.
func (c *conn) pin(ctx context.Context, key uint64) (memory.Memory, func(), error) {
	if ctx.Done() == nil {
		return c.to.in.Pin(Kind, key)
	}
	type pinned struct {
		m       memory.Memory
		release func()
		err     error
	}
	done := make(chan pinned, 1)
	go func() {
		m, release, err := c.to.in.Pin(Kind, key)
		done <- pinned{m, release, err}
	}()
	select {
	case p := <-done:
		return p.m, p.release, p.err
	case <-ctx.Done():
		go func() {
			if p := <-done; p.err == nil {
				p.release()
			}
		}()
		return memory.Memory{}, nil, fmt.Errorf("memtest: waiting for the receiver: %w", ctx.Err())
	}
}
