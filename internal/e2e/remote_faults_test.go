package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
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

// TestRemoteFaults runs the fault and load cases between two hosts (the
// Soft-RoCE testbed's VMs in `make test-rdma`), once per transport. It runs
// on host A and owns A's daemon, so it can kill -9 it and take A's link
// down; it drives B's daemon through B's API over mutual TLS.
//
// Every batch B → A is checked byte for byte against memory this process
// wrote: B's source region is first filled by a batch A → B from a region
// mapped here, and the destination is mapped here too (a killed daemon's
// mapping outlives it).
//
// Environment (test-rdma-vm.sh sets it): B2B_FAULTS_B2BD (a b2bd with
// verbs), B2B_FAULTS_SELF (A's address), B2B_FAULTS_REMOTE_API and
// B2B_FAULTS_REMOTE_PEER (B's API and peer addresses), B2B_FAULTS_NETDEV and
// B2B_FAULTS_RDMA_DEV (A's wire and RDMA device), B2B_E2E_TLS_* (A's
// identity); optional B2B_FAULTS_TRANSPORTS (default "verbs,tcp"),
// B2B_FAULTS_TRIALS (default 10), B2B_FAULTS_LOAD ("32x200") and
// B2B_FAULTS_CASES (which cases run, default all: see parseFaultCases).
func TestRemoteFaults(t *testing.T) {
	env := func(k string) string {
		v := os.Getenv(k)
		if v == "" {
			t.Skipf("%s not set (make test-rdma sets it in the testbed VMs)", k)
		}
		return v
	}
	bin, self, rapi, rpeer := env("B2B_FAULTS_B2BD"), env("B2B_FAULTS_SELF"), env("B2B_FAULTS_REMOTE_API"), env("B2B_FAULTS_REMOTE_PEER")
	netdev, rdev := env("B2B_FAULTS_NETDEV"), env("B2B_FAULTS_RDMA_DEV")
	trials := envInt(t, "B2B_FAULTS_TRIALS", 10)
	clients, batches := 32, 200
	if v := os.Getenv("B2B_FAULTS_LOAD"); v != "" {
		if _, err := fmt.Sscanf(v, "%dx%d", &clients, &batches); err != nil {
			t.Fatalf("B2B_FAULTS_LOAD=%q: want CLIENTSxBATCHES", v)
		}
	}
	kinds := "verbs,tcp"
	if v := os.Getenv("B2B_FAULTS_TRANSPORTS"); v != "" {
		kinds = v
	}
	cases := parseFaultCases(os.Getenv("B2B_FAULTS_CASES"))
	opts := remoteDialOpts(t)
	rc, err := client.Dial(rapi, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()

	for _, kind := range strings.Split(kinds, ",") {
		t.Run(kind, func(t *testing.T) {
			r := newRemoteRig(t, bin, self, rpeer, netdev, rdev, kind, rc)
			defer r.close()
			if cases.has("kill") {
				r.killTrials(trials).print()
			}
			if cases.has("link") {
				r.linkTrials(4).print()
			}
			if cases.has("cut") {
				r.cutTrials(3).print()
			}
			if cases.has("deadline") {
				r.deadlineTrials(3).print()
			}
			if cases.has("deregister") {
				r.deregisterTrials(3).print()
			}
			if cases.has("acl") {
				r.aclCheck().print()
			}
			if cases.has("load") && clients > 0 && batches > 0 {
				r.load(clients, batches)
			}
		})
	}
}

func envInt(t *testing.T, k string, def int) int {
	v := os.Getenv(k)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		t.Fatalf("%s=%q: want a count", k, v)
	}
	return n
}

