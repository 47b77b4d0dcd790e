package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/b2bd/b2bd/client"
)

// The fault and load runs are long; `make test-faults` sets B2B_FAULTS=1.
func needFaults(t *testing.T) {
	if os.Getenv("B2B_FAULTS") != "1" {
		t.Skip("B2B_FAULTS=1 not set (make test-faults)")
	}
}

// TestFaultPeerKillTrials: ten kill -9 trials of the destination mid-batch
// (killPeerTrials says what each must show), reported as a table row.
func TestFaultPeerKillTrials(t *testing.T) {
	needFaults(t)
	const trials = 10
	r := killPeerTrials(t, trials)
	row := newRow("peer kill -9 mid-batch (one host; the sender serves another peer meanwhile)", "tcp")
	for code, k := range r.outcomes {
		for range k {
			row.add(code.String(), 0, true)
		}
	}
	row.worst = r.worst
	row.print()
}

// TestFaultLoad: 32 concurrent clients, 200 batches each of mixed sizes,
// against one pair of daemons: zero failures, every block verified, and the
// daemons' threads, file descriptors and regions back to their baseline.
func TestFaultLoad(t *testing.T) {
	needFaults(t)
	const clients, batches = 32, 200
	_, b, ca, cb := startProcPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	// Baseline once the data path exists (its streams are long-lived).
	warm := func() {
		s, _ := ca.RegisterHost(ctx, 4096, "")
		d, _ := cb.RegisterHost(ctx, 4096, "warm")
		if _, err := transfer(ctx, ca, s.Id, b.peer, "warm", []uint64{0}, []uint64{0}, 4096); err != nil {
			t.Fatal(err)
		}
		s.Unmap()
		d.Unmap()
		_ = ca.Deregister(ctx, s.Id)
		_ = cb.Deregister(ctx, d.Id)
	}
	warm()
	before := [2]usage{settled(t, "a (sender)", ca), settled(t, "b (receiver)", cb)}

	sizes := []uint64{128, 1024, 4096, 16384, 65536}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []string
	var moved, blocksVerified uint64
	start := time.Now()
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fail := func(format string, args ...any) {
				mu.Lock()
				failures = append(failures, fmt.Sprintf("client %d: ", c)+fmt.Sprintf(format, args...))
				mu.Unlock()
			}
			r := rand.New(rand.NewPCG(uint64(c), 99))
			const slots = 64
			region := uint64(slots) * (65536 + 64)
			src, err := ca.RegisterHost(ctx, region, "")
			if err != nil {
				fail("register: %v", err)
				return
			}
			name := fmt.Sprintf("load-%d", c)
			dst, err := cb.RegisterHost(ctx, region, name)
			if err != nil {
				fail("register: %v", err)
				return
			}
			defer func() {
				src.Unmap()
				dst.Unmap()
				_ = ca.Deregister(context.Background(), src.Id)
				_ = cb.Deregister(context.Background(), dst.Id)
			}()
			for i := range batches {
				size := sizes[r.IntN(len(sizes))]
				n := 1 + r.IntN(slots)
				slot := size + 64
				so, do := make([]uint64, n), make([]uint64, n)
				for k, p := range r.Perm(slots)[:n] {
					so[k], do[k] = uint64(k)*slot, uint64(p)*slot
				}
				for _, o := range so {
					for j := o; j < o+size; j += 8 {
						src.Bytes[j] = byte(r.Uint32())
					}
				}
				if _, err := transfer(ctx, ca, src.Id, b.peer, name, so, do, size); err != nil {
					fail("batch %d: %v", i, err)
					return
				}
				if k := badBlock(src.Bytes, dst.Bytes, so, do, size); k >= 0 {
					fail("batch %d: block %d differs", i, k)
					return
				}
				mu.Lock()
				moved += uint64(n) * size
				blocksVerified += uint64(n)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	if len(failures) > 0 {
		t.Fatalf("%d failures, first: %s", len(failures), failures[0])
	}
	fmt.Printf("LOAD %d clients x %d batches (tcp, one host): 0 failures, %d blocks verified, %.1f MB in %v\n", clients, batches, blocksVerified, float64(moved)/1e6, took.Round(time.Millisecond))
	for i, name := range []string{"a (sender)", "b (receiver)"} {
		fmt.Printf("LOAD daemon %s: baseline %s\n", name, before[i])
		noGrowth(t, name, []*client.Client{ca, cb}[i], before[i])
	}
}
