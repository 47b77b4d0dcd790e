package server_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// TestHoldRegion: Peer.HoldRegion answers as ResolveRegion does and holds
// the region from its answer until the caller ends its side (or the stream
// ends): deregistration is refused with FailedPrecondition meanwhile and
// succeeds once the answer to that end came. Bad requests get
// InvalidArgument or the resolution's refusal, and hold nothing.
func TestHoldRegion(t *testing.T) {
	bn := bufNet{}
	b := newNode(t, "b", bn)
	ctx := context.Background()
	cc, err := grpc.NewClient("passthrough:///peer", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return bn["b"].DialContext(ctx) }))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	peer := b2bv1.NewPeerClient(cc)
	register := func(name string) string {
		r, err := b.api.RegisterRegion(ctx, hostAlloc(4096, name))
		if err != nil {
			t.Fatal(err)
		}
		return r.GetRegion().GetId()
	}
	deregister := func(id string) codes.Code {
		_, err := b.api.DeregisterRegion(ctx, &b2bv1.DeregisterRegionRequest{RegionId: id})
		return status.Code(err)
	}
	open := func(names ...string) (b2bv1.Peer_HoldRegionClient, *b2bv1.ResolveRegionResponse, error) {
		st, err := peer.HoldRegion(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range names {
			if err := st.Send(&b2bv1.ResolveRegionRequest{Name: n}); err != nil && !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
		}
		resp, err := st.Recv()
		return st, resp, err
	}

	t.Run("held until the caller's end", func(t *testing.T) {
		id := register("held")
		st, resp, err := open("held")
		if err != nil || resp.GetName() != "held" || resp.GetSize() != 4096 || len(resp.GetKeys()) == 0 {
			t.Fatalf("answer %v, %v; want held's size and keys", resp, err)
		}
		for range 3 {
			if c := deregister(id); c != codes.FailedPrecondition {
				t.Fatalf("deregistration while held: %v, want FailedPrecondition", c)
			}
		}
		if err := st.CloseSend(); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); !errors.Is(err, io.EOF) {
			t.Fatalf("the end's answer: %v, want the stream's clean end", err)
		}
		if c := deregister(id); c != codes.OK {
			t.Fatalf("deregistration once the hold ended: %v", c)
		}
	})
	for _, tc := range []struct {
		name  string
		names []string
		code  codes.Code
		msg   string
	}{
		{"empty name", []string{""}, codes.InvalidArgument, "name is empty"},
		{"unknown name", []string{"nope"}, codes.NotFound, `no region is exported as "nope"`},
		{"a second request", []string{"twice", "twice"}, codes.InvalidArgument, "HoldRegion takes one request"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := ""
			if tc.names[0] != "" && tc.names[0] != "nope" {
				id = register(tc.names[0])
			}
			st, _, err := open(tc.names...)
			if len(tc.names) > 1 && err == nil {
				_, err = st.Recv() // the answer came; the second request ends the stream
			}
			if s := status.Convert(err); s.Code() != tc.code || !strings.Contains(s.Message(), tc.msg) {
				t.Fatalf("got %v %q, want %v naming %q", s.Code(), s.Message(), tc.code, tc.msg)
			}
			if id != "" {
				if c := deregister(id); c != codes.OK {
					t.Fatalf("deregistration after a refused hold: %v (the hold outlived its stream)", c)
				}
			}
		})
	}
}
