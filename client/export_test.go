package client

import (
	"context"
	"net"
	"slices"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// exportDaemon records the ExportRegion requests it gets.
type exportDaemon struct {
	b2bv1.UnimplementedB2BServer
	mu   sync.Mutex
	reqs []*b2bv1.ExportRegionRequest
}

func (f *exportDaemon) ExportRegion(_ context.Context, req *b2bv1.ExportRegionRequest) (*b2bv1.ExportRegionResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reqs = append(f.reqs, req)
	return &b2bv1.ExportRegionResponse{}, nil
}

// TestExportGrants: Export sends the grants it is given (ExportRegion sets
// them anew), so a rename can keep a read-only export with readers; a
// registration's own option (Persist) is refused, not dropped.
func TestExportGrants(t *testing.T) {
	f := &exportDaemon{}
	ln := bufconn.Listen(1 << 20)
	gs := grpc.NewServer()
	b2bv1.RegisterB2BServer(gs, f)
	go gs.Serve(ln)
	cl, err := Dial("passthrough:///fake", grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return ln.DialContext(ctx) }))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { cl.Close(); gs.Stop() }()
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		opts     []RegisterOption
		to, rd   []string
		readOnly bool
	}{
		{"name alone: every writer, no reader", nil, nil, nil, false},
		{"read-only with readers", []RegisterOption{ReadOnly(), Readers("*")}, nil, []string{"*"}, true},
		{"writers and readers", []RegisterOption{ExportTo("a", "b"), Readers("c")}, []string{"a", "b"}, []string{"c"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := cl.Export(ctx, "r1", "kv", tc.opts...); err != nil {
				t.Fatal(err)
			}
			f.mu.Lock()
			r := f.reqs[len(f.reqs)-1]
			f.mu.Unlock()
			if r.GetRegionId() != "r1" || r.GetExportName() != "kv" || !slices.Equal(r.GetExportTo(), tc.to) || !slices.Equal(r.GetReaders(), tc.rd) || r.GetReadOnly() != tc.readOnly {
				t.Fatalf("sent %v; want export_to %v readers %v read_only %v", r, tc.to, tc.rd, tc.readOnly)
			}
		})
	}
	n := len(f.reqs)
	if err := cl.Export(ctx, "r1", "kv", Persist()); status.Code(err) != codes.InvalidArgument || len(f.reqs) != n {
		t.Fatalf("Export with Persist: %v (%d calls); want InvalidArgument and no call", err, len(f.reqs)-n)
	}
}
