package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/client"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// TestDeregisterUnderBatches: many concurrent batches into (or out of) one
// region while its owner deregisters it in a tight loop, over tcp and the
// same-host path, push and pull, the region on the peer and on the
// caller's own daemon. Every Deregister either fails with
// FailedPrecondition (a batch holds the region) or succeeds, once; every
// batch either succeeds, its blocks verified by CRC32C through the test's
// own mappings (which outlive the deregistration), or fails with NotFound
// for a region that was gone before it was resolved, never for a key that
// stopped pinning between its resolution and its first frame ("no live
// ... registration": the region went while the batch held its key). Once
// every batch answered, nothing holds the region.
func TestDeregisterUnderBatches(t *testing.T) {
	a, b := startNode(t, "a", autoTransport), startNode(t, "b", autoTransport)
	w := pinWorld{a: a.c, b: b.c, peer: b.d.PeerAddr()}
	kinds := []b2bv1.TransportKind{b2bv1.TransportKind_TRANSPORT_KIND_TCP, b2bv1.TransportKind_TRANSPORT_KIND_LOCAL}
	ops := []b2bv1.TransferOp{b2bv1.TransferOp_TRANSFER_OP_WRITE, b2bv1.TransferOp_TRANSFER_OP_READ}
	var refused, rounds int
	for _, k := range kinds {
		for _, op := range ops {
			for _, side := range []string{"peer", "local"} {
				name := fmt.Sprintf("%s/%s/%s", strings.TrimPrefix(k.String(), "TRANSPORT_KIND_"), strings.TrimPrefix(op.String(), "TRANSFER_OP_"), side)
				t.Run(name, func(t *testing.T) {
					for round := range pinRounds {
						refused += pinRound(t, w, k, op, side == "local", round)
						rounds++
					}
				})
			}
		}
	}
	t.Logf("%d rounds, %d deregistrations refused while batches held their region", rounds, refused)
	if !t.Failed() && refused == 0 {
		t.Errorf("no deregistration was ever refused: the batches never held the region when it was tried, so this test proved nothing")
	}
}

const (
	pinRounds  = 10
	pinBatches = 12      // concurrent batches per round
	pinChunk   = 1 << 16 // each batch's bytes: its own part of both regions
	pinBlock   = 4096
)

// TestRemoteDeregisterUnderBatches is TestDeregisterUnderBatches over verbs
// between two hosts (the Soft-RoCE VMs in make test-rdma), the peer's
// region deregistered, push and pull. The peer's regions cannot be mapped
// here: a pull's source is filled by a push first, and a push's blocks
// are not read back (a deregistered region cannot be), only its answer
// judged.
func TestRemoteDeregisterUnderBatches(t *testing.T) {
	src, dst, peer := remoteClients(t)
	w := pinWorld{a: src, b: dst, peer: peer, remote: true}
	refused := 0
	for _, op := range []b2bv1.TransferOp{b2bv1.TransferOp_TRANSFER_OP_WRITE, b2bv1.TransferOp_TRANSFER_OP_READ} {
		t.Run(strings.TrimPrefix(op.String(), "TRANSFER_OP_"), func(t *testing.T) {
			for round := range pinRounds {
				refused += pinRound(t, w, b2bv1.TransportKind_TRANSPORT_KIND_VERBS, op, false, round)
			}
		})
	}
	t.Logf("%d deregistrations refused while batches held their region", refused)
	if !t.Failed() && refused == 0 {
		t.Errorf("no deregistration was ever refused: this test proved nothing")
	}
}

// pinWorld is the two daemons of a round: a's regions are mapped here, b's
// too unless remote.
type pinWorld struct {
	a, b   *client.Client
	peer   string // b's peer address
	remote bool
}

