package bench

import (
	"strings"
	"testing"
)

const gib = uint64(1) << 30

func TestNewBudget(t *testing.T) {
	const mib = uint64(1) << 20
	share := func(avail uint64) uint64 { return (avail - 512*mib) / 5 * 2 }
	for _, tc := range []struct {
		name       string
		avail, shm uint64
		regions    int
		use        uint64
		limit      string
	}{
		// The development VM: 22.8 GiB available; 40% above 512 MiB is
		// 8.9 GiB for both regions, 4.5 GiB per side (3.9 GiB ran clean).
		{"24 GiB machine", 23961608 << 10, 24 * gib, 2, share(23961608 << 10), "40% of MemAvailable"},
		// A 2 GiB VM with about 1.7 GiB available: 480 MiB, not "0.0 MiB usable".
		{"2 GiB VM", 1740 * mib, 1024 * mib, 2, share(1740 * mib), "40% of MemAvailable"},
		{"2 GiB VM, two-host (one region)", 1740 * mib, 0, 1, share(1740 * mib), "40% of MemAvailable"},
		{"big host: 8 GiB per region", 500 * gib, 0, 2, 16 * gib, "at most 8.0 GiB per region"},
		{"big host, two-host mode", 500 * gib, 0, 1, 8 * gib, "at most 8.0 GiB per region"},
		{"tmpfs smaller than the share", 22 * gib, 2 * gib, 2, 2*gib - 256*mib, "tmpfs has 2.0 GiB free"},
		{"below the fixed headroom", 400 * mib, 0, 2, 0, "40% of MemAvailable"},
		{"tmpfs full", 22 * gib, 100 * mib, 2, 0, "tmpfs has 100.0 MiB free"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := NewBudget(tc.avail, tc.shm, tc.regions)
			if b.Usable != tc.use {
				t.Fatalf("usable %d (%s), want %d", b.Usable, formatGiB(b.Usable), tc.use)
			}
			if b.Headroom+b.Usable != tc.avail {
				t.Fatalf("headroom %d + usable %d != available %d", b.Headroom, b.Usable, tc.avail)
			}
			if !strings.Contains(b.Limit, tc.limit) {
				t.Fatalf("limit %q, want it to say %q", b.Limit, tc.limit)
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
		// 10,000 x 256 KiB on each side is 2.6 GiB, inside the 4.45 GiB
		// per side; 512 KiB needs 5.1 GiB.
		wantCapped := p.BlockBytes >= 512<<10
		if p.Capped != wantCapped {
			t.Errorf("%s: capped = %v, want %v (blocks %d)", FormatBytes(p.BlockBytes), p.Capped, wantCapped, p.Blocks)
		}
		if p.Capped && p.Blocks*int(p.BlockBytes>>20+1) < 2000 {
			t.Errorf("%s: capped to %d blocks, want at least 2000 MiB of blocks", FormatBytes(p.BlockBytes), p.Blocks)
		}
		if !p.Capped && p.Blocks != 10000 {
			t.Errorf("%s: %d blocks, want 10000", FormatBytes(p.BlockBytes), p.Blocks)
		}
	}
}

func TestPlanSizesOn2GiBVM(t *testing.T) {
	b := NewBudget(1740<<20, 1<<30, 2)
	for _, p := range PlanSizes(DefaultSizes(), 10000, false, b) {
		if p.Blocks < 100 {
			t.Errorf("%s: %d blocks in a 2 GiB VM, want at least 100", FormatBytes(p.BlockBytes), p.Blocks)
		}
		if need := SlotBytes(p.BlockBytes) * uint64(p.Blocks) * 2; need > b.Usable {
			t.Errorf("%s: %d blocks need %d bytes, over the %d usable", FormatBytes(p.BlockBytes), p.Blocks, need, b.Usable)
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
