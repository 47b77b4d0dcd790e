package soak

import (
	"context"
	"hash/crc32"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/client"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

const opRead = b2bv1.TransferOp_TRANSFER_OP_READ

// xfer is one transfer's blocks: a fresh random pattern is written at
// patOffs of patMem (the source: the local region for a push, the peer's for
// a pull) and must arrive at chkOffs of chkMem.
type xfer struct {
	kind             string
	patMem, chkMem   []byte
	patOffs, chkOffs []uint64
	n                uint64
	want             uint32
	refusal          bool // the grants forbid it: success is a violation
}

// kinds is the traffic mix, by weight.
var kinds = []struct {
	name   string
	weight int
}{
	{"push", 14}, {"pull", 12}, {"blocks_push", 10}, {"blocks_pull", 8}, {"prepared", 10},
	{"async_wait", 12}, {"async_poll", 8}, {"async_cancel", 8}, {"async_submit", 8}, {"triggered", 5},
	{"ring_push", 6}, {"ring_pull", 5},
}

var kindTotal = func() (t int) {
	for _, k := range kinds {
		t += k.weight
	}
	return t
}()

func (w *worker) pickKind() string {
	x := w.r.IntN(kindTotal)
	for _, k := range kinds {
		if x < k.weight {
			return k.name
		}
		x -= k.weight
	}
	return kinds[0].name
}

// descBlocks picks 1-4 gapped blocks of one size in a random slot of each
// side, none in quarantine; ok false when it could not.
func (w *worker) descBlocks(read bool) (srcOffs, dstOffs []uint64, n uint64, ok bool) {
	n = blockSizes[w.r.IntN(len(blockSizes))]
	k := 1 + w.r.IntN(4)
	for try := 0; try < 8; try++ {
		ss, ds := uint64(1+w.r.IntN(slots-1)), uint64(1+w.r.IntN(slots-1))
		srcOffs, dstOffs = make([]uint64, k), make([]uint64, k)
		for j := range k {
			srcOffs[j] = ss*slotSize + uint64(j)*2*n
			dstOffs[j] = ds*slotSize + uint64(j)*2*n
		}
		if !w.overlaps(w.src.Bytes, ss*slotSize, (ss+1)*slotSize) && !w.overlaps(w.dst.Bytes, ds*slotSize, (ds+1)*slotSize) {
			return srcOffs, dstOffs, n, true
		}
	}
	return nil, nil, 0, false
}

// idBlocks picks 1-4 distinct block ids on each side, none in quarantine.
func (w *worker) idBlocks() (local, remote []uint32, lo, ro []uint64, ok bool) {
	k := 1 + w.r.IntN(4)
	pick := func(mem []byte) ([]uint32, []uint64, bool) {
		ids, offs := make([]uint32, 0, k), make([]uint64, 0, k)
		seen := map[uint32]bool{}
		for len(ids) < k {
			id := uint32(w.r.Uint64N(w.lay.n))
			if seen[id] {
				continue
			}
			seen[id] = true
			off := descArea + uint64(id)*w.lay.stride
			if w.overlaps(mem, off, off+w.lay.blockLen) {
				return nil, nil, false
			}
			ids, offs = append(ids, id), append(offs, off)
		}
		return ids, offs, true
	}
	var okL, okR bool
	if local, lo, okL = pick(w.src.Bytes); !okL {
		return nil, nil, nil, nil, false
	}
	remote, ro, okR = pick(w.dst.Bytes)
	return local, remote, lo, ro, okR
}

// fillPattern writes fresh random bytes into the pattern blocks.
func (w *worker) fillPattern(x *xfer) {
	for _, o := range x.patOffs {
		_, _ = w.fill.Read(x.patMem[o : o+x.n])
	}
	x.want = crcBlocks(x.patMem, x.patOffs, x.n)
}

// limits draws a call's deadline (mostly long, sometimes a few ms so that
// it cuts the transfer) and a cancel delay (-1: none).
func (w *worker) limits() (deadline, cancelAfter time.Duration) {
	return drawLimits(w.r, callLimit, 30*time.Millisecond, 3*time.Millisecond)
}

// drawLimits draws a call's deadline (long, or for 15% of calls 1 ms to
// shortMax) and a cancel delay (for 10% of calls under cancelMax, µs
// resolution; else -1: none).
func drawLimits(r *rand.Rand, long, shortMax, cancelMax time.Duration) (deadline, cancelAfter time.Duration) {
	deadline = long
	if r.IntN(100) < 15 {
		deadline = time.Duration(1+r.IntN(int(shortMax/time.Millisecond))) * time.Millisecond
	}
	cancelAfter = -1
	if r.IntN(100) < 10 {
		cancelAfter = time.Duration(r.IntN(int(cancelMax/time.Microsecond))) * time.Microsecond
	}
	return deadline, cancelAfter
}

// call is one call's bookkeeping from its start.
type call struct {
	start, due time.Time
	cancelAt   time.Time // zero: not cancelled before its deadline
	mA, mB     mark
	kills      uint64
}

func (w *worker) begin(due time.Time) call {
	return call{start: time.Now(), due: due, mA: w.a.mark(), mB: w.b.mark(), kills: w.kills.Load()}
}

// finish classifies an answer and checks the invariants on it.
func (w *worker) finish(c call, x *xfer, err error) {
	now := time.Now()
	st := w.s.stats
	if w.kills.Load() != c.kills {
		st.workerKilled.Add(1)
		return
	}
	ks := st.kind(x.kind)
	ks.transfers.Add(1)
	localHit, peerHit := w.a.disturbedSince(c.mA), w.b.disturbedSince(c.mB)
	if localHit || peerHit {
		st.chaosAffected.Add(1)
	}
	// The peer's answers count only while no chaos was on it: a frozen
	// peer must not widen the allowance it is judged by.
	o := overrun{kind: x.kind, start: c.start, end: now, due: c.due, localHit: localHit, peerHit: peerHit, err: err, ping: []*series{w.a.ping},
		around: w.around(c.mA, c.mB)}
	if peerHit {
		o.peerWhat = "peer " + w.b.name + " " + w.b.what(c.mB) + " during the call; "
	}
	if !peerHit {
		o.ping = append(o.ping, w.b.ping)
	}
	if slack, _ := w.s.sched.slack(c.start, now, o.ping...); now.Sub(c.due) > slack {
		w.late = append(w.late, o) // judged once the delays around it are measured
	} else if !localHit && !peerHit {
		st.noteLate(now.Sub(c.due))
	}
	if !c.cancelAt.IsZero() && !localHit && !peerHit {
		if slack, _ := w.s.sched.slack(c.start, now, o.ping...); now.Sub(c.cancelAt) > slack {
			// Not an invariant: a cancel answers once no byte can land,
			// which may take the data path's own time; reported.
			st.cancelOverruns.Add(1)
			st.noteCancelLate(now.Sub(c.cancelAt))
		}
	}
	if err == nil {
		ks.done.Add(1)
		st.checks.Add(1)
		if x.refusal {
			st.grantViolations.Add(1)
			st.violation("grant", x.kind, w.id, "a transfer the export's grants forbid answered OK")
			return
		}
		if got := crcBlocks(x.chkMem, x.chkOffs, x.n); got != x.want {
			st.falseSuccess.Add(1)
			st.violation("false_success", x.kind, w.id, "answered OK but the destination's CRC32C is %08x, the source's %08x (%d blocks of %d B, %s)",
				got, x.want, len(x.chkOffs), x.n, w.route())
		}
		return
	}
	code := status.Code(err)
	switch code {
	case codes.Canceled:
		ks.cancelled.Add(1)
	case codes.DeadlineExceeded:
		ks.deadline.Add(1)
	default:
		ks.failed.Add(1)
	}
	st.errCode(x.kind, code.String(), err)
	if x.chkMem == nil {
		return
	}
	lo, hi := x.chkOffs[0], x.chkOffs[len(x.chkOffs)-1]+x.n
	for _, o := range x.chkOffs {
		lo, hi = min(lo, o), max(hi, o+x.n)
	}
	what := ""
	if localHit {
		what = w.a.name + " " + w.a.what(c.mA)
	}
	q := quarantined{kind: x.kind, what: what, mem: x.chkMem, lo: lo, hi: hi, offs: x.chkOffs, n: x.n,
		crc: crcBlocks(x.chkMem, x.chkOffs, x.n), until: now.Add(time.Duration(200+w.r.IntN(1800)) * time.Millisecond),
		localChaos: localHit, answeredAt: now, around: w.around(c.mA, c.mB), mA: w.a.mark(), mB: w.b.mark()}
	if peerHit && strings.Contains(err.Error(), unconfirmedCut) {
		q.peerUnconfirmed = true
		for _, o := range x.chkOffs {
			q.blockCRCs = append(q.blockCRCs, crc32.Checksum(x.chkMem[o:o+x.n], castagnoli))
		}
	}
	w.quar = append(w.quar, q)
}

// around names the call's pair and transport and the chaos on both
// daemons since the marks: "soak0->soak3 tcp; soak0 calm, soak3 frozen".
func (w *worker) around(mA, mB mark) string {
	return w.route() + "; " + w.a.name + " " + w.a.state(mA) + ", " + w.b.name + " " + w.b.state(mB)
}

func (w *worker) route() string {
	t := "auto"
	if w.transport == b2bv1.TransportKind_TRANSPORT_KIND_TCP {
		t = "tcp"
	}
	return w.a.name + "->" + w.b.name + " " + t
}

// syncCall runs fn under a drawn deadline and maybe a cancel.
func (w *worker) syncCall(x *xfer, fn func(ctx context.Context) error) error {
	d, cancelAfter := w.limits()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	due := time.Now().Add(d)
	var cancelAt time.Time
	if cancelAfter >= 0 {
		t := time.AfterFunc(cancelAfter, cancel)
		defer t.Stop()
		if ca := time.Now().Add(cancelAfter); ca.Before(due) {
			cancelAt = ca
		}
	}
	w.fillPattern(x)
	c := w.begin(due)
	c.cancelAt = cancelAt
	err := fn(ctx)
	w.finish(c, x, err)
	return err
}

func (w *worker) transferOnce(ctx context.Context) {
	kind := w.pickKind()
	read := kind == "pull" || kind == "blocks_pull" || kind == "ring_pull" || (kind == "async_poll" || kind == "async_wait") && w.r.IntN(2) == 0
	x := &xfer{kind: kind}
	var t client.Transfer
	var blocks client.Blocks
	useIDs := kind == "blocks_push" || kind == "blocks_pull" || kind == "async_poll" && w.r.IntN(2) == 0
	switch {
	case kind == "prepared" || kind == "async_submit":
		if w.plan == nil || w.overlaps(w.src.Bytes, 0, slotSize) || w.overlaps(w.dst.Bytes, 0, slotSize) {
			return
		}
		x.patMem, x.patOffs, x.chkMem, x.chkOffs, x.n = w.src.Bytes, w.planOffs, w.dst.Bytes, w.planOffs, 512
	case useIDs:
		local, remote, lo, ro, ok := w.idBlocks()
		if !ok {
			return
		}
		blocks = client.Blocks{LocalLayout: w.layA, Peer: w.peer, RemoteLayout: w.layB, LocalIDs: local, RemoteIDs: remote, Transport: w.transport}
		x.n = w.lay.blockLen
		x.patMem, x.patOffs, x.chkMem, x.chkOffs = w.src.Bytes, lo, w.dst.Bytes, ro
		if read {
			blocks.Op = opRead
			x.patMem, x.patOffs, x.chkMem, x.chkOffs = w.dst.Bytes, ro, w.src.Bytes, lo
		}
	default:
		so, do, n, ok := w.descBlocks(read)
		if !ok {
			return
		}
		t = client.Transfer{SrcRegion: w.src.Id, Peer: w.peer, DstRegion: w.export, Transport: w.transport,
			Blocks: client.Descriptors{Src: so, Dst: do, BlockLength: n}}
		x.n = n
		x.patMem, x.patOffs, x.chkMem, x.chkOffs = w.src.Bytes, so, w.dst.Bytes, do
		if read {
			t.Op = opRead
			x.patMem, x.patOffs, x.chkMem, x.chkOffs = w.dst.Bytes, do, w.src.Bytes, so
		}
	}
	ca, ring := w.ca, w.ring
	switch kind {
	case "push", "pull":
		w.syncCall(x, func(ctx context.Context) error { _, err := ca.BatchTransfer(ctx, t); return err })
	case "ring_push", "ring_pull":
		if ring == nil {
			return
		}
		// An ad hoc batch as a ring record (its descriptors in the arena);
		// its deadline rides in the record, a cancel goes through the ring.
		w.syncCall(x, func(ctx context.Context) error { _, err := ca.TransferRing(ctx, ring, t); return err })
	case "blocks_push", "blocks_pull":
		w.syncCall(x, func(ctx context.Context) error { _, err := ca.TransferBlocks(ctx, blocks); return err })
	case "prepared":
		p := w.plan
		w.replan(w.syncCall(x, func(ctx context.Context) error { _, err := p.Submit(ctx); return err }))
	case "async_submit":
		w.replan(w.async(kind, x, t, blocks, useIDs))
	default:
		w.async(kind, x, t, blocks, useIDs)
	}
}

// replan prepares the plan again when the daemon called it stale (its
// destination was re-exported, or its peer came back).
func (w *worker) replan(err error) {
	if status.Code(err) != codes.FailedPrecondition || w.plan == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), callLimit)
	defer cancel()
	_ = w.plan.Release(ctx)
	if w.prepare(ctx) != nil {
		w.ready = false
	}
}