// remoteDialOpts is the TLS identity from B2B_E2E_TLS_* for a daemon's API
// off its host; none when B2B_E2E_TLS_CERT is unset.
func remoteDialOpts(t *testing.T) []grpc.DialOption {
	t.Helper()
	c := os.Getenv("B2B_E2E_TLS_CERT")
	if c == "" {
		return nil
	}
	tl, err := auth.LoadPeerTLS(c, os.Getenv("B2B_E2E_TLS_KEY"), os.Getenv("B2B_E2E_TLS_CA"))
	if err != nil {
		t.Fatal(err)
	}
	return []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tl.Client))}
}

// remoteRig is A's daemon (owned here) and B's (driven over its API).
type remoteRig struct {
	t             *testing.T
	kind          string
	want          b2bv1.TransportKind
	local         *proc
	lc, rc        *client.Client
	self, rpeer   string // peer addresses of A and B
	netdev, rdev  string
	srcID         string // B's source region, exported as srcName
	srcName       string
	n, size       uint64
	seed, dst     *client.HostRegion
	dstOffs, offs []uint64
}

const (
	rigBlocks = 64
	rigSize   = 256 << 10 // 16 MiB batches: over the emulated wire, half a second or more
)

func newRemoteRig(t *testing.T, bin, self, rpeer, netdev, rdev, kind string, rc *client.Client) *remoteRig {
	r := &remoteRig{t: t, kind: kind, rc: rc, self: self + ":7470", rpeer: rpeer, netdev: netdev, rdev: rdev,
		n: rigBlocks, size: rigSize, srcName: "faults-src-" + kind}
	switch kind {
	case "verbs":
		r.want = b2bv1.TransportKind_TRANSPORT_KIND_VERBS
	case "tcp":
		r.want = b2bv1.TransportKind_TRANSPORT_KIND_TCP
	default:
		t.Fatalf("transport %q: want verbs or tcp", kind)
	}
	dir := t.TempDir()
	ca, cert, key := os.Getenv("B2B_E2E_TLS_CA"), os.Getenv("B2B_E2E_TLS_CERT"), os.Getenv("B2B_E2E_TLS_KEY")
	p := &proc{bin: bin, name: "a", sock: filepath.Join(dir, "b2bd.sock"), shm: filepath.Join(dir, "shm"), peer: r.self, data: self + ":7471"}
	p.args = []string{"--node-name", "a", "--socket", p.sock, "--shm-dir", p.shm, "--peer-listen", p.peer, "--data-listen", p.data,
		"--transport", kind, "--rdma-device", rdev, "--shutdown-grace", "10s", "--log-level", "warn",
		"--tls-cert", cert, "--tls-key", key, "--tls-ca", ca}
	r.local = p
	p.start(t)
	r.dial()
	r.offs = make([]uint64, r.n)
	r.dstOffs = make([]uint64, r.n)
	for i := range r.offs {
		r.offs[i], r.dstOffs[i] = uint64(i)*r.size, uint64(r.n-1-uint64(i))*r.size
	}
	r.registerSource()
	return r
}

// registerSource (re)creates B's source region, exported as srcName.
func (r *remoteRig) registerSource() {
	id, err := allocRegion(context.Background(), r.rc, r.n*r.size, r.srcName)
	if err != nil {
		r.t.Fatalf("register B's source: %v", err)
	}
	r.srcID = id
}

// allocRegion has c's daemon allocate a host region exported as name (to
// the peers in to, or to all); for daemons whose memory this process cannot
// map. It returns the region's ID.
func allocRegion(ctx context.Context, c *client.Client, size uint64, name string, to ...string) (string, error) {
	resp, err := c.API().RegisterRegion(ctx, &b2bv1.RegisterRegionRequest{
		Source:     &b2bv1.RegisterRegionRequest_HostAlloc{HostAlloc: &b2bv1.HostAlloc{Size: size}},
		ExportName: name, ExportTo: to})
	if err != nil {
		return "", err
	}
	return resp.Region.Id, nil
}

func (r *remoteRig) dial() {
	if r.lc != nil {
		r.lc.Close()
	}
	c, err := client.Dial(r.local.sock)
	if err != nil {
		r.t.Fatal(err)
	}
	r.lc = c
}

