package soak

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/client"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// The two-host form's worker has one region on its local daemon (a file
// it maps) and one on the remote daemon (allocated there, exported to
// every peer for writing and reading): slots of slotSize, slot 0 the
// prepared plan's. It pushes local blocks into the remote region and
// pulls remote blocks into the local one. The remote side is read with
// the remote daemon's Checksum (CRC32C per block), across the wire.
const (
	rSlots     = regionSize / slotSize
	rCallLimit = 5 * time.Second // the long deadline: a link flap lasts 1.5 s at most
	// verifyLimit bounds how long a check across the wire waits for the
	// link to come back before the check counts as lost.
	verifyLimit = 30 * time.Second
	planBlock   = 512
)

var errDaemonDown = errors.New("the local daemon is down")

type rworker struct {
	id   int
	s    *soak
	a    *daemon
	b    *peerHost
	r    *rand.Rand
	fill *rand.ChaCha8
	log  hclog.Logger

	connMu   sync.Mutex
	ca, cb   *client.Client
	kills    atomic.Uint64
	killSeen uint64
	ready    bool
	seq      int
	genA     uint64
	loc      *client.HostRegion
	locPath  string
	remID    string
	export   string
	plan     *client.Plan
	quar     []rquar
	late     []overrun
	moved    atomic.Uint64 // DONE transfers (the warm-up waits for them)
}

// rquar is a cut transfer's destination blocks (local for a pull, remote
// for a push): their digests at the answer, checked again at until.
type rquar struct {
	kind       string
	remote     bool
	slot       int
	offs       []uint64
	n          uint64
	digests    []uint64 // nil: the remote snapshot is still to take (the wire was down)
	answeredAt time.Time
	until      time.Time
	giveUp     time.Time
	localChaos bool
	around     string
}

// rxfer is one transfer: local blocks loffs, remote blocks roffs, want the
// source blocks' digests.
type rxfer struct {
	kind         string
	read         bool // the destination is local (a pull, or the remote daemon's push)
	viaRemote    bool // the remote daemon runs it, called across the wire
	lslot, rslot int
	loffs, roffs []uint64
	n            uint64
	want         []uint64
}

func (w *rworker) transportKind() b2bv1.TransportKind {
	if w.s.cfg.Transport == "tcp" {
		return b2bv1.TransportKind_TRANSPORT_KIND_TCP
	}
	return b2bv1.TransportKind_TRANSPORT_KIND_VERBS
}

func localDigests(mem []byte, offs []uint64, n uint64) []uint64 {
	out := make([]uint64, len(offs))
	for i, o := range offs {
		out[i] = uint64(crc32.Checksum(mem[o:o+n], castagnoli))
	}
	return out
}

