package transport

import (
	"fmt"
	"math/bits"
	"time"

	"github.com/b2bd/b2bd/internal/memory"
)

// With --transport auto, a peer on this host is reachable over several
// kinds (local, tcp, verbs), and which is fastest depends on where the
// bytes are and how large the blocks are: on an H200 host, 10,000 × 128 B
// from GPU to host took 2.7 ms over TCP and 6.9 ms over local, while local
// won by 4× at 64 KiB. So the daemon measures its own paths at start (a
// batch to itself over each kind, internal/daemon/calibrate.go) and auto
// takes, for a same-host peer, the kind measured fastest for the batch's
// route and block size. A peer on another host keeps the ranking: a batch
// to itself says nothing about the wire.

// Route is where a batch's bytes come from and land, as the measured
// choice tells routes apart.
type Route struct {
	From, To memory.Kind
	// SameDevice: CUDA to CUDA on one GPU (staged through host memory by
	// the local kind), not across two.
	SameDevice bool
}

// Known: both ends' memory kinds are known.
func (r Route) Known() bool { return r.From != 0 && r.To != 0 }

func (r Route) String() string {
	s := fmt.Sprintf("%s→%s", r.From, r.To)
	if r.From == memory.CUDA && r.To == memory.CUDA {
		if r.SameDevice {
			return s + " (one GPU)"
		}
		return s + " (two GPUs)"
	}
	return s
}

// RouteOf is the route of a batch between local memory and a peer's
// region: local to remote for a write, remote to local for a read. It is
// unknown (zero) when the peer did not say its region's memory kind.
func RouteOf(local memory.Memory, remote Resolution, read bool) Route {
	if remote.Memory == 0 || local.Kind == 0 {
		return Route{}
	}
	r := Route{From: local.Kind, To: remote.Memory}
	if read {
		r.From, r.To = r.To, r.From
	}
	r.SameDevice = local.Kind == memory.CUDA && remote.Memory == memory.CUDA && local.Device == remote.Device
	return r
}

// KeepMargin is how much slower than the fastest measured kind the
// ranking's first may be and still be chosen, so that the choice does not
// flip between runs on noise. A calibration's eight batches a kind do not
// resolve less: on an H200 host (a VM) a batch of small GPU copies queued
// by one thread takes 30-50% longer on some cores than on others, and
// which core a daemon's thread sits on changes from start to start; TCP's
// GPU0 -> GPU0 128 B batch to the daemon itself measured 6.9-7.1 ms in two
// calibrations and 10.1-11.7 ms in six others on one host, against the
// same-host path's 6.4-7.5 ms (queued by four threads), and a 6.9 ms one
// chose TCP, 1.31x slower than local in the batches that followed.
const KeepMargin = 0.10

// CalibrationRow is one route and block size: each kind's median batch
// time, the kinds that could not carry it, and the kind auto takes for a
// peer that offers them all.
type CalibrationRow struct {
	Route      Route
	BlockBytes uint64
	Blocks     int
	Median     map[Kind]time.Duration
	Failed     map[Kind]string
	Chosen     Kind
	Why        string
}

// Calibration is the daemon's measurement, immutable once published:
// State says where it is ("off", "measuring", "done", "cached", "failed:
// …"), and Rows are by route, each route's rows by rising BlockBytes.
type Calibration struct {
	State   string
	Elapsed time.Duration
	File    string
	Rows    []CalibrationRow
}

// Choose picks, among candidates (the kinds that reach the peer and can
// carry the batch, ranking first), the one measured fastest for route at
// the measured block size nearest blockBytes (in powers of two); ok is
// false when no row covers the route, no candidate was measured there, or
// a candidate failed to be measured there: the daemon measures by batches
// to itself, which a kind may refuse (the same-host path, from one GPU to
// its own region on another) though it carries the route between daemons,
// so an incomplete row goes by rank. It allocates nothing: it runs for
// every batch auto chooses for.
func (c *Calibration) Choose(route Route, blockBytes uint64, candidates []Kind) (Kind, bool) {
	if c == nil || !route.Known() || blockBytes == 0 {
		return "", false
	}
	row := c.nearest(route, blockBytes)
	if row == nil {
		return "", false
	}
	for _, k := range candidates {
		if _, bad := row.Failed[k]; bad {
			return "", false
		}
	}
	k, _, _ := pick(row.Median, candidates)
	return k, k != ""
}

// nearest is route's row whose block size is nearest blockBytes in powers
// of two (the larger on a tie), nil when route has none.
func (c *Calibration) nearest(route Route, blockBytes uint64) *CalibrationRow {
	var best *CalibrationRow
	bestDist := 0
	want := log2(blockBytes)
	for i := range c.Rows {
		r := &c.Rows[i]
		if r.Route != route {
			continue
		}
		d := log2(r.BlockBytes) - want
		if d < 0 {
			d = -d
		}
		if best == nil || d <= bestDist {
			best, bestDist = r, d
		}
	}
	return best
}

// pick is the fastest of candidates in median, or the first measured one
// when it is within KeepMargin of the fastest; "" when none of them was
// measured. fastest is the fastest, first the ranking's first measured.
func pick(median map[Kind]time.Duration, candidates []Kind) (chosen, fastest, first Kind) {
	for _, k := range candidates {
		t, ok := median[k]
		if !ok || t <= 0 {
			continue
		}
		if first == "" {
			first = k
		}
		if fastest == "" || t < median[fastest] {
			fastest = k
		}
	}
	if fastest == "" || float64(median[first]) <= float64(median[fastest])*(1+KeepMargin) {
		return first, fastest, first
	}
	return fastest, fastest, first
}

// explain says why pick chose chosen.
func explain(median map[Kind]time.Duration, chosen, fastest, first Kind) string {
	switch {
	case chosen == "":
		return "no kind carried it"
	case fastest == first:
		return "fastest"
	case chosen == first:
		return fmt.Sprintf("within %.0f%% of %s: the ranking's first kept", KeepMargin*100, fastest)
	}
	return fmt.Sprintf("fastest: %.2f× faster than %s", float64(median[first])/float64(median[fastest]), first)
}

// Decide fills each row's Chosen and Why for a peer that offers every
// kind in ranked (highest rank first).
func (c *Calibration) Decide(ranked []Kind) {
	for i := range c.Rows {
		r := &c.Rows[i]
		if k := firstFailed(r.Failed, ranked); k != "" && len(ranked) > 0 {
			r.Chosen, r.Why = ranked[0], fmt.Sprintf("by rank: %s could not be measured here (by batches to this daemon itself)", k)
			continue
		}
		chosen, fastest, first := pick(r.Median, ranked)
		r.Chosen, r.Why = chosen, explain(r.Median, chosen, fastest, first)
	}
}

// firstFailed is the first of ranked that failed, "" when none did.
func firstFailed(failed map[Kind]string, ranked []Kind) Kind {
	for _, k := range ranked {
		if _, bad := failed[k]; bad {
			return k
		}
	}
	return ""
}

func log2(n uint64) int {
	if n == 0 {
		return 0
	}
	return bits.Len64(n) - 1
}
