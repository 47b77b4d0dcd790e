package bench

import (
	"fmt"
	"math/rand/v2"
	"slices"
)

// Layout is where one side's blocks of one size live in its region: the
// region is cut into equal slots, each a block plus a gap, and block i sits
// at the start of slot perm[i]. The gap keeps every two blocks apart, so a
// daemon cannot merge neighbours into one bigger transfer and the benchmark
// measures per-block cost honestly.
type Layout struct {
	BlockBytes  uint64
	SlotBytes   uint64
	RegionBytes uint64
	Offsets     []uint64 // Offsets[i] is block i's byte offset in the region
}

// gapBytes is the unused space after each block: as large as the block up to
// one page, so small blocks keep their natural alignment and blocks of a page
// or more stay page-aligned, for at most 0.2% more memory at 2 MiB.
func gapBytes(blockBytes uint64) uint64 { return min(blockBytes, 4096) }

// SlotBytes is the region space one block takes, gap included.
func SlotBytes(blockBytes uint64) uint64 { return blockBytes + gapBytes(blockBytes) }

// NewLayout places blocks blocks of blockBytes at a random permutation of
// slots, drawn from rng.
func NewLayout(blocks int, blockBytes uint64, rng *rand.Rand) Layout {
	slot := SlotBytes(blockBytes)
	offs := make([]uint64, blocks)
	for i, p := range rng.Perm(blocks) {
		offs[i] = uint64(p) * slot
	}
	return Layout{BlockBytes: blockBytes, SlotBytes: slot, RegionBytes: uint64(blocks) * slot, Offsets: offs}
}

// Check verifies what the benchmark relies on: every block lies inside the
// region, and no two blocks overlap or touch.
func (l Layout) Check() error {
	if l.BlockBytes == 0 {
		return fmt.Errorf("layout: block size is 0")
	}
	type span struct {
		block    int
		from, to uint64
	}
	spans := make([]span, len(l.Offsets))
	for i, off := range l.Offsets {
		if off > l.RegionBytes || l.BlockBytes > l.RegionBytes-off {
			return fmt.Errorf("layout: block %d at offset %d (+%d bytes) runs past the %d-byte region", i, off, l.BlockBytes, l.RegionBytes)
		}
		spans[i] = span{i, off, off + l.BlockBytes}
	}
	slices.SortFunc(spans, func(a, b span) int {
		switch {
		case a.from < b.from:
			return -1
		case a.from > b.from:
			return 1
		}
		return 0
	})
	for i := 1; i < len(spans); i++ {
		prev, cur := spans[i-1], spans[i]
		if cur.from < prev.to {
			return fmt.Errorf("layout: blocks %d [%d,%d) and %d [%d,%d) overlap", prev.block, prev.from, prev.to, cur.block, cur.from, cur.to)
		}
		if cur.from == prev.to {
			return fmt.Errorf("layout: blocks %d and %d are adjacent at offset %d and could be merged", prev.block, cur.block, cur.from)
		}
	}
	return nil
}
