package local

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/transport"
)

// TestQueuedBatchAnswersAtItsOwnCut: with the receiver stalled (its Pin
// held, as a stopped peer daemon never answers), a batch holds the conn
// until its long deadline; a second batch, or a Warm, queued behind it
// answers at its own deadline or cancel, not the first batch's. The first
// batch's deadline is long, so that the second answering before it cannot
// be a scheduling accident.
func TestQueuedBatchAnswersAtItsOwnCut(t *testing.T) {
	const long, short = 3 * time.Second, 30 * time.Millisecond
	for _, tc := range []struct {
		name   string
		cancel bool // cut by a cancel (no deadline), else by its deadline
		warm   bool
	}{
		{"write/deadline", false, false},
		{"write/cancel", true, false},
		{"warm/cancel", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t, 1<<20)
			dst := transport.RemoteRegion{Name: "d", Size: 1 << 20, Key: p.dst.Key()}
			b := gapped(4, 4096)
			release := holdReceiver(t, p)
			firstStart := time.Now()
			first := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), long)
				defer cancel()
				_, err := transport.Write(ctx, p.conn, p.src, dst, b)
				first <- err
			}()
			time.Sleep(50 * time.Millisecond) // the first batch waits on the receiver now
			ctx, cancel := context.WithCancel(context.Background())
			if tc.cancel {
				time.AfterFunc(short, cancel)
			} else {
				ctx, cancel = context.WithTimeout(context.Background(), short)
			}
			defer cancel()
			start := time.Now()
			var err error
			if tc.warm {
				err = p.conn.(*Conn).Warm(ctx, p.src, dst)
			} else {
				_, err = transport.Write(ctx, p.conn, p.src, dst, b)
			}
			took := time.Since(start)
			want := context.DeadlineExceeded
			if tc.cancel {
				want = context.Canceled
			}
			if !errors.Is(err, want) {
				t.Fatalf("queued call: err = %v, want %v", err, want)
			}
			// It must answer well before the first batch's deadline frees
			// the conn: at its own cut plus scheduling, which on a loaded
			// machine is far below the second or more that separates them.
			if left := long - time.Since(firstStart); took > short+left/2 {
				t.Fatalf("queued call answered after %v (its cut at %v); it waited for the batch ahead of it", took, short)
			}
			release()
			if err := <-first; err != nil {
				t.Logf("first batch: %v", err)
			}
		})
	}
}

// TestCloseCutsBatchInFlight: Close of a conn whose batch waits on a
// stalled receiver (the manager closes a broken conn holding the peer's
// lock) returns at once, not at the batch's deadline, and the batch
// answers then too.
func TestCloseCutsBatchInFlight(t *testing.T) {
	const long = 3 * time.Second
	p := newPair(t, 1<<20)
	_, dst, b, first := stalledWrite(t, p, long)
	start := time.Now()
	if err := p.conn.Close(); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if err := <-first; err == nil {
		t.Fatal("the batch cut by Close answered OK")
	}
	if took > long/2 {
		t.Fatalf("Close took %v: it waited for the batch's %v deadline", took, long)
	}
	if _, err := transport.Write(context.Background(), p.conn, p.src, dst, b); err == nil {
		t.Fatal("a batch on a closed conn answered OK")
	}
}

// TestErrDoesNotWaitForBatch: Err answers at once while a batch waits on a
// stalled receiver. The peer manager asks Err holding the peer's lock, so
// an Err that waited for the batch held every call to that peer past its
// own deadline (the chaos soak's overruns against a frozen peer).
func TestErrDoesNotWaitForBatch(t *testing.T) {
	const long = 3 * time.Second
	p := newPair(t, 1<<20)
	firstStart := time.Now()
	release, _, _, first := stalledWrite(t, p, long)
	start := time.Now()
	err := p.conn.Err()
	took := time.Since(start)
	if err != nil {
		t.Fatalf("Err = %v while a batch is in flight on a sound connection", err)
	}
	if left := long - time.Since(firstStart); took > left/2 {
		t.Fatalf("Err took %v: it waited for the batch in flight", took)
	}
	release()
	<-first
	if err := p.conn.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.conn.Err(); !errors.Is(err, errs.ErrUnavailable) {
		t.Fatalf("Err after Close = %v, want Unavailable", err)
	}
}

// holdReceiver stalls p's receiver (its Pin held, as a stopped peer daemon
// never answers) until the returned release, which the test's end calls too.
func holdReceiver(t *testing.T, p *pair) (release func()) {
	p.in.mu.Lock()
	var once sync.Once
	release = func() { once.Do(p.in.mu.Unlock) }
	t.Cleanup(release)
	return release
}

// stalledWrite holds p's receiver (holdReceiver) and starts a write of a few
// blocks with deadline long, which waits on it by the time this returns;
// its error comes on first.
func stalledWrite(t *testing.T, p *pair, long time.Duration) (release func(), dst transport.RemoteRegion, b *desc.Batch, first <-chan error) {
	dst = transport.RemoteRegion{Name: "d", Size: 1 << 20, Key: p.dst.Key()}
	b = gapped(4, 4096)
	release = holdReceiver(t, p)
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), long)
		defer cancel()
		_, err := transport.Write(ctx, p.conn, p.src, dst, b)
		done <- err
	}()
	time.Sleep(50 * time.Millisecond) // the batch waits on the receiver now
	return release, dst, b, done
}
