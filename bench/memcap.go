package bench

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// MemoryBudget is how many bytes of regions one host can hold at once.
type MemoryBudget struct {
	MemAvailable uint64 // /proc/meminfo MemAvailable when the run started
	ShmFree      uint64 // free space of the tmpfs the regions live in (0: unknown)
	Headroom     uint64 // left for the daemons, the kernel's socket buffers, page cache, everything else
	Usable       uint64 // what the regions may take together
	// RegionsHere is how many regions of a size live on this host at once:
	// 2 in embedded mode (source and destination), 1 in two-host mode.
	RegionsHere int
	// Limit names what set Usable, for the header.
	Limit string
}

// The policy: regions may take usableShare of what is available above a
// fixed headroom, and at most maxRegionBytes each.
//
// Why not nearly all of it (the old policy kept a tenth): on the 24 GiB
// development VM, regions of 10.4 GiB per side (20.7 of 23 GiB) took 46 s to
// first-touch against 2.6 s for 3.9 GiB per side, and the 1-2 MiB rows then
// ran at 0.67-0.68x the TCP yardstick against 0.78-0.92x with 2,000 blocks:
// the kernel was reclaiming page cache under the run. 40% of 22.5 GiB is
// 4.5 GiB per side, next to the 3.9 GiB that ran clean. A fixed headroom
// alone (the old 2 GiB minimum) left a 2 GiB VM nothing ("0.0 MiB usable").
// The per-region cap bounds the fill and first-touch time on big hosts:
// more blocks beyond a few GiB change no rate, only how long the run takes.
const (
	fixedHeadroom  = 512 << 20
	usableShareNum = 2
	usableShareDen = 5
	maxRegionBytes = 8 << 30
	// shmSlack is kept free on the tmpfs so other users of it are not starved.
	shmSlack = 256 << 20
)

// NewBudget derives the usable bytes from what the machine has free.
func NewBudget(memAvailable, shmFree uint64, regionsHere int) MemoryBudget {
	b := MemoryBudget{MemAvailable: memAvailable, ShmFree: shmFree, RegionsHere: max(1, regionsHere)}
	if memAvailable > fixedHeadroom {
		b.Usable = (memAvailable - fixedHeadroom) / usableShareDen * usableShareNum
	}
	b.Limit = fmt.Sprintf("%d%% of MemAvailable above %s", 100*usableShareNum/usableShareDen, formatGiB(fixedHeadroom))
	if most := uint64(maxRegionBytes) * uint64(b.RegionsHere); b.Usable > most {
		b.Usable = most
		b.Limit = fmt.Sprintf("at most %s per region", formatGiB(maxRegionBytes))
	}
	if shmFree != 0 {
		shmUsable := uint64(0)
		if shmFree > shmSlack {
			shmUsable = shmFree - shmSlack
		}
		if shmUsable < b.Usable {
			b.Usable = shmUsable
			b.Limit = fmt.Sprintf("the regions' tmpfs has %s free", formatGiB(shmFree))
		}
	}
	b.Headroom = memAvailable - min(memAvailable, b.Usable)
	return b
}

// MaxBlocks is the most blocks of blockBytes whose regions fit the budget.
func (b MemoryBudget) MaxBlocks(blockBytes uint64) int {
	perBlock := SlotBytes(blockBytes) * uint64(b.RegionsHere)
	n := b.Usable / perBlock
	if n > 1<<30 {
		n = 1 << 30
	}
	return int(n)
}

// SizePlan is how many blocks one size runs with.
type SizePlan struct {
	BlockBytes uint64
	Blocks     int  // what the batch holds
	Requested  int  // what was asked for
	Capped     bool // Blocks < Requested because of the memory budget
	// OverBudget: --full forced Requested although it does not fit.
	OverBudget bool
}

// PlanSizes caps each size's block count to the budget unless full is set.
func PlanSizes(sizes []uint64, requested int, full bool, b MemoryBudget) []SizePlan {
	out := make([]SizePlan, 0, len(sizes))
	for _, s := range sizes {
		p := SizePlan{BlockBytes: s, Blocks: requested, Requested: requested}
		if fit := b.MaxBlocks(s); fit < requested {
			if full {
				p.OverBudget = true
			} else {
				p.Blocks, p.Capped = fit, true
			}
		}
		out = append(out, p)
	}
	return out
}

// ReadMemAvailable reads MemAvailable from a meminfo file (/proc/meminfo).
func ReadMemAvailable(path string) (uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("read available memory: %w", err)
	}
	defer f.Close()
	return ParseMemAvailable(f)
}

// ParseMemAvailable finds the "MemAvailable: N kB" line and returns bytes.
func ParseMemAvailable(r io.Reader) (uint64, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 || fields[0] != "MemAvailable:" {
			continue
		}
		kb, err := strconv.ParseUint(fields[1], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("meminfo: MemAvailable %q is not a number", fields[1])
		}
		if len(fields) >= 3 && fields[2] != "kB" {
			return 0, fmt.Errorf("meminfo: MemAvailable in unknown unit %q", fields[2])
		}
		return kb << 10, nil
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("meminfo: %w", err)
	}
	return 0, fmt.Errorf("meminfo: no MemAvailable line")
}

// filesystemFree is the bytes an unprivileged writer may still use in the
// file system holding dir, or 0 if it cannot be told.
func filesystemFree(dir string) uint64 {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0
	}
	return st.Bavail * uint64(st.Bsize)
}
