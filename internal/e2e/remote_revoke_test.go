package e2e

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/client"
	"github.com/b2bd/b2bd/internal/auth"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// remoteClients dials the local (source) daemon and the remote (destination)
// daemon's API as TestRemote does; it skips without the testbed's variables.
func remoteClients(t *testing.T) (src, dst *client.Client, peer string) {
	t.Helper()
	srcAPI, dstAPI, peer := os.Getenv("B2B_E2E_SRC_API"), os.Getenv("B2B_E2E_DST_API"), os.Getenv("B2B_E2E_DST_PEER")
	if srcAPI == "" || dstAPI == "" || peer == "" {
		t.Skip("B2B_E2E_SRC_API, B2B_E2E_DST_API and B2B_E2E_DST_PEER are not set (make test-rdma sets them)")
	}
	var opts []grpc.DialOption
	if c := os.Getenv("B2B_E2E_TLS_CERT"); c != "" {
		tl, err := auth.LoadPeerTLS(c, os.Getenv("B2B_E2E_TLS_KEY"), os.Getenv("B2B_E2E_TLS_CA"))
		if err != nil {
			t.Fatal(err)
		}
		opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(tl.Client)))
	}
	src, err := client.Dial(srcAPI)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	dst, err = client.Dial(dstAPI, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dst.Close() })
	return src, dst, peer
}

// remoteRegions registers size bytes on both daemons; the destination is
// exported as name.
func remoteRegions(t *testing.T, ctx context.Context, src, dst *client.Client, size uint64, name string) (*client.HostRegion, string) {
	t.Helper()
	s, err := src.RegisterHost(ctx, size, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Unmap(); _ = src.Deregister(context.Background(), s.Id) })
	d, err := dst.API().RegisterRegion(ctx, &b2bv1.RegisterRegionRequest{
		Source: &b2bv1.RegisterRegionRequest_HostAlloc{HostAlloc: &b2bv1.HostAlloc{Size: size}}, ExportName: name})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dst.Deregister(context.Background(), d.Region.Id) })
	return s, d.Region.Id
}

// digests hashes n blocks of bl bytes from offset 0 of a region.
func digests(t *testing.T, ctx context.Context, c *client.Client, id string, n int, bl uint64) []uint64 {
	t.Helper()
	offs := make([]uint64, n)
	for i := range offs {
		offs[i] = uint64(i) * bl
	}
	cs, err := c.Checksum(ctx, id, offs, nil, bl, b2bv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_CRC32C, true)
	if err != nil {
		t.Fatal(err)
	}
	return client.Unpack(cs.BlockDigests)
}

