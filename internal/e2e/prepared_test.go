package e2e

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/client"
	"github.com/b2bd/b2bd/internal/daemon"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// preparedSetup registers a source on a and a destination exported as "dst"
// on b, fills the source with random bytes, and lays out n blocks of size
// bytes at random gapped slots on both sides.
type preparedSetup struct {
	src, dst       *client.HostRegion
	srcOff, dstOff []uint64
	size           uint64
	tr             client.Transfer
}

func newPreparedSetup(ctx context.Context, t *testing.T, a, b *node, n int, size uint64, seed uint64) *preparedSetup {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 1))
	srcOff, srcSize := layout(n, size, r)
	dstOff, dstSize := layout(n, size, r)
	src, dst := registerPair(ctx, t, a.c, b.c, srcSize, dstSize, "dst")
	fill(src.Bytes, func(int) byte { return byte(r.Uint32()) })
	return &preparedSetup{src: src, dst: dst, srcOff: srcOff, dstOff: dstOff, size: size,
		tr: client.Transfer{SrcRegion: src.Id, Peer: a.peerOf(b), DstRegion: "dst", Blocks: client.Descriptors{Src: srcOff, Dst: dstOff, BlockLength: size}}}
}

func (n *node) peerOf(b *node) string { return b.d.PeerAddr() }

// checkBlocks compares every block on both sides, by bytes and by the
// daemons' per-block checksums.
func (p *preparedSetup) checkBlocks(ctx context.Context, t *testing.T, a, b *node) {
	t.Helper()
	sameBlocks(ctx, t, a.c, b.c, p.src, p.dst, p.srcOff, p.dstOff, p.size)
}

func wantCode(t *testing.T, err error, code codes.Code, msg string) {
	t.Helper()
	if status.Code(err) != code || !strings.Contains(status.Convert(err).Message(), msg) {
		t.Fatalf("err = %v, want %v containing %q", err, code, msg)
	}
}