func (r *remoteRig) close() {
	log := r.local.stderr.String()
	if dir := os.Getenv("B2B_FAULTS_LOGDIR"); dir != "" {
		_ = os.WriteFile(filepath.Join(dir, "faults-daemon-a-"+r.kind+".log"), []byte(log), 0o644)
	}
	if r.t.Failed() {
		if i := strings.Index(log, "panic:"); i >= 0 {
			log = log[i:]
		} else if i := strings.Index(log, "fatal error:"); i >= 0 {
			log = log[i:]
		} else if i := strings.Index(log, "SIGSEGV"); i >= 0 {
			log = log[max(0, i-200):]
		} else {
			log = log[max(0, len(log)-4096):]
		}
		r.t.Logf("A's daemon log:\n%s", log[:min(len(log), 4096)])
	}
	r.releaseLocal()
	_ = r.rc.Deregister(context.Background(), r.srcID)
	if r.lc != nil {
		r.lc.Close()
	}
	_ = r.local.cmd.Process.Kill()
	_ = r.local.cmd.Wait()
}

// restart brings A's daemon back after a kill, on the same addresses.
func (r *remoteRig) restart() {
	r.local.start(r.t)
	r.dial()
	r.seed, r.dst = nil, nil // the old daemon's regions are gone; the test's mappings are kept by the callers
}

// prepare registers A's seed and destination, fills the seed with pattern,
// and sends it to B's source (A → B): B then holds exactly seed's bytes.
func (r *remoteRig) prepare(pattern int) {
	t := r.t
	ctx := context.Background()
	r.releaseLocal()
	seed, err := r.lc.RegisterHost(ctx, r.n*r.size, "")
	if err != nil {
		t.Fatal(err)
	}
	dst, err := r.lc.RegisterHost(ctx, r.n*r.size, "faults-dst")
	if err != nil {
		t.Fatal(err)
	}
	r.seed, r.dst = seed, dst
	rnd := rand.New(rand.NewPCG(uint64(pattern), 7))
	for i := 0; i < len(seed.Bytes); i += 8 {
		v := rnd.Uint64()
		for k := range 8 {
			seed.Bytes[i+k] = byte(v >> (8 * k))
		}
	}
	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	resp, err := r.lc.BatchTransfer(cctx, client.Transfer{SrcRegion: seed.Id, Peer: r.rpeer, DstRegion: r.srcName, Transport: r.want,
		Blocks: client.Descriptors{Src: r.offs, Dst: r.offs, BlockLength: r.size}})
	if err != nil {
		t.Fatalf("seed A → B: %v", err)
	}
	if resp.Transport != r.want {
		t.Fatalf("seed A → B went over %v, want %v", resp.Transport, r.want)
	}
}

// releaseLocal unmaps and deregisters A's seed and destination (harmless
// when A's daemon died meanwhile).
func (r *remoteRig) releaseLocal() {
	for _, h := range []*client.HostRegion{r.seed, r.dst} {
		if h != nil {
			h.Unmap()
			// A batch that failed half-landed keeps its destination pinned until
			// the receiver learns the sender gave up: at once when the sender
			// can say so, else once the wire is back (the sender's disconnect
			// retries over the peer's newest control channel). 10 s bounds
			// that; the receiver's keepalive (30 s) is only the last resort.
			// Every wait over 100 ms is reported.
			start := time.Now()
			for {
				err := r.lc.Deregister(context.Background(), h.Id)
				if status.Code(err) == codes.FailedPrecondition && time.Since(start) < 10*time.Second {
					time.Sleep(20 * time.Millisecond)
					continue
				}
				if err != nil && status.Code(err) != codes.Unavailable {
					r.t.Errorf("deregister %s (%s) on A: %v", h.Id, h.GetExportName(), err)
				}
				if w := time.Since(start); w > 100*time.Millisecond {
					r.t.Logf("deregister %s (%s) on A waited %v for a failed batch's pin", h.Id, h.GetExportName(), w.Round(time.Millisecond))
				}
				break
			}
		}
	}
	r.seed, r.dst = nil, nil
}

