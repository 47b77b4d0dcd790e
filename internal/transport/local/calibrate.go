package local

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/b2bd/b2bd/gpudirect"
	"github.com/b2bd/b2bd/internal/desc"
)

// Calibration of the staged same-device path, once per device when its
// stage is made: whether one chunk's second hop (host -> device, per block)
// goes on one stream or is split over two or four, so that copy engines
// share its copies (TCP's receivers land a batch's shares on one stream
// each), is decided by timing each on a small scattered batch, not by a
// fixed choice: which wins depends on the GPU, the driver and the host. The
// result is cached in the stage and shown in Status.

// calBlocks and calBlock shape the calibration batch: the per-copy cost the
// split is about dominates at small blocks.
const (
	calBlocks = 4096
	calBlock  = 128
	calRounds = 3
)

// calSplits are the second-hop stream counts calibrate times.
var calSplits = []int{1, 2, maxSplit}

// calibrate times the staged copy with the second hop on each of calSplits
// streams (best of calRounds after a warm-up each) and keeps the fastest in
// s.split; s.note says what was measured. It allocates two small device
// buffers and frees them. On any failure s keeps one stream, and the
// failure is returned for the log.
func (s *stage) calibrate(cu gpudirect.Interface) error {
	s.split = 1
	slot := uint64(2 * calBlock)
	region := uint64(calBlocks) * slot
	src, err := cu.MemAlloc(s.dev, region)
	if err != nil {
		s.note = "calibration failed: one stream"
		return fmt.Errorf("samehost: calibrate staging on device %d: %w", s.dev, err)
	}
	defer func() { _ = cu.MemFree(s.dev, src) }()
	dst, err := cu.MemAlloc(s.dev, region)
	if err != nil {
		s.note = "calibration failed: one stream"
		return fmt.Errorf("samehost: calibrate staging on device %d: %w", s.dev, err)
	}
	defer func() { _ = cu.MemFree(s.dev, dst) }()
	b := &desc.Batch{Src: make([]uint64, calBlocks), Dst: make([]uint64, calBlocks), Len: make([]uint64, calBlocks)}
	for i := range calBlocks {
		// A fixed scatter (multiplication by an odd constant permutes the
		// slots), so both choices see the same batch.
		b.Src[i] = uint64(i*2654435761%calBlocks) * slot
		b.Dst[i] = uint64(i*40503%calBlocks) * slot
		b.Len[i] = calBlock
	}
	var best [maxSplit + 1]time.Duration
	for _, split := range calSplits {
		s.split = split
		for r := 0; r <= calRounds; r++ {
			start := time.Now()
			if err := copyStaged(context.Background(), cu, s, uint64(src), uint64(dst), b); err != nil {
				s.split, s.note = 1, "calibration failed: one stream"
				return fmt.Errorf("samehost: calibrate staging on device %d: %w", s.dev, err)
			}
			if d := time.Since(start); r > 0 && (best[split] == 0 || d < best[split]) {
				best[split] = d
			}
		}
	}
	s.split = 1
	var took strings.Builder
	for _, split := range calSplits {
		if best[split] < best[s.split] {
			s.split = split
		}
		fmt.Fprintf(&took, ", %.2f ms on %d", ms(best[split]), split)
	}
	s.note = fmt.Sprintf("second hop in %d part(s), one stream and thread each, calibrated at start: %d x %d B took%s", s.split, calBlocks, calBlock, strings.TrimPrefix(took.String(), ","))
	return nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }
