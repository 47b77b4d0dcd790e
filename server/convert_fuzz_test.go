package server

import (
	"bytes"
	"errors"
	"os"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/b2bd/b2bd/internal/batch"
	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/region"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// FuzzPrepareRequest feeds arbitrary bytes, as a PrepareTransferRequest,
// through the converter and on to batch's validation (Plan: fields, the
// source region, descriptors; nothing dialled): the converter must carry
// every field over unchanged, and validation must not panic and must refuse
// with a domain class.
func FuzzPrepareRequest(f *testing.F) {
	seed := func(m proto.Message) {
		b, _ := proto.Marshal(m)
		f.Add(b)
	}
	u := desc.Pack
	seed(&b2bv1.PrepareTransferRequest{SrcRegionId: "r1", Peer: "b:1", DstRegion: "d", Descriptors: &b2bv1.Descriptors{SrcOffsets: u([]uint64{0, 128}), DstOffsets: u([]uint64{128, 0}), BlockLength: 128}})
	seed(&b2bv1.PrepareTransferRequest{SrcRegionId: "r1", Peer: "b:1", DstRegion: "d", Transport: 7, Descriptors: &b2bv1.Descriptors{SrcOffsets: u([]uint64{0}), DstOffsets: u([]uint64{0}), Lengths: u([]uint64{4096})}})
	seed(&b2bv1.PrepareTransferRequest{SrcRegionId: "r1", Peer: "b:1", DstRegion: "d", Notification: make([]byte, 5000), Descriptors: &b2bv1.Descriptors{}})
	seed(&b2bv1.PrepareTransferRequest{SrcRegionId: "r1", Peer: "b:1", DstRegion: "d", Descriptors: &b2bv1.Descriptors{SrcOffsets: make([]byte, 12), DstOffsets: u([]uint64{0}), BlockLength: 8}})
	seed(&b2bv1.PrepareTransferRequest{})

	reg, err := region.New(region.Config{ShmDir: f.TempDir(), CUDAWhy: "no GPU in this test"})
	if err != nil {
		f.Fatal(err)
	}
	defer reg.Close()
	who := region.Caller{UID: uint32(os.Getuid()), GID: uint32(os.Getgid()), Known: true}
	if _, err := reg.AllocHost(4096, region.Export{}, who); err != nil { // r1
		f.Fatal(err)
	}
	s := batch.New(batch.Config{Registry: reg, MaxDescriptors: 64, DefaultTimeout: time.Second})
	classes := []error{errs.ErrInvalidArgument, errs.ErrNotFound, errs.ErrPermissionDenied, errs.ErrFailedPrecondition, errs.ErrResourceExhausted}

	f.Fuzz(func(t *testing.T, data []byte) {
		var m b2bv1.PrepareTransferRequest
		if proto.Unmarshal(data, &m) != nil {
			return
		}
		r := prepareRequest(&m, who)
		if r.Src != m.GetSrcRegionId() || r.Peer != m.GetPeer() || r.Dst != m.GetDstRegion() || r.Caller != who ||
			!bytes.Equal(r.Notification, m.GetNotification()) || (r.Descriptors == nil) != (m.GetDescriptors() == nil) {
			t.Fatalf("converted %+v from %v", r, &m)
		}
		if d := r.Descriptors; d != nil {
			md := m.GetDescriptors()
			if !bytes.Equal(d.SrcOffsets, md.GetSrcOffsets()) || !bytes.Equal(d.DstOffsets, md.GetDstOffsets()) ||
				!bytes.Equal(d.Lengths, md.GetLengths()) || d.BlockLength != md.GetBlockLength() {
				t.Fatalf("descriptors %+v from %v", d, md)
			}
		}
		if known := m.GetTransport() <= b2bv1.TransportKind_TRANSPORT_KIND_VERBS && m.GetTransport() >= 0; known != (r.BadTransport == nil) {
			t.Fatalf("transport %v: %v", m.GetTransport(), r.BadTransport)
		}
		p, err := s.Plan(r)
		if err == nil {
			p.Close()
			return
		}
		for _, c := range classes {
			if errors.Is(err, c) {
				return
			}
		}
		t.Fatalf("refusal without a domain class: %v", err)
	})
}
