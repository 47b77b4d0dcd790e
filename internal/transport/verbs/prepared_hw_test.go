package verbs

import (
	"bytes"
	"context"
	"errors"
	"math/rand"
	"sync"
	"testing"
	"time"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/transport"
)

func prepare(t testing.TB, p *pair, b *desc.Batch) transport.Prepared {
	t.Helper()
	pr, err := transport.Prepare(p.conn, p.src, p.remote, b)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pr.Close() })
	return pr
}

// Every block of a prepared batch lands, in every shape the planner has.
func TestHWPreparedLands(t *testing.T) {
	dev := hwDevice(t)
	const size = 40 << 20
	p := newPair(t, testConfig(dev), size)
	r := rand.New(rand.NewSource(21))
	for _, tc := range []struct {
		name  string
		n     int
		sizes []uint64
		mode  string
	}{
		{"128B random", 4000, []uint64{128}, "random"},
		{"4KiB random", 2000, []uint64{4096}, "random"},
		{"mixed random", 300, []uint64{128, 4096, 700, 64 << 10, 1}, "random"},
		{"512B gather", 3000, []uint64{512}, "gather"},
		{"2MiB adjacent (cut across QPs)", 16, []uint64{2 << 20}, "adjacent"},
		{"empty", 0, []uint64{1}, "random"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &desc.Batch{}
			if tc.n > 0 {
				b = layout(r, tc.n, tc.sizes, tc.mode, size)
			}
			pr := prepare(t, p, b)
			pl := pr.(*prepared)
			wrs, sges, _ := pl.plan.Totals()
			for k := 0; k < 2; k++ {
				clear(p.dm.Host)
				r.Read(p.sm.Host)
				before := p.in.batches.Load()
				ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
				st, err := pr.Write(ctx)
				cancel()
				if err != nil {
					t.Fatal(err)
				}
				verify(t, p, b)
				if got := p.in.batches.Load(); got != before+1 {
					t.Fatalf("Landed called %d times, want 1", got-before)
				}
				if st.WorkRequests != uint64(wrs)+1 || st.Segments != uint64(sges) || st.Plan != 0 || st.Post <= 0 {
					t.Fatalf("stats %+v, want %d WRs (meta included), %d SGEs, no plan time, some post time", st, wrs+1, sges)
				}
			}
		})
	}
}

// One Prepared submitted 50 times (fresh source bytes each time, and from
// four goroutines at once at the end) lands every block every time.
func TestHWPrepared50Submits(t *testing.T) {
	dev := hwDevice(t)
	const size = 8 << 20
	p := newPair(t, testConfig(dev), size)
	r := rand.New(rand.NewSource(22))
	b := layout(r, 1500, []uint64{128, 4096, 1000}, "random", size)
	pr := prepare(t, p, b)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Second)
	defer cancel()
	before := p.in.batches.Load()
	for k := 0; k < 46; k++ {
		clear(p.dm.Host)
		r.Read(p.sm.Host)
		if _, err := pr.Write(ctx); err != nil {
			t.Fatalf("submit %d: %v", k, err)
		}
		verify(t, p, b)
	}
	r.Read(p.sm.Host)
	clear(p.dm.Host)
	var wg sync.WaitGroup
	errc := make(chan error, 4)
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := pr.Write(ctx); err != nil {
				errc <- err
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	verify(t, p, b)
	if got := p.in.batches.Load() - before; got != 50 {
		t.Fatalf("%d batches landed, want 50", got)
	}
	if pins, unpins := p.in.pins.Load(), p.in.unpins.Load(); pins != unpins {
		t.Fatalf("pins %d, unpins %d", pins, unpins)
	}
}

// A source rekeyed between submits: the next submit re-stamps the plan
// with the new MR (the retired one is deregistered, never posted with) and
// lands every block.
func TestHWPreparedRekeyedSource(t *testing.T) {
	dev := hwDevice(t)
	const size = 4 << 20
	p := newPair(t, testConfig(dev), size)
	r := rand.New(rand.NewSource(23))
	b := layout(r, 1000, []uint64{4096, 128}, "random", size)
	pr := prepare(t, p, b)
	pl := pr.(*prepared)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	for round := 0; round < 3; round++ {
		r.Read(p.sm.Host)
		clear(p.dm.Host)
		if _, err := pr.Write(ctx); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		verify(t, p, b)
		if lk, cur := pl.plan.LKey(), p.src.(*registration).cur.mr.LKey(); lk != cur {
			t.Fatalf("round %d: plan stamped with lkey %#x, the source's MR has %#x", round, lk, cur)
		}
		mrs := p.a.live.mrs.Load()
		old, err := p.src.Rekey()
		if err != nil {
			t.Fatal(err)
		}
		// The old MR was idle: deregistered at once, so the count is back.
		if got := p.a.live.mrs.Load(); got != mrs {
			t.Fatalf("MRs %d after rekey, want %d (old one deregistered)", got, mrs)
		}
		if old.Key == p.src.Key().Key {
			t.Fatal("rekey kept the rkey")
		}
	}
}