// remoteDigests reads the remote blocks' CRC32Cs, retrying while the wire
// is down (Unavailable, DeadlineExceeded) until limit.
func (w *rworker) remoteDigests(offs []uint64, n uint64, limit time.Duration) ([]uint64, error) {
	stop := time.Now().Add(limit)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		resp, err := w.cb.Checksum(ctx, w.remID, offs, nil, n, b2bv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_CRC32C, true)
		cancel()
		if err == nil {
			return client.Unpack(resp.GetBlockDigests()), nil
		}
		c := status.Code(err)
		if (c != codes.Unavailable && c != codes.DeadlineExceeded) || time.Now().After(stop) {
			return nil, fmt.Errorf("checksum of %d remote blocks: %w", len(offs), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (w *rworker) run(ctx context.Context) {
	defer w.teardown()
	for ctx.Err() == nil {
		if !w.ready || w.stale() {
			w.teardown()
			if err := w.setup(ctx); err != nil {
				if errors.Is(err, errDaemonDown) {
					sleep(ctx, 100*time.Millisecond) // the chaos loop restarts it
					continue
				}
				if ctx.Err() == nil {
					w.s.stats.setupErrors.Add(1)
					w.s.stats.errCode("setup", status.Code(err).String(), err)
					w.log.Debug("setup", "err", err)
					sleep(ctx, time.Duration(100+w.r.IntN(400))*time.Millisecond)
				}
				continue
			}
		}
		w.checkQuarantine()
		w.judgeLate(false)
		w.transferOnce()
	}
}

func (w *rworker) stale() bool {
	_, ga, upA := w.a.current()
	return !upA || ga != w.genA || w.kills.Load() != w.killSeen
}

// kill closes the worker's connection to its local daemon under its
// transfer in flight, as if the client process died there.
func (w *rworker) kill() {
	w.kills.Add(1)
	w.connMu.Lock()
	defer w.connMu.Unlock()
	if w.ca != nil {
		_ = w.ca.Close()
	}
}

// setup registers the local and the remote region, seeds the remote one
// from the local one (a verified push of every slot) and plans the
// prepared push.
func (w *rworker) setup(ctx context.Context) error {
	_, ga, upA := w.a.current()
	if !upA {
		return errDaemonDown
	}
	ctx, cancel := context.WithTimeout(ctx, 4*rCallLimit)
	defer cancel()
	w.seq++
	ca, err := client.Dial(w.a.socket)
	if err != nil {
		return fmt.Errorf("dial %s: %w", w.a.name, err)
	}
	cb, err := w.b.dial()
	if err != nil {
		_ = ca.Close()
		return err
	}
	w.connMu.Lock()
	w.ca, w.cb = ca, cb
	w.connMu.Unlock()
	w.genA, w.killSeen = ga, w.kills.Load()
	w.export = fmt.Sprintf("soak-w%d-%d-%d", w.id, w.s.runID, w.seq)
	if w.locPath, err = makeFile(w.a.shm, w.export); err != nil {
		return err
	}
	// Exported too: the remote daemon pushes into it and pulls from it.
	if w.loc, err = ca.ImportHostFile(ctx, w.locPath, 0, regionSize, w.export, client.Readers("*")); err != nil {
		return fmt.Errorf("import %s: %w", w.locPath, err)
	}
	resp, err := cb.API().RegisterRegion(ctx, &b2bv1.RegisterRegionRequest{
		Source:     &b2bv1.RegisterRegionRequest_HostAlloc{HostAlloc: &b2bv1.HostAlloc{Size: regionSize}},
		ExportName: w.export, Readers: []string{"*"}})
	if err != nil {
		return fmt.Errorf("register %s on %s: %w", w.export, w.b.name, err)
	}
	w.remID = resp.GetRegion().GetId()
	_, _ = w.fill.Read(w.loc.Bytes)
	offs := make([]uint64, rSlots)
	for i := range offs {
		offs[i] = uint64(i) * slotSize
	}
	if _, err := ca.BatchTransfer(ctx, client.Transfer{SrcRegion: w.loc.Id, Peer: w.b.peer, DstRegion: w.export, Transport: w.transportKind(),
		Blocks: client.Descriptors{Src: offs, Dst: offs, BlockLength: slotSize}}); err != nil {
		return fmt.Errorf("seed push: %w", err)
	}
	got, err := w.remoteDigests(offs, slotSize, verifyLimit)
	if err != nil {
		return fmt.Errorf("seed check: %w", err)
	}
	if !slices.Equal(got, localDigests(w.loc.Bytes, offs, slotSize)) {
		w.s.stats.falseSuccess.Add(1)
		w.s.stats.violation("false_success", "seed_push", w.id, "the seeding push answered OK but the remote region's CRC32Cs differ (%s)", w.route())
		return errors.New("seed push: false success")
	}
	if err := w.prepare(ctx); err != nil {
		return err
	}
	w.ready = true
	return nil
}

func (w *rworker) prepare(ctx context.Context) error {
	offs := []uint64{0, 2 * planBlock, 4 * planBlock, 6 * planBlock}
	p, err := w.ca.Prepare(ctx, client.Transfer{SrcRegion: w.loc.Id, Peer: w.b.peer, DstRegion: w.export, Transport: w.transportKind(),
		Blocks: client.Descriptors{Src: offs, Dst: offs, BlockLength: planBlock}})
	if err != nil {
		w.plan = nil
		return fmt.Errorf("prepare: %w", err)
	}
	w.plan = p
	return nil
}

// teardown settles the quarantine (the remote checks need the remote
// connection, closed after them), judges the overruns, and releases both
// regions.
func (w *rworker) teardown() {
	stop := time.Now().Add(verifyLimit)
	for len(w.quar) > 0 && time.Now().Before(stop) {
		next := stop
		for _, q := range w.quar {
			next = minTime(next, q.until)
		}
		time.Sleep(time.Until(next))
		w.checkQuarantine()
	}
	for range w.quar {
		w.s.stats.recheckLost.Add(1)
	}
	w.quar = w.quar[:0]
	time.Sleep(time.Until(w.lastEnd().Add(lookahead)))
	w.judgeLate(true)
	w.connMu.Lock()
	ca, cb := w.ca, w.cb
	w.ca, w.cb = nil, nil
	w.connMu.Unlock()
	if cb != nil {
		if w.remID != "" {
			ctx, cancel := context.WithTimeout(context.Background(), rCallLimit)
			_ = cb.Deregister(ctx, w.remID)
			cancel()
		}
		_ = cb.Close() // releases the remote region's lease if the deregistration did not
	}
	if ca != nil {
		_ = ca.Close() // releases the plan
	}
	if w.loc != nil {
		w.dropLocal(w.loc.Id)
	}
	if w.loc != nil {
		_ = unix.Munmap(w.loc.Bytes)
		w.loc.Bytes = nil
	}
	if w.locPath != "" {
		_ = os.Remove(w.locPath)
	}
	w.loc, w.locPath, w.remID, w.plan, w.ready = nil, "", "", nil, false
}

// dropLocal deregisters the local region on a fresh connection: leases
// are per client process, and this one stays connected (the pingers), so
// a worker's region outlives its connection as it would a client's
// connection that is not its last. A cut transfer may still pin it a
// moment; a restarted daemon has lost it anyway.
func (w *rworker) dropLocal(id string) {
	if _, gen, up := w.a.current(); !up || gen != w.genA {
		return
	}
	c, err := client.Dial(w.a.socket)
	if err != nil {
		return
	}
	defer c.Close()
	stop := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), rCallLimit)
		err := c.Deregister(ctx, id)
		cancel()
		if status.Code(err) != codes.FailedPrecondition || time.Now().After(stop) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func (w *rworker) lastEnd() time.Time {
	var t time.Time
	for _, o := range w.late {
		t = later(t, o.end)
	}
	return t
}

func (w *rworker) route() string {
	return w.a.name + "<->" + w.b.name + " " + w.s.cfg.Transport
}

// busy: the slot holds quarantined blocks on that side.
func (w *rworker) busy(remote bool, slot int) bool {
	for _, q := range w.quar {
		if q.remote == remote && q.slot == slot {
			return true
		}
	}
	return false
}

// blocks picks 1-4 gapped blocks of one size in a free slot of each side.
func (w *rworker) blocks(x *rxfer) bool {
	x.n = blockSizes[w.r.IntN(len(blockSizes))]
	k := 1 + w.r.IntN(4)
	for try := 0; try < 8; try++ {
		x.lslot, x.rslot = 1+w.r.IntN(rSlots-1), 1+w.r.IntN(rSlots-1)
		if w.busy(false, x.lslot) || w.busy(true, x.rslot) {
			continue
		}
		x.loffs, x.roffs = make([]uint64, k), make([]uint64, k)
		for j := range k {
			x.loffs[j] = uint64(x.lslot)*slotSize + uint64(j)*2*x.n
			x.roffs[j] = uint64(x.rslot)*slotSize + uint64(j)*2*x.n
		}
		return true
	}
	return false
}
