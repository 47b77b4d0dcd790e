package server_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/internal/desc"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// preparedPair registers a 64 KiB source on a, filled with random bytes, and
// a 64 KiB destination exported as "dst" on b, and returns a request for 100
// blocks of 128 B at random gapped slots.
func preparedPair(t *testing.T, a, b *node) (*b2bv1.Region, *b2bv1.Region, *b2bv1.PrepareTransferRequest) {
	t.Helper()
	ctx := context.Background()
	sr, err := a.api.RegisterRegion(ctx, hostAlloc(64<<10, ""))
	if err != nil {
		t.Fatal(err)
	}
	dr, err := b.api.RegisterRegion(ctx, hostAlloc(64<<10, "dst"))
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(3, 4))
	buf := make([]byte, 64<<10)
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	if err := os.WriteFile(sr.GetRegion().GetShmPath(), buf, 0); err != nil {
		t.Fatal(err)
	}
	srcOff, dstOff := make([]uint64, 100), make([]uint64, 100)
	for i, p := range r.Perm(100) {
		srcOff[i], dstOff[p] = uint64(i)*256, uint64(i)*320
	}
	req := &b2bv1.PrepareTransferRequest{SrcRegionId: sr.GetRegion().GetId(), Peer: "b:7470", DstRegion: "dst",
		Descriptors: &b2bv1.Descriptors{SrcOffsets: desc.Pack(srcOff), DstOffsets: desc.Pack(dstOff), BlockLength: 128}}
	return sr.GetRegion(), dr.GetRegion(), req
}

// sameBlocks compares the per-block checksums of both sides.
func sameBlocks(t *testing.T, a, b *node, src, dst *b2bv1.Region, req *b2bv1.PrepareTransferRequest) {
	t.Helper()
	ctx := context.Background()
	d := req.GetDescriptors()
	cs, err := a.api.Checksum(ctx, &b2bv1.ChecksumRequest{RegionId: src.GetId(), Offsets: d.GetSrcOffsets(), BlockLength: 128, PerBlock: true})
	if err != nil {
		t.Fatal(err)
	}
	cd, err := b.api.Checksum(ctx, &b2bv1.ChecksumRequest{RegionId: dst.GetId(), Offsets: d.GetDstOffsets(), BlockLength: 128, PerBlock: true})
	if err != nil {
		t.Fatal(err)
	}
	if cs.GetBlocks() != 100 || cs.GetDigest() != cd.GetDigest() || !bytes.Equal(cs.GetBlockDigests(), cd.GetBlockDigests()) {
		t.Fatalf("blocks differ: %x / %x", cs.GetDigest(), cd.GetDigest())
	}
}

