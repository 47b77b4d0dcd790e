package soak

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/b2bd/b2bd/client"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// A worker's two regions (its source on its own daemon, its destination
// on the peer) are files it creates in each daemon's --shm-dir:
//
//	[0, descArea)            descriptor transfers: slots of slotSize, slot 0 the prepared plan's
//	[descArea, regionSize-4K) the block-id layouts
//	[regionSize-8, regionSize) the trigger counter (source only)
const (
	regionSize = 2 << 20
	slotSize   = 32 << 10
	descArea   = 1 << 20
	slots      = descArea / slotSize
	layoutArea = regionSize - descArea - 4096
	counterOff = regionSize - 8
	callLimit  = 3 * time.Second // the long deadline; setup calls use it too
)

var blockSizes = []uint64{128, 256, 512, 1024, 2048, 4096}

// shape is a layout's geometry.
type shape struct{ blockLen, stride, n uint64 }

// worker is one client: its daemon a, its peer b, its regions, and the
// transfers it runs one after another.
type worker struct {
	id        int
	s         *soak
	a, b      *daemon
	transport b2bv1.TransportKind
	r         *rand.Rand
	fill      *rand.ChaCha8
	log       hclog.Logger

	connMu    sync.Mutex
	ca, cb    *client.Client
	ring      *client.Ring  // on a's submit socket (ring kinds); nil when it could not be had
	kills     atomic.Uint64 // moves when the chaos loop kills this worker
	killSeen  uint64
	pending   atomic.Uint32 // chaos requests (bits of event*)
	ready     bool
	seq       int
	genA      uint64
	genB      uint64
	peer      string
	src, dst  *client.HostRegion
	srcPath   string
	dstPath   string
	export    string
	layA      string
	layB      string
	lay       shape
	plan      *client.Plan
	planOffs  []uint64
	counter   uint64
	quar      []quarantined
	leftovers []leftover
	late      []overrun
	retired   []retiredMap
}

// Chaos requests a worker carries out between its transfers.
const (
	eventTruncate = 1 << iota
	eventLayout
	eventNarrow
)

// quarantined is a cut transfer's destination blocks: snapshotted at the
// answer, re-checked at until, never reused before.
type quarantined struct {
	kind       string
	mem        []byte
	lo, hi     uint64 // byte range in mem, for overlap
	offs       []uint64
	n          uint64
	crc        uint32
	until      time.Time
	localChaos bool
	what       string // the chaos on the worker's own daemon, when localChaos
	answeredAt time.Time
	around     string // pair, transport and both daemons' chaos during the call
	mA, mB     mark   // both daemons' chaos state at the answer
	// peerUnconfirmed: the peer was frozen or killed during the call and
	// the answer said its receiver did not confirm the cut (tcp's
	// cutNote): the copy it was entering may still complete. blockCRCs
	// then holds each block's CRC at the answer, to size what changed.
	peerUnconfirmed bool
	blockCRCs       []uint32
}

// unconfirmedCut is what the tcp transport's answer to a cut batch says
// when the receiver did not confirm in time that it stopped placing it;
// cutWindow bounds what may still land then: the one copy it was entering
// (tcp's copyPiece).
const (
	unconfirmedCut = "did not confirm in time"
	cutWindow      = 16 << 10
)

// changedBytes is how many bytes of q's blocks changed since the answer,
// by block.
func (q *quarantined) changedBytes() uint64 {
	var n uint64
	for i, o := range q.offs {
		if crc32.Checksum(q.mem[o:o+q.n], castagnoli) != q.blockCRCs[i] {
			n += q.n
		}
	}
	return n
}

type retiredMap struct {
	mem   []byte
	path  string
	until time.Time
}

func (w *worker) run(ctx context.Context) {
	defer w.teardown(true)
	for ctx.Err() == nil {
		if !w.ready || w.stale() {
			w.teardown(false)
			if err := w.setup(ctx); err != nil {
				if ctx.Err() == nil {
					w.s.stats.setupErrors.Add(1)
					w.log.Debug("setup", "err", err)
					sleep(ctx, time.Duration(20+w.r.IntN(200))*time.Millisecond)
				}
				continue
			}
		}
		w.step(ctx)
	}
}

