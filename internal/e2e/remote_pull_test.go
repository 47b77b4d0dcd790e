package e2e

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/client"
	"github.com/b2bd/b2bd/internal/checksum"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// Pulls over verbs between two hosts: the twins of
// TestPullTrust, TestPullDeadline, TestPullFaults, TestPullPeerKilled and
// TestPullLoad, run by test-rdma-vm.sh in VM B with a real daemon in each VM
// (remoteClients: B's daemon is "src", the caller; A's is "dst", the serving
// side, over its API with mutual TLS). Every pulled block is verified.

const verbsKind = b2bv1.TransportKind_TRANSPORT_KIND_VERBS

// seededExport registers size bytes on the remote daemon exported as name
// (writable, readable by readers) and pushes seed's bytes into it from a
// region mapped here, so this process knows what the remote holds.
func seededExport(ctx context.Context, t *testing.T, src, dst *client.Client, peer, name string, size uint64, readers []string, seedFill func(int) byte) (seed *client.HostRegion, remoteID string) {
	t.Helper()
	seed, err := src.RegisterHost(ctx, size, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { seed.Unmap(); _ = src.Deregister(context.Background(), seed.Id) })
	fill(seed.Bytes, seedFill)
	resp, err := dst.API().RegisterRegion(ctx, &b2bv1.RegisterRegionRequest{
		Source:     &b2bv1.RegisterRegionRequest_HostAlloc{HostAlloc: &b2bv1.HostAlloc{Size: size}},
		ExportName: name, Readers: readers})
	if err != nil {
		t.Fatal(err)
	}
	remoteID = resp.Region.Id
	t.Cleanup(func() { _ = dst.Deregister(context.Background(), remoteID) })
	const chunk = 64 << 10
	offs := strided(int(size/chunk), chunk)
	if _, err := src.BatchTransfer(ctx, client.Transfer{SrcRegion: seed.Id, Peer: peer, DstRegion: name, Transport: verbsKind,
		Blocks: client.Descriptors{Src: offs, Dst: offs, BlockLength: chunk}}); err != nil {
		t.Fatalf("seed %s: %v", name, err)
	}
	return seed, remoteID
}

// pulledSame checks, through both daemons' Checksum, that the local
// blocks hold the remote's: block i of size bytes at localOff[i] in localID
// (on lc) equals the one at remoteOff[i] in remoteID (on rc).
func pulledSame(ctx context.Context, t *testing.T, lc *client.Client, localID string, localOff []uint64, rc *client.Client, remoteID string, remoteOff []uint64, size uint64) {
	t.Helper()
	want := blockDigests(ctx, t, rc, remoteID, remoteOff, size)
	got := blockDigests(ctx, t, lc, localID, localOff, size)
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("pulled block %d (local %d, remote %d, %d B) differs", i, localOff[i], remoteOff[i], size)
		}
	}
}

func blockDigests(ctx context.Context, t *testing.T, c *client.Client, id string, offs []uint64, size uint64) []uint64 {
	t.Helper()
	cs, err := c.Checksum(ctx, id, offs, nil, size, b2bv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_CRC32C, true)
	if err != nil {
		t.Fatalf("checksum of %s: %v", id, err)
	}
	return client.Unpack(cs.BlockDigests)
}

// pullVerbs pulls over verbs and checks that it went over verbs.
func pullVerbs(ctx context.Context, c *client.Client, localID, peer, name string, localOff, remoteOff []uint64, size uint64) error {
	resp, err := pull(ctx, c, localID, peer, name, localOff, remoteOff, size, verbsKind)
	if err == nil && resp.Transport != verbsKind {
		return fmt.Errorf("the pull went over %v, want verbs", resp.Transport)
	}
	return err
}

