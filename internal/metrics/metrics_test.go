package metrics

import (
	"context"
	"encoding/binary"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

func TestSizeClass(t *testing.T) {
	for _, tc := range []struct {
		blocks, bytes uint64
		want          string
	}{
		{0, 0, SizeLE4KiB},
		{1, 128, SizeLE4KiB},
		{100, 409600, SizeLE4KiB},
		{100, 409700, SizeLE64KiB},
		{1, 64 << 10, SizeLE64KiB},
		{1, 64<<10 + 1, SizeLE1MiB},
		{2, 2 << 20, SizeLE1MiB},
		{1, 1<<20 + 1, SizeGT1MiB},
	} {
		if got := SizeClass(tc.blocks, tc.bytes); got != tc.want {
			t.Errorf("SizeClass(%d, %d) = %s, want %s", tc.blocks, tc.bytes, got, tc.want)
		}
	}
}

// TestTransportLabel: every transport kind the API names is labelled by
// its own name (a batch over the same-host path is "local", not "auto");
// only the daemon's choice and values outside the enum are not a transport.
func TestTransportLabel(t *testing.T) {
	for k, want := range map[b2bv1.TransportKind]string{
		b2bv1.TransportKind_TRANSPORT_KIND_UNSPECIFIED: "auto",
		b2bv1.TransportKind_TRANSPORT_KIND_TCP:         "tcp",
		b2bv1.TransportKind_TRANSPORT_KIND_VERBS:       "verbs",
		b2bv1.TransportKind_TRANSPORT_KIND_LOCAL:       "local",
		b2bv1.TransportKind(99):                        "auto",
	} {
		if got := TransportLabel(k); got != want {
			t.Errorf("TransportLabel(%v) = %s, want %s", k, got, want)
		}
	}
	// A kind added to the proto gets a label of its own without a change here.
	seen := map[string]b2bv1.TransportKind{}
	for v := range b2bv1.TransportKind_name {
		k := b2bv1.TransportKind(v)
		l := TransportLabel(k)
		if o, dup := seen[l]; dup {
			t.Errorf("TransportLabel(%v) = TransportLabel(%v) = %q", k, o, l)
		}
		seen[l] = k
	}
}

// TestLocalBatchCounted: a batch the same-host path carried counts under
// transport="local".
func TestLocalBatchCounted(t *testing.T) {
	m := New(Sources{Version: "t"})
	ic := m.UnaryInterceptor()
	req := &b2bv1.BatchTransferRequest{Descriptors: &b2bv1.Descriptors{SrcOffsets: pack(0, 4096), BlockLength: 4096}}
	local := func(context.Context, any) (any, error) {
		return &b2bv1.BatchTransferResponse{Blocks: 2, Bytes: 8192, Transport: b2bv1.TransportKind_TRANSPORT_KIND_LOCAL}, nil
	}
	if _, err := ic(context.Background(), req, &grpc.UnaryServerInfo{FullMethod: "/b2b.v1.B2B/BatchTransfer"}, local); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(m.batches.WithLabelValues("local", OutcomeOK)); got != 1 {
		t.Errorf(`b2bd_batches_total{transport="local",outcome="ok"} = %v, want 1`, got)
	}
	if got := testutil.ToFloat64(m.batches.WithLabelValues("auto", OutcomeOK)); got != 0 {
		t.Errorf(`b2bd_batches_total{transport="auto",outcome="ok"} = %v, want 0: a batch that landed had a transport`, got)
	}
}

func pack(v ...uint64) []byte {
	b := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(b[8*i:], x)
	}
	return b
}

func TestRequested(t *testing.T) {
	for _, tc := range []struct {
		name          string
		d             *b2bv1.Descriptors
		blocks, bytes uint64
	}{
		{"nil", nil, 0, 0},
		{"uniform", &b2bv1.Descriptors{SrcOffsets: pack(0, 8192, 16384), BlockLength: 4096}, 3, 12288},
		{"lengths", &b2bv1.Descriptors{SrcOffsets: pack(0, 100), Lengths: pack(100, 28)}, 2, 128},
		{"truncated", &b2bv1.Descriptors{SrcOffsets: pack(0, 100)[:12], Lengths: pack(100, 28)[:12]}, 1, 100},
	} {
		b, n := requested(tc.d)
		if b != tc.blocks || n != tc.bytes {
			t.Errorf("%s: requested = %d blocks, %d bytes; want %d, %d", tc.name, b, n, tc.blocks, tc.bytes)
		}
	}
}

