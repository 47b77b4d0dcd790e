package peer

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/notify"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// holdingPeer takes a note and never answers it, on its stream or by the
// unary call (unary: no stream, an older b2bd): a daemon frozen (SIGSTOP)
// after the note reached it, which delivers it when continued.
type holdingPeer struct {
	fakePeer
	unary bool
}

func (p *holdingPeer) Notify(ctx context.Context, req *b2bv1.NotifyRequest) (*b2bv1.NotifyResponse, error) {
	switch req.GetRegion() {
	case "refuse":
		return nil, status.Error(codes.NotFound, `region "refuse" is not exported`)
	case "expired": // the deadline gRPC sent along ran out here first
		return nil, status.Error(codes.DeadlineExceeded, "context deadline exceeded")
	}
	<-ctx.Done()
	return nil, ctx.Err()
}

func (p *holdingPeer) NotifyStream(s b2bv1.Peer_NotifyStreamServer) error {
	if p.unary {
		return status.Error(codes.Unimplemented, "method NotifyStream not implemented")
	}
	for {
		req, err := s.Recv()
		if err != nil {
			return err
		}
		if req.GetRegion() == "refuse" {
			if err := s.Send(&b2bv1.NotifyResponse{Seq: req.GetSeq(), Code: uint32(codes.NotFound), Message: `region "refuse" is not exported`}); err != nil {
				return err
			}
		}
	}
}

// TestNoteLeftButUnanswered: a note that reached the peer but whose answer
// did not come before the caller's deadline may still be delivered (the
// frozen peer reads it when continued), so its error must say so
// (notify.ErrUnconfirmed): before, the batch answered "its notification
// was not delivered", and the receiver's watchers got it a moment later.
// A note the peer refused was not delivered, and says that.
func TestNoteLeftButUnanswered(t *testing.T) {
	const addr = "127.0.0.1:7470"
	for _, tc := range []struct {
		name            string
		unary           bool
		region          string
		wantUnconfirmed bool
		wantClass       error
	}{
		{"stream, unanswered", false, "r", true, context.DeadlineExceeded},
		{"unary, unanswered", true, "r", true, context.DeadlineExceeded},
		{"unary, the peer's deadline first", true, "expired", true, context.DeadlineExceeded},
		{"stream, refused", false, "refuse", false, errs.ErrNotFound},
		{"unary, refused", true, "refuse", false, errs.ErrNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, _, _ := newTestManagerWith(t, &holdingPeer{unary: tc.unary})
			if _, err := m.Get(context.Background(), addr, "", writeNeed); err != nil {
				t.Fatal(err)
			}
			// A refused note first, with time to spare: the note stream is
			// open (or known missing, unary) before the timed note, which
			// otherwise may never leave within its deadline on a loaded
			// machine (it then was not sent, and rightly not unconfirmed).
			warm, stop := context.WithTimeout(context.Background(), 10*time.Second)
			err := m.Notify(warm, addr, notify.Notification{Region: "refuse", Notification: []byte("n")})
			stop()
			if !errors.Is(err, errs.ErrNotFound) {
				t.Fatalf("the refused note first: %v", err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			err = m.Notify(ctx, addr, notify.Notification{Region: tc.region, Notification: []byte("n")})
			if got := errors.Is(err, notify.ErrUnconfirmed); got != tc.wantUnconfirmed {
				t.Fatalf("err = %v: unconfirmed %v, want %v", err, got, tc.wantUnconfirmed)
			}
			if !errors.Is(err, tc.wantClass) || errs.Class(err) != tc.wantClass {
				t.Fatalf("err = %v (class %v), want class %v", err, errs.Class(err), tc.wantClass)
			}
		})
	}
}

// endedStream is a NotifyStream the peer ended with status st: Send gets
// io.EOF (gRPC's way), and Recv the status, only once Send has returned.
type endedStream struct {
	b2bv1.Peer_NotifyStreamClient
	st   error
	sent chan struct{}
}

func (s *endedStream) Send(*b2bv1.NotifyRequest) error { close(s.sent); return io.EOF }
func (s *endedStream) Recv() (*b2bv1.NotifyResponse, error) {
	<-s.sent
	time.Sleep(20 * time.Millisecond) // the reader comes second, as on a loaded host
	return nil, s.st
}

// TestNoteStreamEndedByPeer: a note whose Send finds the stream ended gets
// the peer's status (Recv's), not a closed stream: Unimplemented (an older
// b2bd) makes Notify take the call, where a closed stream lost the note.
func TestNoteStreamEndedByPeer(t *testing.T) {
	for _, want := range []codes.Code{codes.Unimplemented, codes.PermissionDenied} {
		s := &endedStream{st: status.Error(want, "ended"), sent: make(chan struct{})}
		ns := newNoteStream(nil, s, func() {})
		go ns.receive()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		_, sent, _, err := ns.notify(ctx, &b2bv1.NotifyRequest{Region: "r"})
		cancel()
		if sent || status.Code(err) != want {
			t.Fatalf("note on a stream the peer ended with %v: sent %v, err %v", want, sent, err)
		}
		if status.Code(ns.err()) != want {
			t.Fatalf("the stream's end: %v, want %v", ns.err(), want)
		}
	}
}