// TestRemotePullTrust: over verbs between the VMs, an export without a read
// grant refuses pulls with PermissionDenied and its daemon hands this peer
// no key; a readable export's read key differs from its write key; a grant
// naming this peer's certificate identity lets it pull a read-only export,
// which refuses writes; narrowing the readers stops the pulls.
func TestRemotePullTrust(t *testing.T) {
	src, dst, peer := remoteClients(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const n, size = 16, 4096
	offs := strided(n, size)
	local, err := src.RegisterHost(ctx, n*size, "")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { local.Unmap(); _ = src.Deregister(context.Background(), local.Id) }()
	untouched := func(what string) {
		t.Helper()
		if !bytes.Equal(local.Bytes, make([]byte, len(local.Bytes))) {
			t.Fatalf("%s wrote into the local region", what)
		}
	}

	_, _ = seededExport(ctx, t, src, dst, peer, "e2e-pull-wo", n*size, nil, func(i int) byte { return byte(i) | 1 })
	err = pullVerbs(ctx, src, local.Id, peer, "e2e-pull-wo", offs, offs, size)
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("pull from a write-only export: %v, want PermissionDenied", err)
	}
	untouched("a refused pull")

	// The remote daemon's Peer service, dialled as a daemon would (this
	// VM's certificate): no read grant, no key.
	cc, err := grpc.NewClient(peer, remoteDialOpts(t)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	pc := b2bv1.NewPeerClient(cc)
	resp, err := pc.ResolveRegion(ctx, &b2bv1.ResolveRegionRequest{Name: "e2e-pull-wo", Access: b2bv1.Access_ACCESS_READ})
	if status.Code(err) != codes.PermissionDenied || resp != nil {
		t.Fatalf("resolve for read without a grant: %v, %v; want PermissionDenied and no key", resp, err)
	}

	// A readable, writable export: the read resolution carries another key
	// than the write resolution, for every kind (verbs: another MR's rkey).
	_, _ = seededExport(ctx, t, src, dst, peer, "e2e-pull-rw", n*size, []string{"*"}, func(i int) byte { return byte(i) })
	wr, err := pc.ResolveRegion(ctx, &b2bv1.ResolveRegionRequest{Name: "e2e-pull-rw"})
	if err != nil {
		t.Fatal(err)
	}
	rd, err := pc.ResolveRegion(ctx, &b2bv1.ResolveRegionRequest{Name: "e2e-pull-rw", Access: b2bv1.Access_ACCESS_READ})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := rd.GetKeys()["verbs"]; !ok {
		t.Fatalf("the read resolution has no verbs key: kinds %v", keysOf(rd.GetKeys()))
	}
	for kind, key := range rd.GetKeys() {
		if bytes.Equal(key, wr.GetKeys()[kind]) {
			t.Fatalf("%s: the read resolution carries the write key", kind)
		}
	}

	// Read-only, readable by this VM's identity only ("b", its certificate's).
	_, roID := seededExport(ctx, t, src, dst, peer, "e2e-pull-ro", n*size, nil, func(i int) byte { return byte(i>>4) | 1 })
	if _, err := dst.API().ExportRegion(ctx, &b2bv1.ExportRegionRequest{RegionId: roID, ExportName: "e2e-pull-ro", Readers: []string{remoteIdentity()}, ReadOnly: true}); err != nil {
		t.Fatal(err)
	}
	rev := reversed(n, size)
	if err := pullVerbs(ctx, src, local.Id, peer, "e2e-pull-ro", rev, offs, size); err != nil {
		t.Fatalf("pull from a read-only export granted to %q: %v", remoteIdentity(), err)
	}
	pulledSame(ctx, t, src, local.Id, rev, dst, roID, offs, size)
	_, err = src.BatchTransfer(ctx, client.Transfer{SrcRegion: local.Id, Peer: peer, DstRegion: "e2e-pull-ro", Transport: verbsKind,
		Blocks: client.Descriptors{Src: offs, Dst: offs, BlockLength: size}})
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("write into a read-only export: %v, want PermissionDenied", err)
	}
	// Narrowed to another identity: the resolved read key is retired and a
	// fresh resolution is refused.
	if _, err := dst.API().ExportRegion(ctx, &b2bv1.ExportRegionRequest{RegionId: roID, ExportName: "e2e-pull-ro", Readers: []string{"someone-else"}, ReadOnly: true}); err != nil {
		t.Fatal(err)
	}
	clear(local.Bytes)
	err = pullVerbs(ctx, src, local.Id, peer, "e2e-pull-ro", offs, offs, size)
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("pull after the readers narrowed: %v, want PermissionDenied", err)
	}
	untouched("a pull after the readers narrowed")
}