func TestPreparedTransfer(t *testing.T) {
	a, b := startNode(t, "a", func(c *daemon.Config) { c.MaxPlans = 3 }), startNode(t, "b")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	t.Run("100 submits land every block", func(t *testing.T) {
		p := newPreparedSetup(ctx, t, a, b, 1000, 128, 1)
		defer release(ctx, t, b.c, p.dst)
		plan, err := a.c.Prepare(ctx, p.tr)
		if err != nil {
			t.Fatal(err)
		}
		if plan.Handle == 0 || plan.Info.Blocks != 1000 || plan.Info.Bytes != 128000 || plan.Info.Phases.GetValidateNs() == 0 {
			t.Fatalf("prepare: %v", plan.Info)
		}
		st0, err := a.c.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		r := rand.New(rand.NewPCG(2, 2))
		for i := 0; i < 100; i++ {
			if i%25 == 0 { // new bytes, so each check sees this round's submit
				fill(p.src.Bytes, func(int) byte { return byte(r.Uint32()) })
			}
			resp, err := plan.Submit(ctx)
			if err != nil {
				t.Fatalf("submit %d: %v", i, err)
			}
			ph := resp.GetPhases()
			if resp.Blocks != 1000 || resp.Bytes != 128000 || ph.GetWireNs() == 0 || ph.GetTotalNs() < ph.GetWireNs() || ph.GetValidateNs() != 0 {
				t.Fatalf("submit %d: %v", i, resp)
			}
			if i%25 == 24 {
				p.checkBlocks(ctx, t, a, b)
			}
		}
		st1, err := a.c.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if d := st1.BatchesSent - st0.BatchesSent; d != 100 || st1.BytesSent-st0.BytesSent != 100*128000 || st1.BatchesFailed != st0.BatchesFailed {
			t.Fatalf("%d batches sent, want 100", d)
		}
		// The plan holds its source.
		wantCode(t, a.c.Deregister(ctx, p.src.Id), codes.FailedPrecondition, "prepared plan")
		if err := plan.Release(ctx); err != nil {
			t.Fatal(err)
		}
		wantCode(t, plan.Release(ctx), codes.NotFound, "no such prepared transfer")
		release(ctx, t, a.c, p.src)
	})

	t.Run("ad hoc reports its phases", func(t *testing.T) {
		p := newPreparedSetup(ctx, t, a, b, 1000, 128, 3)
		defer release(ctx, t, a.c, p.src)
		defer release(ctx, t, b.c, p.dst)
		resp, err := a.c.BatchTransfer(ctx, p.tr)
		if err != nil {
			t.Fatal(err)
		}
		ph := resp.GetPhases()
		if ph.GetDecodeNs() == 0 || ph.GetValidateNs() == 0 || ph.GetResolveNs() == 0 || ph.GetWireNs() == 0 ||
			ph.GetTotalNs() < ph.GetDecodeNs()+ph.GetValidateNs()+ph.GetResolveNs()+ph.GetWireNs() {
			t.Fatalf("phases %v", ph)
		}
		p.checkBlocks(ctx, t, a, b)
	})

	// staleCase prepares a plan, submits it once, breaks it with change, and
	// checks the next submit is refused as stale without writing a byte
	// into what is then registered as "dst".
	staleCase := func(t *testing.T, seed uint64, change func(p *preparedSetup) *client.HostRegion) {
		p := newPreparedSetup(ctx, t, a, b, 200, 128, seed)
		defer release(ctx, t, a.c, p.src)
		plan, err := a.c.Prepare(ctx, p.tr)
		if err != nil {
			t.Fatal(err)
		}
		defer plan.Release(ctx)
		if _, err := plan.Submit(ctx); err != nil {
			t.Fatal(err)
		}
		p.checkBlocks(ctx, t, a, b)
		now := change(p)
		defer release(ctx, t, b.c, now)
		clear(now.Bytes)
		_, err = plan.Submit(ctx)
		wantCode(t, err, codes.FailedPrecondition, fmt.Sprintf("plan %d is stale: ", plan.Handle))
		wantCode(t, err, codes.FailedPrecondition, "; prepare it again")
		if i := bytes.IndexFunc(now.Bytes, func(r rune) bool { return r != 0 }); i >= 0 {
			t.Fatalf("a stale plan wrote into the destination (byte %d)", i)
		}
		// Prepared again, it lands.
		again, err := a.c.Prepare(ctx, p.tr)
		if err != nil {
			t.Fatal(err)
		}
		defer again.Release(ctx)
		if _, err := again.Submit(ctx); err != nil {
			t.Fatal(err)
		}
		p.dst = now
		p.checkBlocks(ctx, t, a, b)
	}
	t.Run("destination re-registered", func(t *testing.T) {
		staleCase(t, 4, func(p *preparedSetup) *client.HostRegion {
			size := uint64(len(p.dst.Bytes))
			release(ctx, t, b.c, p.dst)
			dst, err := b.c.RegisterHost(ctx, size, "dst")
			if err != nil {
				t.Fatal(err)
			}
			return dst
		})
	})
	t.Run("export narrowed", func(t *testing.T) {
		staleCase(t, 5, func(p *preparedSetup) *client.HostRegion {
			// Exported to nobody in particular, then back: each change
			// rekeys the region, revoking the key the plan holds.
			for _, to := range [][]string{{"spiffe://nobody"}, nil} {
				if _, err := b.c.API().ExportRegion(ctx, &b2bv1.ExportRegionRequest{RegionId: p.dst.Id, ExportName: "dst", ExportTo: to}); err != nil {
					t.Fatal(err)
				}
			}
			return p.dst
		})
	})

	t.Run("the plan limit", func(t *testing.T) {
		p := newPreparedSetup(ctx, t, a, b, 10, 128, 6)
		defer release(ctx, t, a.c, p.src)
		defer release(ctx, t, b.c, p.dst)
		var plans []*client.Plan
		for i := 0; i < 3; i++ {
			plan, err := a.c.Prepare(ctx, p.tr)
			if err != nil {
				t.Fatal(err)
			}
			plans = append(plans, plan)
		}
		_, err := a.c.Prepare(ctx, p.tr)
		wantCode(t, err, codes.ResourceExhausted, "the limit (--max-plans) is 3")
		for _, plan := range plans {
			if err := plan.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
	})

	t.Run("another client's handle", func(t *testing.T) {
		p := newPreparedSetup(ctx, t, a, b, 10, 128, 7)
		defer release(ctx, t, a.c, p.src)
		defer release(ctx, t, b.c, p.dst)
		plan, err := a.c.Prepare(ctx, p.tr)
		if err != nil {
			t.Fatal(err)
		}
		defer plan.Release(ctx)
		other := dialSock(t, a.d.APIAddr())
		_, err = other.API().SubmitTransfer(ctx, &b2bv1.SubmitTransferRequest{Handle: plan.Handle})
		wantCode(t, err, codes.NotFound, fmt.Sprintf("plan %d: no such prepared transfer", plan.Handle))
		_, err = other.API().ReleaseTransfer(ctx, &b2bv1.ReleaseTransferRequest{Handle: plan.Handle})
		wantCode(t, err, codes.NotFound, "no such prepared transfer")
		if _, err := plan.Submit(ctx); err != nil {
			t.Fatalf("the owner's submit after another's attempts: %v", err)
		}
	})

	t.Run("closed connection frees its plans", func(t *testing.T) {
		c2, err := client.Dial(a.d.APIAddr())
		if err != nil {
			t.Fatal(err)
		}
		p := newPreparedSetup(ctx, t, a, b, 10, 128, 8)
		defer release(ctx, t, b.c, p.dst)
		for i := 0; i < 2; i++ {
			if _, err := c2.Prepare(ctx, p.tr); err != nil {
				t.Fatal(err)
			}
		}
		wantCode(t, a.c.Deregister(ctx, p.src.Id), codes.FailedPrecondition, "in use by 2")
		c2.Close()
		deadline := time.Now().Add(5 * time.Second)
		for {
			err := a.c.Deregister(ctx, p.src.Id)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("plans of a closed connection still hold the source: %v", err)
			}
			time.Sleep(10 * time.Millisecond)
		}
		p.src.Unmap()
	})

	t.Run("release while a submit runs", func(t *testing.T) {
		p := newPreparedSetup(ctx, t, a, b, 2, 16<<20, 9) // 32 MiB: a submit takes a while
		defer release(ctx, t, b.c, p.dst)
		plan, err := a.c.Prepare(ctx, p.tr)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { _, err := plan.Submit(ctx); done <- err }()
		time.Sleep(2 * time.Millisecond)
		if err := plan.Release(ctx); err != nil {
			t.Fatal(err)
		}
		// The submit either ran (and landed) or came after the release.
		if err := <-done; err != nil && status.Code(err) != codes.NotFound {
			t.Fatalf("submit: %v", err)
		} else if err == nil {
			p.checkBlocks(ctx, t, a, b)
		}
		release(ctx, t, a.c, p.src) // freed once the submit ended
	})

	t.Run("stream", func(t *testing.T) {
		p := newPreparedSetup(ctx, t, a, b, 100, 128, 10)
		defer release(ctx, t, a.c, p.src)
		defer release(ctx, t, b.c, p.dst)
		plan, err := a.c.Prepare(ctx, p.tr)
		if err != nil {
			t.Fatal(err)
		}
		defer plan.Release(ctx)
		st, err := a.c.OpenStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		const n = 200
		bad := &client.Plan{Handle: plan.Handle ^ 1}
		var badTag uint64
		go func() {
			for i := 0; i < n; i++ {
				pl := plan
				if i == n/2 {
					pl = bad
				}
				tag, err := st.Submit(pl)
				if err != nil {
					t.Error(err)
					return
				}
				if i == n/2 {
					badTag = tag
				}
			}
			st.CloseSend()
		}()
		seen := map[uint64]bool{}
		var failed []client.StreamResult
		for r := range st.Results() {
			if seen[r.Tag] {
				t.Fatalf("tag %d twice", r.Tag)
			}
			seen[r.Tag] = true
			if r.Err != nil {
				failed = append(failed, r)
			} else if r.Resp.GetBlocks() != 100 {
				t.Fatalf("result %v", r.Resp)
			}
		}
		if err := st.Err(); err != nil || len(seen) != n {
			t.Fatalf("%d results, stream error %v", len(seen), err)
		}
		if len(failed) != 1 || failed[0].Tag != badTag || status.Code(failed[0].Err) != codes.NotFound {
			t.Fatalf("failures %v (bad tag %d)", failed, badTag)
		}
		p.checkBlocks(ctx, t, a, b)
	})

	t.Run("ping", func(t *testing.T) {
		if err := a.c.Ping(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

func TestPreparedPeerRestart(t *testing.T) {
	a, b := startNode(t, "a"), startNode(t, "b")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := newPreparedSetup(ctx, t, a, b, 100, 128, 11)
	plan, err := a.c.Prepare(ctx, p.tr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plan.Submit(ctx); err != nil {
		t.Fatal(err)
	}
	p.checkBlocks(ctx, t, a, b)
	addr, size := b.d.PeerAddr(), uint64(len(p.dst.Bytes))
	p.dst.Unmap()
	b.stop(t)
	b2 := startNode(t, "b", func(c *daemon.Config) { c.PeerListen = addr })
	dst, err := b2.c.RegisterHost(ctx, size, "dst")
	if err != nil {
		t.Fatal(err)
	}
	_, err = plan.Submit(ctx)
	wantCode(t, err, codes.FailedPrecondition, fmt.Sprintf("plan %d is stale: its peer %s restarted; prepare it again", plan.Handle, addr))
	if bytes.IndexFunc(dst.Bytes, func(r rune) bool { return r != 0 }) >= 0 {
		t.Fatal("a stale plan wrote into the restarted peer's region")
	}
	if err := plan.Release(ctx); err != nil {
		t.Fatal(err)
	}
	release(ctx, t, a.c, p.src)
	release(ctx, t, b2.c, dst)
}

func TestRawSubmitSocket(t *testing.T) {
	var sock string
	a := startNode(t, "a", func(c *daemon.Config) {
		sock = filepath.Join(filepath.Dir(c.Socket), "submit.sock")
		c.SubmitSocket = sock
	})
	b := startNode(t, "b")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := newPreparedSetup(ctx, t, a, b, 1000, 128, 12)
	defer release(ctx, t, b.c, p.dst)
	plan, err := a.c.Prepare(ctx, p.tr)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := client.DialSubmit(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	r := rand.New(rand.NewPCG(5, 5))
	for i := 0; i < 20; i++ {
		fill(p.src.Bytes, func(int) byte { return byte(r.Uint32()) })
		res, err := raw.Submit(plan)
		if err != nil {
			t.Fatalf("submit %d: %v", i, err)
		}
		if res.Blocks != 1000 || res.Bytes != 128000 || res.Wire <= 0 || res.Total < res.Wire {
			t.Fatalf("submit %d: %+v", i, res)
		}
		p.checkBlocks(ctx, t, a, b)
	}
	_, err = raw.Submit(&client.Plan{Handle: plan.Handle ^ 1})
	wantCode(t, err, codes.NotFound, "no such prepared transfer")
	if _, err := raw.Submit(plan); err != nil { // the socket goes on after a refusal
		t.Fatal(err)
	}
	if err := plan.Release(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = raw.Submit(plan)
	wantCode(t, err, codes.NotFound, "no such prepared transfer")
	release(ctx, t, a.c, p.src)
}
