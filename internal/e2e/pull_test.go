package e2e

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/client"
	"github.com/b2bd/b2bd/internal/daemon"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// Pulls (docs/pull.md): the caller's daemon reads the peer's
// exported blocks into the caller's region, over tcp and local, with read
// grants (readers), on real daemons.

const opRead = b2bv1.TransferOp_TRANSFER_OP_READ

// pullKinds are the transports pulls run over on one host.
var pullKinds = []struct {
	name string
	kind b2bv1.TransportKind
	cfg  func(*daemon.Config)
}{
	{"tcp", b2bv1.TransportKind_TRANSPORT_KIND_TCP, func(*daemon.Config) {}},
	{"local", b2bv1.TransportKind_TRANSPORT_KIND_LOCAL, autoTransport},
}

// pull copies the blocks of size bytes at remoteOff of the region the peer
// exports as name into localOff of the local region localID.
func pull(ctx context.Context, c *client.Client, localID, peer, name string, localOff, remoteOff []uint64, size uint64, kind b2bv1.TransportKind) (*b2bv1.BatchTransferResponse, error) {
	return c.BatchTransfer(ctx, client.Transfer{SrcRegion: localID, Peer: peer, DstRegion: name, Transport: kind, Op: opRead,
		Blocks: client.Descriptors{Src: localOff, Dst: remoteOff, BlockLength: size}})
}

func TestPullVerified(t *testing.T) {
	for _, k := range pullKinds {
		t.Run(k.name, func(t *testing.T) {
			a, b := startNode(t, "a", k.cfg), startNode(t, "b", k.cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			r := rand.New(rand.NewPCG(24, 1))
			for _, size := range []uint64{128, 4096, 1 << 20} {
				n := 5000
				if size >= 1<<20 {
					n = 24
				}
				localOff, localSize := layout(n, size, r)
				remoteOff, remoteSize := layout(n, size, r)
				local, err := a.c.RegisterHost(ctx, localSize, "")
				if err != nil {
					t.Fatal(err)
				}
				remote, err := b.c.RegisterHost(ctx, remoteSize, "kv", client.Readers("*"))
				if err != nil {
					t.Fatal(err)
				}
				fill(remote.Bytes, func(int) byte { return byte(r.Uint32()) })
				resp, err := pull(ctx, a.c, local.Id, b.d.PeerAddr(), "kv", localOff, remoteOff, size, k.kind)
				if err != nil {
					t.Fatalf("size %d: %v", size, err)
				}
				if resp.Transport != k.kind || resp.Blocks != uint64(n) || resp.Bytes != uint64(n)*size {
					t.Fatalf("size %d: response %v", size, resp)
				}
				sameBlocks(ctx, t, b.c, a.c, remote, local, remoteOff, localOff, size)

				// A prepared pull: planned once, submitted twice, each
				// submit reading what the remote holds then.
				plan, err := a.c.Prepare(ctx, client.Transfer{SrcRegion: local.Id, Peer: b.d.PeerAddr(), DstRegion: "kv", Transport: k.kind, Op: opRead,
					Blocks: client.Descriptors{Src: localOff, Dst: remoteOff, BlockLength: size}})
				if err != nil {
					t.Fatalf("size %d: prepare: %v", size, err)
				}
				for round := 0; round < 2; round++ {
					fill(remote.Bytes, func(int) byte { return byte(r.Uint32()) })
					if _, err := plan.Submit(ctx); err != nil {
						t.Fatalf("size %d: submit %d: %v", size, round, err)
					}
					sameBlocks(ctx, t, b.c, a.c, remote, local, remoteOff, localOff, size)
				}
				if err := plan.Release(ctx); err != nil {
					t.Fatal(err)
				}
				release(ctx, t, a.c, local)
				release(ctx, t, b.c, remote)
			}
		})
	}
}

// TestPullRefusals: the local side is the destination: overlapping local
// ranges are refused naming src_offsets, remote ranges past the peer's
// region naming dst_offsets, both before any byte moves.
func TestPullRefusals(t *testing.T) {
	a, b := startNode(t, "a"), startNode(t, "b")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	local, err := a.c.RegisterHost(ctx, 1<<16, "")
	if err != nil {
		t.Fatal(err)
	}
	remote, err := b.c.RegisterHost(ctx, 1<<16, "kv", client.Readers("*"))
	if err != nil {
		t.Fatal(err)
	}
	fill(remote.Bytes, func(i int) byte { return byte(i) | 1 })
	for _, c := range []struct {
		name              string
		localOff, remote  []uint64
		want              codes.Code
		field             string
		kind              b2bv1.TransportKind
		remoteMayRepeat   bool
		expectLocalChange bool
	}{
		{name: "local ranges overlap", localOff: []uint64{0, 2048}, remote: []uint64{0, 8192}, want: codes.InvalidArgument, field: "src_offsets"},
		{name: "remote past its end", localOff: []uint64{0}, remote: []uint64{1<<16 - 100}, want: codes.InvalidArgument, field: "dst_offsets"},
		{name: "remote ranges may repeat", localOff: []uint64{0, 4096}, remote: []uint64{0, 0}, want: codes.OK, expectLocalChange: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			clear(local.Bytes)
			_, err := pull(ctx, a.c, local.Id, b.d.PeerAddr(), "kv", c.localOff, c.remote, 4096, c.kind)
			if status.Code(err) != c.want {
				t.Fatalf("%v, want %v", err, c.want)
			}
			if c.field != "" && !strings.Contains(status.Convert(err).Message(), c.field) {
				t.Fatalf("%v does not name %s", err, c.field)
			}
			if changed := !bytes.Equal(local.Bytes, make([]byte, len(local.Bytes))); changed != c.expectLocalChange {
				t.Fatalf("local region changed: %v, want %v", changed, c.expectLocalChange)
			}
		})
	}
}