// remoteIdentity is this VM's certificate identity (certs.sh names it).
func remoteIdentity() string {
	if v := os.Getenv("B2B_E2E_IDENTITY"); v != "" {
		return v
	}
	return "b"
}

func keysOf(m map[string][]byte) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

// TestRemotePullDeadline: a verbs pull cut off by its deadline answers
// DeadlineExceeded, one cut off by its caller's cancel answers Canceled
// (pullCuts: each the daemon's answer), and no byte of the caller's region
// changes in the 2 s after the answer. Cuts are fractions of a whole pull's
// time here, so at least one cut lands part of the batch: the cut is
// mid-pull.
func TestRemotePullDeadline(t *testing.T) {
	src, dst, peer := remoteClients(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const n, size = 64, 256 << 10 // 16 MiB: half a second or more over the emulated wire
	offs := strided(n, size)
	seed, remoteID := seededExport(ctx, t, src, dst, peer, "e2e-pull-deadline", n*size, []string{"*"}, func(i int) byte { return byte(i>>12) | 1 })
	// Pulls go through a watched client, so that each cancel is timed from
	// the moment its call went out; the local region is that client's.
	wc, w := dialWatched(t, os.Getenv("B2B_E2E_SRC_API"))
	local, err := wc.RegisterHost(ctx, n*size, "")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { local.Unmap(); _ = wc.Deregister(context.Background(), local.Id) }()
	start := time.Now()
	if err := pullVerbs(ctx, wc, local.Id, peer, "e2e-pull-deadline", offs, offs, size); err != nil {
		t.Fatalf("whole pull: %v", err)
	}
	whole := time.Since(start)
	if !bytes.Equal(local.Bytes, seed.Bytes) {
		t.Fatal("the whole pull did not bring the remote's bytes")
	}
	var notCreated []string
	for _, how := range pullCuts {
		cut, mid := 0, 0
		for _, frac := range []int{8, 4, 2} {
			// A late answer is tried again, up to 3 times in all: a VM on a
			// loaded host stalls now and then, while a daemon that waits on
			// the READs is late every time. Every lateness is logged.
			for attempt := 1; ; attempt++ {
				d := whole / time.Duration(frac)
				// A cut pull's connection is rebuilt for the next one: a one-block
				// pull first, so that the cut falls in this pull's READs rather
				// than in the new connection's set-up.
				if err := pullVerbs(ctx, wc, local.Id, peer, "e2e-pull-deadline", offs[:1], offs[:1], size); err != nil {
					t.Fatalf("warm-up pull before the %s %v cut: %v", how.name, d, err)
				}
				clear(local.Bytes)
				margin := answerMargin(ctx, t, wc)
				stalls := watchStalls()
				called := time.Now()
				sent, err := w.cut(ctx, how, d, func(ctx context.Context) error {
					return pullVerbs(ctx, wc, local.Id, peer, "e2e-pull-deadline", offs, offs, size)
				})
				took := time.Since(called)
				margin += stalls()
				if err == nil {
					if !bytes.Equal(local.Bytes, seed.Bytes) {
						t.Fatalf("%s %v: success but the local region does not hold the remote's bytes", how.name, d)
					}
					break
				}
				if !sent {
					if snap := bytes.Clone(local.Bytes); status.Code(err) != how.code || !bytes.Equal(snap, make([]byte, len(snap))) {
						t.Fatalf("%s %v passed before the call went out: %v; want %v and no byte landed", how.name, d, err, how.code)
					}
					t.Logf("%s %v passed before the call went out (a slow host): the client's own answer, no byte landed", how.name, d)
					break
				}
				how.check(t, d, err)
				cut++
				snap := bytes.Clone(local.Bytes)
				// The cut READs target this caller's own memory: the daemon fences
				// them locally and answers, without waiting for them.
				budget := pullStopBudget
				if how.code == codes.Canceled {
					budget = pullCancelBudget
				}
				late := ""
				if limit := d + budget + margin; took > limit {
					late = fmt.Sprintf("%s %v: answered %v after the call, past the cut + %v + %v (this VM's scheduling and API delay, measured before and during the call)",
						how.name, d, took.Round(time.Millisecond), budget, margin.Round(time.Millisecond))
				}
				landed := 0
				for i := range n {
					if bytes.Equal(snap[offs[i]:offs[i]+size], seed.Bytes[offs[i]:offs[i]+size]) {
						landed++
					}
				}
				if landed > 0 || !bytes.Equal(snap, make([]byte, len(snap))) {
					mid++
				}
				// The window the contract names, watched every millisecond so that a
				// failure says when bytes landed after the answer, and how many.
				if first, last, changed := watchChanges(snap, local.Bytes, 2*time.Second); changed > 0 {
					t.Fatalf("%s %v (answered %v after the call): %d bytes of the caller's region changed after the answer, the first %v and the last %v after it",
						how.name, d, took.Round(time.Millisecond), changed, first, last)
				}
				t.Logf("%s %v (whole pull %v): %v %v after the call (%v past the cut; margin %v), %d of %d blocks whole at the answer, 0 bytes changed in the 2 s after",
					how.name, d, whole.Round(time.Millisecond), how.code, took.Round(time.Millisecond), (took - d).Round(time.Millisecond),
					margin.Round(time.Millisecond), landed, n)
				if late == "" {
					break
				}
				if attempt == 3 {
					t.Errorf("late on all %d attempts; the last: %s", attempt, late)
					break
				}
				t.Logf("attempt %d: %s; trying again", attempt, late)
			}
		}
		if cut == 0 || mid == 0 {
			notCreated = append(notCreated, fmt.Sprintf("%s: %d pulls cut by the daemon, %d of them mid-pull (some bytes landed)", how.name, cut, mid))
		}
	}
	// The daemons serve on: a whole pull, verified.
	clear(local.Bytes)
	rev := reversed(n, size)
	if err := pullVerbs(ctx, wc, local.Id, peer, "e2e-pull-deadline", rev, offs, size); err != nil {
		t.Fatalf("pull after the cuts: %v", err)
	}
	pulledSame(ctx, t, wc, local.Id, rev, dst, remoteID, offs, size)
	if len(notCreated) > 0 {
		t.Skipf("this host could not create the condition (whole pull %v): %s", whole, strings.Join(notCreated, "; "))
	}
}

// pullStopBudget is how long after its deadline a verbs pull may answer,
// beyond the machine's own delays (answerMargin, watchStalls). A cancel
// reaches the daemon as a stream reset the daemon does not time itself,
// which a stalled VM delivers late: pullCancelBudget.
const (
	pullStopBudget   = 100 * time.Millisecond
	pullCancelBudget = time.Second
)

// answerMargin measures, just before a timed call, the delays of this
// machine that are not the daemon's: the worst oversleep of 1 ms sleeps
// over 200 ms (how late a goroutine runs, here or in the daemon) plus the
// slowest of 5 Pings to c's daemon (the answer's own trip).
func answerMargin(ctx context.Context, t *testing.T, c *client.Client) time.Duration {
	t.Helper()
	var sleep time.Duration
	for end := time.Now().Add(200 * time.Millisecond); time.Now().Before(end); {
		t0 := time.Now()
		time.Sleep(time.Millisecond)
		sleep = max(sleep, time.Since(t0)-time.Millisecond)
	}
	var rpc time.Duration
	for range 5 {
		t0 := time.Now()
		if _, err := c.API().Ping(ctx, &b2bv1.PingRequest{}); err != nil {
			t.Fatalf("ping the daemon: %v", err)
		}
		rpc = max(rpc, time.Since(t0))
	}
	return sleep + rpc
}

// watchStalls samples, until the returned func is called, how late 1 ms
// sleeps wake: the worst is how long this machine (a VM on a loaded host)
// stopped running anything during a timed call. It returns that worst.
func watchStalls() func() time.Duration {
	done, res := make(chan struct{}), make(chan time.Duration, 1)
	go func() {
		var worst time.Duration
		for {
			select {
			case <-done:
				res <- worst
				return
			default:
			}
			t0 := time.Now()
			time.Sleep(time.Millisecond)
			worst = max(worst, time.Since(t0)-time.Millisecond)
		}
	}()
	return func() time.Duration { close(done); return <-res }
}

// watchChanges watches mem for window against snap (updated as it goes):
// when it first and last saw a change, and how many bytes changed in all.
func watchChanges(snap, mem []byte, window time.Duration) (first, last time.Duration, changed int) {
	start := time.Now()
	for time.Since(start) < window {
		if !bytes.Equal(snap, mem) {
			at := time.Since(start)
			for i := range snap {
				if snap[i] != mem[i] {
					changed++
					snap[i] = mem[i]
				}
			}
			if first == 0 {
				first = at
			}
			last = at
		}
		time.Sleep(time.Millisecond) // a poll interval, not a synchronisation
	}
	return first, last, changed
}

// TestRemotePullLoad: CLIENTS clients (each its own API connection) x
// PULLS pulls of small batches over verbs (B2B_E2E_PULL_LOAD, default
// 32x200), every block compared with what the remote holds; 0 failures;
// then no count of either daemon's Status (goroutines, fds, regions,
// connections, QPs, MRs) is above its settled baseline.
func TestRemotePullLoad(t *testing.T) {
	src, dst, peer := remoteClients(t)
	clients, pulls := 32, 200
	if v := os.Getenv("B2B_E2E_PULL_LOAD"); v != "" {
		if _, err := fmt.Sscanf(v, "%dx%d", &clients, &pulls); err != nil {
			t.Fatalf("B2B_E2E_PULL_LOAD=%q: want CLIENTSxPULLS", v)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	const slots, size, perPull = 64, 1024, 4
	seed, _ := seededExport(ctx, t, src, dst, peer, "e2e-pull-load", slots*size, []string{"*"}, func(i int) byte { return byte(i*7) ^ byte(i>>10) | 1 })
	// Warm: the pull path is connected before the baseline.
	warm, err := src.RegisterHost(ctx, slots*size, "")
	if err != nil {
		t.Fatal(err)
	}
	offs := strided(slots, size)
	if err := pullVerbs(ctx, src, warm.Id, peer, "e2e-pull-load", offs, offs, size); err != nil {
		t.Fatal(err)
	}
	warm.Unmap()
	if err := src.Deregister(ctx, warm.Id); err != nil {
		t.Fatal(err)
	}
	before := [2]usage{settled(t, "B (caller)", src), settled(t, "A (serving)", dst)}

	srcAPI := os.Getenv("B2B_E2E_SRC_API")
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	start := time.Now()
	for ci := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := client.Dial(srcAPI)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			local, err := c.RegisterHost(ctx, slots*size, "")
			if err != nil {
				errs <- err
				return
			}
			defer func() {
				local.Unmap()
				if err := c.Deregister(context.Background(), local.Id); err != nil {
					errs <- fmt.Errorf("client %d: deregister: %w", ci, err)
				}
			}()
			r := rand.New(rand.NewPCG(uint64(ci), 24))
			lo, ro := make([]uint64, perPull), make([]uint64, perPull)
			for i := range pulls {
				lp, rp := r.Perm(slots), r.Perm(slots)
				for k := range perPull {
					lo[k], ro[k] = uint64(lp[k])*size, uint64(rp[k])*size
				}
				clear(local.Bytes)
				if err := pullVerbs(ctx, c, local.Id, peer, "e2e-pull-load", lo, ro, size); err != nil {
					errs <- fmt.Errorf("client %d pull %d: %w", ci, i, err)
					return
				}
				if k := differingBlock(local.Bytes, lo, seed.Bytes, ro, size); k >= 0 {
					errs <- fmt.Errorf("client %d pull %d: block %d differs", ci, i, k)
					return
				}
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	close(errs)
	failures := 0
	for err := range errs {
		failures++
		t.Error(err)
	}
	if failures > 0 {
		t.FailNow()
	}
	t.Logf("%d clients x %d pulls of %d x %d B over verbs: 0 failures, every block compared, in %v",
		clients, pulls, perPull, size, took.Round(time.Millisecond))
	// Back at the baseline (the clients' regions went with them): polled,
	// bounded; a count below it is an earlier test's connection reaped.
	noGrowth(t, "B (caller)", src, before[0])
	noGrowth(t, "A (serving)", dst, before[1])
}

// pullServer is a daemon this test owns in VM B, serving pulls over verbs
// to A's daemon (which pulls through its API): the serving side of the
// faults, which this process must be able to kill -9 and whose region file
// it must be able to truncate. Needs B2B_E2E_B2BD and B2B_E2E_SELF (this
// VM's address; ports 7472 and 7473) besides remoteClients' variables.
type pullServer struct {
	t      *testing.T
	p      *proc
	c      *client.Client
	rdev   string
	caller *client.Client // A's daemon: it pulls
}

func startPullServer(t *testing.T, caller *client.Client) *pullServer {
	t.Helper()
	bin, self := os.Getenv("B2B_E2E_B2BD"), os.Getenv("B2B_E2E_SELF")
	if bin == "" || self == "" {
		t.Skip("B2B_E2E_B2BD and B2B_E2E_SELF are not set (make test-rdma sets them in the testbed VMs)")
	}
	rdev := os.Getenv("B2B_E2E_RDMA_DEV")
	if rdev == "" {
		rdev = "rxe0"
	}
	dir := t.TempDir()
	p := &proc{bin: bin, name: "pull-server", sock: filepath.Join(dir, "b2bd.sock"), shm: filepath.Join(dir, "shm"),
		peer: self + ":7472", data: self + ":7473"}
	p.args = []string{"--node-name", "b-pull-server", "--socket", p.sock, "--shm-dir", p.shm, "--peer-listen", p.peer,
		"--data-listen", p.data, "--transport", "verbs", "--rdma-device", rdev, "--shutdown-grace", "10s", "--log-level", "warn",
		"--tls-cert", os.Getenv("B2B_E2E_TLS_CERT"), "--tls-key", os.Getenv("B2B_E2E_TLS_KEY"), "--tls-ca", os.Getenv("B2B_E2E_TLS_CA")}
	s := &pullServer{t: t, p: p, rdev: rdev, caller: caller}
	s.start()
	t.Cleanup(func() {
		if t.Failed() {
			log := p.stderr.String()
			t.Logf("the serving daemon's log (last 4 KiB):\n%s", log[max(0, len(log)-4096):])
		}
	})
	return s
}

func (s *pullServer) start() {
	s.p.start(s.t)
	c, err := client.Dial(s.p.sock)
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { c.Close() })
	s.c = c
}

// export registers n blocks of size bytes here, exported as name to every
// reader, filled from seed; it returns the region (mapped) and the blocks'
// CRC32C digests.
func (s *pullServer) export(ctx context.Context, name string, n int, size uint64, seed uint64) (*client.HostRegion, []uint64) {
	s.t.Helper()
	r, err := s.c.RegisterHost(ctx, uint64(n)*size, name, client.Readers("*"))
	if err != nil {
		s.t.Fatal(err)
	}
	rnd := rand.New(rand.NewPCG(seed, 24))
	for i := 0; i < len(r.Bytes); i += 8 {
		v := rnd.Uint64()
		for k := range 8 {
			r.Bytes[i+k] = byte(v >> (8 * k))
		}
	}
	want := make([]uint64, n)
	for i := range want {
		want[i] = checksum.Block(checksum.CRC32C, r.Bytes[uint64(i)*size:uint64(i+1)*size])
	}
	return r, want
}

// callerRegion is a region of size bytes on A's daemon, the pulls' destination.
func (s *pullServer) callerRegion(ctx context.Context, size uint64) string {
	s.t.Helper()
	id, err := allocRegion(ctx, s.caller, size, "")
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { _ = s.caller.Deregister(context.Background(), id) })
	return id
}

// pullInto has A's daemon pull the export name's blocks (offs, reversed
// into localOff) into its region id; on success it checks every block
// against want through A's Checksum.
func (s *pullServer) pullInto(ctx context.Context, id, name string, localOff, remoteOff []uint64, size uint64, want []uint64) error {
	if err := pullVerbs(ctx, s.caller, id, s.p.peer, name, localOff, remoteOff, size); err != nil {
		return err
	}
	cs, err := s.caller.Checksum(ctx, id, localOff, nil, size, b2bv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_CRC32C, true)
	if err != nil {
		return fmt.Errorf("checksum on the caller: %w", err)
	}
	got := client.Unpack(cs.BlockDigests)
	for i := range remoteOff {
		if got[i] != want[remoteOff[i]/size] {
			return fmt.Errorf("pull reported success but block %d differs from the remote's", i)
		}
	}
	return nil
}

// afterRewrite regrows the truncated file at path and writes new bytes into
// it, then pulls once more: the region must stay failed (its old MR pinned
// the pre-truncation pages; only a new registration is the file again).
func (s *pullServer) afterRewrite(ctx context.Context, path, local, name string, localOff, remoteOff []uint64, size uint64) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		s.t.Fatalf("rewrite: %v", err)
	}
	defer f.Close()
	if _, err := f.WriteAt(bytes.Repeat([]byte{0xa5}, len(remoteOff)*int(size)), 0); err != nil {
		s.t.Fatalf("rewrite: %v", err)
	}
	return pullVerbs(ctx, s.caller, local, s.p.peer, name, localOff, remoteOff, size)
}