// step runs one chaos request or one transfer; a fault reading a mapping
// (a region file cut short under it) is counted and the worker starts over.
func (w *worker) step(ctx context.Context) {
	old := debug.SetPanicOnFault(true)
	defer debug.SetPanicOnFault(old)
	defer func() {
		if p := recover(); p != nil {
			if e, ok := p.(runtime.Error); !ok || !strings.Contains(e.Error(), "fault") {
				panic(p) // a bug of the soak, not a region cut short
			}
			w.s.stats.faults.Add(1)
			w.s.stats.violation("fault", "mapping", w.id, "%v", p)
			w.ready = false
		}
	}()
	w.checkQuarantine(false)
	w.judgeLate(false)
	if ev := w.pending.Swap(0); ev != 0 {
		w.events(ctx, ev)
		return
	}
	w.transferOnce(ctx)
}

// stale: a daemon of the worker restarted, or the chaos loop killed it.
func (w *worker) stale() bool {
	_, ga, upA := w.a.current()
	_, gb, upB := w.b.current()
	return !upA || !upB || ga != w.genA || gb != w.genB || w.kills.Load() != w.killSeen
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// setup connects to both daemons and registers the worker's regions,
// layouts and plan afresh (new files, new names: the old ones' leases may
// still be in release).
func (w *worker) setup(ctx context.Context) error {
	peer, ga, upA := w.a.current()
	peerB, gb, upB := w.b.current()
	_ = peer
	if !upA || !upB {
		return errors.New("a daemon is down")
	}
	ctx, cancel := context.WithTimeout(ctx, 4*callLimit)
	defer cancel()
	w.seq++
	ca, err := client.Dial(w.a.socket)
	if err != nil {
		return fmt.Errorf("dial %s: %w", w.a.name, err)
	}
	cb, err := client.Dial(w.b.socket)
	if err != nil {
		_ = ca.Close()
		return fmt.Errorf("dial %s: %w", w.b.name, err)
	}
	ring, _ := client.DialRing(w.a.submit) // the ring kinds skip without it
	w.connMu.Lock()
	w.ca, w.cb, w.ring = ca, cb, ring
	w.connMu.Unlock()
	w.genA, w.genB, w.peer, w.killSeen = ga, gb, peerB, w.kills.Load()
	w.dropLeftovers(ctx)
	tag := fmt.Sprintf("w%d-%d-%d", w.id, w.s.runID, w.seq)
	w.export = tag
	if w.srcPath, err = makeFile(w.a.shm, tag+"-src"); err != nil {
		return err
	}
	if w.src, err = ca.ImportHostFile(ctx, w.srcPath, 0, regionSize, ""); err != nil {
		return fmt.Errorf("import source %s: %w", w.srcPath, err)
	}
	if w.dstPath, err = makeFile(w.b.shm, tag+"-dst"); err != nil {
		return err
	}
	if w.dst, err = cb.ImportHostFile(ctx, w.dstPath, 0, regionSize, w.export, client.Readers("*")); err != nil {
		return fmt.Errorf("import destination %s: %w", w.dstPath, err)
	}
	w.counter = 0
	if err := w.registerLayouts(ctx); err != nil {
		return err
	}
	if err := w.prepare(ctx); err != nil {
		return err
	}
	w.ready = true
	return nil
}

// leftover is what a worker registered on a daemon incarnation.
type leftover struct {
	d       *daemon
	gen     uint64
	regions []string
	layouts []string
}

// noteLeftovers records the worker's registrations: leases are per client
// process, and this process stays connected, so a worker gone (closed or
// killed) leaves them to its next incarnation to deregister, as a client
// process restarting would find and drop them.
func (w *worker) noteLeftovers() {
	var ra, rb []string
	if w.src != nil {
		ra = append(ra, w.src.Id)
	}
	if w.dst != nil {
		rb = append(rb, w.dst.Id)
	}
	w.leftovers = append(w.leftovers,
		leftover{d: w.a, gen: w.genA, regions: ra, layouts: []string{w.layA}},
		leftover{d: w.b, gen: w.genB, regions: rb, layouts: []string{w.layB}})
	w.layA, w.layB = "", ""
}

// dropLeftovers deregisters them where their daemon incarnation still runs.
func (w *worker) dropLeftovers(ctx context.Context) {
	for _, l := range w.leftovers {
		c := w.ca
		if l.d == w.b {
			c = w.cb
		}
		if _, gen, up := l.d.current(); !up || gen != l.gen || c == nil {
			continue
		}
		dctx, cancel := context.WithTimeout(ctx, callLimit)
		for _, name := range l.layouts {
			if name != "" {
				_ = c.DeregisterLayout(dctx, name)
			}
		}
		for _, id := range l.regions {
			_ = c.Deregister(dctx, id)
		}
		cancel()
	}
	w.leftovers = w.leftovers[:0]
}

// makeFile creates a zeroed region file in a daemon's shm directory.
func makeFile(dir, name string) (string, error) {
	p := filepath.Join(dir, name)
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o600)
	if err != nil {
		return "", fmt.Errorf("region file: %w", err)
	}
	defer f.Close()
	if err := f.Truncate(regionSize); err != nil {
		return "", fmt.Errorf("region file %s: %w", p, err)
	}
	return p, nil
}