// peerClient dials a daemon's Peer service as another daemon would.
func peerClient(t *testing.T, addr string) b2bv1.PeerClient {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return b2bv1.NewPeerClient(cc)
}

// TestPullTrust: an export without readers refuses pulls with
// PermissionDenied and hands out no key; a read grant's key differs from
// the write key and the write key is never handed to a reader; a
// read-only export refuses writes; narrowing the readers stops a puller
// that resolved before.
func TestPullTrust(t *testing.T) {
	for _, k := range pullKinds {
		t.Run(k.name, func(t *testing.T) {
			a, b := startNode(t, "a", k.cfg), startNode(t, "b", k.cfg)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			offs := strided(16, 4096)
			local, err := a.c.RegisterHost(ctx, 16*4096, "")
			if err != nil {
				t.Fatal(err)
			}
			writeOnly, err := b.c.RegisterHost(ctx, 16*4096, "wo")
			if err != nil {
				t.Fatal(err)
			}
			fill(writeOnly.Bytes, func(i int) byte { return byte(i) | 1 })
			_, err = pull(ctx, a.c, local.Id, b.d.PeerAddr(), "wo", offs, offs, 4096, k.kind)
			if status.Code(err) != codes.PermissionDenied {
				t.Fatalf("pull from a write-only export: %v, want PermissionDenied", err)
			}
			if !bytes.Equal(local.Bytes, make([]byte, len(local.Bytes))) {
				t.Fatal("a refused pull wrote into the local region")
			}
			pc := peerClient(t, b.d.PeerAddr())
			resp, err := pc.ResolveRegion(ctx, &b2bv1.ResolveRegionRequest{Name: "wo", Access: b2bv1.Access_ACCESS_READ})
			if status.Code(err) != codes.PermissionDenied || resp != nil {
				t.Fatalf("resolve for read without a grant: %v, %v; want PermissionDenied and no key", resp, err)
			}
			// The write key and the read key of a readable export differ,
			// and each resolution carries its own only.
			_, err = b.c.RegisterHost(ctx, 16*4096, "rw", client.Readers("*"))
			if err != nil {
				t.Fatal(err)
			}
			wr, err := pc.ResolveRegion(ctx, &b2bv1.ResolveRegionRequest{Name: "rw"})
			if err != nil {
				t.Fatal(err)
			}
			rd, err := pc.ResolveRegion(ctx, &b2bv1.ResolveRegionRequest{Name: "rw", Access: b2bv1.Access_ACCESS_READ})
			if err != nil {
				t.Fatal(err)
			}
			for kind, key := range rd.GetKeys() {
				if bytes.Equal(key, wr.GetKeys()[kind]) {
					t.Fatalf("%s: the read resolution carries the write key", kind)
				}
			}
			// Read-only: a pull works, a write is refused.
			ro, err := b.c.RegisterHost(ctx, 16*4096, "ro", client.Readers("*"), client.ReadOnly())
			if err != nil {
				t.Fatal(err)
			}
			fill(ro.Bytes, func(i int) byte { return byte(i) | 1 })
			if _, err := pull(ctx, a.c, local.Id, b.d.PeerAddr(), "ro", offs, offs, 4096, k.kind); err != nil {
				t.Fatalf("pull from a read-only export: %v", err)
			}
			sameBlocks(ctx, t, b.c, a.c, ro, local, offs, offs, 4096)
			clear(local.Bytes)
			_, err = a.c.BatchTransfer(ctx, client.Transfer{SrcRegion: local.Id, Peer: b.d.PeerAddr(), DstRegion: "ro", Transport: k.kind,
				Blocks: client.Descriptors{Src: offs, Dst: offs, BlockLength: 4096}})
			if status.Code(err) != codes.PermissionDenied {
				t.Fatalf("write into a read-only export: %v, want PermissionDenied", err)
			}
			if ro.Bytes[0] != 1 {
				t.Fatal("a refused write changed the read-only export")
			}
			// Narrowing: the readers drop to one named peer that is not a
			// (unauthenticated here): a resolved read key stops working and
			// a fresh resolution is refused.
			if _, err := b.c.API().ExportRegion(ctx, &b2bv1.ExportRegionRequest{RegionId: ro.Id, ExportName: "ro", Readers: []string{"someone-else"}, ReadOnly: true}); err != nil {
				t.Fatal(err)
			}
			clear(local.Bytes)
			_, err = pull(ctx, a.c, local.Id, b.d.PeerAddr(), "ro", offs, offs, 4096, k.kind)
			if status.Code(err) != codes.PermissionDenied {
				t.Fatalf("pull after the readers narrowed: %v, want PermissionDenied", err)
			}
			if !bytes.Equal(local.Bytes, make([]byte, len(local.Bytes))) {
				t.Fatal("a pull after the readers narrowed wrote into the local region")
			}
		})
	}
}

