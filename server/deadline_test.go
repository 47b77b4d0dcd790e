package server_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/client"
	"github.com/b2bd/b2bd/internal/callerdeadline"
	"github.com/b2bd/b2bd/internal/callid"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// TestCallerDeadline: a transfer made through the Go client, whose caller's
// deadline passes while the daemon waits on a silent peer, gets the
// daemon's DeadlineExceeded (its message names the caller's deadline and
// says the transfer stopped), at or after that deadline, not the client's
// own gRPC one; a raw caller without the metadata gets today's answer.
func TestCallerDeadline(t *testing.T) {
	a, src, silent := silentPeerRig(t)
	ctx := context.Background()
	c := dialAPI(t, a)
	const daemons = "the caller's deadline (" + callerdeadline.Key
	for _, op := range []b2bv1.TransferOp{b2bv1.TransferOp_TRANSFER_OP_WRITE, b2bv1.TransferOp_TRANSFER_OP_READ} {
		t.Run(op.String(), func(t *testing.T) {
			tctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer cancel()
			deadline, _ := tctx.Deadline()
			_, err := c.BatchTransfer(tctx, client.Transfer{SrcRegion: src.Region.Id, Peer: silent.Addr().String(), DstRegion: "dst", Op: op,
				Blocks: client.Descriptors{Src: []uint64{0}, Dst: []uint64{0}, BlockLength: 64}})
			answered := time.Now()
			st := status.Convert(err)
			if st.Code() != codes.DeadlineExceeded || !strings.Contains(st.Message(), daemons) || !strings.Contains(st.Message(), "the transfer stopped before this answer") {
				t.Fatalf("got %v %q; want the daemon's DeadlineExceeded, naming %q", st.Code(), st.Message(), daemons)
			}
			if answered.Before(deadline) {
				t.Fatalf("answered %v before the caller's deadline", deadline.Sub(answered))
			}
		})
	}
	t.Run("raw caller", func(t *testing.T) {
		tctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		_, err := a.api.BatchTransfer(tctx, &b2bv1.BatchTransferRequest{SrcRegionId: src.Region.Id, Peer: silent.Addr().String(), DstRegion: "dst",
			Descriptors: &b2bv1.Descriptors{SrcOffsets: client.Pack([]uint64{0}), DstOffsets: client.Pack([]uint64{0}), BlockLength: 64}})
		if st := status.Convert(err); st.Code() != codes.DeadlineExceeded || strings.Contains(st.Message(), daemons) {
			t.Fatalf("got %v %q; want DeadlineExceeded without the caller's deadline", st.Code(), st.Message())
		}
	})
}

// TestCallerDeadlineBad: a bad b2b-timeout-ms is refused with
// InvalidArgument naming the key, the value and the limit, before anything
// runs; the same on a stream.
func TestCallerDeadlineBad(t *testing.T) {
	a := newNode(t, "a", bufNet{})
	for _, tc := range []struct {
		name   string
		values []string
		msg    string
	}{
		{"zero", []string{"0"}, `metadata b2b-timeout-ms is "0": want whole milliseconds from 1 to 86400000`},
		{"not a number", []string{"soon"}, `metadata b2b-timeout-ms is "soon": want whole milliseconds from 1 to 86400000`},
		{"over the limit", []string{"86400001"}, `"86400001": want whole milliseconds from 1 to 86400000`},
		{"two values", []string{"5", "6"}, `metadata b2b-timeout-ms has 2 values`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			md := metadata.MD{}
			for _, v := range tc.values {
				md.Append(callerdeadline.Key, v)
			}
			ctx, cancel := context.WithTimeout(metadata.NewOutgoingContext(context.Background(), md), time.Minute)
			defer cancel()
			_, err := a.api.BatchTransfer(ctx, &b2bv1.BatchTransferRequest{})
			if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), tc.msg) {
				t.Fatalf("BatchTransfer: %v %q, want InvalidArgument containing %q", st.Code(), st.Message(), tc.msg)
			}
			s, err := a.api.SubmitStream(ctx)
			if err == nil {
				_, err = s.Recv()
			}
			if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), tc.msg) {
				t.Fatalf("SubmitStream: %v %q, want InvalidArgument containing %q", st.Code(), st.Message(), tc.msg)
			}
		})
	}
}