// back sends B's source into A's destination (B → A), as B's daemon.
func (r *remoteRig) back(ctx context.Context, timeout time.Duration) (*b2bv1.BatchTransferResponse, error) {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := r.rc.BatchTransfer(cctx, client.Transfer{SrcRegion: r.srcID, Peer: r.self, DstRegion: "faults-dst", Transport: r.want,
		Blocks: client.Descriptors{Src: r.offs, Dst: r.dstOffs, BlockLength: r.size}})
	if err == nil && resp.Transport != r.want {
		return resp, fmt.Errorf("B → A went over %v, want %v", resp.Transport, r.want)
	}
	return resp, err
}

// landed checks that dst holds every block of seed where B → A puts it.
func (r *remoteRig) landed(seed, dst []byte) error {
	for i := range r.offs {
		s, d := seed[r.offs[i]:r.offs[i]+r.size], dst[r.dstOffs[i]:r.dstOffs[i]+r.size]
		if string(s) != string(d) {
			return fmt.Errorf("block %d differs", i)
		}
	}
	return nil
}

// warmBack runs one verified B → A batch: the data path is connected.
func (r *remoteRig) warmBack(what string) {
	clear(r.dst.Bytes)
	if _, err := r.back(context.Background(), 60*time.Second); err != nil {
		r.t.Fatalf("%s: %v", what, err)
	}
	if err := r.landed(r.seed.Bytes, r.dst.Bytes); err != nil {
		r.t.Fatalf("%s: %v", what, err)
	}
}

// asyncBack starts B → A and returns when it ends: the error and when.
func (r *remoteRig) asyncBack(timeout time.Duration) <-chan batchEnd {
	ch := make(chan batchEnd, 1)
	go func() {
		_, err := r.back(context.Background(), timeout)
		ch <- batchEnd{err, time.Now()}
	}()
	return ch
}

type batchEnd struct {
	err error
	at  time.Time
}

// failedCleanly is what a batch hit by a fault may report: success only
// with every block in place, else Unavailable or Aborted (or, when its own
// deadline ran out, DeadlineExceeded).
func (r *remoteRig) failedCleanly(what string, end batchEnd, seed, dst []byte, allowDeadline bool) bool {
	t := r.t
	switch code := status.Code(end.err); {
	case end.err == nil:
		if err := r.landed(seed, dst); err != nil {
			t.Fatalf("%s: success reported but %v", what, err)
		}
		return true
	case code == codes.Unavailable || code == codes.Aborted:
	case code == codes.DeadlineExceeded && allowDeadline:
	default:
		t.Fatalf("%s: %v, want Unavailable or Aborted", what, end.err)
	}
	return false
}