// TestPullFaults: the remote region deregistered, its export withdrawn, or
// its file truncated while pulls run: each pull either succeeded with every
// byte, or failed with a code and a message naming the remote region; both
// daemons live on and serve the next pull.
func TestPullFaults(t *testing.T) {
	for _, k := range pullKinds {
		for _, fault := range pullFaults {
			t.Run(k.name+"/"+fault, func(t *testing.T) {
				a, b := startNode(t, "a", k.cfg), startNode(t, "b", k.cfg)
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				const n, size = 256, 16 << 10
				offs := reversed(n, size)
				local, err := a.c.RegisterHost(ctx, n*size, "")
				if err != nil {
					t.Fatal(err)
				}
				remote, err := b.c.RegisterHost(ctx, n*size, "victim", client.Readers("*"))
				if err != nil {
					t.Fatal(err)
				}
				want := bytes.Repeat([]byte{0x5a}, n*size)
				copy(remote.Bytes, want)
				path := remote.GetShmPath()
				remote.Unmap() // this process must not fault on a truncated file
				if _, err := pull(ctx, a.c, local.Id, b.d.PeerAddr(), "victim", offs, offs, size, k.kind); err != nil {
					t.Fatalf("warm-up: %v", err)
				}
				// Pulls in a loop while the fault is made; the first failure ends it.
				errc := make(chan error, 1)
				go func() {
					for i := 0; i < 2000; i++ {
						clear(local.Bytes)
						if _, err := pull(ctx, a.c, local.Id, b.d.PeerAddr(), "victim", offs, offs, size, k.kind); err != nil {
							errc <- err
							return
						}
						if !bytes.Equal(local.Bytes, want) {
							errc <- fmt.Errorf("pull %d succeeded but the local region does not hold the remote's bytes", i)
							return
						}
					}
					errc <- nil
				}()
				makePullFault(ctx, t, b.c, remote.Id, path, fault)
				err = <-errc
				if err == nil {
					t.Fatal("2000 pulls succeeded after the fault")
				}
				faultedPull(t, err, `"victim"`)
				if fault == "file truncated" && status.Code(err) != codes.DataLoss {
					t.Fatalf("pull from a truncated source: %v, want DataLoss", err)
				}
				t.Logf("%s: %v", fault, err)
				// Both daemons live on: a fresh export pulls fine.
				other, err := b.c.RegisterHost(ctx, n*size, "other", client.Readers("*"))
				if err != nil {
					t.Fatalf("daemon b after the fault: %v", err)
				}
				fill(other.Bytes, func(i int) byte { return byte(i) | 1 })
				if _, err := pull(ctx, a.c, local.Id, b.d.PeerAddr(), "other", offs, offs, size, k.kind); err != nil {
					t.Fatalf("pull after the fault: %v", err)
				}
				sameBlocks(ctx, t, b.c, a.c, other, local, offs, offs, size)
			})
		}
	}
}

