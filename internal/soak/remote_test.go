package soak

import (
	"bytes"
	"context"
	"hash/crc32"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/b2bd/b2bd/client"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

func TestParseFlagsRemote(t *testing.T) {
	tls := []string{"--remote-api", "10.77.0.2:7480", "--tls-cert", "a.pem", "--tls-key", "a-key.pem", "--tls-ca", "ca.pem", "--self", "10.77.0.1"}
	with := func(extra ...string) []string { return append(append([]string{}, tls...), extra...) }
	cases := []struct {
		name string
		args []string
		want []string // substrings of the error; none: no error
	}{
		{"verbs with link flaps", with("--rdma-device", "rxe0", "--netdev", "eth0"), nil},
		{"tcp, no link chaos", with("--transport", "tcp", "--chaos", "kill,worker"), nil},
		{"no certificate", []string{"--remote-api", "h:1", "--self", "x", "--rdma-device", "rxe0", "--chaos", ""}, []string{"--tls-cert", "required"}},
		{"verbs without device", with("--chaos", ""), []string{"--rdma-device"}},
		{"link without netdev", with("--rdma-device", "rxe0"), []string{"--chaos link", "--netdev"}},
		{"freeze the remote", with("--rdma-device", "rxe0", "--chaos", "stop"), []string{`"stop"`, "kill,worker,link"}},
		{"one daemon", with("--rdma-device", "rxe0", "--chaos", "", "--daemons", "1"), []string{"--daemons 1", "2..8"}},
		{"unknown transport", with("--transport", "ud", "--chaos", ""), []string{`"ud"`, "verbs or tcp"}},
		{"bad neighbour", with("--rdma-device", "rxe0", "--netdev", "eth0", "--neigh", "10.77.0.2"), []string{"IP=MAC"}},
		{"link on loopback form", []string{"--chaos", "link"}, []string{`"link"`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := ParseFlags(c.args, &bytes.Buffer{})
			if len(c.want) == 0 {
				if err != nil {
					t.Fatalf("got %v, want no error", err)
				}
				if cfg.Daemons != 2 || cfg.Workers != 4 || cfg.Stable != 1 {
					t.Fatalf("two-host defaults: daemons %d workers %d stable %d, want 2 4 1", cfg.Daemons, cfg.Workers, cfg.Stable)
				}
				return
			}
			if err == nil {
				t.Fatalf("got no error, want one naming %q", c.want)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
		})
	}
}

// fakeRemote is a remote daemon's Checksum over one region "r" held here.
type fakeRemote struct {
	b2bv1.UnimplementedB2BServer
	mu  sync.Mutex
	mem []byte
}

func (f *fakeRemote) Checksum(_ context.Context, req *b2bv1.ChecksumRequest) (*b2bv1.ChecksumResponse, error) {
	if req.GetRegionId() != "r" {
		return nil, status.Errorf(codes.NotFound, "region_id %q: no such region", req.GetRegionId())
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	offs := client.Unpack(req.GetOffsets())
	d := make([]uint64, len(offs))
	for i, o := range offs {
		d[i] = uint64(crc32.Checksum(f.mem[o:o+req.GetBlockLength()], castagnoli))
	}
	return &b2bv1.ChecksumResponse{BlockDigests: client.Pack(d), Blocks: uint64(len(d))}, nil
}

// testRemoteWorker is a two-host worker whose remote daemon is fake.
func testRemoteWorker(t *testing.T) (*rworker, *fakeRemote) {
	t.Helper()
	f := &fakeRemote{mem: make([]byte, regionSize)}
	l := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	b2bv1.RegisterB2BServer(srv, f)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	cb, err := client.Dial("passthrough:///remote", grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return l.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cb.Close() })
	s := &soak{stats: newStats(), sched: newSchedMonitor(), cfg: Config{Remote: Remote{Transport: "verbs"}}}
	w := &rworker{s: s, a: &daemon{name: "a"}, b: &peerHost{name: "remote"}, r: rand.New(rand.NewPCG(1, 2)), fill: rand.NewChaCha8([32]byte{1}),
		cb: cb, remID: "r", loc: &client.HostRegion{Region: &b2bv1.Region{Id: "l"}, Bytes: make([]byte, regionSize)}}
	return w, f
}

// TestRemoteVerify: a DONE push is checked against the remote blocks, a
// DONE pull against the local ones; an OK whose destination does not hold
// the source is a false success, one whose remote destination cannot be
// read is unverified.
func TestRemoteVerify(t *testing.T) {
	cases := []struct {
		name        string
		read        bool
		apply       func(w *rworker, f *fakeRemote, x *rxfer)
		false_, unv uint64
	}{
		{"push landed", false, landRemote, 0, 0},
		{"push not landed", false, func(*rworker, *fakeRemote, *rxfer) {}, 1, 0},
		{"push one byte short", false, func(w *rworker, f *fakeRemote, x *rxfer) { landRemote(w, f, x); f.mem[x.roffs[0]+x.n-1] ^= 1 }, 1, 0},
		{"push, remote region gone", false, func(w *rworker, _ *fakeRemote, _ *rxfer) { w.remID = "gone" }, 0, 1},
		{"pull landed", true, landLocal, 0, 0},
		{"pull not landed", true, func(*rworker, *fakeRemote, *rxfer) {}, 1, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w, f := testRemoteWorker(t)
			_, _ = w.fill.Read(f.mem)
			x := &rxfer{kind: "push", read: c.read}
			if !w.blocks(x) || !w.source(x) {
				t.Fatal("no transfer drawn")
			}
			c.apply(w, f, x)
			w.finish(w.begin(time.Now().Add(time.Second)), x, nil)
			st := w.s.stats
			if st.falseSuccess.Load() != c.false_ || st.unverified.Load() != c.unv {
				t.Fatalf("false successes %d, unverified %d; want %d, %d", st.falseSuccess.Load(), st.unverified.Load(), c.false_, c.unv)
			}
		})
	}
}

// landRemote copies a push's local blocks into the fake remote region.
func landRemote(w *rworker, f *fakeRemote, x *rxfer) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, o := range x.loffs {
		copy(f.mem[x.roffs[i]:x.roffs[i]+x.n], w.loc.Bytes[o:o+x.n])
	}
}