// FuzzRequested: any descriptor bytes give len(src)/8 blocks and never panic.
func FuzzRequested(f *testing.F) {
	f.Add(pack(0, 1), pack(5, 6), uint64(0))
	f.Add([]byte{1, 2, 3}, []byte{}, uint64(4096))
	f.Fuzz(func(t *testing.T, src, lens []byte, bl uint64) {
		b, _ := requested(&b2bv1.Descriptors{SrcOffsets: src, Lengths: lens, BlockLength: bl})
		if b != uint64(len(src)/8) {
			t.Fatalf("blocks %d for %d source bytes", b, len(src))
		}
	})
}

// TestInterceptor: the interceptor counts a batch by its outcome, feeds
// the phase hook on success only, tracks calls in flight and leaves other
// methods to api_requests_total.
func TestInterceptor(t *testing.T) {
	var hooked int
	m := New(Sources{Version: "t", Phases: func(r *b2bv1.BatchTransferResponse) []Phase {
		hooked++
		return []Phase{{Name: "write", Seconds: 0.5}, {Name: "ack", Seconds: 0.25}}
	}})
	ic := m.UnaryInterceptor()
	batch := &grpc.UnaryServerInfo{FullMethod: "/b2b.v1.B2B/BatchTransfer"}
	req := &b2bv1.BatchTransferRequest{Descriptors: &b2bv1.Descriptors{SrcOffsets: pack(0, 1<<20), BlockLength: 2 << 20}}
	inFlight := -1.0
	ok := func(ctx context.Context, r any) (any, error) {
		inFlight = testutil.ToFloat64(m.inFlight)
		return &b2bv1.BatchTransferResponse{Blocks: 2, Bytes: 4 << 20, Transport: b2bv1.TransportKind_TRANSPORT_KIND_VERBS}, nil
	}
	fail := func(ctx context.Context, r any) (any, error) {
		return nil, status.Error(codes.DeadlineExceeded, "late")
	}
	for i := 0; i < 2; i++ {
		if _, err := ic(context.Background(), req, batch, ok); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ic(context.Background(), req, batch, fail); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("the interceptor changed the error: %v", err)
	}
	if _, err := ic(context.Background(), &b2bv1.StatusRequest{}, &grpc.UnaryServerInfo{FullMethod: "/b2b.v1.B2B/Status"}, fail); err == nil {
		t.Fatal("no error")
	}
	for _, tc := range []struct {
		name string
		c    prometheus.Collector
		want float64
	}{
		{"batches ok", m.batches.WithLabelValues("verbs", OutcomeOK), 2},
		{"blocks ok", m.blocks.WithLabelValues("verbs", OutcomeOK), 4},
		{"bytes ok", m.bytes.WithLabelValues("verbs", OutcomeOK), 8 << 20},
		{"batches error", m.batches.WithLabelValues("auto", OutcomeError), 1},
		{"bytes error", m.bytes.WithLabelValues("auto", OutcomeError), 4 << 20},
		{"errors by code", m.errors.WithLabelValues("auto", "DeadlineExceeded"), 1},
		{"status calls", m.requests.WithLabelValues("Status", "DeadlineExceeded"), 1},
		{"batch calls", m.requests.WithLabelValues("BatchTransfer", "OK"), 2},
		{"in flight after", m.inFlight, 0},
	} {
		if got := testutil.ToFloat64(tc.c); got != tc.want {
			t.Errorf("%s = %v, want %v", tc.name, got, tc.want)
		}
	}
	if inFlight != 1 {
		t.Errorf("in flight during the call = %v, want 1", inFlight)
	}
	if hooked != 2 {
		t.Errorf("phase hook ran %d times, want 2 (successes only)", hooked)
	}
	if n := testutil.CollectAndCount(m.phases); n != 2 {
		t.Errorf("%d phase series, want 2 (write, ack)", n)
	}
	if n := testutil.CollectAndCount(m.duration); n != 2 {
		t.Errorf("%d duration series, want 2 (verbs ok gt_1MiB, auto error gt_1MiB)", n)
	}
}