// differingBlock is the index of the first block of size bytes at
// gotOff[i] of got that differs from the one at wantOff[i] of want; -1
// when none does.
func differingBlock(got []byte, gotOff []uint64, want []byte, wantOff []uint64, size uint64) int {
	for i := range gotOff {
		if !bytes.Equal(got[gotOff[i]:gotOff[i]+size], want[wantOff[i]:wantOff[i]+size]) {
			return i
		}
	}
	return -1
}

// pullFaults are what TestPullFaults and TestRemotePullFaults do to an
// exported region while pulls from it run.
var pullFaults = []string{"deregistered", "export withdrawn", "file truncated"}

// makePullFault does fault to region id (its file at path) of c's daemon.
func makePullFault(ctx context.Context, t *testing.T, c *client.Client, id, path, fault string) {
	t.Helper()
	switch fault {
	case "deregistered":
		// Refused while a pull holds it: retried until it goes.
		for {
			err := c.Deregister(ctx, id)
			if err == nil {
				break
			}
			if status.Code(err) != codes.FailedPrecondition {
				t.Fatalf("deregister: %v", err)
			}
		}
	case "export withdrawn":
		if err := c.Export(ctx, id, ""); err != nil {
			t.Fatal(err)
		}
	case "file truncated":
		if err := os.Truncate(path, 0); err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatalf("unknown fault %q", fault)
	}
}

// faultedPull fails t unless err, a pull's failure after a fault, carries
// a gRPC code and names the remote region (its message holds name).
func faultedPull(t *testing.T, err error, name string) {
	t.Helper()
	switch code := status.Code(err); {
	case code == codes.Unknown || code == codes.OK:
		t.Fatalf("pull after the fault: %v", err)
	case !strings.Contains(err.Error(), name):
		t.Fatalf("the failure does not name the remote region %s: %v", name, err)
	}
}

