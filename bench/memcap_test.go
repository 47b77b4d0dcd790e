package bench

import (
	"strings"
	"testing"
)

const gib = uint64(1) << 30

func TestNewBudget(t *testing.T) {
	for _, tc := range []struct {
		name          string
		avail, shm    uint64
		regions       int
		headroom, use uint64
	}{
		{"24 GiB machine: a tenth kept", 22 * gib, 0, 2, 22 * gib / 10, 22*gib - 22*gib/10},
		{"small machine: 2 GiB kept", 8 * gib, 0, 2, 2 * gib, 6 * gib},
		{"tmpfs smaller than RAM", 22 * gib, 8 * gib, 2, 22 * gib / 10, 8*gib - 256<<20},
		{"nothing free", 1 * gib, 0, 2, 2 * gib, 0},
		{"tmpfs full", 22 * gib, 100 << 20, 2, 22 * gib / 10, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := NewBudget(tc.avail, tc.shm, tc.regions)
			if b.Headroom != tc.headroom || b.Usable != tc.use {
				t.Fatalf("headroom %d usable %d, want %d and %d", b.Headroom, b.Usable, tc.headroom, tc.use)
			}
		})
	}
}

func TestPlanSizesOn24GiB(t *testing.T) {
	// What the 24 GiB development machine reports (MemAvailable about 22.8 GiB).
	b := NewBudget(23961608<<10, 24*gib, 2)
	plans := PlanSizes(DefaultSizes(), 10000, false, b)
	if len(plans) != 15 {
		t.Fatalf("%d sizes planned, want 15", len(plans))
	}
	for _, p := range plans {
		need := SlotBytes(p.BlockBytes) * uint64(p.Blocks) * 2
		if need > b.Usable {
			t.Errorf("%s: %d blocks need %d bytes, over the %d usable", FormatBytes(p.BlockBytes), p.Blocks, need, b.Usable)
		}
		// 10,000 x 1 MiB on each side is 21.05e9 bytes, just inside the
		// 22.08e9 usable; 2 MiB needs twice that.
		wantCapped := p.BlockBytes >= 2<<20
		if p.Capped != wantCapped {
			t.Errorf("%s: capped = %v, want %v (blocks %d)", FormatBytes(p.BlockBytes), p.Capped, wantCapped, p.Blocks)
		}
		if p.Capped && (p.Blocks >= 10000 || p.Blocks < 4000) {
			t.Errorf("%s: capped to %d blocks, want between 4000 and 9999", FormatBytes(p.BlockBytes), p.Blocks)
		}
		if !p.Capped && p.Blocks != 10000 {
			t.Errorf("%s: %d blocks, want 10000", FormatBytes(p.BlockBytes), p.Blocks)
		}
	}
}

func TestPlanSizes(t *testing.T) {
	b := MemoryBudget{Usable: 10 * (SlotBytes(1<<20) * 2), RegionsHere: 2} // room for exactly 10 blocks of 1 MiB
	for _, tc := range []struct {
		name               string
		size               uint64
		requested          int
		full               bool
		blocks             int
		capped, overBudget bool
	}{
		{"fits", 1 << 20, 10, false, 10, false, false},
		{"capped", 1 << 20, 11, false, 10, true, false},
		{"full forces the request", 1 << 20, 11, true, 11, false, true},
		{"small blocks fit", 128, 10000, false, 10000, false, false},
		{"nothing fits", 1 << 30, 1, false, 0, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := PlanSizes([]uint64{tc.size}, tc.requested, tc.full, b)[0]
			if p.Blocks != tc.blocks || p.Capped != tc.capped || p.OverBudget != tc.overBudget || p.Requested != tc.requested {
				t.Fatalf("plan %+v, want blocks %d capped %v overBudget %v", p, tc.blocks, tc.capped, tc.overBudget)
			}
		})
	}
}

func TestOneRegionPerHostDoublesTheCap(t *testing.T) {
	two := NewBudget(10*gib, 0, 2).MaxBlocks(1 << 20)
	one := NewBudget(10*gib, 0, 1).MaxBlocks(1 << 20)
	if one < 2*two || one > 2*two+1 {
		t.Fatalf("one region per host fits %d blocks, two fit %d: want twice as many", one, two)
	}
}

func TestParseMemAvailable(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     uint64
		err      string
	}{
		{"typical", "MemTotal:       24684084 kB\nMemFree:        23000000 kB\nMemAvailable:   23961608 kB\n", 23961608 << 10, ""},
		{"missing", "MemTotal: 1 kB\n", 0, "no MemAvailable"},
		{"garbage", "MemAvailable: lots kB\n", 0, "not a number"},
		{"unit", "MemAvailable: 5 MB\n", 0, "unknown unit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseMemAvailable(strings.NewReader(tc.in))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %d, %v; want %d", got, err, tc.want)
			}
		})
	}
}