// A prepared batch cut off by its deadline with WRs in flight posts nothing
// more before DeadlineExceeded is returned (no byte lands after); the same
// batch prepared again lands (see afterStop).
func TestHWPreparedDeadlineStops(t *testing.T) {
	dev := hwDevice(t)
	const size = 64 << 20
	p := newPair(t, testConfig(dev), size)
	r := rand.New(rand.NewSource(24))
	r.Read(p.sm.Host)
	b := layout(r, size/4096, []uint64{4096}, "random", size)
	pr := prepare(t, p, b)
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := pr.Write(ctx)
	el := time.Since(start)
	snap := bytes.Clone(p.dm.Host)
	if err == nil {
		t.Skipf("64 MiB landed within the 150 ms deadline (%v): this device is too fast for the test", el)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want DeadlineExceeded", err)
	}
	t.Logf("cut off after %v: %v", el, err)
	time.Sleep(2 * time.Second)
	if !bytes.Equal(snap, p.dm.Host) {
		t.Fatal("bytes changed after DeadlineExceeded was returned")
	}
	afterStop(t, p, err)
	clear(p.dm.Host)
	pr = prepare(t, p, b) // a plan belongs to its connection
	ctx2, cancel2 := context.WithTimeout(context.Background(), 300*time.Second)
	defer cancel2()
	if _, err := pr.Write(ctx2); err != nil {
		t.Fatal(err)
	}
	verify(t, p, b)
	waitSets(t, p.b, 1, 10*time.Second)
}

// A prepared batch whose destination the receiver cannot pin is refused
// with NotFound and never accounted; the connection and the plan stay
// usable.
func TestHWPreparedRefused(t *testing.T) {
	dev := hwDevice(t)
	p := newPair(t, testConfig(dev), 1<<20)
	rand.New(rand.NewSource(25)).Read(p.sm.Host)
	b := layout(rand.New(rand.NewSource(26)), 200, []uint64{4096}, "random", 1<<20)
	pr := prepare(t, p, b)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	landed := p.in.batches.Load()
	p.in.refuse.Store(true)
	_, err := pr.Write(ctx)
	p.in.refuse.Store(false)
	if !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("got %v, want NotFound", err)
	}
	if got := p.in.batches.Load(); got != landed {
		t.Fatalf("a refused batch was accounted as landed")
	}
	if err := p.conn.Err(); err != nil {
		t.Fatalf("a refusal broke the connection: %v", err)
	}
	clear(p.dm.Host)
	if _, err := pr.Write(ctx); err != nil {
		t.Fatal(err)
	}
	verify(t, p, b)
}

// Close while a Write is in flight frees the plan when the Write ends (it
// still lands); later Writes fail with FailedPrecondition; Close twice.
func TestHWPreparedCloseInFlight(t *testing.T) {
	dev := hwDevice(t)
	const size = 16 << 20
	p := newPair(t, testConfig(dev), size)
	r := rand.New(rand.NewSource(27))
	r.Read(p.sm.Host)
	b := layout(r, 3000, []uint64{4096}, "random", size)
	pr := prepare(t, p, b)
	pl := pr.(*prepared)
	// Hold the set's token so the Write is surely in flight (entered,
	// waiting its turn) when the plan is closed.
	s := p.conn.(*qpSet)
	s.sem <- struct{}{}
	done := make(chan error, 1)
	go func() {
		_, err := pr.Write(context.Background())
		done <- err
	}()
	for {
		pl.mu.Lock()
		n := pl.inflight
		pl.mu.Unlock()
		if n > 0 {
			break
		}
		time.Sleep(50 * time.Microsecond)
	}
	if err := pr.Close(); err != nil {
		t.Fatal(err)
	}
	if pl.plan.Shares() == 0 {
		t.Fatal("plan freed under an in-flight Write")
	}
	<-s.sem
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	verify(t, p, b)
	if pl.plan.Shares() != 0 {
		t.Fatal("plan not freed after the in-flight Write ended")
	}
	if _, err := pr.Write(context.Background()); !errors.Is(err, errs.ErrFailedPrecondition) {
		t.Fatalf("write after close: %v", err)
	}
	if err := pr.Close(); err != nil {
		t.Fatal(err)
	}
}