// killTrials: kill -9 of A's daemon while B sends to it. B's batch must fail
// with Unavailable or Aborted within its deadline plus 1 s (over verbs, with
// the failed work completion's status in the message); after A restarts,
// B's next batch reconnects, re-resolves and lands every block.
func (r *remoteRig) killTrials(trials int) *faultRow {
	t := r.t
	row := newRow("peer kill -9 mid-batch", r.kind)
	const deadline = 10 * time.Second
	for trial := 1; trial <= trials; trial++ {
		r.prepare(trial)
		r.warmBack(fmt.Sprintf("trial %d warm-up", trial))
		seed, dst := r.seed, r.dst
		clear(dst.Bytes)
		start := time.Now()
		done := r.asyncBack(deadline)
		// Kill once the batch is on the wire (its first bytes are in A's
		// memory), not after a fixed sleep: on a busy machine a sleep can end
		// while B is still resolving, and the trial would test set-up instead.
		if !r.waitFirstBytes(done, deadline) {
			t.Logf("trial %d: the batch ended before its first bytes were seen", trial)
		}
		time.Sleep(time.Duration(trial*5) * time.Millisecond) // vary the point of the kill
		_ = r.local.cmd.Process.Kill()
		_ = r.local.cmd.Wait()
		killed := time.Now()
		end := <-done
		if end.at.Sub(start) > deadline+time.Second {
			t.Fatalf("trial %d: the batch ended %v after it began", trial, end.at.Sub(start))
		}
		r.failedCleanly(fmt.Sprintf("trial %d", trial), end, seed.Bytes, dst.Bytes, false)
		detect := max(0, end.at.Sub(killed))
		if end.err != nil && trial == 1 {
			row.note = "first error: " + status.Convert(end.err).Message()
		}
		if end.err != nil && r.kind == "verbs" && !wcStatus.MatchString(status.Convert(end.err).Message()) &&
			!strings.Contains(status.Convert(end.err).Message(), "closed by") {
			t.Errorf("trial %d: verbs failure without a work-completion status: %v", trial, end.err)
		}
		r.restart()
		// B still has the trial's data; the next batch must reconnect to the
		// new daemon, resolve its new region and land all of it.
		dst2, err := r.lc.RegisterHost(context.Background(), r.n*r.size, "faults-dst")
		if err != nil {
			t.Fatal(err)
		}
		r.dst = dst2
		if _, err := r.back(context.Background(), 60*time.Second); err != nil {
			t.Fatalf("trial %d: batch after the restart: %v", trial, err)
		}
		if err := r.landed(seed.Bytes, dst2.Bytes); err != nil {
			t.Fatalf("trial %d: after the restart: %v", trial, err)
		}
		seed.Unmap()
		dst.Unmap()
		row.add(outcome(end.err), detect, true)
	}
	return row
}

// wcStatus matches a failed work completion as the verbs transport reports it.
var wcStatus = regexp.MustCompile(`work completion on QP \d+ .* failed: .+ \(status \d+`)

// deadlineTrials: a batch given far less time than it needs fails with
// DeadlineExceeded or Aborted within its deadline plus 1 s, and the next
// batch on the same daemons lands every block.
func (r *remoteRig) deadlineTrials(trials int) *faultRow {
	t := r.t
	row := newRow("deadline 150 ms on a 16 MiB batch", r.kind)
	const deadline = 150 * time.Millisecond
	for trial := 1; trial <= trials; trial++ {
		r.prepare(200 + trial)
		r.warmBack(fmt.Sprintf("deadline trial %d warm-up", trial))
		clear(r.dst.Bytes)
		start := time.Now()
		_, err := r.back(context.Background(), deadline)
		took := time.Since(start)
		if code := status.Code(err); err != nil && code != codes.DeadlineExceeded && code != codes.Aborted {
			t.Fatalf("deadline trial %d: %v, want DeadlineExceeded or Aborted", trial, err)
		}
		if took > deadline+time.Second {
			t.Fatalf("deadline trial %d: failed after %v", trial, took)
		}
		if err == nil {
			if lerr := r.landed(r.seed.Bytes, r.dst.Bytes); lerr != nil {
				t.Fatalf("deadline trial %d: success but %v", trial, lerr)
			}
		}
		r.warmBack(fmt.Sprintf("deadline trial %d: the next batch", trial))
		row.add(outcome(err), max(0, took-deadline), true)
	}
	return row
}