// TestPullDeadline: a pull cut off by its deadline answers DeadlineExceeded,
// one cut off by its caller's cancel answers Canceled, each the daemon's
// answer (sent once the transfer stopped, and saying so), and no byte of
// the caller's region changes in the 2 s after. The cuts are fractions of
// a whole pull's time measured here, the cancel timed from the moment the
// call went out; a deadline that passed before the call could go (a
// loaded host) is answered by the client, and then no byte may land at all.
func TestPullDeadline(t *testing.T) {
	for _, k := range pullKinds {
		t.Run(k.name, func(t *testing.T) {
			a, b := startNode(t, "a", k.cfg), startNode(t, "b", k.cfg)
			c, w := dialWatched(t, a.d.APIAddr())
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			const n, size = 128, 1 << 20
			offs := strided(n, size)
			local, err := c.RegisterHost(ctx, n*size, "")
			if err != nil {
				t.Fatal(err)
			}
			remote, err := b.c.RegisterHost(ctx, n*size, "big", client.Readers("*"))
			if err != nil {
				t.Fatal(err)
			}
			fill(remote.Bytes, func(i int) byte { return byte(i>>12) | 1 })
			if _, err := pull(ctx, c, local.Id, b.d.PeerAddr(), "big", offs[:1], offs[:1], size, k.kind); err != nil {
				t.Fatalf("warm-up: %v", err)
			}
			// A whole pull's time: the faster of two, the first paying for
			// the local region's first touch.
			whole := time.Hour
			for range 2 {
				clear(local.Bytes)
				start := time.Now()
				if _, err := pull(ctx, c, local.Id, b.d.PeerAddr(), "big", offs, offs, size, k.kind); err != nil {
					t.Fatalf("whole pull: %v", err)
				}
				whole = min(whole, time.Since(start))
				if !bytes.Equal(local.Bytes, remote.Bytes) {
					t.Fatal("the whole pull did not bring the remote's bytes")
				}
			}
			for _, how := range pullCuts {
				t.Run(how.name, func(t *testing.T) {
					// Down to 1/32: a pull's time varies with the load, and
					// one that beats its cut costs nothing; two cuts do.
					cut := 0
					for _, frac := range []time.Duration{32, 16, 8, 4, 2} {
						if cut == 2 {
							break
						}
						d := whole / frac
						clear(local.Bytes)
						sent, err := w.cut(ctx, how, d, func(ctx context.Context) error {
							_, err := pull(ctx, c, local.Id, b.d.PeerAddr(), "big", offs, offs, size, k.kind)
							return err
						})
						if err == nil {
							continue // the whole pull beat this cut
						}
						snap := bytes.Clone(local.Bytes)
						if sent {
							how.check(t, d, err)
							cut++
						} else if status.Code(err) != how.code || !bytes.Equal(snap, make([]byte, len(snap))) {
							t.Fatalf("%s %v passed before the call went out: %v, and %v bytes landed; want %v and none",
								how.name, d, err, len(snap)-bytes.Count(snap, []byte{0}), how.code)
						} else {
							t.Logf("%s %v passed before the call went out (a slow host): the client's own answer, no byte landed", how.name, d)
						}
						time.Sleep(2 * time.Second) // the window the contract names, not a synchronisation
						if !bytes.Equal(snap, local.Bytes) {
							t.Fatalf("%s %v: bytes of the caller's region changed after the pull answered", how.name, d)
						}
					}
					if cut == 0 {
						t.Skipf("no pull of 128 MiB (whole: %v) was cut by its %s while the daemon had it: this host could not create the condition", whole, how.name)
					}
				})
			}
		})
	}
}

// pullCut is one way a pull's caller cuts it short: its deadline, or its
// cancel (sendWatch.cut).
type pullCut struct {
	name string
	code codes.Code
}

var (
	deadlineCut = pullCut{"deadline", codes.DeadlineExceeded}
	cancelCut   = pullCut{"cancel", codes.Canceled}
	pullCuts    = []pullCut{deadlineCut, cancelCut}
)

