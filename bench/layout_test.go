package bench

import (
	"math/rand/v2"
	"strings"
	"testing"
)

func TestNewLayoutNeverAdjacentOrOverlapping(t *testing.T) {
	for _, tc := range []struct {
		name   string
		blocks int
		size   uint64
	}{
		{"one block", 1, 128},
		{"two blocks", 2, 128},
		{"10k tiny", 10000, 128},
		{"odd size", 1000, 1000},
		{"page", 10000, 4096},
		{"2 MiB", 500, 2 << 20},
		{"one byte", 100, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := NewLayout(tc.blocks, tc.size, rand.New(rand.NewPCG(1, 2)))
			if len(l.Offsets) != tc.blocks {
				t.Fatalf("got %d offsets, want %d", len(l.Offsets), tc.blocks)
			}
			if err := l.Check(); err != nil {
				t.Fatal(err)
			}
			if l.SlotBytes <= tc.size {
				t.Fatalf("slot %d leaves no gap after a %d-byte block", l.SlotBytes, tc.size)
			}
			if l.RegionBytes != uint64(tc.blocks)*l.SlotBytes {
				t.Fatalf("region %d bytes, want %d slots of %d", l.RegionBytes, tc.blocks, l.SlotBytes)
			}
		})
	}
}

func TestNewLayoutIsRandomAndSeeded(t *testing.T) {
	a := NewLayout(1000, 4096, rand.New(rand.NewPCG(1, 0)))
	b := NewLayout(1000, 4096, rand.New(rand.NewPCG(1, 0)))
	c := NewLayout(1000, 4096, rand.New(rand.NewPCG(2, 0)))
	same, inOrder := 0, 0
	for i := range a.Offsets {
		if a.Offsets[i] != b.Offsets[i] {
			t.Fatal("the same seed gave different layouts")
		}
		if a.Offsets[i] == c.Offsets[i] {
			same++
		}
		if i > 0 && a.Offsets[i] > a.Offsets[i-1] {
			inOrder++
		}
	}
	if same > 20 {
		t.Errorf("independent seeds share %d of 1000 slots", same)
	}
	if inOrder > 600 {
		t.Errorf("%d of 999 consecutive blocks ascend: not a random permutation", inOrder)
	}
}

func TestLayoutCheckRejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		l    Layout
		want string
	}{
		{"overlap", Layout{BlockBytes: 100, RegionBytes: 1000, Offsets: []uint64{0, 50}}, "overlap"},
		{"adjacent", Layout{BlockBytes: 100, RegionBytes: 1000, Offsets: []uint64{100, 0}}, "adjacent"},
		{"duplicate", Layout{BlockBytes: 100, RegionBytes: 1000, Offsets: []uint64{300, 300}}, "overlap"},
		{"past the end", Layout{BlockBytes: 100, RegionBytes: 1000, Offsets: []uint64{950}}, "runs past"},
		{"overflow", Layout{BlockBytes: 100, RegionBytes: 1000, Offsets: []uint64{^uint64(0) - 10}}, "runs past"},
		{"zero size", Layout{BlockBytes: 0, RegionBytes: 1000, Offsets: []uint64{0}}, "block size is 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.l.Check()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Check() = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestSlotBytes(t *testing.T) {
	for _, tc := range []struct{ block, slot uint64 }{
		{1, 2}, {128, 256}, {4096, 8192}, {8192, 8192 + 4096}, {2 << 20, 2<<20 + 4096},
	} {
		if got := SlotBytes(tc.block); got != tc.slot {
			t.Errorf("SlotBytes(%d) = %d, want %d", tc.block, got, tc.slot)
		}
	}
}