// TestRemoteRevoke (item 9a, over verbs between the testbed's VMs): once the
// destination's owner narrows the export to another identity, the sender's
// next batch, made with the rkey its daemon resolved and cached before, is
// refused: the NIC rejects the old rkey (the destination's bytes do not
// change), and resolving afresh is PermissionDenied. Widening the export
// again works with the new key; removing it revokes that key too.
func TestRemoteRevoke(t *testing.T) {
	src, dst, peer := remoteClients(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const size, bl, n = 1 << 20, 4096, 64
	s, dstID := remoteRegions(t, ctx, src, dst, size, "e2e-revoke")
	r := rand.New(rand.NewPCG(21, 22))
	so, do := make([]uint64, n), make([]uint64, n)
	for i, p := range r.Perm(n) {
		so[i], do[p] = uint64(i)*bl, uint64(i)*2*bl
	}
	tr := client.Transfer{SrcRegion: s.Id, Peer: peer, DstRegion: "e2e-revoke", Transport: b2bv1.TransportKind_TRANSPORT_KIND_VERBS,
		Blocks: client.Descriptors{Src: so, Dst: do, BlockLength: bl}}
	fill := func() {
		for i := range s.Bytes[:n*bl] {
			s.Bytes[i] = byte(r.Uint32())
		}
	}
	landed := func(what string) {
		t.Helper()
		fill()
		if _, err := src.BatchTransfer(ctx, tr); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		a := digests(t, ctx, src, s.Id, n, bl)
		cd, err := dst.Checksum(ctx, dstID, do, nil, bl, b2bv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_CRC32C, true)
		if err != nil {
			t.Fatal(err)
		}
		b := client.Unpack(cd.BlockDigests)
		for i := range a {
			if a[i] != b[i] {
				t.Fatalf("%s: block %d differs", what, i)
			}
		}
		t.Logf("%s: %d blocks landed and verified", what, n)
	}
	export := func(name string, to ...string) {
		t.Helper()
		if _, err := dst.API().ExportRegion(ctx, &b2bv1.ExportRegionRequest{RegionId: dstID, ExportName: name, ExportTo: to}); err != nil {
			t.Fatalf("export %q to %v: %v", name, to, err)
		}
	}
	refused := func(what string, want codes.Code) {
		t.Helper()
		before := digests(t, ctx, dst, dstID, size/bl, bl)
		fill()
		_, err := src.BatchTransfer(ctx, tr)
		if err == nil {
			t.Fatalf("%s: the batch with the key resolved before succeeded", what)
		}
		if c := status.Code(err); c != want {
			t.Fatalf("%s: got %v, want %v", what, err, want)
		}
		t.Logf("%s: %v", what, err)
		after := digests(t, ctx, dst, dstID, size/bl, bl)
		for i := range before {
			if before[i] != after[i] {
				t.Fatalf("%s: destination block at %d changed: the old rkey still wrote", what, uint64(i)*bl)
			}
		}
	}

	landed("first batch (resolves and caches the key)")
	export("e2e-revoke", "someone-else") // narrowed: the sender's identity is no longer allowed
	refused("after the export was narrowed", codes.PermissionDenied)
	export("e2e-revoke") // widened back to every authenticated peer
	landed("after the export was widened again")
	export("") // removed
	refused("after the export was removed", codes.NotFound)
}

// TestRemoteDeadline (item 9b, over verbs between the testbed's VMs): a big
// batch cut off by a short deadline fails with DeadlineExceeded, and once the
// source daemon has answered, no byte of the destination changes any more
// (its QPs were moved to ERROR before the answer); the next batch lands every
// block.
func TestRemoteDeadline(t *testing.T) {
	src, dst, peer := remoteClients(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const bl, n = 1 << 20, 64
	s, dstID := remoteRegions(t, ctx, src, dst, n*bl, "e2e-deadline")
	rand.NewChaCha8([32]byte{9}).Read(s.Bytes)
	verbs := b2bv1.TransportKind_TRANSPORT_KIND_VERBS
	// Warm up: the connection and the resolved key are in place, so the
	// deadline below falls while the big batch's WRITEs are in flight.
	if _, err := src.BatchTransfer(ctx, client.Transfer{SrcRegion: s.Id, Peer: peer, DstRegion: "e2e-deadline", Transport: verbs,
		Blocks: client.Descriptors{Src: []uint64{0}, Dst: []uint64{0}, BlockLength: 4096}}); err != nil {
		t.Fatal(err)
	}
	zero := digests(t, ctx, dst, dstID, n, bl)
	offs := make([]uint64, n)
	for i := range offs {
		offs[i] = uint64(i) * bl
	}
	tr := client.Transfer{SrcRegion: s.Id, Peer: peer, DstRegion: "e2e-deadline", Transport: verbs,
		Blocks: client.Descriptors{Src: offs, Dst: offs, BlockLength: bl}}
	st0, err := src.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	short, cancelShort := context.WithTimeout(ctx, 200*time.Millisecond)
	start := time.Now()
	_, err = src.BatchTransfer(short, tr)
	cancelShort()
	if err == nil {
		t.Skipf("64 MiB landed within 200 ms (%v): the link is too fast for this test", time.Since(start))
	}
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("got %v, want DeadlineExceeded", err)
	}
	failedAt := time.Since(start)
	// The client's own deadline ends the call; the source daemon answers at
	// the same deadline. Wait until it has (its failed-batch count moved).
	for {
		st, err := src.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.BatchesFailed > st0.BatchesFailed {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the source daemon never answered the cut-off batch")
		}
		time.Sleep(10 * time.Millisecond)
	}
	answeredAt := time.Since(start)
	first := digests(t, ctx, dst, dstID, n, bl)
	t.Logf("DeadlineExceeded after %v; the source daemon had answered by %v", failedAt.Round(time.Millisecond), answeredAt.Round(time.Millisecond))
	time.Sleep(2 * time.Second)
	second := digests(t, ctx, dst, dstID, n, bl)
	touched, changed := 0, 0
	for i := range first {
		if first[i] != zero[i] {
			touched++
		}
		if first[i] != second[i] {
			changed++
		}
	}
	t.Logf("%d of %d blocks had been written when the daemon answered; %d changed in the 2 s after", touched, n, changed)
	if changed > 0 {
		t.Fatalf("%d blocks changed after the daemon answered DeadlineExceeded: WRITEs went on landing", changed)
	}
	// The next batch lands every block.
	if _, err := src.BatchTransfer(ctx, tr); err != nil {
		t.Fatalf("the batch after the cut-off one: %v", err)
	}
	a, b := digests(t, ctx, src, s.Id, n, bl), digests(t, ctx, dst, dstID, n, bl)
	if !bytes.Equal(client.Pack(a), client.Pack(b)) {
		t.Fatal("the batch after the cut-off one did not land every block")
	}
	t.Logf("the next batch landed and verified all %d blocks", n)
}
