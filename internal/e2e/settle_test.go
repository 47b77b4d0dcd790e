package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/b2bd/b2bd/client"
)

// Leak checks compare a daemon's Status after a test's work with a baseline
// taken once the daemon has settled, and fail only on growth. A daemon the
// tests share (the testbed VMs') still holds what earlier tests left, idle
// peer connections above all, and reaps them on its own clock: a count
// that shrank during the test is that reaping, not a fault of the test's.

const (
	// goroutineSlack is how far goroutines may sit above the baseline: gRPC
	// and the Go runtime run a transient one or two (a closing stream, a
	// keepalive); a leak per call or per client is tens.
	goroutineSlack = 2
	// settleGap and settleBound: the daemon has settled when two samples
	// settleGap apart agree, within settleBound.
	settleGap   = 250 * time.Millisecond
	settleBound = 30 * time.Second
	// growthBound bounds the wait for counts to come back down after the
	// work: closed calls, leases and streams end asynchronously.
	growthBound = 30 * time.Second
)

// usage is what a daemon's Status reports for leak checks; connections,
// queue pairs and memory regions summed over its transports.
type usage struct {
	goroutines, fds, regions, peers int
	conns, qps, mrs                 int
	inFlight, held                  int
}

func (u usage) String() string {
	return fmt.Sprintf("{goroutines %d fds %d regions %d peers %d connections %d qps %d mrs %d transfers in flight %d held %d}",
		u.goroutines, u.fds, u.regions, u.peers, u.conns, u.qps, u.mrs, u.inFlight, u.held)
}

// usageOf samples c's daemon.
func usageOf(t *testing.T, c *client.Client) usage {
	t.Helper()
	st, err := c.Status(context.Background())
	if err != nil {
		t.Fatalf("Status for a leak check: %v", err)
	}
	u := usage{goroutines: int(st.Goroutines), fds: int(st.OpenFds), regions: int(st.Regions), peers: int(st.PeersConnected),
		inFlight: int(st.TransfersInFlight), held: int(st.TransfersHeld)}
	for _, ts := range st.Transports {
		u.conns += int(ts.Connections)
		u.qps += int(ts.QueuePairs)
		u.mrs += int(ts.MemoryRegions)
	}
	return u
}

// grown names the counts of u above base's ("fds 12 > 10"), goroutines
// past goroutineSlack.
func (u usage) grown(base usage) []string {
	var g []string
	for _, c := range []struct {
		name        string
		now, before int
		slack       int
	}{
		{"goroutines", u.goroutines, base.goroutines, goroutineSlack},
		{"fds", u.fds, base.fds, 0},
		{"regions", u.regions, base.regions, 0},
		{"peers", u.peers, base.peers, 0},
		{"connections", u.conns, base.conns, 0},
		{"qps", u.qps, base.qps, 0},
		{"mrs", u.mrs, base.mrs, 0},
		{"transfers in flight", u.inFlight, base.inFlight, 0},
		{"transfers held", u.held, base.held, 0},
	} {
		if c.now > c.before+c.slack {
			g = append(g, fmt.Sprintf("%s %d > %d", c.name, c.now, c.before))
		}
	}
	return g
}

// same: nothing moved between two samples but goroutines within the slack.
func (u usage) same(v usage) bool {
	return len(u.grown(v)) == 0 && len(v.grown(u)) == 0
}

// settled is c's daemon's baseline for a leak check: polled until no
// transfer is in flight or held and two samples settleGap apart agree, so
// that what earlier work left behind (calls still closing, a connection
// being reaped) is not mistaken for the baseline. A daemon that never
// settles within settleBound gives its last sample, logged: the growth
// check that follows still holds against it.
func settled(t *testing.T, who string, c *client.Client) usage {
	t.Helper()
	prev := usageOf(t, c)
	for end := time.Now().Add(settleBound); ; {
		time.Sleep(settleGap) // the quiet interval a settled daemon keeps, not a synchronisation
		u := usageOf(t, c)
		if u.inFlight == 0 && u.held == 0 && u.same(prev) {
			return u
		}
		if time.Now().After(end) {
			t.Logf("%s daemon still moving after %v: baseline %s (the sample before %s)", who, settleBound, u, prev)
			return u
		}
		prev = u
	}
}

