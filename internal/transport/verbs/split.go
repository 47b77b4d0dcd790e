package verbs

import (
	"fmt"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	ibv "github.com/b2bd/b2bd/verbs"
)

// splitMin: blocks at least this big may be cut between two QPs; smaller
// ones go whole to one QP (cutting them buys no balance, costs a WR).
const splitMin = 64 << 10

// cutAlign: where a block is cut, the cut is aligned so both halves stay
// page-friendly for the NIC's DMA.
const cutAlign = 4096

// splitBatch cuts the batch into at most nq byte-balanced, non-empty,
// consecutive ranges and writes their nq+1 boundaries to cuts (which needs
// room for nq+1). It returns how many ranges it made (0 for a batch without
// bytes). It does not allocate.
func splitBatch(lens []uint64, total uint64, nq int, cuts []ibv.Pos) int {
	n := uint32(len(lens))
	if total == 0 || nq < 1 {
		return 0
	}
	cuts[0] = ibv.Pos{}
	m := 0            // ranges closed so far
	var prefix uint64 // bytes before block i
	i := uint32(0)
	lastBytes := uint64(0) // bytes before the last cut
	for k := 1; k < nq; k++ {
		target := total / uint64(nq) * uint64(k)
		if rem := total % uint64(nq); rem != 0 {
			target += rem * uint64(k) / uint64(nq)
		}
		for i < n && prefix+lens[i] <= target {
			prefix += lens[i]
			i++
		}
		var c ibv.Pos
		var cb uint64
		switch {
		case i >= n:
			c, cb = ibv.Pos{I: n}, total
		case lens[i] >= splitMin:
			off := (target - prefix) / cutAlign * cutAlign
			c, cb = ibv.Pos{I: i, Off: off}, prefix+off
		case target-prefix < prefix+lens[i]-target:
			c, cb = ibv.Pos{I: i}, prefix
		default:
			c, cb = ibv.Pos{I: i + 1}, prefix+lens[i]
		}
		if c.Off != 0 && c.Off >= lens[c.I] {
			c = ibv.Pos{I: c.I + 1}
		}
		if cb <= lastBytes || cb >= total {
			continue // an empty range: fewer QPs
		}
		m++
		cuts[m] = c
		lastBytes = cb
	}
	m++
	cuts[m] = ibv.Pos{I: n}
	return m
}

// checkBatch validates a batch against both regions before anything is
// posted: arrays agree, every block lies inside its region, and the WR
// block index fits. It returns the payload bytes. It does not allocate
// unless it fails.
func checkBatch(b *desc.Batch, srcLen, dstLen uint64) (uint64, error) {
	n := len(b.Src)
	if len(b.Dst) != n || len(b.Len) != n {
		return 0, fmt.Errorf("verbs: batch arrays differ in length (src %d, dst %d, len %d): %w", n, len(b.Dst), len(b.Len), errs.ErrInvalidArgument)
	}
	if n > 1<<28 {
		return 0, fmt.Errorf("verbs: batch of %d blocks exceeds %d: %w", n, 1<<28, errs.ErrInvalidArgument)
	}
	var total uint64
	for i := 0; i < n; i++ {
		l := b.Len[i]
		if l > srcLen || b.Src[i] > srcLen-l {
			return 0, fmt.Errorf("verbs: block %d: source [%d, +%d) outside the %d-byte source region: %w", i, b.Src[i], l, srcLen, errs.ErrInvalidArgument)
		}
		if l > dstLen || b.Dst[i] > dstLen-l {
			return 0, fmt.Errorf("verbs: block %d: destination [%d, +%d) outside the %d-byte destination region: %w", i, b.Dst[i], l, dstLen, errs.ErrInvalidArgument)
		}
		total += l
	}
	return total, nil
}