// deregisterTrials: deregistering A's destination, or B's source, while a
// batch uses it either fails with FailedPrecondition or waits; the batch
// fails cleanly or lands every block; the daemons survive and the next
// batch lands every block.
func (r *remoteRig) deregisterTrials(trials int) *faultRow {
	t := r.t
	row := newRow("deregister in flight (dst on A, src on B)", r.kind)
	for trial := 1; trial <= 2*trials; trial++ {
		r.prepare(300 + trial)
		r.warmBack(fmt.Sprintf("deregister trial %d warm-up", trial))
		clear(r.dst.Bytes)
		done := r.asyncBack(60 * time.Second)
		// Deregister once the batch is on the wire (its first bytes are in A's
		// memory): by then both daemons hold the regions of the batch.
		r.waitFirstBytes(done, 60*time.Second)
		srcSide := trial%2 == 0
		var derr error
		if srcSide {
			derr = r.rc.Deregister(context.Background(), r.srcID)
		} else {
			derr = r.lc.Deregister(context.Background(), r.dst.Id)
		}
		deregAt := time.Now()
		end := <-done
		if derr != nil && status.Code(derr) != codes.FailedPrecondition {
			t.Fatalf("deregister trial %d: %v, want FailedPrecondition or success", trial, derr)
		}
		if derr == nil && end.err == nil && end.at.After(deregAt) {
			// The region went away before the batch said it landed: the data
			// cannot all be there, unless the batch was already done.
			if err := r.landed(r.seed.Bytes, r.dst.Bytes); err != nil {
				t.Fatalf("deregister trial %d: success reported after the region was deregistered, and %v", trial, err)
			}
		}
		if derr == nil && !srcSide && status.Code(end.err) == codes.NotFound {
			// The destination went away before A learnt of the batch (over verbs,
			// WRITEs on other QPs can precede the batch's meta): A refused it.
		} else if end.err != nil && !errors.Is(end.err, context.DeadlineExceeded) {
			r.failedCleanly(fmt.Sprintf("deregister trial %d", trial), end, r.seed.Bytes, r.dst.Bytes, false)
		} else if end.err == nil {
			if err := r.landed(r.seed.Bytes, r.dst.Bytes); err != nil {
				t.Fatalf("deregister trial %d: success but %v", trial, err)
			}
		}
		side := "dst"
		if srcSide {
			side = "src"
		}
		row.add(fmt.Sprintf("%s-deregister:%s/batch:%s", side, outcome(derr), outcome(end.err)), 0, true)
		if derr == nil {
			if srcSide { // B's source is gone: a new one, refilled by the next prepare
				r.registerSource()
			} else {
				r.dst.Unmap()
				r.dst = nil
			}
		}
		r.prepare(400 + trial)
		r.warmBack(fmt.Sprintf("deregister trial %d: the next batch", trial))
	}
	return row
}