// landLocal copies a pull's remote blocks into the local region.
func landLocal(w *rworker, f *fakeRemote, x *rxfer) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, o := range x.roffs {
		copy(w.loc.Bytes[x.loffs[i]:x.loffs[i]+x.n], f.mem[o:o+x.n])
	}
}

// TestRemoteQuarantine: a cut transfer's destination (remote for a push,
// local for a pull) is snapshotted at the answer; a change before the
// re-check is a late byte, and its slot is not reused meanwhile.
func TestRemoteQuarantine(t *testing.T) {
	cases := []struct {
		name       string
		read, late bool
		want       uint64
	}{
		{"push unchanged", false, false, 0},
		{"push, byte after the answer", false, true, 1},
		{"pull unchanged", true, false, 0},
		{"pull, byte after the answer", true, true, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w, f := testRemoteWorker(t)
			x := &rxfer{kind: "push", read: c.read}
			if !w.blocks(x) || !w.source(x) {
				t.Fatal("no transfer drawn")
			}
			w.finish(w.begin(time.Now().Add(time.Second)), x, status.Error(codes.DeadlineExceeded, "cut"))
			if len(w.quar) != 1 || !w.busy(!c.read, map[bool]int{false: x.rslot, true: x.lslot}[c.read]) {
				t.Fatalf("the cut transfer's blocks are not in quarantine: %+v", w.quar)
			}
			if c.late {
				if c.read {
					landLocal(w, f, x)
				} else {
					landRemote(w, f, x)
				}
			}
			w.checkQuarantine() // not yet due
			if len(w.quar) != 1 {
				t.Fatal("re-checked before its time")
			}
			w.quar[0].until = time.Now()
			w.checkQuarantine()
			if st := w.s.stats; st.lateBytes.Load() != c.want || st.lateChecked.Load() != 1 || len(w.quar) != 0 {
				t.Fatalf("late bytes %d (checked %d, left %d), want %d (1, 0)", st.lateBytes.Load(), st.lateChecked.Load(), len(w.quar), c.want)
			}
		})
	}
}

// TestRemoteDeadlineLinkFlap: the local daemon answers, so a link flap
// during the call does not excuse an answer past its deadline; the own
// daemon's kill does. The remote daemon's answer (its push or pull) is
// excused by a flap, which it crosses, not by its peer's kill.
func TestRemoteDeadlineLinkFlap(t *testing.T) {
	cases := []struct {
		name                  string
		viaRemote             bool
		late                  time.Duration
		flap, own             bool
		clean, link, ocn, ans uint64
	}{
		{"on time", false, 0, false, false, 0, 0, 0, 0},
		{"late", false, 300 * time.Millisecond, false, false, 1, 0, 0, 0},
		{"late, link flapped", false, 300 * time.Millisecond, true, false, 0, 1, 0, 0},
		{"late, own daemon killed", false, 300 * time.Millisecond, false, true, 0, 0, 1, 0},
		{"remote's answer late", true, 300 * time.Millisecond, false, false, 1, 0, 0, 0},
		{"remote's answer late, its peer killed", true, 300 * time.Millisecond, false, true, 0, 1, 0, 0},
		{"remote's answer late across a flap", true, 300 * time.Millisecond, true, false, 0, 0, 0, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w, _ := testRemoteWorker(t)
			x := &rxfer{kind: "pull", read: true, viaRemote: c.viaRemote}
			if !w.blocks(x) || !w.source(x) {
				t.Fatal("no transfer drawn")
			}
			call := w.begin(time.Now().Add(-c.late))
			if c.flap {
				w.b.wireEpoch.Add(1)
			}
			if c.own {
				w.a.beginChaos()
			}
			w.finish(call, x, status.Error(codes.Unavailable, "link down"))
			w.judgeLate(true)
			st := w.s.stats
			if st.overruns.Load() != c.clean || st.overrunsPeerChaos.Load() != c.link || st.overrunsLocalChaos.Load() != c.ocn || st.overrunsAnswerWire.Load() != c.ans {
				t.Fatalf("overruns clean %d, chaos %d, own %d, answer across a flap %d; want %d, %d, %d, %d", st.overruns.Load(), st.overrunsPeerChaos.Load(),
					st.overrunsLocalChaos.Load(), st.overrunsAnswerWire.Load(), c.clean, c.link, c.ocn, c.ans)
			}
		})
	}
}