func (w *worker) registerLayouts(ctx context.Context) error {
	bl := blockSizes[w.r.IntN(len(blockSizes))]
	stride := bl * uint64(1+w.r.IntN(2))
	w.lay = shape{blockLen: bl, stride: stride, n: min(layoutArea/stride, 256)}
	w.layA = fmt.Sprintf("%s-la%d", w.export, w.r.Uint32())
	w.layB = fmt.Sprintf("%s-lb%d", w.export, w.r.Uint32())
	seg := func(id string) []client.Segment {
		return []client.Segment{{RegionID: id, Offset: descArea, BlockLen: w.lay.blockLen, Stride: w.lay.stride}}
	}
	if _, err := w.ca.RegisterLayout(ctx, client.Layout{Name: w.layA, Segments: seg(w.src.Id), NumBlocks: w.lay.n}); err != nil {
		return fmt.Errorf("register layout %s: %w", w.layA, err)
	}
	if _, err := w.cb.RegisterLayout(ctx, client.Layout{Name: w.layB, Segments: seg(w.dst.Id), NumBlocks: w.lay.n, Export: w.layB, Readers: []string{"*"}}); err != nil {
		return fmt.Errorf("register layout %s: %w", w.layB, err)
	}
	return nil
}

// prepare plans a push of four 512 B blocks in slot 0, both sides.
func (w *worker) prepare(ctx context.Context) error {
	const n = 512
	w.planOffs = []uint64{0, 2 * n, 4 * n, 6 * n}
	p, err := w.ca.Prepare(ctx, client.Transfer{SrcRegion: w.src.Id, Peer: w.peer, DstRegion: w.export, Transport: w.transport,
		Blocks: client.Descriptors{Src: w.planOffs, Dst: w.planOffs, BlockLength: n}})
	if err != nil {
		w.plan = nil
		return fmt.Errorf("prepare: %w", err)
	}
	w.plan = p
	return nil
}

