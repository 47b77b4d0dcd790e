package e2e

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/client"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// TestRemote runs against two daemons on two hosts (the Soft-RoCE testbed's
// VMs in `make test-rdma`): verified transfers over verbs and the bad inputs
// that apply to it. It needs B2B_E2E_SRC_API (the local daemon, whose regions
// this process maps), B2B_E2E_DST_API and B2B_E2E_DST_PEER, and B2B_E2E_TLS_*
// for the remote API; without them it is skipped.
func TestRemote(t *testing.T) {
	src, dst, peer := remoteClients(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	const regionBytes = 8 << 20
	s, err := src.RegisterHost(ctx, regionBytes, "")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Unmap(); _ = src.Deregister(context.Background(), s.Id) }()
	d, err := dst.API().RegisterRegion(ctx, &b2bv1.RegisterRegionRequest{
		Source: &b2bv1.RegisterRegionRequest_HostAlloc{HostAlloc: &b2bv1.HostAlloc{Size: regionBytes}}, ExportName: "e2e-remote"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = dst.Deregister(context.Background(), d.Region.Id) }()
	r := rand.New(rand.NewPCG(11, 12))

	t.Run("verified transfers", func(t *testing.T) {
		for _, tc := range []struct {
			size   uint64
			blocks int
			kind   b2bv1.TransportKind
		}{
			{128, 2000, b2bv1.TransportKind_TRANSPORT_KIND_VERBS},
			{4096, 1000, b2bv1.TransportKind_TRANSPORT_KIND_VERBS},
			{65536, 50, b2bv1.TransportKind_TRANSPORT_KIND_VERBS},
			{1 << 20, 3, b2bv1.TransportKind_TRANSPORT_KIND_VERBS},
			{4096, 500, b2bv1.TransportKind_TRANSPORT_KIND_UNSPECIFIED}, // auto picks verbs
			{4096, 500, b2bv1.TransportKind_TRANSPORT_KIND_TCP},         // TCP over mutual TLS between the hosts
		} {
			slot := tc.size + 64
			so, do := make([]uint64, tc.blocks), make([]uint64, tc.blocks)
			for i, p := range r.Perm(tc.blocks) {
				so[i], do[p] = uint64(i)*slot, uint64(i)*slot
			}
			for i := range s.Bytes[:uint64(tc.blocks)*slot] {
				s.Bytes[i] = byte(r.Uint32())
			}
			resp, err := src.BatchTransfer(ctx, client.Transfer{SrcRegion: s.Id, Peer: peer, DstRegion: "e2e-remote",
				Transport: tc.kind, Blocks: client.Descriptors{Src: so, Dst: do, BlockLength: tc.size}})
			if err != nil {
				t.Fatalf("%d x %d B: %v", tc.blocks, tc.size, err)
			}
			want := b2bv1.TransportKind_TRANSPORT_KIND_VERBS
			if tc.kind == b2bv1.TransportKind_TRANSPORT_KIND_TCP {
				want = tc.kind
			}
			if resp.Transport != want {
				t.Fatalf("%d x %d B went over %v, want %v", tc.blocks, tc.size, resp.Transport, want)
			}
			alg := b2bv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_CRC32C
			cs, err := src.Checksum(ctx, s.Id, so, nil, tc.size, alg, true)
			if err != nil {
				t.Fatal(err)
			}
			cd, err := dst.Checksum(ctx, d.Region.Id, do, nil, tc.size, alg, true)
			if err != nil {
				t.Fatal(err)
			}
			a, b := client.Unpack(cs.BlockDigests), client.Unpack(cd.BlockDigests)
			for i := range a {
				if a[i] != b[i] {
					t.Fatalf("%d x %d B over %v: block %d differs", tc.blocks, tc.size, resp.Transport, i)
				}
			}
			t.Logf("%d x %d B over %v: %d WRs, %v, every block verified", tc.blocks, tc.size, resp.Transport, resp.WorkRequests, time.Duration(resp.ElapsedNs))
		}
	})

	t.Run("bad inputs over verbs", func(t *testing.T) {
		verbs := b2bv1.TransportKind_TRANSPORT_KIND_VERBS
		cases := []struct {
			name string
			tr   client.Transfer
			code codes.Code
			msg  string
		}{
			{"unknown destination export", client.Transfer{DstRegion: "no-such-region", Blocks: client.Descriptors{Src: []uint64{0}, Dst: []uint64{0}, BlockLength: 64}}, codes.NotFound, `no region is exported as "no-such-region"`},
			{"past the destination's end", client.Transfer{DstRegion: "e2e-remote", Blocks: client.Descriptors{Src: []uint64{0}, Dst: []uint64{regionBytes - 8}, BlockLength: 64}}, codes.InvalidArgument, "runs past the destination region's 8388608 bytes"},
			{"overlapping destinations", client.Transfer{DstRegion: "e2e-remote", Blocks: client.Descriptors{Src: []uint64{0, 64}, Dst: []uint64{128, 100}, BlockLength: 64}}, codes.InvalidArgument, "overlap"},
			{"past the source's end", client.Transfer{DstRegion: "e2e-remote", Blocks: client.Descriptors{Src: []uint64{regionBytes}, Dst: []uint64{0}, BlockLength: 1}}, codes.InvalidArgument, "runs past the source region's"},
			{"unreachable peer", client.Transfer{Peer: "10.77.0.250:7470", DstRegion: "e2e-remote", Blocks: client.Descriptors{Src: []uint64{0}, Dst: []uint64{0}, BlockLength: 64}}, codes.Unavailable, ""},
		}
		for _, c := range cases {
			tr := c.tr
			tr.SrcRegion, tr.Transport = s.Id, verbs
			if tr.Peer == "" {
				tr.Peer = peer
			}
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := src.BatchTransfer(cctx, tr)
			cancel()
			st, _ := status.FromError(err)
			code := st.Code()
			if c.code == codes.Unavailable && code == codes.DeadlineExceeded {
				code = codes.Unavailable // an address with no host behind it may only time out
			}
			if code != c.code || !strings.Contains(st.Message(), c.msg) {
				t.Errorf("%s: got %v %q, want %v containing %q", c.name, st.Code(), st.Message(), c.code, c.msg)
			}
		}
		// The daemons are still fine: one more verified batch.
		for i := range s.Bytes[:4096] {
			s.Bytes[i] = byte(i * 5)
		}
		if _, err := src.BatchTransfer(ctx, client.Transfer{SrcRegion: s.Id, Peer: peer, DstRegion: "e2e-remote", Transport: verbs,
			Blocks: client.Descriptors{Src: []uint64{0}, Dst: []uint64{4096}, BlockLength: 4096}}); err != nil {
			t.Fatalf("batch after the bad inputs: %v", err)
		}
	})
}
