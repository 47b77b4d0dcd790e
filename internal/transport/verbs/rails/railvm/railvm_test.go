// Package railvm holds the two-rail trials of the Soft-RoCE testbed
// (deploy/rdma-testbed/test-rails.sh): they run in VM A against two local
// daemons (one over both rails, one over rxe0 only) and the two-rail daemon
// of VM B. Skipped unless B2B_RAILS_A2 is set.
package railvm

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/client"
	"github.com/b2bd/b2bd/internal/auth"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

type env struct {
	a2, a1     *client.Client // local daemons: two rails, one rail
	a3         *client.Client // optional: two rails with half the QPs each (same QPs in all as a1)
	src3       *client.HostRegion
	b          *client.Client // the remote daemon's API
	peer       string         // the remote daemon's peer address
	a1peer     string
	src2, src1 *client.HostRegion
	dstID      string
	size       uint64
}

const dstName = "rails-dst"

func setup(t *testing.T) *env {
	a2 := os.Getenv("B2B_RAILS_A2")
	if a2 == "" {
		t.Skip("B2B_RAILS_A2 not set: runs in the testbed (deploy/rdma-testbed/test-rails.sh)")
	}
	e := &env{peer: os.Getenv("B2B_RAILS_B_PEER"), size: 96 << 20}
	var err error
	if e.a2, err = client.Dial(a2); err != nil {
		t.Fatal(err)
	}
	if e.a1, err = client.Dial(os.Getenv("B2B_RAILS_A1")); err != nil {
		t.Fatal(err)
	}
	if a3 := os.Getenv("B2B_RAILS_A3"); a3 != "" {
		if e.a3, err = client.Dial(a3); err != nil {
			t.Fatal(err)
		}
	}
	tl, err := auth.LoadPeerTLS(os.Getenv("B2B_E2E_TLS_CERT"), os.Getenv("B2B_E2E_TLS_KEY"), os.Getenv("B2B_E2E_TLS_CA"))
	if err != nil {
		t.Fatal(err)
	}
	if e.b, err = client.Dial(os.Getenv("B2B_RAILS_B_API"), grpc.WithTransportCredentials(credentials.NewTLS(tl.Client)),
		grpc.WithDefaultCallOptions(grpc.WaitForReady(true))); err != nil { // B is reached over eth0, which a trial takes down
		t.Fatal(err)
	}
	ctx := context.Background()
	deadline := time.Now().Add(5 * time.Minute)
	for {
		resp, err := e.b.API().RegisterRegion(ctx, &b2bv1.RegisterRegionRequest{
			Source: &b2bv1.RegisterRegionRequest_HostAlloc{HostAlloc: &b2bv1.HostAlloc{Size: e.size}}, ExportName: dstName})
		if err == nil {
			e.dstID = resp.Region.Id
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("register the destination at B: %v", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	for _, p := range []struct {
		c *client.Client
		r **client.HostRegion
	}{{e.a2, &e.src2}, {e.a1, &e.src1}, {e.a3, &e.src3}} {
		if p.c == nil {
			continue
		}
		r, err := p.c.RegisterHost(ctx, e.size, "")
		if err != nil {
			t.Fatal(err)
		}
		*p.r = r
		fill(r.Bytes)
	}
	t.Cleanup(func() {
		e.b.Deregister(context.Background(), e.dstID)
		e.a2.Close()
		e.a1.Close()
		if e.a3 != nil {
			e.a3.Close()
		}
		e.b.Close()
	})
	return e
}

func fill(b []byte) {
	for i := 0; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], rand.Uint64())
	}
}

// layout is n blocks of l bytes, destinations in reverse order.
func layout(n int, l uint64) (src, dst []uint64) {
	src, dst = make([]uint64, n), make([]uint64, n)
	for i := range src {
		src[i], dst[i] = uint64(i)*l, uint64(n-1-i)*l
	}
	return src, dst
}

