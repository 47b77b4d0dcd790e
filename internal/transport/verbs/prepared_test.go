//go:build cgo && linux

package verbs

import (
	"fmt"
	"math/rand"
	"sync"
	"testing"
	"time"

	"github.com/b2bd/b2bd/internal/desc"
	ibv "github.com/b2bd/b2bd/verbs"
)

// preparedPlan builds the plan Prepare would for n random 128 B blocks over
// nq QPs, without a device.
func preparedPlan(t testing.TB, n, nq int) (*ibv.Plan, []postJob) {
	t.Helper()
	size := uint64(n) * 256
	// 128 B blocks in random 256 B slots on both sides: never adjacent, so
	// one WR each.
	r := rand.New(rand.NewSource(1))
	ps, pd := r.Perm(n), r.Perm(n)
	b := &desc.Batch{}
	for i := 0; i < n; i++ {
		b.Src, b.Dst, b.Len = append(b.Src, uint64(ps[i])*256), append(b.Dst, uint64(pd[i])*256), append(b.Len, 128)
	}
	cuts := make([]ibv.Pos, nq+1)
	m := splitBatch(b.Len, b.Bytes(), nq, cuts)
	p := ibv.ChainParams{SrcBase: 0x10000, DstBase: 0x20000, SrcLimit: size, DstLimit: size, LKey: 1, RKey: 2,
		MaxSGE: DefaultMaxSGE, MaxWRBytes: DefaultMaxWRBytes, SignalEvery: DefaultSignalEvery}
	pl, err := ibv.NewPlan(&p, b.Src, b.Dst, b.Len, cuts[:m+1])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pl.Close() })
	jobs := make([]postJob, m)
	for k := range jobs {
		jobs[k] = postJob{plan: pl, k: k, tag: 7, minPost: 1}
	}
	return pl, jobs
}

// submitDry is one prepared submit without a NIC: every share rewound and
// patched to its end in chains of chain WRs, by the posters pool.
func submitDry(pp *posters, pl *ibv.Plan, jobs []postJob, chain int, wg *sync.WaitGroup) (int, error) {
	for k := range jobs {
		pl.Start(k, uint32(k)<<20)
		jobs[k].maxWR = chain
	}
	return pp.run(jobs, wg)
}

// BenchmarkPreparedPatch10k is the plan-only figure of a prepared submit:
// 10,000 WRs (random 128 B blocks) over 4 QP shares, patched for posting
// (wr_id sequence numbers, each chain's last WR signaled and the list cut
// there, then restored; the immediate) exactly as PostPlan does before
// ibv_post_send, by 1, 2 or 4 OS-locked threads. ns/op is the wall time of
// one whole submit's 10,000 WRs.
func BenchmarkPreparedPatch10k(b *testing.B) {
	for _, threads := range []int{1, 2, 4} {
		for _, chain := range []int{64, 512} {
			b.Run(fmt.Sprintf("threads=%d/chain=%d", threads, chain), func(b *testing.B) {
				pl, jobs := preparedPlan(b, 10000, 4)
				pp := newPosters(threads)
				defer pp.close()
				var wg sync.WaitGroup
				b.ReportAllocs()
				for b.Loop() {
					wrs, err := submitDry(pp, pl, jobs, chain, &wg)
					if err != nil || wrs != 10000 {
						b.Fatalf("%d WRs, %v", wrs, err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/10000, "ns/WR")
			})
		}
	}
}

// TestPreparedPatchNoAlloc: a dry submit allocates nothing, with and
// without worker threads, and patches every WR once.
func TestPreparedPatchNoAlloc(t *testing.T) {
	for _, threads := range []int{1, 3} {
		pl, jobs := preparedPlan(t, 2000, 4)
		pp := newPosters(threads)
		var wg sync.WaitGroup
		var wrs int
		allocs := testing.AllocsPerRun(50, func() {
			n, err := submitDry(pp, pl, jobs, 64, &wg)
			if err != nil {
				t.Fatal(err)
			}
			wrs = n
		})
		pp.close()
		pp.close()
		if allocs != 0 {
			t.Fatalf("threads=%d: %v allocations per dry submit", threads, allocs)
		}
		if w, _, _ := pl.Totals(); wrs != w || w != 2000 {
			t.Fatalf("patched %d WRs of %d (want 2000)", wrs, w)
		}
		for k := range jobs {
			n, _, _ := pl.ShareSize(k)
			if pl.Left(k) != 0 || pl.Seq(k) != uint32(k)<<20+uint32(n) {
				t.Fatalf("share %d: %d WRs left, seq %#x, want 0 and %#x", k, pl.Left(k), pl.Seq(k), uint32(k)<<20+uint32(n))
			}
		}
	}
}

// TestPreparedPatchWallTime is not a timed assertion; it logs the wall time
// of one dry submit of 10,000 WRs per thread count, for the record.
func TestPreparedPatchWallTime(t *testing.T) {
	for _, threads := range []int{1, 2, 4} {
		pl, jobs := preparedPlan(t, 10000, 4)
		pp := newPosters(threads)
		var wg sync.WaitGroup
		best := time.Hour
		for k := 0; k < 200; k++ {
			t0 := time.Now()
			if _, err := submitDry(pp, pl, jobs, 64, &wg); err != nil {
				t.Fatal(err)
			}
			best = min(best, time.Since(t0))
		}
		pp.close()
		t.Logf("threads=%d: best dry submit of 10,000 WRs %v", threads, best)
	}
}