// TestCancelCall: a transfer made through the Go client and cancelled by
// its caller while the daemon waits on a silent peer gets the daemon's
// Canceled, which names the call id and says the transfer stopped, for a
// push and a pull alike; a CancelCall that overtakes its call stops it when
// it comes; bad ids get InvalidArgument naming the field, the value and the
// limit.
func TestCancelCall(t *testing.T) {
	a, src, silent := silentPeerRig(t)
	ctx := context.Background()
	// sending runs as the client's BatchTransfer goes out (after the
	// client's own interceptor took the call): the caller's cancel is timed
	// from there, so every cut is one of a call that was sent.
	var sending atomic.Pointer[func()]
	c := dialAPI(t, a, grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if f := sending.Load(); f != nil && method == b2bv1.B2B_BatchTransfer_FullMethodName {
			(*f)()
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}))
	const daemons = "the caller cancelled the call (" + callid.Key
	req := func(op b2bv1.TransferOp) client.Transfer {
		return client.Transfer{SrcRegion: src.Region.Id, Peer: silent.Addr().String(), DstRegion: "dst", Op: op,
			Blocks: client.Descriptors{Src: []uint64{0}, Dst: []uint64{0}, BlockLength: 64}}
	}
	for _, op := range []b2bv1.TransferOp{b2bv1.TransferOp_TRANSFER_OP_WRITE, b2bv1.TransferOp_TRANSFER_OP_READ} {
		for _, wait := range []time.Duration{0, 50 * time.Millisecond} {
			t.Run(fmt.Sprintf("%s cancelled %v after it was sent", op, wait), func(t *testing.T) {
				cctx, cancel := context.WithTimeout(ctx, time.Minute)
				defer cancel()
				cut := func() { time.AfterFunc(wait, cancel) }
				sending.Store(&cut)
				defer sending.Store(nil)
				_, err := c.BatchTransfer(cctx, req(op))
				st := status.Convert(err)
				if st.Code() != codes.Canceled || !strings.Contains(st.Message(), daemons) || !strings.Contains(st.Message(), "the transfer stopped before this answer") {
					t.Fatalf("got %v %q; want the daemon's Canceled, naming %q", st.Code(), st.Message(), daemons)
				}
			})
		}
	}
	t.Run("cancel before the call", func(t *testing.T) {
		id := callid.New()
		r, err := a.api.CancelCall(ctx, &b2bv1.CancelCallRequest{CallId: id})
		if err != nil || r.GetInFlight() {
			t.Fatalf("CancelCall: %v %v, want not in flight", r, err)
		}
		cctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx, callid.Key, id), time.Minute)
		defer cancel()
		_, err = a.api.BatchTransfer(cctx, &b2bv1.BatchTransferRequest{SrcRegionId: src.Region.Id, Peer: silent.Addr().String(), DstRegion: "dst",
			Descriptors: &b2bv1.Descriptors{SrcOffsets: client.Pack([]uint64{0}), DstOffsets: client.Pack([]uint64{0}), BlockLength: 64}})
		if st := status.Convert(err); st.Code() != codes.Canceled || !strings.Contains(st.Message(), daemons+" "+id) {
			t.Fatalf("got %v %q; want the daemon's Canceled naming %s", st.Code(), st.Message(), id)
		}
	})
	t.Run("bad ids", func(t *testing.T) {
		_, err := a.api.CancelCall(ctx, &b2bv1.CancelCallRequest{CallId: "a b"})
		if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), `call_id is "a b": want 1 to 64 characters`) {
			t.Fatalf("CancelCall: %v %q", st.Code(), st.Message())
		}
		cctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx, callid.Key, strings.Repeat("x", 65)), time.Minute)
		defer cancel()
		_, err = a.api.BatchTransfer(cctx, &b2bv1.BatchTransferRequest{})
		if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "metadata b2b-call-id is") || !strings.Contains(st.Message(), "want 1 to 64") {
			t.Fatalf("BatchTransfer: %v %q", st.Code(), st.Message())
		}
	})
}

// silentPeerRig is node a with a 4 KiB source region, a node b exporting
// "dst" to readers and writers, and a listener that accepts and says
// nothing: a transfer from a to it waits until its caller stops it.
func silentPeerRig(t *testing.T) (a *node, src *b2bv1.RegisterRegionResponse, silent net.Listener) {
	t.Helper()
	bn := bufNet{}
	a, b := newNode(t, "a", bn), newNode(t, "b", bn)
	ctx := context.Background()
	src, err := a.api.RegisterRegion(ctx, hostAlloc(4096, ""))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.api.RegisterRegion(ctx, &b2bv1.RegisterRegionRequest{
		Source: &b2bv1.RegisterRegionRequest_HostAlloc{HostAlloc: &b2bv1.HostAlloc{Size: 4096}}, ExportName: "dst", Readers: []string{"*"}}); err != nil {
		t.Fatal(err)
	}
	silent, err = listenSilent()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { silent.Close() })
	return a, src, silent
}

// dialAPI is a Go client of node a's API, closed when t ends.
func dialAPI(t *testing.T, a *node, opts ...grpc.DialOption) *client.Client {
	t.Helper()
	c, err := client.Dial("passthrough:///api", append([]grpc.DialOption{grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
		return a.apiLn.DialContext(ctx)
	})}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
