package bench

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/b2bd/b2bd/gpudirect"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// rawCopy is the same-run yardstick for GPU memory (--yardstick raw): one
// cuMemcpyBatchAsync of a batch's own blocks, from the source region to
// the destination region, both opened here through their IPC handles on
// the source's GPU (as the same-host path opens a destination), timed to
// the stream's end. It runs next to each timed write batch of every
// mode, so both see the same driver, machine and moment: the floor a
// daemon's copy-engine path is compared with, without the run-to-run swings (up to 1.6× at 128 B on the GPU hosts)
// that a separate tool's best-of-5 hides. It moves the bytes the batch
// just moved, to where it moved them: the destination does not change.
type rawCopy struct {
	cuda     gpudirect.Interface
	dev      int
	dstBase  uintptr // the destination's IPC mapping (closed by Close)
	src, dst uint64  // the regions' first bytes
	stream   *gpudirect.Stream
	dsts     []uint64
	srcs     []uint64
	sizes    []uint64
}

// openRawCopy opens the destination region here beside the source.
func openRawCopy(src *cudaSource, dst *b2bv1.Region) (*rawCopy, error) {
	h, err := gpudirect.ParseIPCHandle("region.cuda_ipc_handle", dst.GetCudaIpcHandle())
	if err != nil {
		return nil, fmt.Errorf("raw yardstick: %w", err)
	}
	c := &rawCopy{cuda: src.cuda, dev: src.dev, src: uint64(src.ptr)}
	base, err := c.cuda.IPCOpenMemHandle(c.dev, h)
	if err != nil {
		return nil, fmt.Errorf("raw yardstick: open the destination region's IPC handle on cuda:%d: %w", c.dev, err)
	}
	c.dstBase, c.dst = base, uint64(base)+dst.GetCudaIpcOffset()
	if c.stream, err = c.cuda.StreamCreate(c.dev); err != nil {
		return nil, errors.Join(fmt.Errorf("raw yardstick: stream on cuda:%d: %w", c.dev, err), c.Close())
	}
	return c, nil
}

// trial copies block i from srcOffs[i] to dstOffs[i] (each blockBytes) in
// one batch call and returns the time to the stream's end.
func (c *rawCopy) trial(srcOffs, dstOffs []uint64, blockBytes uint64) (time.Duration, error) {
	n := len(srcOffs)
	if cap(c.dsts) < n {
		c.dsts, c.srcs, c.sizes = make([]uint64, n), make([]uint64, n), make([]uint64, n)
	}
	c.dsts, c.srcs, c.sizes = c.dsts[:n], c.srcs[:n], c.sizes[:n]
	for i := range n {
		c.srcs[i], c.dsts[i], c.sizes[i] = c.src+srcOffs[i], c.dst+dstOffs[i], blockBytes
	}
	start := time.Now()
	if err := c.cuda.MemcpyBatchAsync(c.stream, c.dsts, c.srcs, c.sizes); err != nil {
		return 0, fmt.Errorf("raw yardstick: batch of %d blocks: %w", n, err)
	}
	if err := c.cuda.StreamSynchronize(c.stream); err != nil {
		return 0, fmt.Errorf("raw yardstick: wait for %d blocks: %w", n, err)
	}
	return time.Since(start), nil
}

// Close frees the stream and the destination's mapping; safe twice.
func (c *rawCopy) Close() error {
	var errs []error
	if c.stream != nil {
		errs = append(errs, c.cuda.StreamDestroy(c.stream))
		c.stream = nil
	}
	if c.dstBase != 0 {
		errs = append(errs, c.cuda.IPCCloseMemHandle(c.dev, c.dstBase))
		c.dstBase = 0
	}
	return errors.Join(errs...)
}

// printRawCopy prints, per write row, the raw copy's median and each
// mode's median over it (the same run, trials next to the batches).
func printRawCopy(w io.Writer, rows []Row) {
	fmt.Fprintf(w, "raw copy   median of each mode's trials; the mode's median over it\n")
	fmt.Fprintf(w, "  %-8s %14s %10s %14s %10s\n", "block", "ad hoc: raw", "over", "prepared: raw", "over")
	for _, row := range rows {
		if row.Op != OpWrite {
			continue
		}
		cell := func(m *ModeOut) (string, string) {
			if m == nil || m.RawCopyMedianSeconds == nil || m.OverRawCopy == nil {
				return "-", "-"
			}
			return fmt.Sprintf("%.3f ms", *m.RawCopyMedianSeconds*1e3), fmt.Sprintf("%.2fx", *m.OverRawCopy)
		}
		ar, ao := cell(row.AdHoc)
		pr, po := cell(row.Prepared)
		fmt.Fprintf(w, "  %-8s %14s %10s %14s %10s\n", FormatBytes(row.BlockBytes), ar, ao, pr, po)
	}
}
