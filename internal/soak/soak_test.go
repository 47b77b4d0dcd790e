package soak

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestParseFlags(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want []string // substrings of the error; none: no error
	}{
		{"defaults", nil, nil},
		{"a chaos subset", []string{"--duration", "60s", "--chaos", "kill,worker,truncate,layout,narrow"}, nil},
		{"no chaos", []string{"--chaos", ""}, nil},
		{"three daemons", []string{"--daemons", "3"}, []string{"--daemons 3", "4..16"}},
		{"all stable", []string{"--stable", "4"}, []string{"--stable 4", "1..3"}},
		{"zero duration", []string{"--duration", "0s"}, []string{"--duration 0s", "> 0"}},
		{"unknown chaos", []string{"--chaos", "kill,meteor"}, []string{`"meteor"`, "kill,stop"}},
		{"no workers", []string{"--workers", "0"}, []string{"--workers 0", "1..1024"}},
		{"stray argument", []string{"extra"}, []string{`"extra"`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var stderr bytes.Buffer
			_, err := ParseFlags(c.args, &stderr)
			if len(c.want) == 0 {
				if err != nil {
					t.Fatalf("got %v, want no error", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("got no error, want one naming %q", c.want)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
		})
	}
}

// testWorker is a worker over two in-memory regions, with no daemons.
func testWorker() *worker {
	s := &soak{stats: newStats(), sched: newSchedMonitor()}
	w := &worker{s: s, a: &daemon{name: "a"}, b: &daemon{name: "b"}, r: rand.New(rand.NewPCG(1, 2)), fill: rand.NewChaCha8([32]byte{1})}
	return w
}

func testXfer() *xfer {
	src, dst := make([]byte, 1<<16), make([]byte, 1<<16)
	return &xfer{kind: "push", patMem: src, chkMem: dst, patOffs: []uint64{0, 4096}, chkOffs: []uint64{8192, 16384}, n: 1024}
}

// land copies the pattern blocks to the checked blocks, as a transfer does.
func land(x *xfer) {
	for i, o := range x.patOffs {
		copy(x.chkMem[x.chkOffs[i]:x.chkOffs[i]+x.n], x.patMem[o:o+x.n])
	}
}

// TestFinishVerifiesSuccess: an OK whose blocks did not all land (or hold a
// stale pattern) is a false success; one whose blocks landed is not.
func TestFinishVerifiesSuccess(t *testing.T) {
	cases := []struct {
		name  string
		apply func(w *worker, x *xfer)
		want  uint64
	}{
		{"landed", func(w *worker, x *xfer) { w.fillPattern(x); land(x) }, 0},
		{"nothing landed", func(w *worker, x *xfer) { w.fillPattern(x) }, 1},
		{"one byte short", func(w *worker, x *xfer) { w.fillPattern(x); land(x); x.chkMem[x.chkOffs[1]+x.n-1] ^= 1 }, 1},
		{"stale pattern", func(w *worker, x *xfer) { w.fillPattern(x); land(x); w.fillPattern(x) }, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w, x := testWorker(), testXfer()
			c.apply(w, x)
			w.finish(w.begin(time.Now().Add(time.Second)), x, nil)
			if got := w.s.stats.falseSuccess.Load(); got != c.want {
				t.Fatalf("false successes: got %d, want %d", got, c.want)
			}
		})
	}
}

// TestQuarantineCatchesLateBytes: a cut transfer's blocks are snapshotted
// at the answer; a byte changed before the re-check is a late byte (kept
// apart when the worker's own daemon was killed or frozen meanwhile).
func TestQuarantineCatchesLateBytes(t *testing.T) {
	cases := []struct {
		name        string
		late, chaos bool
		want, apart uint64
	}{
		{"unchanged", false, false, 0, 0},
		{"byte after the answer", true, false, 1, 0},
		{"own daemon killed", true, true, 0, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w, x := testWorker(), testXfer()
			w.fillPattern(x)
			call := w.begin(time.Now().Add(time.Second))
			if c.chaos {
				w.a.beginChaos()
			}
			w.finish(call, x, status.Error(codes.DeadlineExceeded, "cut"))
			if len(w.quar) != 1 || !w.overlaps(x.chkMem, x.chkOffs[0], x.chkOffs[0]+1) {
				t.Fatalf("the cut transfer's blocks are not in quarantine: %+v", w.quar)
			}
			if c.late {
				x.chkMem[x.chkOffs[0]] ^= 0xff
			}
			w.checkQuarantine(false) // not yet due
			if len(w.quar) != 1 {
				t.Fatalf("re-checked before its time")
			}
			w.checkQuarantine(true)
			st := w.s.stats
			if st.lateBytes.Load() != c.want || st.lateBytesChaos.Load() != c.apart {
				t.Fatalf("late bytes %d (own-daemon chaos %d), want %d (%d)", st.lateBytes.Load(), st.lateBytesChaos.Load(), c.want, c.apart)
			}
			if ks := st.kind("push"); ks.deadline.Load() != 1 {
				t.Fatalf("deadline count %d, want 1", ks.deadline.Load())
			}
		})
	}
}