// pinRound runs one round: fresh regions on both daemons (the peer's
// exported under a name no resolution has cached), pinBatches batches at
// once, and a deregistration of the peer's region (or, with local, of the
// caller's own) tried without pause from when they start until it
// succeeds. It returns how many tries were refused.
func pinRound(t *testing.T, w pinWorld, k b2bv1.TransportKind, op b2bv1.TransferOp, local bool, round int) int {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const size = pinBatches * pinChunk
	export := fmt.Sprintf("pin-%s-%s-%v-%d", k, op, local, round)
	mine, err := w.a.RegisterHost(ctx, size, "")
	if err != nil {
		t.Fatal(err)
	}
	defer mine.Unmap()
	var theirs []byte // nil: not mapped here
	var theirsID string
	if w.remote {
		resp, err := w.b.API().RegisterRegion(ctx, &b2bv1.RegisterRegionRequest{Source: &b2bv1.RegisterRegionRequest_HostAlloc{HostAlloc: &b2bv1.HostAlloc{Size: size}},
			ExportName: export, Readers: []string{"*"}})
		if err != nil {
			t.Fatal(err)
		}
		theirsID = resp.GetRegion().GetId()
	} else {
		hr, err := w.b.RegisterHost(ctx, size, export, client.Readers("*"))
		if err != nil {
			t.Fatal(err)
		}
		defer hr.Unmap()
		theirs, theirsID = hr.Bytes, hr.Id
	}
	r := rand.New(rand.NewPCG(uint64(round), uint64(k)))
	from, into := mine.Bytes, theirs // where the bytes come from, where they land
	if op == b2bv1.TransferOp_TRANSFER_OP_READ {
		from, into = theirs, mine.Bytes
		if from == nil {
			// Fill the peer's region by a push, then pull it back.
			fill(mine.Bytes, func(int) byte { return byte(r.Uint32()) })
			offs := strided(size/pinBlock, pinBlock)
			if _, err := w.a.BatchTransfer(ctx, client.Transfer{SrcRegion: mine.Id, Peer: w.peer, DstRegion: export, Transport: k,
				Blocks: client.Descriptors{Src: offs, Dst: offs, BlockLength: pinBlock}}); err != nil {
				t.Fatal(err)
			}
			from = bytes.Clone(mine.Bytes)
			clear(mine.Bytes)
		}
	}
	if op == b2bv1.TransferOp_TRANSFER_OP_WRITE || theirs != nil {
		fill(from, func(int) byte { return byte(r.Uint32()) })
	}
	victim, owner := theirsID, w.b
	if local {
		victim, owner = mine.Id, w.a
	}

	type outcome struct {
		err      error
		answered time.Time
	}
	outs := make([]outcome, pinBatches)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range pinBatches {
		wg.Add(1)
		go func() {
			defer wg.Done()
			offs := strided(pinChunk/pinBlock, pinBlock)
			for j := range offs {
				offs[j] += uint64(i) * pinChunk
			}
			<-start
			_, err := w.a.BatchTransfer(ctx, client.Transfer{SrcRegion: mine.Id, Peer: w.peer, DstRegion: export,
				Transport: k, Op: op, Blocks: client.Descriptors{Src: offs, Dst: offs, BlockLength: pinBlock}})
			outs[i] = outcome{err, time.Now()}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()

	var gone time.Time // when the deregistration succeeded
	refused := 0
	close(start)
	if w.remote {
		// Over the network the owner's first Deregister overtakes the
		// batches' first resolution: start once something holds the region.
		waitHeld(ctx, t, owner, victim, done)
	}
	for gone.IsZero() {
		select {
		case <-done:
			// Every batch answered: nothing may hold the region now.
			gone = time.Now()
			if err := owner.Deregister(ctx, victim); err != nil {
				t.Fatalf("deregistration once every batch answered: %v (a hold or pin outlived its batch)", err)
			}
			continue
		default:
		}
		tried := time.Now() // a success deregistered it after this
		err := owner.Deregister(ctx, victim)
		switch status.Code(err) {
		case codes.OK:
			gone = tried
		case codes.FailedPrecondition:
			refused++
		default:
			t.Fatalf("deregistration under batches: %v, want OK or FailedPrecondition", err)
		}
	}
	<-done

	var landed int
	for i, o := range outs {
		lo, hi := i*pinChunk, (i+1)*pinChunk
		if o.err == nil && into == nil {
			landed++ // pushed to a region of another host, gone now: its answer is all there is
			continue
		}
		if o.err == nil {
			// Landed: its bytes are where they belong, whatever came after.
			if want, got := crc32.Checksum(from[lo:hi], castagnoli), crc32.Checksum(into[lo:hi], castagnoli); want != got || !bytes.Equal(from[lo:hi], into[lo:hi]) {
				t.Errorf("round %d, batch %d succeeded, but its blocks' CRC32C is %08x, want %08x", round, i, got, want)
			}
			landed++
			continue
		}
		st, _ := status.FromError(o.err)
		switch {
		case st.Code() != codes.NotFound:
			t.Errorf("round %d, batch %d: %v, want success or NotFound", round, i, o.err)
		case strings.Contains(st.Message(), "no live"):
			t.Errorf("round %d, batch %d: the region went while the batch held its key: %v", round, i, o.err)
		case o.answered.Before(gone):
			t.Errorf("round %d, batch %d failed NotFound at %v, before the deregistration succeeded at %v: %v",
				round, i, o.answered.Format(time.RFC3339Nano), gone.Format(time.RFC3339Nano), o.err)
		}
	}
	t.Logf("round %d: %d of %d batches landed, %d deregistrations refused first", round, landed, pinBatches, refused)
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("round %d ran past its minute", round)
	}
	return refused
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// waitHeld returns once owner lists region id with a batch holding it, or
// done closed, or 5 s passed.
func waitHeld(ctx context.Context, t *testing.T, owner *client.Client, id string, done <-chan struct{}) {
	t.Helper()
	until := time.Now().Add(5 * time.Second)
	for time.Now().Before(until) {
		select {
		case <-done:
			return
		default:
		}
		rs, err := owner.Regions(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rs {
			if r.GetId() == id && r.GetActiveBatches() > 0 {
				return
			}
		}
	}
}
