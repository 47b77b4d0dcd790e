package peer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/notify"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// notePeer takes notes by Notify and, unless unary, by NotifyStream; a
// region named "refuse" is refused NotFound. breakAfter ends each stream
// after that many notes (0: never).
type notePeer struct {
	fakePeer
	unary      bool
	breakAfter int
	mu         sync.Mutex
	got        []string
	calls      atomic.Int32 // unary Notify calls
	streams    atomic.Int32 // NotifyStreams opened
}

func (p *notePeer) take(req *b2bv1.NotifyRequest) error {
	if req.GetRegion() == "refuse" {
		return status.Error(codes.NotFound, `region "refuse" is not exported`)
	}
	p.mu.Lock()
	p.got = append(p.got, string(req.GetNotification()))
	p.mu.Unlock()
	return nil
}

func (p *notePeer) Notify(_ context.Context, req *b2bv1.NotifyRequest) (*b2bv1.NotifyResponse, error) {
	p.calls.Add(1)
	if err := p.take(req); err != nil {
		return nil, err
	}
	return &b2bv1.NotifyResponse{Delivered: 1}, nil
}

func (p *notePeer) NotifyStream(s b2bv1.Peer_NotifyStreamServer) error {
	if p.unary {
		return status.Error(codes.Unimplemented, "method NotifyStream not implemented")
	}
	p.streams.Add(1)
	for n := 0; ; n++ {
		if p.breakAfter > 0 && n == p.breakAfter {
			return status.Error(codes.Unavailable, "stream cut")
		}
		req, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		out := &b2bv1.NotifyResponse{Seq: req.GetSeq(), Delivered: 1}
		if err := p.take(req); err != nil {
			st := status.Convert(err)
			out.Code, out.Message, out.Delivered = uint32(st.Code()), st.Message(), 0
		}
		if err := s.Send(out); err != nil {
			return err
		}
	}
}

func (p *notePeer) notes() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.got...)
}

// TestNotesOverTheStream: a peer's notes go on one NotifyStream, in
// order, each answered (a refusal keeps its code and message); a peer
// without NotifyStream (an older b2bd) gets every note by Notify; a
// stream the peer ends is replaced for the next note, and a note sent on
// it when it ended fails Unavailable, never silently.
func TestNotesOverTheStream(t *testing.T) {
	ctx := context.Background()
	const addr = "127.0.0.1:7470"
	for _, tc := range []struct {
		name           string
		peer           *notePeer
		notes          int
		wantCalls      int32 // unary
		wantStreamsMin int32
	}{
		{"stream", &notePeer{}, 50, 0, 1},
		{"older peer: unary", &notePeer{unary: true}, 50, 50, 0},
		{"stream cut every 10 notes", &notePeer{breakAfter: 10}, 50, 0, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, _, _ := newTestManagerWith(t, tc.peer)
			if _, err := m.Get(ctx, addr, "", writeNeed); err != nil { // handshake
				t.Fatal(err)
			}
			var want []string
			for i := 0; i < tc.notes; i++ {
				note := fmt.Sprintf("note %d", i)
				err := m.Notify(ctx, addr, notify.Notification{Region: "r", Notification: []byte(note)})
				if err != nil && tc.peer.breakAfter > 0 && errors.Is(err, errs.ErrUnavailable) {
					continue // sent on the stream as it was cut: reported, and the next note goes on a new one
				}
				if err != nil {
					t.Fatalf("note %d: %v", i, err)
				}
				want = append(want, note)
			}
			got := tc.peer.notes()
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("the peer took %q, want %q (every acknowledged note, in order)", got, want)
			}
			if tc.peer.breakAfter > 0 && len(got) < tc.notes*8/10 {
				t.Fatalf("only %d of %d notes delivered over cut streams", len(got), tc.notes)
			}
			if c := tc.peer.calls.Load(); c != tc.wantCalls {
				t.Fatalf("%d unary calls, want %d", c, tc.wantCalls)
			}
			if s := tc.peer.streams.Load(); s < tc.wantStreamsMin || (tc.peer.breakAfter == 0 && s > 1) {
				t.Fatalf("%d streams opened, want at least %d (one when never cut)", s, tc.wantStreamsMin)
			}
			err := m.Notify(ctx, addr, notify.Notification{Region: "refuse", Notification: []byte("x")})
			if !errors.Is(err, errs.ErrNotFound) || !errors.Is(fromRPC(ctx, err), errs.ErrNotFound) {
				t.Fatalf("a refused note: %v, want NotFound", err)
			}
		})
	}
}

// TestNotesConcurrent: notes sent from many goroutines at once on one
// stream are each answered as their own (none lost, none answered twice).
func TestNotesConcurrent(t *testing.T) {
	ctx := context.Background()
	const addr = "127.0.0.1:7470"
	p := &notePeer{}
	m, _, _ := newTestManagerWith(t, p)
	if _, err := m.Get(ctx, addr, "", writeNeed); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errc := make(chan error, 400)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				region := "r"
				if i%7 == 3 {
					region = "refuse"
				}
				err := m.Notify(ctx, addr, notify.Notification{Region: region, Notification: []byte(fmt.Sprintf("%d.%d", g, i))})
				if (region == "refuse") != (err != nil) {
					errc <- fmt.Errorf("goroutine %d note %d to %s: %v", g, i, region, err)
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	if n, want := len(p.notes()), 8*(50-7); n != want {
		t.Fatalf("%d notes taken, want %d", n, want)
	}
	if s := p.streams.Load(); s != 1 {
		t.Fatalf("%d streams, want 1", s)
	}
}

// deafPeer opens note streams and never reads them (a frozen daemon):
// the stream's flow-control window fills and a Send would wait for ever.
type deafPeer struct {
	fakePeer
	streams atomic.Int32
}

func (p *deafPeer) NotifyStream(s b2bv1.Peer_NotifyStreamServer) error {
	p.streams.Add(1)
	<-s.Context().Done()
	return nil
}

// TestNotesToAFrozenPeerKeepTheirDeadlines: notes to a peer that stopped
// reading (far more bytes than a stream's window) each fail at their own
// deadline, DeadlineExceeded, none later: a stuck Send takes the stream
// down at the deadline, and the next note opens another.
func TestNotesToAFrozenPeerKeepTheirDeadlines(t *testing.T) {
	const addr = "127.0.0.1:7470"
	p := &deafPeer{}
	m, _, _ := newTestManagerWith(t, p)
	if _, err := m.Get(context.Background(), addr, "", writeNeed); err != nil {
		t.Fatal(err)
	}
	note := make([]byte, 4096)
	const deadline = 50 * time.Millisecond
	for i := 0; i < 40; i++ { // 160 KiB: past a stream's 64 KiB window
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		t0 := time.Now()
		err := m.Notify(ctx, addr, notify.Notification{Region: "r", Notification: note})
		took := time.Since(t0)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("note %d: %v, want DeadlineExceeded", i, err)
		}
		if took > deadline+2*time.Second {
			t.Fatalf("note %d answered %v after its start, its deadline was %v", i, took, deadline)
		}
	}
}