// teardown closes the connections (the daemons release the leased regions,
// layouts and plan) and retires the mappings: quarantined blocks are
// still re-checked there; final re-checks them all now.
func (w *worker) teardown(final bool) {
	w.noteLeftovers()
	if final {
		w.dropFinal()
	}
	w.connMu.Lock()
	if w.ring != nil {
		_ = w.ring.Close()
		w.ring = nil
	}
	if w.ca != nil {
		_ = w.ca.Close()
	}
	if w.cb != nil {
		_ = w.cb.Close()
	}
	w.ca, w.cb = nil, nil
	w.connMu.Unlock()
	until := time.Now()
	for _, q := range w.quar {
		until = later(until, q.until)
	}
	for _, r := range []struct {
		h    *client.HostRegion
		path string
	}{{w.src, w.srcPath}, {w.dst, w.dstPath}} {
		if r.h != nil && r.h.Bytes != nil {
			w.retired = append(w.retired, retiredMap{mem: r.h.Bytes, path: r.path, until: until})
			r.h.Bytes = nil
		} else if r.path != "" {
			_ = os.Remove(r.path)
		}
	}
	w.src, w.dst, w.srcPath, w.dstPath, w.plan, w.ready = nil, nil, "", "", nil, false
	if final {
		w.checkQuarantine(true)
		time.Sleep(time.Until(w.lastEnd().Add(lookahead)))
		w.judgeLate(true)
	}
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// kill is the chaos loop's: the worker's connections close under its
// transfer in flight, as if the client process died.
func (w *worker) kill() {
	w.kills.Add(1)
	w.connMu.Lock()
	defer w.connMu.Unlock()
	if w.ca != nil {
		_ = w.ca.Close()
	}
	if w.cb != nil {
		_ = w.cb.Close()
	}
}

// checkQuarantine re-checks the quarantined blocks whose time came (all of
// them when all), and unmaps retired mappings none of them needs any more.
func (w *worker) checkQuarantine(all bool) {
	now := time.Now()
	keep := w.quar[:0]
	for _, q := range w.quar {
		if !all && now.Before(q.until) {
			keep = append(keep, q)
			continue
		}
		w.s.stats.lateChecked.Add(1)
		if got := crcBlocks(q.mem, q.offs, q.n); got != q.crc {
			switch {
			case q.localChaos:
				w.s.stats.lateBytesChaos.Add(1)
				w.s.stats.violation("late_bytes_own_daemon_chaos (not counted)", q.kind, w.id, "destination blocks changed %v after the answer, with the worker's own daemon %s (call: %s; since the answer: %s)",
					now.Sub(q.answeredAt).Round(time.Millisecond), q.what, q.around, w.around(q.mA, q.mB))
			case q.peerUnconfirmed && q.changedBytes() <= cutWindow:
				// What the answer said may still happen, within its bound.
				w.s.stats.lateBytesUnconfirmed.Add(1)
				w.s.stats.violation("late_bytes_peer_stopped_unconfirmed (not counted)", q.kind, w.id, "%d B of the destination changed %v after an answer that said the stopped receiver did not confirm the cut (call: %s; since the answer: %s)",
					q.changedBytes(), now.Sub(q.answeredAt).Round(time.Millisecond), q.around, w.around(q.mA, q.mB))
			default:
				w.s.stats.lateBytes.Add(1)
				w.s.stats.violation("late_bytes", q.kind, w.id, "destination blocks changed %v after the answer (crc %08x at the answer, %08x now; %d blocks of %d B; call: %s; since the answer: %s)",
					now.Sub(q.answeredAt).Round(time.Millisecond), q.crc, got, len(q.offs), q.n, q.around, w.around(q.mA, q.mB))
			}
		}
	}
	w.quar = keep
	keepR := w.retired[:0]
	for _, r := range w.retired {
		if !all && now.Before(r.until) {
			keepR = append(keepR, r)
			continue
		}
		_ = unix.Munmap(r.mem)
		_ = os.Remove(r.path)
	}
	w.retired = keepR
}

// overlaps: a quarantined range of mem intersects [lo, hi).
func (w *worker) overlaps(mem []byte, lo, hi uint64) bool {
	for _, q := range w.quar {
		if &q.mem[0] == &mem[0] && lo < q.hi && q.lo < hi {
			return true
		}
	}
	return false
}

// dropFinal deregisters everything the worker left, on fresh connections.
func (w *worker) dropFinal() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*callLimit)
	defer cancel()
	w.connMu.Lock()
	old := []*client.Client{w.ca, w.cb}
	w.connMu.Unlock()
	for _, c := range old {
		if c != nil {
			_ = c.Close()
		}
	}
	ca, errA := client.Dial(w.a.socket)
	cb, errB := client.Dial(w.b.socket)
	if errA == nil && errB == nil {
		w.connMu.Lock()
		w.ca, w.cb = ca, cb
		w.connMu.Unlock()
		w.dropLeftovers(ctx)
	}
	w.leftovers = nil
}

func (w *worker) lastEnd() time.Time {
	var t time.Time
	for _, o := range w.late {
		t = later(t, o.end)
	}
	return t
}