// A prepared Write allocates nothing (asserted, not only benchmarked).
func TestHWPreparedNoAlloc(t *testing.T) {
	dev := hwDevice(t)
	const size = 4 << 20
	p := newPair(t, testConfig(dev), size)
	b := layout(rand.New(rand.NewSource(28)), 2000, []uint64{128}, "random", size)
	pr := prepare(t, p, b)
	ctx := context.Background()
	allocs := testing.AllocsPerRun(20, func() {
		if _, err := pr.Write(ctx); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per prepared Write", allocs)
	}
}

// TestHWPreparedPost prints the plan+post figure of 10,000 x 128 B random
// blocks (one WR each) with real posts, per posting thread count, against
// the ad hoc path: Stats.Plan and Stats.Post (the time spent building and
// in ibv_post_send, credit waits excluded) and the whole Write, medians of
// several submits. Not a timed assertion: it logs the figures.
func TestHWPreparedPost(t *testing.T) {
	dev := hwDevice(t)
	const n, size = 10000, 10000 * 256
	r := rand.New(rand.NewSource(29))
	ps, pd := r.Perm(n), r.Perm(n)
	b := &desc.Batch{}
	for i := 0; i < n; i++ {
		b.Src, b.Dst, b.Len = append(b.Src, uint64(ps[i])*256), append(b.Dst, uint64(pd[i])*256), append(b.Len, 128)
	}
	median := func(d []time.Duration) time.Duration {
		d = append([]time.Duration(nil), d...)
		for i := range d {
			for j := i + 1; j < len(d); j++ {
				if d[j] < d[i] {
					d[i], d[j] = d[j], d[i]
				}
			}
		}
		return d[len(d)/2]
	}
	const rounds = 7
	for _, threads := range []int{1, 2, 4} {
		cfg := testConfig(dev)
		cfg.PostThreads = threads
		p := newPair(t, cfg, size)
		r.Read(p.sm.Host)
		pr := prepare(t, p, b)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Second)
		var prep, adhoc [3][]time.Duration // plan+post, post, wall
		for k := 0; k < rounds; k++ {
			t0 := time.Now()
			st, err := pr.Write(ctx)
			wall := time.Since(t0)
			if err != nil {
				t.Fatal(err)
			}
			prep[0], prep[1], prep[2] = append(prep[0], st.Plan+st.Post), append(prep[1], st.Post), append(prep[2], wall)
			t0 = time.Now()
			st, err = transport.Write(ctx, p.conn, p.src, p.remote, b)
			wall = time.Since(t0)
			if err != nil {
				t.Fatal(err)
			}
			adhoc[0], adhoc[1], adhoc[2] = append(adhoc[0], st.Plan+st.Post), append(adhoc[1], st.Post), append(adhoc[2], wall)
		}
		cancel()
		clear(p.dm.Host)
		if _, err := pr.Write(context.Background()); err != nil {
			t.Fatal(err)
		}
		verify(t, p, b)
		t.Logf("PREPARED-POST threads=%d qps=%d wrs=%d: prepared plan+post %v (post %v) write %v | ad hoc plan+post %v (post %v) write %v (medians of %d)",
			threads, cfg.QPsPerPeer, n, median(prep[0]), median(prep[1]), median(prep[2]),
			median(adhoc[0]), median(adhoc[1]), median(adhoc[2]), rounds)
		p.conn.Close()
	}
}

// BenchmarkHWPreparedWrite: a prepared Write of 2,000 random 128 B blocks;
// allocations per Write (there must be none) and post time per WR.
func BenchmarkHWPreparedWrite(b *testing.B) {
	dev := hwDevice(b)
	const size = 2000 * 256
	p := newPair(b, testConfig(dev), size)
	batch := layout(rand.New(rand.NewSource(30)), 2000, []uint64{128}, "random", size)
	pr := prepare(b, p, batch)
	ctx := context.Background()
	var wrs uint64
	var post time.Duration
	b.ReportAllocs()
	b.SetBytes(int64(batch.Bytes()))
	for b.Loop() {
		st, err := pr.Write(ctx)
		if err != nil {
			b.Fatal(err)
		}
		wrs += st.WorkRequests
		post += st.Post
	}
	b.ReportMetric(float64(post.Nanoseconds())/float64(wrs), "post-ns/WR")
}

// Prepare validates like Write: blocks outside either region and foreign
// registrations are InvalidArgument, and the connection stays usable.
func TestHWPreparedBadInput(t *testing.T) {
	dev := hwDevice(t)
	p := newPair(t, testConfig(dev), 1<<20)
	pp := p.conn
	for _, tc := range []struct {
		name string
		src  transport.Registration
		b    *desc.Batch
	}{
		{"dst past the region", p.src, &desc.Batch{Src: []uint64{0}, Dst: []uint64{1<<20 - 10}, Len: []uint64{64}}},
		{"src past the registration", p.src, &desc.Batch{Src: []uint64{1 << 20}, Dst: []uint64{0}, Len: []uint64{1}}},
		{"ragged arrays", p.src, &desc.Batch{Src: []uint64{0, 1}, Dst: []uint64{0}, Len: []uint64{1}}},
		{"foreign registration", p.dst, &desc.Batch{Src: []uint64{0}, Dst: []uint64{0}, Len: []uint64{1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := transport.Prepare(pp, tc.src, p.remote, tc.b); !errors.Is(err, errs.ErrInvalidArgument) {
				t.Fatalf("got %v, want InvalidArgument", err)
			}
		})
	}
	if err := p.conn.Err(); err != nil {
		t.Fatal(err)
	}
	b := &desc.Batch{Src: []uint64{0}, Dst: []uint64{4096}, Len: []uint64{4096}}
	rand.New(rand.NewSource(31)).Read(p.sm.Host[:4096])
	if _, err := prepare(t, p, b).Write(context.Background()); err != nil {
		t.Fatal(err)
	}
	verify(t, p, b)
}