// sentPackets is the RDMA device's sent-packet counter in this VM: READ
// responses this VM's NIC sends.
func (s *pullServer) sentPackets() uint64 {
	b, err := os.ReadFile(filepath.Join("/sys/class/infiniband", s.rdev, "ports/1/hw_counters/sent_pkts"))
	if err != nil {
		s.t.Fatalf("read %s's sent_pkts: %v", s.rdev, err)
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		s.t.Fatal(err)
	}
	return v
}

// TestRemotePullFaults: A's daemon pulls over verbs from a daemon this test
// owns in B, and the serving side fails mid-pull:
//   - its region deregistered, its export withdrawn, its file truncated:
//     the pulls fail with a code (not Unknown) and a message naming the
//     remote region, every pull that succeeded brought every block, and
//     both daemons serve the next pull; a truncated file answers DataLoss,
//     still after it was regrown and rewritten (the old MR's pages are not
//     the file's);
//   - kill -9 of the serving daemon while A's READs are on the wire (B's
//     NIC sending responses): Unavailable or Aborted within 1 s of the
//     kill, or success with every block; A's daemon serves on.
func TestRemotePullFaults(t *testing.T) {
	_, caller, _ := remoteClients(t)
	s := startPullServer(t, caller)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const n, size = 64, 64 << 10 // 4 MiB a pull
	offs, rev := strided(n, size), reversed(n, size)
	local := s.callerRegion(ctx, n*size)

	for i, fault := range pullFaults {
		t.Run(fault, func(t *testing.T) {
			name := fmt.Sprintf("pull-victim-%d", i)
			remote, want := s.export(ctx, name, n, size, uint64(i))
			path := remote.GetShmPath()
			remote.Unmap() // this process must not fault on a truncated file
			if err := s.pullInto(ctx, local, name, rev, offs, size, want); err != nil {
				t.Fatalf("warm-up: %v", err)
			}
			// Pulls in a loop while the fault is made; the first failure ends it.
			errc := make(chan error, 1)
			started := make(chan struct{})
			go func() {
				for k := 0; k < 100; k++ {
					if k == 1 {
						close(started)
					}
					if err := s.pullInto(ctx, local, name, rev, offs, size, want); err != nil {
						if k == 0 {
							close(started)
						}
						errc <- err
						return
					}
				}
				errc <- nil
			}()
			<-started // one pull done, the next on its way
			makePullFault(ctx, t, s.c, remote.Id, path, fault)
			err := <-errc
			if err == nil {
				t.Fatalf("100 pulls succeeded after the remote region was %s", fault)
			}
			faultedPull(t, err, name)
			t.Logf("%s: %v", fault, err)
			if fault == "file truncated" {
				// The serving daemon saw its file shrink and withdrew the
				// region's keys (the NIC no longer serves the MR's pinned
				// pages): DataLoss naming it, also once the file grew back
				// and was rewritten.
				if status.Code(err) != codes.DataLoss || !strings.Contains(err.Error(), "truncated to 0 bytes") {
					t.Fatalf("pull from a truncated source: %v, want DataLoss saying the file was truncated", err)
				}
				err := s.afterRewrite(ctx, path, local, name, rev, offs, size)
				if status.Code(err) != codes.DataLoss || !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), "grows back") {
					t.Fatalf("pull after the truncated file was regrown and rewritten: %v, want DataLoss naming %q: the region stays failed", err, name)
				}
				t.Logf("after the file was regrown and rewritten: %v", err)
			}
			// Both daemons serve on: a fresh export pulls, verified.
			other := name + "-after"
			r2, want2 := s.export(ctx, other, n, size, uint64(100+i))
			r2.Unmap()
			if err := s.pullInto(ctx, local, other, rev, offs, size, want2); err != nil {
				t.Fatalf("pull after the fault: %v", err)
			}
		})
	}

	t.Run("serving daemon killed", func(t *testing.T) {
		const kn, ksize = 64, 256 << 10 // 16 MiB: half a second or more on the wire
		koffs, krev := strided(kn, ksize), reversed(kn, ksize)
		klocal := s.callerRegion(ctx, kn*ksize)
		remote, want := s.export(ctx, "pull-kill", kn, ksize, 7)
		remote.Unmap()
		if err := s.pullInto(ctx, klocal, "pull-kill", krev, koffs, ksize, want); err != nil {
			t.Fatalf("warm-up: %v", err)
		}
		type end struct {
			err error
			at  time.Time
		}
		margin := timeMargin(t)
		done := make(chan end, 1)
		sent := s.sentPackets()
		go func() {
			pctx, pcancel := context.WithTimeout(ctx, 20*time.Second)
			defer pcancel()
			err := s.pullInto(pctx, klocal, "pull-kill", krev, koffs, ksize, want)
			done <- end{err, time.Now()}
		}()
		// Kill once this VM's NIC is answering the READs (256 packets of a
		// 16 MiB pull's 16,384 sent), not after a fixed sleep.
		onWire := false
		for stop := time.Now().Add(20 * time.Second); time.Now().Before(stop) && len(done) == 0; {
			if s.sentPackets()-sent >= 256 {
				onWire = true
				break
			}
			time.Sleep(200 * time.Microsecond)
		}
		if !onWire {
			t.Fatalf("the pull's READ responses were never seen on the wire (%v)", <-done)
		}
		_ = s.p.cmd.Process.Kill()
		_ = s.p.cmd.Wait()
		killed := time.Now()
		e := <-done
		detect := max(0, e.at.Sub(killed))
		switch code := status.Code(e.err); {
		case e.err == nil:
			t.Logf("the pull completed, verified, before the kill took effect")
		case code != codes.Unavailable && code != codes.Aborted:
			t.Fatalf("%v, want Unavailable or Aborted", e.err)
		case detect > time.Second+margin:
			t.Fatalf("the failure came %v after the kill (bound 1 s + margin %v): %v", detect, margin, e.err)
		}
		t.Logf("outcome %v, %v after the kill: %v", status.Code(e.err), detect.Round(time.Millisecond), e.err)
		if _, err := caller.Status(ctx); err != nil {
			t.Fatalf("the caller's daemon after the kill: %v", err)
		}
		// The serving daemon restarted: A's next pull reaches it, verified.
		s.start()
		r2, want2 := s.export(ctx, "pull-kill-after", kn, ksize, 8)
		r2.Unmap()
		if err := s.pullInto(ctx, klocal, "pull-kill-after", krev, koffs, ksize, want2); err != nil {
			t.Fatalf("first pull after the restart: %v", err)
		}
	})
}
