package e2e

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/internal/daemon"
)

// activeBatches is the region's active_batches as the daemon lists it, or -1
// when the region is not listed.
func activeBatches(ctx context.Context, t *testing.T, n *node, id string) int {
	t.Helper()
	rs, err := n.c.Regions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if r.GetId() == id {
			return int(r.GetActiveBatches())
		}
	}
	return -1
}

// waitIdle waits (generously) until the region holds no batch.
func waitIdle(ctx context.Context, t *testing.T, n *node, id string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		a := activeBatches(ctx, t, n, id)
		if a == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("region %s still has %d active batches: a pin leaked", id, a)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestBatchHoldsDestination: a multi-frame TCP batch holds its destination
// from its first frame until all of it landed, on one stream and on several:
// DeregisterRegion on the destination meanwhile fails with
// FailedPrecondition every time, the batch succeeds and verifies, and
// afterwards deregistration succeeds.
func TestBatchHoldsDestination(t *testing.T) {
	for _, streams := range []int{1, 4} {
		t.Run(fmt.Sprintf("streams=%d", streams), func(t *testing.T) {
			a := startNode(t, "a", func(c *daemon.Config) { c.KindFlags["tcp-streams"] = strconv.Itoa(streams) })
			b := startNode(t, "b")
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			// 64 MiB in 1 MiB blocks at scattered slots: 16 frames of 4 MiB.
			const n, size = 64, 1 << 20
			r := rand.New(rand.NewPCG(uint64(streams), 3))
			srcOff, srcSize := layout(n, size, r)
			dstOff, dstSize := layout(n, size, r)
			src, err := a.c.RegisterHost(ctx, srcSize, "")
			if err != nil {
				t.Fatal(err)
			}
			fill(src.Bytes, func(int) byte { return byte(r.Uint32()) })
			for round := 0; round < 3; round++ {
				name := fmt.Sprintf("held%d", round)
				dst, err := b.c.RegisterHost(ctx, dstSize, name)
				if err != nil {
					t.Fatal(err)
				}
				var (
					wg       sync.WaitGroup
					stop     = make(chan struct{})
					mu       sync.Mutex
					refused  int
					wrong    []string
					inFlight bool
					gone     bool // the watcher's deregistration succeeded
				)
				wg.Add(1)
				go func() {
					defer wg.Done()
					// Only once the batch holds the region, i.e. its first
					// frame is being placed (block 0's bytes show in our
					// mapping): before that a deregistration is legitimate.
					// (active_batches > 0 alone would also count the peer's
					// momentary hold while it resolves the name.)
					first := dst.Bytes[dstOff[0] : dstOff[0]+64]
					for bytes.Count(first, []byte{0}) == len(first) {
						select {
						case <-stop:
							return
						default:
							runtime.Gosched()
						}
					}
					mu.Lock()
					inFlight = true
					mu.Unlock()
					for {
						select {
						case <-stop:
							return
						default:
						}
						err := b.c.Deregister(ctx, dst.Id)
						mu.Lock()
						switch {
						case status.Code(err) == codes.FailedPrecondition:
							refused++
						case err == nil && badBlock(src.Bytes, dst.Bytes, srcOff, dstOff, size) < 0:
							// Every block was already in place (our mapping outlives
							// the daemon's): the receiver let go just before its ack,
							// as it should, and BatchTransfer had not returned yet.
						default:
							select {
							case <-stop: // the batch ended just before: fine
							default:
								wrong = append(wrong, fmt.Sprintf("%v (code %v)", err, status.Code(err)))
							}
						}
						mu.Unlock()
						if err == nil {
							mu.Lock()
							gone = true
							mu.Unlock()
							return
						}
					}
				}()
				_, terr := transfer(ctx, a.c, src.Id, b.d.PeerAddr(), name, srcOff, dstOff, size)
				close(stop)
				wg.Wait()
				if len(wrong) > 0 {
					t.Fatalf("round %d: deregistration during the batch did not fail with FailedPrecondition: %v (batch: %v)", round, wrong, terr)
				}
				if terr != nil {
					t.Fatalf("round %d: batch: %v", round, terr)
				}
				if i := badBlock(src.Bytes, dst.Bytes, srcOff, dstOff, size); i >= 0 {
					t.Fatalf("round %d: block %d differs", round, i)
				}
				t.Logf("round %d: %d deregistrations refused during the batch (watcher saw it in flight: %v)", round, refused, inFlight)
				if gone {
					continue // the watcher's attempt right after the ack succeeded: fine
				}
				// The pin is released before the ack: deregistration works at once.
				if got := activeBatches(ctx, t, b, dst.Id); got != 0 {
					t.Fatalf("round %d: %d active batches after the ack", round, got)
				}
				dst.Unmap()
				if err := b.c.Deregister(ctx, dst.Id); err != nil {
					t.Fatalf("round %d: deregister after the batch: %v", round, err)
				}
			}
		})
	}
}

// TestCutBatchReleasesDestination: a batch whose caller gives up mid-way
// (its session dies at the receiver mid-batch) leaves no pin behind.
func TestCutBatchReleasesDestination(t *testing.T) {
	for _, streams := range []int{1, 4} {
		t.Run(fmt.Sprintf("streams=%d", streams), func(t *testing.T) {
			a := startNode(t, "a", func(c *daemon.Config) { c.KindFlags["tcp-streams"] = strconv.Itoa(streams) })
			b := startNode(t, "b")
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			const n, size = 256, 1 << 20
			r := rand.New(rand.NewPCG(9, uint64(streams)))
			srcOff, srcSize := layout(n, size, r)
			dstOff, dstSize := layout(n, size, r)
			src, dst := registerPair(ctx, t, a.c, b.c, srcSize, dstSize, "cut")
			fill(src.Bytes, func(int) byte { return byte(r.Uint32() | 1) })
			bctx, bcancel := context.WithCancel(ctx)
			go func() {
				// Cancel once the batch holds the destination: its first
				// frame is being placed.
				first := dst.Bytes[dstOff[0] : dstOff[0]+64]
				for bytes.Count(first, []byte{0}) == len(first) && bctx.Err() == nil {
					runtime.Gosched()
				}
				bcancel()
			}()
			_, err := transfer(bctx, a.c, src.Id, b.d.PeerAddr(), "cut", srcOff, dstOff, size)
			bcancel()
			t.Logf("cut batch: %v", err)
			waitIdle(ctx, t, b, dst.Id)
			// The daemons still work, and the destination can go.
			resp, err := transfer(ctx, a.c, src.Id, b.d.PeerAddr(), "cut", srcOff[:8], dstOff[:8], size)
			if err != nil || resp.Bytes != 8*size {
				t.Fatalf("next batch: %v %v", resp, err)
			}
			waitIdle(ctx, t, b, dst.Id)
			dst.Unmap()
			if err := b.c.Deregister(ctx, dst.Id); err != nil {
				t.Fatalf("deregister after the cut batch: %v", err)
			}
		})
	}
}