// noGrowth polls c's daemon until no count is above base's and fails,
// naming those that grew, if that does not happen within growthBound. A
// count below base's passes: it is earlier work being reaped.
func noGrowth(t *testing.T, who string, c *client.Client, base usage) {
	t.Helper()
	u, g := untilNoGrowth(t, c, base, growthBound)
	if len(g) > 0 {
		t.Fatalf("%s daemon grew past its baseline %v after the work: %s; now %s, baseline %s",
			who, growthBound, strings.Join(g, ", "), u, base)
	}
	t.Logf("%s daemon at or below its baseline: %s (baseline %s)", who, u, base)
}

// untilNoGrowth polls c's daemon until no count is above base's, or for
// bound: the last sample and what in it grew.
func untilNoGrowth(t *testing.T, c *client.Client, base usage, bound time.Duration) (usage, []string) {
	t.Helper()
	for end := time.Now().Add(bound); ; {
		u := usageOf(t, c)
		if g := u.grown(base); len(g) == 0 || time.Now().After(end) {
			return u, g
		}
		time.Sleep(50 * time.Millisecond) // a poll interval, not a synchronisation
	}
}

// TestNoGrowthCatchesALeak: against a real daemon, a region registered
// after the baseline is growth until it is deregistered.
func TestNoGrowthCatchesALeak(t *testing.T) {
	a := startNode(t, "a")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	base := settled(t, "a", a.c)
	r, err := a.c.RegisterHost(ctx, 4096, "leak")
	if err != nil {
		t.Fatal(err)
	}
	// Its shared memory may hold a descriptor too: the region must be named.
	if u, g := untilNoGrowth(t, a.c, base, 500*time.Millisecond); !slices.Contains(g, fmt.Sprintf("regions %d > %d", base.regions+1, base.regions)) {
		t.Fatalf("a region left registered: grown %q (now %s, baseline %s), want the region named", g, u, base)
	}
	r.Unmap()
	if err := a.c.Deregister(ctx, r.Id); err != nil {
		t.Fatal(err)
	}
	noGrowth(t, "a", a.c, base)
}

// TestUsageGrown: growth past the baseline is named, goroutines only past
// the slack; a count below the baseline (earlier work reaped) is not.
func TestUsageGrown(t *testing.T) {
	base := usage{goroutines: 40, fds: 20, regions: 3, peers: 2, conns: 2, qps: 8, mrs: 4}
	for _, tc := range []struct {
		name string
		edit func(*usage)
		want string // "" for no growth
	}{
		{"equal", func(*usage) {}, ""},
		{"a connection reaped", func(u *usage) { u.conns, u.qps, u.peers = 1, 4, 1 }, ""},
		{"goroutines within the slack", func(u *usage) { u.goroutines += goroutineSlack }, ""},
		{"goroutines past the slack", func(u *usage) { u.goroutines += goroutineSlack + 1 }, "goroutines 43 > 40"},
		{"one fd", func(u *usage) { u.fds++ }, "fds 21 > 20"},
		{"a region", func(u *usage) { u.regions++ }, "regions 4 > 3"},
		{"a qp, though a connection went", func(u *usage) { u.conns, u.qps = 1, 9 }, "qps 9 > 8"},
		{"an mr", func(u *usage) { u.mrs++ }, "mrs 5 > 4"},
		{"a transfer held", func(u *usage) { u.held = 1 }, "transfers held 1 > 0"},
		{"a transfer in flight", func(u *usage) { u.inFlight = 1 }, "transfers in flight 1 > 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := base
			tc.edit(&u)
			if got := strings.Join(u.grown(base), ", "); got != tc.want {
				t.Fatalf("grown = %q, want %q", got, tc.want)
			}
		})
	}
}