// aclCheck: a region exported only to another identity is refused to this
// peer with PermissionDenied, in both directions, so no key is handed out.
func (r *remoteRig) aclCheck() *faultRow {
	t := r.t
	row := newRow("unauthorised peer (export_to names another)", r.kind)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reg := func(c *client.Client, name string) string {
		id, err := allocRegion(ctx, c, 4096, name, "someone-else")
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	remoteACL, localACL := reg(r.rc, "faults-acl-"+r.kind), reg(r.lc, "faults-acl")
	defer func() {
		_ = r.rc.Deregister(context.Background(), remoteACL)
		_ = r.lc.Deregister(context.Background(), localACL)
	}()
	r.prepare(500)
	for _, c := range []struct {
		c         *client.Client
		src, peer string
		name      string
	}{{r.lc, r.seed.Id, r.rpeer, "faults-acl-" + r.kind}, {r.rc, r.srcID, r.self, "faults-acl"}} {
		start := time.Now()
		_, err := c.c.BatchTransfer(ctx, client.Transfer{SrcRegion: c.src, Peer: c.peer, DstRegion: c.name, Transport: r.want,
			Blocks: client.Descriptors{Src: []uint64{0}, Dst: []uint64{0}, BlockLength: 64}})
		if status.Code(err) != codes.PermissionDenied {
			t.Fatalf("batch to %s/%s exported to someone else: %v, want PermissionDenied", c.peer, c.name, err)
		}
		row.add(outcome(err), time.Since(start), false)
	}
	return row
}

// load: clients concurrent clients, each alternating A → B and B → A
// batches of mixed sizes, every block of every round trip compared here;
// then both daemons' goroutines, fds, regions, connections, QPs and MRs,
// and the kernel's QP and MR counts on A, must be back at their baseline.
func (r *remoteRig) load(clients, batches int) {
	t := r.t
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	r.releaseLocal()
	// Warm both directions so the long-lived data paths exist in the baseline.
	r.prepare(600)
	r.warmBack("load warm-up")
	r.releaseLocal()
	time.Sleep(300 * time.Millisecond)
	before := [2]remoteSample{r.sampleLocal(), r.sampleRemote()}

	sizes := []uint64{128, 1024, 4096, 16384}
	const slots = 32
	const slot = 16384 + 64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []string
	var blocks, bytes uint64
	var nBatches int
	start := time.Now()
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fail := func(format string, args ...any) {
				mu.Lock()
				failures = append(failures, fmt.Sprintf("client %d: ", c)+fmt.Sprintf(format, args...))
				mu.Unlock()
			}
			rnd := rand.New(rand.NewPCG(uint64(c), 1234))
			// Blocks are copied from a random pool at random offsets: fresh
			// bytes every batch without a generator call per byte, which the
			// emulated CPU cannot afford.
			pool := make([]byte, 2*16384)
			for i := range pool {
				pool[i] = byte(rnd.Uint32())
			}
			l, err := r.lc.RegisterHost(ctx, slots*slot, "")
			if err != nil {
				fail("register: %v", err)
				return
			}
			dname, rname := fmt.Sprintf("load-d-%d", c), fmt.Sprintf("load-r-%d-%s", c, r.kind)
			d, err := r.lc.RegisterHost(ctx, slots*slot, dname)
			if err != nil {
				fail("register: %v", err)
				return
			}
			rid, err := allocRegion(ctx, r.rc, slots*slot, rname)
			if err != nil {
				fail("register on B: %v", err)
				return
			}
			defer func() {
				l.Unmap()
				d.Unmap()
				_ = r.lc.Deregister(context.Background(), l.Id)
				_ = r.lc.Deregister(context.Background(), d.Id)
				_ = r.rc.Deregister(context.Background(), rid)
			}()
			for i := 0; i < batches; i += 2 {
				size := sizes[rnd.IntN(len(sizes))]
				n := 1 + rnd.IntN(slots)
				lo, ro, do := make([]uint64, n), make([]uint64, n), make([]uint64, n)
				p1, p2 := rnd.Perm(slots), rnd.Perm(slots)
				for k := range n {
					lo[k], ro[k], do[k] = uint64(k)*slot, uint64(p1[k])*slot, uint64(p2[k])*slot
				}
				for _, o := range lo {
					copy(l.Bytes[o:o+size], pool[rnd.IntN(16384):])
				}
				clear(d.Bytes)
				if _, err := r.lc.BatchTransfer(ctx, client.Transfer{SrcRegion: l.Id, Peer: r.rpeer, DstRegion: rname, Transport: r.want,
					Blocks: client.Descriptors{Src: lo, Dst: ro, BlockLength: size}}); err != nil {
					fail("batch %d A → B: %v", i, err)
					return
				}
				sent := 1
				if i+1 < batches {
					if _, err := r.rc.BatchTransfer(ctx, client.Transfer{SrcRegion: rid, Peer: r.self, DstRegion: dname, Transport: r.want,
						Blocks: client.Descriptors{Src: ro, Dst: do, BlockLength: size}}); err != nil {
						fail("batch %d B → A: %v", i+1, err)
						return
					}
					for k := range n {
						if string(l.Bytes[lo[k]:lo[k]+size]) != string(d.Bytes[do[k]:do[k]+size]) {
							fail("round trip %d: block %d differs", i/2, k)
							return
						}
					}
					sent = 2
				}
				mu.Lock()
				nBatches += sent
				blocks += uint64(sent * n)
				bytes += uint64(sent*n) * size
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	if len(failures) > 0 {
		t.Fatalf("LOAD: %d failures, first: %s", len(failures), failures[0])
	}
	// Back at the baseline, polled and bounded: closed calls settle, and
	// the extra connections a burst opened to the peer close once unused
	// for 5 s, at the reaper's next round (10 s apart at the default idle
	// timeout).
	after := [2]remoteSample{r.sampleLocal(), r.sampleRemote()}
	for until := time.Now().Add(40 * time.Second); time.Now().Before(until) && !(after[0].sameAs(before[0]) && after[1].sameAs(before[1])); {
		time.Sleep(500 * time.Millisecond)
		after = [2]remoteSample{r.sampleLocal(), r.sampleRemote()}
	}
	fmt.Printf("LOAD %d clients x %d batches (%s, between the VMs, half A → B, half B → A): 0 failures, %d batches, %d blocks verified, %.1f MB in %v\n",
		clients, batches, r.kind, nBatches, blocks, float64(bytes)/1e6, took.Round(time.Millisecond))
	for i, name := range []string{"A (test's daemon)", "B"} {
		fmt.Printf("LOAD %s daemon %s: before %s\nLOAD %s daemon %s: after  %s\n", r.kind, name, before[i], r.kind, name, after[i])
		if !after[i].sameAs(before[i]) {
			t.Errorf("daemon %s did not return to its baseline: before %s, after %s", name, before[i], after[i])
		}
	}
}

// remoteSample is a daemon's resource counts, plus the kernel's for A.
type remoteSample struct {
	goroutines, fds, regions int
	conns, qps, mrs          int
	kernelQPs, kernelMRs     int
	kernel                   bool
}

func (s remoteSample) String() string {
	k := ""
	if s.kernel {
		k = fmt.Sprintf(" kernel(rdma resource):{qp %d mr %d}", s.kernelQPs, s.kernelMRs)
	}
	return fmt.Sprintf("{goroutines %d fds %d regions %d connections %d qps %d mrs %d}%s", s.goroutines, s.fds, s.regions, s.conns, s.qps, s.mrs, k)
}

func (s remoteSample) sameAs(b remoteSample) bool {
	return s.fds == b.fds && s.regions == b.regions && s.conns == b.conns && s.qps == b.qps && s.mrs == b.mrs &&
		s.kernelQPs == b.kernelQPs && s.kernelMRs == b.kernelMRs && s.goroutines <= b.goroutines+2
}

func (r *remoteRig) sampleLocal() remoteSample {
	s := statusSample(r.t, r.lc, r.want)
	out, err := exec.Command("rdma", "resource", "show").CombinedOutput()
	if err != nil {
		r.t.Fatalf("rdma resource show: %v: %s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if !strings.Contains(line, r.rdev+":") {
			continue
		}
		f := strings.Fields(line)
		for i := 0; i+1 < len(f); i++ {
			v, _ := strconv.Atoi(f[i+1])
			switch f[i] {
			case "qp":
				s.kernelQPs = v
			case "mr":
				s.kernelMRs = v
			}
		}
		s.kernel = true
	}
	return s
}

func (r *remoteRig) sampleRemote() remoteSample { return statusSample(r.t, r.rc, r.want) }

func statusSample(t *testing.T, c *client.Client, kind b2bv1.TransportKind) remoteSample {
	t.Helper()
	st, err := c.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	s := remoteSample{goroutines: int(st.Goroutines), fds: int(st.OpenFds), regions: int(st.Regions)}
	for _, ts := range st.Transports {
		if ts.Kind == kind {
			s.conns, s.qps, s.mrs = int(ts.Connections), int(ts.QueuePairs), int(ts.MemoryRegions)
		}
	}
	return s
}