// verify compares every block's CRC32C on both sides.
func (e *env) verify(t *testing.T, c *client.Client, srcID string, src, dst []uint64, l uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	a, err := c.Checksum(ctx, srcID, src, nil, l, b2bv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_CRC32C, true)
	if err != nil {
		t.Fatalf("checksum source: %v", err)
	}
	b, err := e.b.Checksum(ctx, e.dstID, dst, nil, l, b2bv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_CRC32C, true)
	if err != nil {
		t.Fatalf("checksum destination: %v", err)
	}
	if len(a.BlockDigests) != len(b.BlockDigests) || len(a.BlockDigests) != 8*len(src) {
		t.Fatalf("digests: %d and %d bytes for %d blocks", len(a.BlockDigests), len(b.BlockDigests), len(src))
	}
	for i := range src {
		if !slices.Equal(a.BlockDigests[8*i:8*i+8], b.BlockDigests[8*i:8*i+8]) {
			t.Fatalf("block %d of %d (%d bytes) differs at the destination", i, len(src), l)
		}
	}
}

func (e *env) send(ctx context.Context, c *client.Client, srcID string, src, dst []uint64, l uint64) (*b2bv1.BatchTransferResponse, error) {
	return c.BatchTransfer(ctx, client.Transfer{SrcRegion: srcID, Peer: e.peer, DstRegion: dstName,
		Blocks: client.Descriptors{Src: src, Dst: dst, BlockLength: l}, Transport: b2bv1.TransportKind_TRANSPORT_KIND_VERBS})
}

func rails(t *testing.T, c *client.Client) []*b2bv1.RailStatus {
	t.Helper()
	st, err := c.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, ts := range st.Transports {
		if ts.Kind == b2bv1.TransportKind_TRANSPORT_KIND_VERBS {
			return ts.Rails
		}
	}
	return nil
}

func logRails(t *testing.T, what string, rs []*b2bv1.RailStatus) {
	for _, r := range rs {
		t.Logf("RAILS %s rail %d %s up=%v sent=%d failovers=%d reconnects=%d last_error=%q detail=%q", what, r.Rail, r.Device, r.Up, r.BytesSent, r.Failovers, r.Reconnects, r.LastError, r.Detail)
	}
}

// link takes a netdev down or up with one ioctl: `ip` would fork and exec
// in a VM whose one vCPU is busy with the batch, and take the wire down
// seconds late (a run saw every pull land after the batch).
func link(t *testing.T, name string, up bool) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		t.Fatalf("SIOCGIFFLAGS %s: %v", name, err)
	}
	fl := ifr.Uint16()
	if up {
		fl |= unix.IFF_UP
	} else {
		fl &^= unix.IFF_UP
	}
	ifr.SetUint16(fl)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		t.Fatalf("SIOCSIFFLAGS %s: %v", name, err)
	}
	state := "down"
	if up {
		state = "up"
	}
	t.Logf("RAILS link %s %s", name, state)
}