// check fails t unless err is the daemon's answer to this cut: its code,
// and its word that the transfer stopped before the answer (the client's
// own answer would come at once, whatever the data path was doing).
func (c pullCut) check(t *testing.T, d time.Duration, err error) {
	t.Helper()
	if st := status.Convert(err); st.Code() != c.code || !strings.Contains(st.Message(), "the transfer stopped before this answer") {
		t.Fatalf("%s %v: %v, want the daemon's %v saying the transfer stopped before it", c.name, d, err, c.code)
	}
}

// TestPullPeerKilled: kill -9 of the serving daemon mid-pull fails the
// pull with Unavailable or Aborted within 1 s of the kill (plus the
// host's timing margin), or it succeeded before the kill with every byte.
func TestPullPeerKilled(t *testing.T) {
	bin := buildDaemon(t)
	a, b := startProc(t, bin, "a"), startProc(t, bin, "b")
	ctx := context.Background()
	ca, cb := dialSock(t, a.sock), dialSock(t, b.sock)
	const n, size = 256, 1 << 20
	offs := reversed(n, size)
	local, err := ca.RegisterHost(ctx, n*size, "")
	if err != nil {
		t.Fatal(err)
	}
	remote, err := cb.RegisterHost(ctx, n*size, "src", client.Readers("*"))
	if err != nil {
		t.Fatal(err)
	}
	fill(remote.Bytes, func(i int) byte { return byte(i>>10) | 1 })
	want := bytes.Clone(remote.Bytes)
	remote.Unmap()
	xfer := func() error {
		c, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err := pull(c, ca, local.Id, b.peer, "src", offs, offs, size, b2bv1.TransportKind_TRANSPORT_KIND_TCP)
		return err
	}
	if err := xfer(); err != nil {
		t.Fatalf("warm-up: %v", err)
	}
	margin := timeMargin(t)
	clear(local.Bytes)
	errc := make(chan error, 1)
	go func() { errc <- xfer() }()
	time.Sleep(2 * time.Millisecond) // the point of the kill, not a synchronisation
	_ = b.cmd.Process.Kill()
	_ = b.cmd.Wait()
	killed := time.Now()
	err = <-errc
	detect := time.Since(killed)
	switch code := status.Code(err); {
	case err == nil:
		if !bytes.Equal(local.Bytes, want) {
			t.Fatal("success reported but the local region does not hold the remote's bytes")
		}
	case code != codes.Unavailable && code != codes.Aborted:
		t.Fatalf("%v, want Unavailable or Aborted", err)
	case detect > time.Second+margin:
		t.Fatalf("the failure came %v after the kill (bound 1 s + margin %v)", detect, margin)
	}
	t.Logf("outcome %v after %v", status.Code(err), detect)
}

