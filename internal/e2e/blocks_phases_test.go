package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/b2bd/b2bd/client"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// TestKVPhases measures TransferBlocks between two in-process daemons on
// loopback, over tcp and local: 160 segments of 8 KiB blocks, in 160
// regions (one per segment, as vLLM's per-layer tensors) and in 1 region,
// 512 random ids of a 1,024-block pool into other random ids. It logs the
// medians of the response's phase timings and the daemon's non-wire time
// (total - wire). It is a measurement, not a check: it runs only with
// B2B_KV_PHASES=1 (it registers 2.6 GiB).
//
//	B2B_KV_PHASES=1 [B2B_KV_BLOCK=64] go test -count=1 -run TestKVPhases -v ./internal/e2e/
func TestKVPhases(t *testing.T) {
	if os.Getenv("B2B_KV_PHASES") == "" {
		t.Skip("a measurement: set B2B_KV_PHASES=1")
	}
	const (
		segs = 160
		pool = 1024
		req  = 512
		runs = 10
	)
	// B2B_KV_BLOCK=64 shrinks the bytes so that fixed costs show.
	block := 8 << 10
	if v, err := strconv.Atoi(os.Getenv("B2B_KV_BLOCK")); err == nil && v > 0 {
		block = v
	}
	a, b := startNode(t, "a", autoTransport), startNode(t, "b", autoTransport)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// register makes the layout over nreg regions (segs/nreg segments each,
	// one after the other in a region).
	register := func(c *client.Client, name string, nreg int, export bool) {
		per := segs / nreg
		var ss []client.Segment
		for r := 0; r < nreg; r++ {
			exp := ""
			if export {
				exp = fmt.Sprintf("%s-r%d", name, r)
			}
			reg, err := c.RegisterHost(ctx, uint64(per*pool*block), exp)
			if err != nil {
				t.Fatal(err)
			}
			fill(reg.Bytes, func(i int) byte { return byte(i*7 + r) })
			for k := 0; k < per; k++ {
				ss = append(ss, client.Segment{RegionID: reg.Id, Offset: uint64(k * pool * block), BlockLen: uint64(block), Stride: uint64(block)})
			}
		}
		le := ""
		if export {
			le = name
		}
		if _, err := c.RegisterLayout(ctx, client.Layout{Name: name, Segments: ss, NumBlocks: pool, Export: le}); err != nil {
			t.Fatal(err)
		}
	}
	rnd := rand.New(rand.NewPCG(23, 160))
	for _, nreg := range []int{160, 1} {
		ln, rn := fmt.Sprintf("src%d", nreg), fmt.Sprintf("dst%d", nreg)
		register(a.c, ln, nreg, false)
		register(b.c, rn, nreg, true)
		for _, kind := range []b2bv1.TransportKind{b2bv1.TransportKind_TRANSPORT_KIND_TCP, b2bv1.TransportKind_TRANSPORT_KIND_LOCAL} {
			var val, res, plan, post, wire, nonwire, total []time.Duration
			for i := 0; i < runs+1; i++ {
				var src, dst []uint32
				for _, p := range rnd.Perm(pool)[:req] {
					src = append(src, uint32(p))
				}
				for _, p := range rnd.Perm(pool)[:req] {
					dst = append(dst, uint32(p))
				}
				resp, err := a.c.TransferBlocks(ctx, client.Blocks{LocalLayout: ln, Peer: b.d.PeerAddr(), RemoteLayout: rn, LocalIDs: src, RemoteIDs: dst, Transport: kind})
				if err != nil {
					t.Fatal(err)
				}
				if i == 0 {
					continue // the first maps, connects and resolves
				}
				ph := resp.GetPhases()
				d := func(ns uint64) time.Duration { return time.Duration(ns) }
				val, res, plan = append(val, d(ph.GetValidateNs())), append(res, d(ph.GetResolveNs())), append(plan, d(ph.GetPlanNs()))
				post, wire, total = append(post, d(ph.GetPostNs())), append(wire, d(ph.GetWireNs())), append(total, d(ph.GetTotalNs()))
				nonwire = append(nonwire, d(ph.GetTotalNs()-ph.GetWireNs()))
			}
			med := func(x []time.Duration) string {
				slices.Sort(x)
				return fmt.Sprintf("%7.1f", float64(x[len(x)/2])/1e3)
			}
			t.Logf("%-5s %3d regions: median µs  validate %s resolve %s plan %s post %s wire %s | non-wire %s total %s",
				kindName(kind), nreg, med(val), med(res), med(plan), med(post), med(wire), med(nonwire), med(total))
		}
	}
}

func kindName(k b2bv1.TransportKind) string {
	if k == b2bv1.TransportKind_TRANSPORT_KIND_TCP {
		return "tcp"
	}
	return "local"
}
