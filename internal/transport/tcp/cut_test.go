package tcp

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/b2bd/b2bd/internal/transport"
)

// TestCutBatchNeverLandsLate: batches of small blocks cut off at random
// points (cancel or deadline) while the receiver places them; the
// destination must not change after the cut batch's answer. The receiver
// is slowed between its last look at the reset mark and its placement (a
// receiver preempted there), the window that a reset alone cannot close:
// only the fence's ack, awaited before the answer, does.
func TestCutBatchNeverLandsLate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		pause time.Duration // the receiver's pause before placing a frame
		cutBy time.Duration // cuts come at random up to this
		iters int
	}{
		{"preempted", 2 * time.Millisecond, 3 * time.Millisecond, 150},
		{"tight", 0, 400 * time.Microsecond, 400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const blocks, size, slot = 48, 512, 640
			p := newPair(t, blocks*slot, 2)
			if tc.pause > 0 {
				pause := func(*resetMark) { time.Sleep(tc.pause) }
				placeHook.Store(&pause)
				t.Cleanup(func() { placeHook.Store(nil) })
			}
			r := rand.New(rand.NewPCG(7, uint64(tc.pause)))
			b := scattered(r, blocks, size, slot)
			snap := make([]byte, len(p.dstMem.Host))
			var cut, late, acked, unconfirmedLate int
			for i := range tc.iters {
				fill(r, p.srcMem.Host)
				ctx, cancel := context.WithCancel(context.Background())
				after := time.Duration(r.IntN(int(tc.cutBy) + 1))
				if i%3 == 0 {
					ctx, cancel = context.WithTimeout(context.Background(), after)
				} else {
					time.AfterFunc(after, cancel)
				}
				_, err := transport.Write(ctx, p.conn, p.src, p.dst, &b)
				cancel()
				if err == nil {
					checkLanded(t, p, &b)
					continue
				}
				if cut < 3 {
					t.Log(err)
				}
				cut++
				confirmed := strings.Contains(err.Error(), "receiver confirmed")
				if confirmed {
					acked++
				} else if !strings.Contains(err.Error(), "may still complete") {
					t.Errorf("iteration %d: a cut the receiver did not confirm does not say a frame may still land: %v", i, err)
				}
				cutErr := err
				copy(snap, p.dstMem.Host)
				cutID := p.conn.(*conn).id
				// A cut conn carries nothing more: the peer manager dials
				// a fresh one, as here.
				p.conn.Close()
				if p.conn, err = p.a.Connect(context.Background(), transport.Peer{Address: "127.0.0.1:1",
					Advert: MarshalAdvert(p.b.Addr(), p.b.Token())}); err != nil {
					t.Fatal(err)
				}
				// Longer than the receiver's pause plus its scheduling.
				time.Sleep(tc.pause + 5*time.Millisecond)
				if !bytes.Equal(snap, p.dstMem.Host) {
					// Only an answer the receiver confirmed promises that
					// nothing more lands: without its word (a receiver too
					// starved to answer the fence within fenceWait), a frame
					// it had begun placing may complete, as the answer says.
					if confirmed {
						late++
						t.Errorf("iteration %d: the destination changed after the cut batch's confirmed answer (%v)", i, cutErr)
					} else {
						unconfirmedLate++
					}
				}
				if !confirmed {
					// The frame it allows may land later still (a receiver
					// starved past the window above): fence the old conn
					// here, as its own fence would once the receiver ran,
					// so that it cannot overwrite the next batch's bytes.
					p.b.fence(cutID)
				}
			}
			t.Logf("%d iterations: %d cut off (%d with the receiver's fence ack), %d changed after a confirmed answer, %d after an unconfirmed one",
				tc.iters, cut, acked, late, unconfirmedLate)
			if cut == 0 {
				t.Fatal("no batch was cut off: the test tests nothing")
			}
		})
	}
}

