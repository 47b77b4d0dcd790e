package verbs

import (
	"context"
	"errors"
	"testing"

	"github.com/b2bd/b2bd/internal/errs"
)

// fakeAcceptor records what ServeSignal hands it.
type fakeAcceptor struct {
	got  ConnectRequest
	node string
	id   uint64
}

func (f *fakeAcceptor) AcceptVerbs(ctx context.Context, req ConnectRequest) (Accept, error) {
	f.got = req
	return Accept{Port: Port{Device: "b0", ActiveMTU: 1024, MaxDestRdAtomic: 16}, PathMTU: 1024, Endpoints: req.Endpoints}, nil
}

func (f *fakeAcceptor) DisconnectVerbs(node string, id uint64) bool {
	f.node, f.id = node, id
	return id == 7
}

// The sender's connect and disconnect reach the receiver's acceptor whole
// through the opaque signal bytes, and the rail WithRail names arrives.
func TestSignalRoundTrip(t *testing.T) {
	ctx := context.Background()
	acc := &fakeAcceptor{}
	sig := func(ctx context.Context, b []byte) ([]byte, error) { return ServeSignal(ctx, b, acc) }
	req := ConnectRequest{Node: "a", ConnID: 9, Port: Port{GID: make([]byte, 16), ActiveMTU: 4096, LinkLayer: "Ethernet", Device: "a0", MaxDestRdAtomic: 128},
		Endpoints: []Endpoint{{QPN: 1, PSN: 2}, {QPN: 3, PSN: 4}}}
	got, err := CallConnect(ctx, WithRail(sig, 3), req)
	if err != nil {
		t.Fatal(err)
	}
	if acc.got.Node != "a" || acc.got.ConnID != 9 || acc.got.Rail != 3 || len(acc.got.Endpoints) != 2 || acc.got.Endpoints[1] != (Endpoint{3, 4}) || acc.got.Port.Device != "a0" || acc.got.Port.MaxDestRdAtomic != 128 {
		t.Fatalf("acceptor got %+v", acc.got)
	}
	if got.PathMTU != 1024 || got.Port.Device != "b0" || got.Port.MaxDestRdAtomic != 16 || len(got.Endpoints) != 2 {
		t.Fatalf("sender got %+v", got)
	}
	if err := callDisconnect(ctx, WithRail(sig, 3), "a", 7); err != nil || acc.node != "a" || acc.id != 7 {
		t.Fatalf("disconnect: %v, acceptor saw %q %d", err, acc.node, acc.id)
	}
	for name, b := range map[string][]byte{"no step": nil, "not a signal": {0xff}} {
		if _, err := ServeSignal(ctx, b, acc); !errors.Is(err, errs.ErrInvalidArgument) {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
	if err := callDisconnect(ctx, sig, "", 0); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Errorf("disconnect without node and id: %v, want InvalidArgument", err)
	}
}

func TestAdvertRoundTrip(t *testing.T) {
	rails := []RailAdvert{{Index: 0, Port: Port{Device: "b0", GID: make([]byte, 16)}}, {Index: 1, Port: Port{Device: "b1"}}}
	got, err := ParseAdvert(MarshalAdvert(rails))
	if err != nil || len(got) != 2 || got[1].Index != 1 || got[1].Port.Device != "b1" {
		t.Fatalf("got %+v, %v", got, err)
	}
	if got, err := ParseAdvert(MarshalAdvert(nil)); err != nil || got != nil {
		t.Fatalf("one device: got %+v, %v", got, err)
	}
	if _, err := ParseAdvert([]byte{0xff}); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Fatalf("bad advert: %v", err)
	}
}

// FuzzServeSignal: no payload panics the receiving side, and every refusal
// is InvalidArgument.
func FuzzServeSignal(f *testing.F) {
	f.Add([]byte{0x0a, 0x00})
	f.Add([]byte{0x12, 0x04, 0x0a, 0x01, 0x61, 0x10})
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, err := ServeSignal(context.Background(), b, &fakeAcceptor{}); err != nil && !errors.Is(err, errs.ErrInvalidArgument) {
			t.Fatalf("refusal %v is not InvalidArgument", err)
		}
	})
}