// asyncLimit draws an async transfer's timeout.
func (w *worker) asyncLimit() time.Duration {
	if w.r.IntN(100) < 15 {
		return time.Duration(1+w.r.IntN(30)) * time.Millisecond
	}
	return callLimit
}

// async starts a transfer and follows it by Wait, Poll or Cancel.
func (w *worker) async(kind string, x *xfer, t client.Transfer, blocks client.Blocks, useIDs bool) error {
	timeout := w.asyncLimit()
	ca := w.ca
	var opts []client.StartOption
	if kind == "triggered" {
		opts = append(opts, client.After(w.src.Id, counterOff, w.counter+1))
	}
	w.fillPattern(x)
	c := w.begin(time.Now().Add(timeout))
	sctx, scancel := context.WithTimeout(context.Background(), callLimit)
	defer scancel()
	var h *client.TransferHandle
	var err error
	switch {
	case kind == "async_submit":
		h, err = ca.StartSubmit(sctx, w.plan.Handle, timeout)
	case useIDs:
		h, err = ca.StartBlocks(sctx, blocks, timeout)
	default:
		h, err = ca.StartTransfer(sctx, t, timeout, opts...)
	}
	if err != nil {
		w.finish(c, x, err)
		return err
	}
	wctx, wcancel := context.WithTimeout(context.Background(), timeout+2*callLimit)
	defer wcancel()
	switch kind {
	case "triggered":
		time.Sleep(time.Duration(w.r.IntN(2000)) * time.Microsecond)
		w.counter++
		atomic.StoreUint64((*uint64)(unsafe.Pointer(&w.src.Bytes[counterOff])), w.counter)
		_, err = h.Wait(wctx, 0)
	case "async_poll":
		for {
			var os []*b2bv1.TransferOutcome
			if os, err = ca.Poll(wctx, []*client.TransferHandle{h}); err != nil || ended(os[0]) {
				break
			}
			time.Sleep(time.Duration(500+w.r.IntN(2000)) * time.Microsecond)
		}
	case "async_cancel":
		d := time.Duration(w.r.IntN(3000)) * time.Microsecond
		time.Sleep(d)
		if at := time.Now(); at.Before(c.due) {
			c.cancelAt = at
		}
		_, err = h.Cancel(wctx)
	default:
		_, err = h.Wait(wctx, 0)
	}
	if err == nil {
		_, err = h.Result()
	}
	w.finish(c, x, err)
	return err
}

