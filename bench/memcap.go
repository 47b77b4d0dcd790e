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
	Headroom     uint64 // left for the daemons, the kernel's socket buffers, page tables, everything else
	Usable       uint64 // what the regions may take together
	// RegionsHere is how many regions of a size live on this host at once:
	// 2 in embedded mode (source and destination), 1 in two-host mode.
	RegionsHere int
}

// minHeadroom and headroomFraction: the larger is kept free. Regions are
// shared-memory files, mapped (not copied) by the daemons and the bench, so
// besides them only page tables, socket buffers and the processes' heaps
// need room; a tenth of the machine covers that with a wide margin.
const (
	minHeadroom      = 2 << 30
	headroomFraction = 10
	// shmSlack is kept free on the tmpfs so other users of it are not starved.
	shmSlack = 256 << 20
)

// NewBudget derives the usable bytes from what the machine has free.
func NewBudget(memAvailable, shmFree uint64, regionsHere int) MemoryBudget {
	b := MemoryBudget{MemAvailable: memAvailable, ShmFree: shmFree, RegionsHere: max(1, regionsHere)}
	b.Headroom = max(uint64(minHeadroom), memAvailable/headroomFraction)
	if memAvailable > b.Headroom {
		b.Usable = memAvailable - b.Headroom
	}
	if shmFree != 0 {
		shmUsable := uint64(0)
		if shmFree > shmSlack {
			shmUsable = shmFree - shmSlack
		}
		b.Usable = min(b.Usable, shmUsable)
	}
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