// TestPullLoad: 32 clients x 200 pulls, each verified, with 0 failures;
// then both daemons' goroutines, descriptors and regions go back to the
// baseline.
func TestPullLoad(t *testing.T) {
	a, b := startNode(t, "a"), startNode(t, "b")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const clients, pulls, n, size = 32, 200, 16, 4096
	remote, err := b.c.RegisterHost(ctx, n*size, "shared", client.Readers("*"))
	if err != nil {
		t.Fatal(err)
	}
	fill(remote.Bytes, func(i int) byte { return byte(i*7) | 1 })
	offs := strided(n, size)
	// Warm: the peer is connected, so the baseline counts its data path.
	warm, err := a.c.RegisterHost(ctx, n*size, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pull(ctx, a.c, warm.Id, b.d.PeerAddr(), "shared", offs, offs, size, 0); err != nil {
		t.Fatal(err)
	}
	release(ctx, t, a.c, warm)
	baseA, baseB := settled(t, "a", a.c), settled(t, "b", b.c)
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for ci := 0; ci < clients; ci++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := client.Dial(a.d.APIAddr())
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			local, err := c.RegisterHost(ctx, n*size, "")
			if err != nil {
				errs <- err
				return
			}
			defer func() {
				local.Unmap()
				if err := c.Deregister(ctx, local.Id); err != nil {
					errs <- err
				}
			}()
			for i := 0; i < pulls; i++ {
				clear(local.Bytes)
				rev := reversed(n, size)
				if _, err := pull(ctx, c, local.Id, b.d.PeerAddr(), "shared", rev, offs, size, 0); err != nil {
					errs <- fmt.Errorf("client %d pull %d: %w", ci, i, err)
					return
				}
				if j := differingBlock(local.Bytes, rev, remote.Bytes, offs, size); j >= 0 {
					errs <- fmt.Errorf("client %d pull %d: block %d differs", ci, i, j)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// Back at the baseline (the clients' leased regions go with their
	// connections): polled, bounded.
	noGrowth(t, "a", a.c, baseA)
	noGrowth(t, "b", b.c, baseB)
}

// TestPullBlocks: TransferBlocks with op READ copies block remote_ids[i] of
// every segment of the peer's layout into block local_ids[i] of ours;
// remote ids may repeat, local ids may not; a layout without readers
// refuses with PermissionDenied.
func TestPullBlocks(t *testing.T) {
	for _, k := range pullKinds {
		t.Run(k.name, func(t *testing.T) {
			a, b := startNode(t, "a", k.cfg), startNode(t, "b", k.cfg)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var remote kvSide
			var segs []client.Segment
			for i := 0; i < kvSegments; i++ {
				r, err := b.c.RegisterHost(ctx, kvPool*kvBlock, fmt.Sprintf("prefill%d", i), client.Readers("*"))
				if err != nil {
					t.Fatal(err)
				}
				fill(r.Bytes, func(j int) byte { return byte(j>>12) ^ byte(i*31) | 1 })
				remote.regions = append(remote.regions, r)
				segs = append(segs, client.Segment{RegionID: r.Id, BlockLen: kvBlock, Stride: kvBlock})
			}
			if _, err := b.c.RegisterLayout(ctx, client.Layout{Name: "prefill", Segments: segs, NumBlocks: kvPool, Export: "prefill", Readers: []string{"*"}}); err != nil {
				t.Fatal(err)
			}
			if _, err := b.c.RegisterLayout(ctx, client.Layout{Name: "wo", Segments: segs, NumBlocks: kvPool, Export: "wo"}); err != nil {
				t.Fatal(err)
			}
			local := registerKV(ctx, t, a.c, "", false, "decode", "", func(int) byte { return kvUntouch })
			r := rand.New(rand.NewPCG(24, 9))
			localIDs, remoteIDs := kvIDs(r, 64)
			remoteIDs[1] = remoteIDs[0] // a remote block read into two local ones
			_, err := a.c.TransferBlocks(ctx, client.Blocks{LocalLayout: "decode", Peer: b.d.PeerAddr(), RemoteLayout: "prefill",
				LocalIDs: localIDs, RemoteIDs: remoteIDs, Transport: k.kind, Op: opRead})
			if err != nil {
				t.Fatal(err)
			}
			checkKV(t, remote, local, remoteIDs, localIDs)
			dup := append([]uint32(nil), localIDs...)
			dup[1] = dup[0]
			_, err = a.c.TransferBlocks(ctx, client.Blocks{LocalLayout: "decode", Peer: b.d.PeerAddr(), RemoteLayout: "prefill",
				LocalIDs: dup, RemoteIDs: remoteIDs, Transport: k.kind, Op: opRead})
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "local_ids") {
				t.Fatalf("repeated local ids: %v, want InvalidArgument naming local_ids", err)
			}
			_, err = a.c.TransferBlocks(ctx, client.Blocks{LocalLayout: "decode", Peer: b.d.PeerAddr(), RemoteLayout: "wo",
				LocalIDs: localIDs, RemoteIDs: remoteIDs, Transport: k.kind, Op: opRead})
			if status.Code(err) != codes.PermissionDenied {
				t.Fatalf("pull from a layout without readers: %v, want PermissionDenied", err)
			}
		})
	}
}