func TestPreparedRPCs(t *testing.T) {
	bn := bufNet{}
	a, b := newNode(t, "a", bn), newNode(t, "b", bn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	src, dst, req := preparedPair(t, a, b)

	if _, err := a.api.Ping(ctx, &b2bv1.PingRequest{}); err != nil {
		t.Fatal(err)
	}
	prep, err := a.api.PrepareTransfer(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if prep.GetHandle() == 0 || prep.GetBlocks() != 100 || prep.GetBytes() != 12800 || prep.GetSegments() != 100 ||
		prep.GetTransport() != b2bv1.TransportKind_TRANSPORT_KIND_TCP || prep.GetTransportName() != "tcp" || prep.GetPhases().GetDecodeNs() == 0 || prep.GetPhases().GetValidateNs() == 0 {
		t.Fatalf("prepare: %v", prep)
	}
	for i := 0; i < 3; i++ {
		resp, err := a.api.SubmitTransfer(ctx, &b2bv1.SubmitTransferRequest{Handle: prep.GetHandle()})
		if err != nil {
			t.Fatal(err)
		}
		ph := resp.GetPhases()
		if resp.GetBlocks() != 100 || resp.GetTransportName() != "tcp" || ph.GetWireNs() == 0 || ph.GetDecodeNs() == 0 || ph.GetTotalNs() < ph.GetWireNs()+ph.GetDecodeNs() || ph.GetValidateNs() != 0 {
			t.Fatalf("submit: %v", resp)
		}
	}
	sameBlocks(t, a, b, src, dst, req)

	// Another connection of the same user does not see the plan.
	other := b2bv1.NewB2BClient(a.dial())
	_, err = other.SubmitTransfer(ctx, &b2bv1.SubmitTransferRequest{Handle: prep.GetHandle()})
	wantStatus(t, err, codes.NotFound, fmt.Sprintf("plan %d: no such prepared transfer", prep.GetHandle()))

	// The plan holds its source.
	_, err = a.api.DeregisterRegion(ctx, &b2bv1.DeregisterRegionRequest{RegionId: src.GetId()})
	wantStatus(t, err, codes.FailedPrecondition, "prepared plan")
	if _, err := a.api.ReleaseTransfer(ctx, &b2bv1.ReleaseTransferRequest{Handle: prep.GetHandle()}); err != nil {
		t.Fatal(err)
	}
	_, err = a.api.ReleaseTransfer(ctx, &b2bv1.ReleaseTransferRequest{Handle: prep.GetHandle()})
	wantStatus(t, err, codes.NotFound, "no such prepared transfer")
	_, err = a.api.SubmitTransfer(ctx, &b2bv1.SubmitTransferRequest{Handle: prep.GetHandle()})
	wantStatus(t, err, codes.NotFound, "no such prepared transfer")
	if _, err := a.api.DeregisterRegion(ctx, &b2bv1.DeregisterRegionRequest{RegionId: src.GetId()}); err != nil {
		t.Fatal(err)
	}

	// Bad input is refused with the field named, as BatchTransfer does.
	bad := &b2bv1.PrepareTransferRequest{SrcRegionId: "r999", Peer: "b:7470", DstRegion: "dst", Descriptors: req.GetDescriptors()}
	_, err = a.api.PrepareTransfer(ctx, bad)
	wantStatus(t, err, codes.NotFound, `src_region_id "r999"`)
	_, err = a.api.PrepareTransfer(ctx, &b2bv1.PrepareTransferRequest{SrcRegionId: "r1", Peer: "b:7470", DstRegion: "dst"})
	wantStatus(t, err, codes.InvalidArgument, "descriptors is not set")
	if n := a.srv.Plans(); n != 0 {
		t.Fatalf("%d plans left", n)
	}
}

func TestPlansOfAClosedConnection(t *testing.T) {
	bn := bufNet{}
	a, b := newNode(t, "a", bn), newNode(t, "b", bn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	src, _, req := preparedPair(t, a, b)
	cc := a.dial()
	c := b2bv1.NewB2BClient(cc)
	for i := 0; i < 3; i++ {
		if _, err := c.PrepareTransfer(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.api.PrepareTransfer(ctx, req); err != nil { // the test's own connection keeps this one
		t.Fatal(err)
	}
	if n := a.srv.Plans(); n != 4 {
		t.Fatalf("%d plans", n)
	}
	cc.Close()
	for deadline := time.Now().Add(5 * time.Second); a.srv.Plans() != 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d plans after the connection closed, want 1", a.srv.Plans())
		}
	}
	_, err := a.api.DeregisterRegion(ctx, &b2bv1.DeregisterRegionRequest{RegionId: src.GetId()})
	wantStatus(t, err, codes.FailedPrecondition, "in use by 1")
	a.srv.Close() // shutdown frees the rest
	if _, err := a.api.DeregisterRegion(ctx, &b2bv1.DeregisterRegionRequest{RegionId: src.GetId()}); err != nil {
		t.Fatal(err)
	}
	_, err = a.api.PrepareTransfer(ctx, req)
	wantStatus(t, err, codes.Unavailable, "shutting down")
}

func TestSubmitStream(t *testing.T) {
	bn := bufNet{}
	a, b := newNode(t, "a", bn), newNode(t, "b", bn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	src, dst, req := preparedPair(t, a, b)
	prep, err := a.api.PrepareTransfer(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	st, err := a.api.SubmitStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const n = 300 // more than StreamInFlight
	go func() {
		for i := uint64(1); i <= n; i++ {
			h := prep.GetHandle()
			if i%100 == 0 {
				h ^= 1 // no such plan: answered with its code, the stream goes on
			}
			if err := st.Send(&b2bv1.SubmitStreamRequest{Tag: i, Handle: h}); err != nil {
				t.Error(err)
				return
			}
		}
		st.CloseSend()
	}()
	seen := map[uint64]bool{}
	for {
		resp, err := st.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		tag := resp.GetTag()
		if seen[tag] || tag == 0 || tag > n {
			t.Fatalf("tag %d", tag)
		}
		seen[tag] = true
		if tag%100 == 0 {
			if codes.Code(resp.GetCode()) != codes.NotFound || !strings.Contains(resp.GetMessage(), "no such prepared transfer") || resp.GetResult() != nil {
				t.Fatalf("tag %d: %v", tag, resp)
			}
		} else if resp.GetCode() != 0 || resp.GetResult().GetBlocks() != 100 {
			t.Fatalf("tag %d: %v", tag, resp)
		}
	}
	if len(seen) != n {
		t.Fatalf("%d answers, want %d", len(seen), n)
	}
	sameBlocks(t, a, b, src, dst, req)
}

func wantStatus(t *testing.T, err error, code codes.Code, msg string) {
	t.Helper()
	if status.Code(err) != code || !strings.Contains(status.Convert(err).Message(), msg) {
		t.Fatalf("err = %v, want %v containing %q", err, code, msg)
	}
}