func ended(o *b2bv1.TransferOutcome) bool {
	s := o.GetState()
	return s != b2bv1.TransferState_TRANSFER_STATE_RUNNING && s != b2bv1.TransferState_TRANSFER_STATE_UNSPECIFIED
}

// overrun is an answer that came past its deadline plus the slack known at
// the time, to judge again once the delays after it are measured too.
type overrun struct {
	kind              string
	start, end, due   time.Time
	localHit, peerHit bool
	answerWire        bool // the two-host form: the answer crossed a wire that went down
	peerWhat          string
	around            string // pair, transport and both daemons' chaos during the call
	err               error
	ping              []*series
}

// judgeLate judges the overruns whose lookahead passed (all when all).
func (w *worker) judgeLate(all bool) { w.late = w.s.judgeLate(w.late, w.id, all) }

// judgeLate judges worker id's overruns in late whose lookahead passed
// (all when all) and returns those still waiting: an answer within the
// slack measured around it is fine; past it, one with its own daemon hit
// by chaos is counted apart (not an invariant), one that crossed a link
// flap on its way back too, and every other is a violation.
func (s *soak) judgeLate(late []overrun, id int, all bool) []overrun {
	st := s.stats
	keep := late[:0]
	for _, o := range late {
		if !all && time.Since(o.end) < lookahead {
			keep = append(keep, o)
			continue
		}
		slack, margin := s.sched.slack(o.start, o.end, o.ping...)
		over := o.end.Sub(o.due)
		switch {
		case over <= slack:
			if !o.localHit && !o.peerHit {
				st.noteLate(over)
			}
		case o.answerWire:
			st.overrunsAnswerWire.Add(1)
		case o.localHit:
			st.overrunsLocalChaos.Add(1)
		case o.peerHit:
			st.overrunsPeerChaos.Add(1)
			st.violation("deadline_overrun_peer_chaos", o.kind, id, "answered %v after its deadline (allowed %v incl. margin %v; %s%s): %v",
				over.Round(time.Millisecond), slack.Round(time.Millisecond), margin.Round(time.Millisecond), o.peerWhat, o.around, o.err)
		default:
			st.overruns.Add(1)
			st.violation("deadline_overrun", o.kind, id, "answered %v after its deadline (allowed %v incl. margin %v; %s): %v",
				over.Round(time.Millisecond), slack.Round(time.Millisecond), margin.Round(time.Millisecond), o.around, o.err)
		}
	}
	return keep
}