// TestFinishDeadline: an answer later than its deadline plus the slack is
// an overrun, classified by the chaos on its daemons.
func TestFinishDeadline(t *testing.T) {
	cases := []struct {
		name                string
		late                time.Duration
		peerChaos, ownChaos bool
		clean, peer, own    uint64
	}{
		{"on time", 0, false, false, 0, 0, 0},
		{"within slack", 50 * time.Millisecond, false, false, 0, 0, 0},
		{"late", 300 * time.Millisecond, false, false, 1, 0, 0},
		{"late, peer frozen", 300 * time.Millisecond, true, false, 0, 1, 0},
		{"late, own daemon frozen", 300 * time.Millisecond, false, true, 0, 0, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w, x := testWorker(), testXfer()
			w.fillPattern(x)
			call := w.begin(time.Now().Add(-c.late))
			if c.peerChaos {
				w.b.beginChaos()
			}
			if c.ownChaos {
				w.a.beginChaos()
			}
			w.finish(call, x, errors.New("cut"))
			w.judgeLate(true)
			st := w.s.stats
			if st.overruns.Load() != c.clean || st.overrunsPeerChaos.Load() != c.peer || st.overrunsLocalChaos.Load() != c.own {
				t.Fatalf("overruns clean %d, peer %d, own %d; want %d, %d, %d", st.overruns.Load(), st.overrunsPeerChaos.Load(), st.overrunsLocalChaos.Load(), c.clean, c.peer, c.own)
			}
		})
	}
}

// TestSlackFollowsSchedulingDelay: the allowance grows with the delay
// measured around the call, not with delays long before it.
func TestSlackFollowsSchedulingDelay(t *testing.T) {
	m := newSchedMonitor()
	t0 := m.start
	m.record(t0.Add(500*time.Millisecond), 50*time.Millisecond)
	// A sleeper starved across a call's end: its delay counts for the call.
	m.record(t0.Add(5300*time.Millisecond), 400*time.Millisecond)
	if _, margin := m.slack(t0.Add(4900*time.Millisecond), t0.Add(5*time.Second)); margin != 1600*time.Millisecond {
		t.Fatalf("delay measured after the call: margin %v, want 1.6s", margin)
	}
	m.record(t0.Add(10*time.Second), 5*time.Millisecond)
	if got, margin := m.slack(t0.Add(time.Second), t0.Add(1100*time.Millisecond)); margin != 200*time.Millisecond || got != 300*time.Millisecond {
		t.Fatalf("around the 50 ms delay: slack %v margin %v, want 300ms 200ms", got, margin)
	}
	if _, margin := m.slack(t0.Add(9*time.Second), t0.Add(9500*time.Millisecond)); margin != 20*time.Millisecond {
		t.Fatalf("long after it: margin %v, want 20ms", margin)
	}
}

func TestLeaks(t *testing.T) {
	base := map[string]Sample{"d": {Goroutines: 50, FDs: 40, RSSAnonKiB: 100 << 10}}
	cases := []struct {
		name    string
		end     Sample
		mid     map[string]Sample
		restart int
		want    []string
	}{
		{"back to baseline", Sample{Goroutines: 52, FDs: 41, RSSAnonKiB: 120 << 10}, nil, 0, nil},
		{"region left", Sample{Goroutines: 50, FDs: 40, Regions: 1, RSSAnonKiB: 100 << 10}, nil, 0, []string{"regions"}},
		{"transfer held", Sample{Goroutines: 50, FDs: 40, TransfersHeld: 2, RSSAnonKiB: 100 << 10}, nil, 0, []string{"transfers_held"}},
		{"goroutines", Sample{Goroutines: 90, FDs: 40, RSSAnonKiB: 100 << 10}, nil, 0, []string{"goroutines"}},
		{"fds", Sample{Goroutines: 50, FDs: 60, RSSAnonKiB: 100 << 10}, nil, 0, []string{"fds"}},
		{"memory grew", Sample{Goroutines: 50, FDs: 40, RSSAnonKiB: 200 << 10}, nil, 0, []string{"rss_anon_kib"}},
		{"memory within slack", Sample{Goroutines: 50, FDs: 40, RSSAnonKiB: 189 << 10}, nil, 0, nil},
		{"memory at plateau", Sample{Goroutines: 50, FDs: 40, RSSAnonKiB: 280 << 10}, map[string]Sample{"d": {RSSAnonKiB: 180 << 10}}, 0, nil},
		{"restarted: not checked", Sample{Regions: 9}, nil, 1, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ds := []*daemon{{name: "d", restart: c.restart}}
			got := leaks(base, c.mid, map[string]Sample{"d": c.end}, ds)
			var names []string
			for _, l := range got {
				names = append(names, l.Resource)
			}
			if strings.Join(names, ",") != strings.Join(c.want, ",") {
				t.Fatalf("leaks %v, want %v", names, c.want)
			}
		})
	}
}