// waitUp waits until every rail of c is up again.
func waitUp(t *testing.T, c *client.Client, d time.Duration) {
	t.Helper()
	end := time.Now().Add(d)
	for {
		all := true
		for _, r := range rails(t, c) {
			all = all && r.Up
		}
		if all {
			return
		}
		if time.Now().After(end) {
			logRails(t, "not back", rails(t, c))
			t.Fatalf("rails not all up after %v", d)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func TestRails(t *testing.T) {
	e := setup(t)
	ctx := context.Background()

	t.Run("affinity", func(t *testing.T) {
		regs, err := e.a2.Regions(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range regs {
			if r.Id != e.src2.Id {
				continue
			}
			if len(r.Rails) != 2 {
				t.Fatalf("source region on %d rails: %v", len(r.Rails), r.Rails)
			}
			for _, x := range r.Rails {
				t.Logf("RAILS affinity region %s rail %d %s rkey %#x path %q tier %q preferred %v", r.Id, x.Rail, x.Device, x.Rkey, x.Path, x.Affinity, x.Preferred)
			}
		}
		rs := rails(t, e.a2)
		logRails(t, "status", rs)
		if len(rs) != 2 || !rs[0].Up || !rs[1].Up {
			t.Fatalf("want two rails up: %v", rs)
		}
	})

	t.Run("stripe", func(t *testing.T) {
		before := rails(t, e.a2)
		// Mixed: small blocks whole, big ones cut; every block verified.
		for _, c := range []struct {
			n int
			l uint64
		}{{2000, 4096}, {256, 65536}, {12, 2 << 20}} {
			src, dst := layout(c.n, c.l)
			fill(e.src2.Bytes)
			tc, cancel := context.WithTimeout(ctx, 5*time.Minute)
			resp, err := e.send(tc, e.a2, e.src2.Id, src, dst, c.l)
			cancel()
			if err != nil {
				t.Fatalf("%d x %d: %v", c.n, c.l, err)
			}
			e.verify(t, e.a2, e.src2.Id, src, dst, c.l)
			t.Logf("RAILS stripe %d x %d B: OK, %d WRs, %v, every block verified", c.n, c.l, resp.WorkRequests, time.Duration(resp.ElapsedNs))
		}
		after := rails(t, e.a2)
		logRails(t, "after stripe", after)
		for i := range after {
			if after[i].BytesSent <= before[i].BytesSent {
				t.Fatalf("rail %d carried nothing", i)
			}
		}
	})

	t.Run("pull-one-wire", func(t *testing.T) {
		for attempt := 1; ; attempt++ {
			before := rails(t, e.a2)
			src, dst := layout(int(e.size>>20), 1<<20)
			fill(e.src2.Bytes)
			tc, cancel := context.WithTimeout(ctx, 3*time.Minute)
			done := make(chan error, 1)
			start := time.Now()
			go func() {
				_, err := e.send(tc, e.a2, e.src2.Id, src, dst, 1<<20)
				done <- err
			}()
			time.Sleep(time.Duration(4-attempt) * 250 * time.Millisecond)
			pulledAt := time.Since(start)
			link(t, "eth1", false)
			err := <-done
			cancel()
			el := time.Since(start)
			after := rails(t, e.a2)
			logRails(t, "after pull", after)
			if err != nil {
				link(t, "eth1", true)
				t.Fatalf("batch with one wire pulled: %v (after %v)", err, el)
			}
			e.verify(t, e.a2, e.src2.Id, src, dst, 1<<20)
			moved := after[1].Failovers - before[1].Failovers
			t.Logf("RAILS pull-one-wire attempt %d: eth1 down %v into the batch; %d x 1 MiB OK in %v, every block verified; rail 1 failovers +%d, rail 0 carried %d bytes",
				attempt, pulledAt.Round(time.Millisecond), len(src), el, moved, after[0].BytesSent-before[0].BytesSent)
			link(t, "eth1", true)
			waitUp(t, e.a2, 90*time.Second)
			if moved > 0 {
				break
			}
			if attempt == 3 {
				t.Fatal("the batch finished before the wire was pulled three times")
			}
			t.Logf("RAILS the batch had no share in flight on rail 1 at the pull; again, pulling earlier")
		}
	})

	t.Run("pull-both-wires", func(t *testing.T) {
		src, dst := layout(int(e.size>>20), 1<<20)
		dl := 30 * time.Second
		tc, cancel := context.WithTimeout(ctx, dl)
		defer cancel()
		done := make(chan error, 1)
		start := time.Now()
		go func() {
			_, err := e.send(tc, e.a2, e.src2.Id, src, dst, 1<<20)
			done <- err
		}()
		time.Sleep(300 * time.Millisecond)
		link(t, "eth1", false)
		link(t, "eth0", false)
		err := <-done
		el := time.Since(start)
		link(t, "eth0", true)
		link(t, "eth1", true)
		st, _ := status.FromError(err)
		t.Logf("RAILS pull-both-wires: code %v after %v (deadline %v): %s", st.Code(), el.Round(time.Millisecond), dl, st.Message())
		if err == nil {
			t.Fatal("batch succeeded with both wires pulled")
		}
		if el >= dl {
			t.Fatalf("answered at %v, not before the deadline %v", el, dl)
		}
		waitUp(t, e.a2, 2*time.Minute)
		// The next batch lands again.
		end := time.Now().Add(2 * time.Minute)
		for {
			fill(e.src2.Bytes)
			tc, cancel := context.WithTimeout(ctx, time.Minute)
			_, err := e.send(tc, e.a2, e.src2.Id, src[:16], dst[:16], 1<<20)
			cancel()
			if err == nil {
				break
			}
			if time.Now().After(end) {
				t.Fatalf("no batch lands after the wires came back: %v", err)
			}
			time.Sleep(time.Second)
		}
		e.verify(t, e.a2, e.src2.Id, src[:16], dst[:16], 1<<20)
		t.Logf("RAILS pull-both-wires: recovery batch after the wires came back OK, verified")
	})

	t.Run("sweep", func(t *testing.T) {
		sizes := []uint64{4096, 65536, 262144, 1 << 20, 2 << 20}
		if s := os.Getenv("B2B_RAILS_SIZES"); s != "" {
			sizes = nil
			for _, f := range strings.Split(s, ",") {
				v, err := strconv.ParseUint(f, 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				sizes = append(sizes, v)
			}
		}
		iters := 3
		type row struct {
			Size         uint64  `json:"size"`
			Blocks       int     `json:"blocks"`
			OneRailGBps  float64 `json:"one_rail_gbps"`
			TwoRailsGBps float64 `json:"two_rails_gbps"`
			Ratio        float64 `json:"ratio"`
			// two rails with half the QPs per rail (the same QPs in all as one rail)
			TwoRailsHalfQPsGBps float64 `json:"two_rails_half_qps_gbps,omitempty"`
			RatioHalfQPs        float64 `json:"ratio_half_qps,omitempty"`
		}
		type daemon struct {
			c  *client.Client
			id string
		}
		ds := []daemon{{e.a1, e.src1.Id}, {e.a2, e.src2.Id}}
		if e.a3 != nil {
			ds = append(ds, daemon{e.a3, e.src3.Id})
		}
		var out []row
		for _, l := range sizes {
			n := int(min(uint64(2000), (24<<20)/l))
			src, dst := layout(n, l)
			var best [3]time.Duration
			for it := 0; it < iters; it++ {
				for k, c := range ds {
					tc, cancel := context.WithTimeout(ctx, 5*time.Minute)
					resp, err := e.send(tc, c.c, c.id, src, dst, l)
					cancel()
					if err != nil {
						t.Fatalf("sweep %d x %d on daemon %d: %v", n, l, k, err)
					}
					d := time.Duration(resp.ElapsedNs)
					if best[k] == 0 || d < best[k] {
						best[k] = d
					}
					if it == iters-1 {
						e.verify(t, c.c, c.id, src, dst, l)
					}
				}
			}
			bytes := float64(uint64(n) * l)
			r := row{Size: l, Blocks: n, OneRailGBps: bytes / best[0].Seconds() / 1e9, TwoRailsGBps: bytes / best[1].Seconds() / 1e9}
			r.Ratio = r.TwoRailsGBps / r.OneRailGBps
			if best[2] > 0 {
				r.TwoRailsHalfQPsGBps = bytes / best[2].Seconds() / 1e9
				r.RatioHalfQPs = r.TwoRailsHalfQPsGBps / r.OneRailGBps
			}
			out = append(out, r)
			t.Logf("RAILS sweep size %d blocks %d: one rail %.4f GB/s, two rails %.4f GB/s, ratio %.2fx; two rails half the QPs each %.4f GB/s, ratio %.2fx (best of %d, verified)",
				l, n, r.OneRailGBps, r.TwoRailsGBps, r.Ratio, r.TwoRailsHalfQPsGBps, r.RatioHalfQPs, iters)
		}
		// Small batches: what striping costs or gains where a batch is a
		// few chains (--rdma-stripe-min): 4 KiB blocks, one rail against two.
		for _, n := range []int{4, 16, 64, 256} {
			src, dst := layout(n, 4096)
			var best [2]time.Duration
			for it := 0; it < 5; it++ {
				for k, c := range ds[:2] {
					tc, cancel := context.WithTimeout(ctx, time.Minute)
					resp, err := e.send(tc, c.c, c.id, src, dst, 4096)
					cancel()
					if err != nil {
						t.Fatalf("small batch %d x 4 KiB on daemon %d: %v", n, k, err)
					}
					if d := time.Duration(resp.ElapsedNs); best[k] == 0 || d < best[k] {
						best[k] = d
					}
				}
			}
			t.Logf("RAILS small batch %d x 4 KiB (%d KiB): one rail %v, two rails %v, ratio %.2fx (best of 5)",
				n, n*4, best[0].Round(time.Microsecond), best[1].Round(time.Microsecond), best[0].Seconds()/best[1].Seconds())
		}
		sort.Slice(out, func(i, j int) bool { return out[i].Size < out[j].Size })
		if d := os.Getenv("B2B_OUT"); d != "" {
			b, _ := json.MarshalIndent(out, "", "  ")
			if err := os.WriteFile(filepath.Join(d, "rails-sweep.json"), b, 0o644); err != nil {
				t.Log(err)
			}
		}
		_ = fmt.Sprint
	})
}
