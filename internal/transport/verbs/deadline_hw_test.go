package verbs

import (
	"bytes"
	"context"
	"errors"
	"math/rand"
	"testing"
	"time"

	"github.com/b2bd/b2bd/internal/errs"
)

// A batch cut off by its deadline with WRs in flight posts nothing more
// before DeadlineExceeded is returned, and no byte lands afterwards. Either
// what it posted completed within the stop's bound (the connection stays,
// the receiver does not account the batch) or the QPs were stopped (the
// fallback: Aborted, the connection broken); the next batch lands every
// block either way.
func TestHWDeadlineStopsWrites(t *testing.T) {
	dev := hwDevice(t)
	const size = 64 << 20
	p := newPair(t, testConfig(dev), size)
	r := rand.New(rand.NewSource(10))
	r.Read(p.sm.Host)
	// 4 KiB blocks scattered on both sides: one WR each, 4096 per QP, far
	// more than a send queue holds, so the writer waits for credits and
	// meets the deadline with full send queues. (With 64 WRs of 1 MiB every
	// WR fits at once and rxe does much of the work inside ibv_post_send:
	// the batch was out before the writer ever looked at the deadline.)
	b := layout(r, size/4096, []uint64{4096}, "random", size)
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	landed := p.in.batches.Load()
	start := time.Now()
	_, err := p.conn.Write(ctx, p.src, p.remote, b)
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
	changed, first := 0, -1
	for k := range snap {
		if snap[k] != p.dm.Host[k] {
			if first < 0 {
				first = k
			}
			changed++
		}
	}
	if changed > 0 {
		t.Fatalf("%d bytes (first at offset %d) changed in the 2 s after DeadlineExceeded was returned", changed, first)
	}
	landedBefore := 0
	for k := range snap {
		if snap[k] != 0 {
			landedBefore++
		}
	}
	t.Logf("%d non-zero bytes had landed before the error; none after", landedBefore)
	if got := p.in.batches.Load(); got != landed {
		t.Fatalf("the cut-off batch was accounted as landed (%d batches, want %d)", got, landed)
	}
	afterStop(t, p, err)
	clear(p.dm.Host)
	ctx2, cancel2 := context.WithTimeout(context.Background(), 300*time.Second)
	defer cancel2()
	if _, err := p.conn.Write(ctx2, p.src, p.remote, b); err != nil {
		t.Fatal(err)
	}
	verify(t, p, b)
	if got := p.in.batches.Load(); got != landed+1 {
		t.Fatalf("%d batches accounted, want %d", got, landed+1)
	}
	waitSets(t, p.b, 1, 10*time.Second)
}

// afterStop checks how a stopped batch left the connection: kept (its
// error is the deadline's alone) or broken by the fallback (Aborted too),
// and then reconnects. Either is allowed: which one depends on whether
// the posted WRs completed within the stop's bound on this device.
func afterStop(t *testing.T, p *pair, err error) {
	t.Helper()
	if cerr := p.conn.Err(); cerr == nil {
		if errors.Is(err, errs.ErrAborted) {
			t.Fatalf("the batch failed with Aborted but the connection is still usable: %v", err)
		}
		t.Logf("stopped cleanly: the connection stays")
		return
	}
	if !errors.Is(err, errs.ErrAborted) {
		t.Fatalf("the connection broke but the batch's error does not say so: %v", err)
	}
	t.Logf("fallback: QPs stopped, connection dropped (%v)", p.conn.Err())
	p.conn.Close()
	p.connect(t)
}