// TestQueuedBatchAnswersAtItsOwnCut: with the receiver stalled (its Pin
// held, as a stopped peer never acks), a batch holds the conn until its
// long deadline; a batch queued behind it answers at its own deadline or
// cancel, not the first batch's.
func TestQueuedBatchAnswersAtItsOwnCut(t *testing.T) {
	const long, short = 3 * time.Second, 30 * time.Millisecond
	for _, cancelled := range []bool{false, true} {
		p := newPair(t, 1<<20, 2)
		b := scattered(rand.New(rand.NewPCG(1, 2)), 4, 4096, 8192)
		p.in.mu.Lock()
		firstStart := time.Now()
		first := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), long)
			defer cancel()
			_, err := transport.Write(ctx, p.conn, p.src, p.dst, &b)
			first <- err
		}()
		time.Sleep(50 * time.Millisecond) // the first batch waits on the receiver now
		ctx, cancel := context.WithTimeout(context.Background(), short)
		want := context.DeadlineExceeded
		if cancelled {
			ctx, cancel = context.WithCancel(context.Background())
			time.AfterFunc(short, cancel)
			want = context.Canceled
		}
		start := time.Now()
		_, err := transport.Write(ctx, p.conn, p.src, p.dst, &b)
		took := time.Since(start)
		cancel()
		p.in.mu.Unlock()
		<-first
		if !errors.Is(err, want) {
			t.Fatalf("cancelled %v: queued batch: err = %v, want %v", cancelled, err, want)
		}
		// Well before the first batch's deadline freed the conn: its own
		// cut plus scheduling is far below the seconds between them.
		if left := long - start.Sub(firstStart); took > short+left/2 {
			t.Fatalf("cancelled %v: queued batch answered after %v (its cut at %v): it waited for the batch ahead", cancelled, took, short)
		}
	}
}

// TestStoppedReceiverPlacesOnePieceAtMost: a receiver stopped (as by
// SIGSTOP) after its last look at the reset mark, with a frame of small
// blocks in its read buffer, runs again only once the sender's reset has
// arrived: it completes at most the piece it was copying (copyPiece
// bytes), never the rest of what it had buffered.
func TestStoppedReceiverPlacesOnePieceAtMost(t *testing.T) {
	const blocks, size = 64, 4096
	for i := range 5 {
		p := newPair(t, blocks*size, 1)
		r := rand.New(rand.NewPCG(11, uint64(i)))
		b := scattered(r, blocks, size, size)
		fill(r, p.srcMem.Host)
		reached := make(chan struct{}, 1)
		stop := func(m *resetMark) { // stopped until the sender's cut reached this stream
			select {
			case reached <- struct{}{}:
			default:
			}
			for end := time.Now().Add(30 * time.Second); !m.reset(true); {
				if time.Now().After(end) {
					t.Error("the sender's reset did not arrive within 30 s")
					return
				}
				time.Sleep(100 * time.Microsecond)
			}
			time.Sleep(time.Millisecond) // past resetCheckEvery: the next look reads the mark, as after a stop
		}
		placeHook.Store(&stop)
		ctx, cancel := context.WithCancel(context.Background())
		go func() { <-reached; cancel() }()
		_, err := transport.Write(ctx, p.conn, p.src, p.dst, &b)
		cancel()
		placeHook.Store(nil)
		if err == nil {
			t.Fatalf("round %d: the batch succeeded though it was cancelled while the receiver was stopped", i)
		}
		time.Sleep(20 * time.Millisecond) // the receiver ends what it does
		landed := 0
		for j := range b.Src {
			s, d := b.Src[j], b.Dst[j]
			for k := uint64(0); k < size; k++ {
				switch got := p.dstMem.Host[d+k]; {
				case got == p.srcMem.Host[s+k] && got != 0:
					landed++
				case got != 0:
					t.Fatalf("round %d: block %d byte %d is %#x, neither the source's nor untouched", i, j, k, got)
				}
			}
		}
		if landed > copyPiece {
			t.Fatalf("round %d: %d bytes landed after the reset, want at most one piece (%d): %v", i, landed, copyPiece, err)
		}
		t.Logf("round %d: %d bytes landed (the piece in progress): %v", i, landed, err)
	}
}
