package soak

import (
	"context"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/client"
)

// rkinds is the two-host form's traffic mix, by weight.
var rkinds = []struct {
	name   string
	weight int
}{{"push", 20}, {"pull", 20}, {"async_wait", 12}, {"async_cancel", 8}, {"prepared", 12}, {"remote_push", 14}, {"remote_pull", 14}}

func (w *rworker) pickKind() string {
	t := 0
	for _, k := range rkinds {
		t += k.weight
	}
	x := w.r.IntN(t)
	for _, k := range rkinds {
		if x < k.weight {
			return k.name
		}
		x -= k.weight
	}
	return rkinds[0].name
}

// limits draws a call's deadline (mostly long, sometimes short enough to
// cut the transfer: a small one takes tens of ms between emulated hosts)
// and a cancel delay (-1: none).
func (w *rworker) limits() (deadline, cancelAfter time.Duration) {
	return drawLimits(w.r, rCallLimit, 100*time.Millisecond, 50*time.Millisecond)
}

// rcall is one call's bookkeeping from its start.
type rcall struct {
	start, due time.Time
	cancelAt   time.Time
	mA         mark
	mW         wireMark
	kills      uint64
}

func (w *rworker) begin(due time.Time) rcall {
	return rcall{start: time.Now(), due: due, mA: w.a.mark(), mW: w.b.mark(), kills: w.kills.Load()}
}

// source writes a push's fresh pattern, or reads a pull's source digests
// across the wire (false when the wire is down: the transfer is skipped)
// and fills its local destination with fresh junk, so that a block that
// did not land cannot match.
func (w *rworker) source(x *rxfer) bool {
	if !x.read {
		for _, o := range x.loffs {
			_, _ = w.fill.Read(w.loc.Bytes[o : o+x.n])
		}
		x.want = localDigests(w.loc.Bytes, x.loffs, x.n)
		return true
	}
	want, err := w.remoteDigests(x.roffs, x.n, 0)
	if err != nil {
		w.s.stats.skippedWire.Add(1)
		if status.Code(err) == codes.NotFound {
			w.ready = false // the remote region is gone (its lease went with a broken connection)
		}
		time.Sleep(50 * time.Millisecond)
		return false
	}
	x.want = want
	for _, o := range x.loffs {
		_, _ = w.fill.Read(w.loc.Bytes[o : o+x.n])
	}
	return true
}

func (w *rworker) transferOnce() {
	kind := w.pickKind()
	x := &rxfer{kind: kind, read: kind == "pull" || kind == "remote_push" || (kind == "async_wait" || kind == "async_cancel") && w.r.IntN(2) == 0,
		viaRemote: kind == "remote_push" || kind == "remote_pull"}
	if kind == "prepared" {
		if w.plan == nil || w.busy(false, 0) || w.busy(true, 0) {
			return
		}
		x.n, x.loffs = planBlock, []uint64{0, 2 * planBlock, 4 * planBlock, 6 * planBlock}
		x.roffs = x.loffs
	} else if !w.blocks(x) {
		return
	}
	if x.read && x.kind != "pull" && !x.viaRemote {
		x.kind += "_pull"
	}
	if !w.source(x) {
		return
	}
	t := client.Transfer{SrcRegion: w.loc.Id, Peer: w.b.peer, DstRegion: w.export, Transport: w.transportKind(),
		Blocks: client.Descriptors{Src: x.loffs, Dst: x.roffs, BlockLength: x.n}}
	if x.read {
		t.Op = opRead
	}
	ca := w.ca
	switch kind {
	case "remote_push", "remote_pull":
		peer, _, _ := w.a.current()
		rt := client.Transfer{SrcRegion: w.remID, Peer: peer, DstRegion: w.export, Transport: w.transportKind(),
			Blocks: client.Descriptors{Src: x.roffs, Dst: x.loffs, BlockLength: x.n}}
		if kind == "remote_pull" {
			rt.Op = opRead
		}
		cb := w.cb
		w.syncCall(x, func(ctx context.Context) error { _, err := cb.BatchTransfer(ctx, rt); return err })
	case "push", "pull":
		w.syncCall(x, func(ctx context.Context) error { _, err := ca.BatchTransfer(ctx, t); return err })
	case "prepared":
		p := w.plan
		err := w.syncCall(x, func(ctx context.Context) error { _, err := p.Submit(ctx); return err })
		if status.Code(err) == codes.FailedPrecondition {
			ctx, cancel := context.WithTimeout(context.Background(), rCallLimit)
			_ = p.Release(ctx)
			if w.prepare(ctx) != nil {
				w.ready = false
			}
			cancel()
		}
	default:
		w.async(x, t)
	}
}

func (w *rworker) syncCall(x *rxfer, fn func(ctx context.Context) error) error {
	d, cancelAfter := w.limits()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	due := time.Now().Add(d)
	c := w.begin(due)
	if cancelAfter >= 0 {
		t := time.AfterFunc(cancelAfter, cancel)
		defer t.Stop()
		if ca := c.start.Add(cancelAfter); ca.Before(due) {
			c.cancelAt = ca
		}
	}
	err := fn(ctx)
	w.finish(c, x, err)
	return err
}

// async starts the transfer with a drawn timeout and waits for it, or
// cancels it 0-50 ms in.
func (w *rworker) async(x *rxfer, t client.Transfer) {
	timeout, _ := w.limits()
	c := w.begin(time.Now().Add(timeout))
	sctx, scancel := context.WithTimeout(context.Background(), rCallLimit)
	defer scancel()
	h, err := w.ca.StartTransfer(sctx, t, timeout)
	if err != nil {
		w.finish(c, x, err)
		return
	}
	wctx, wcancel := context.WithTimeout(context.Background(), timeout+2*rCallLimit)
	defer wcancel()
	if x.kind == "async_cancel" || x.kind == "async_cancel_pull" {
		time.Sleep(time.Duration(w.r.IntN(50)) * time.Millisecond)
		if at := time.Now(); at.Before(c.due) {
			c.cancelAt = at
		}
		_, err = h.Cancel(wctx)
	} else {
		_, err = h.Wait(wctx, 0)
	}
	if err == nil {
		_, err = h.Result()
	}
	w.finish(c, x, err)
}

// finish classifies an answer and checks the invariants on it: a DONE
// transfer's destination holds the source's blocks (CRC32C per block on
// both sides); a cut one's destination is quarantined and checked again;
// the answer came by its deadline plus the slack.
func (w *rworker) finish(c rcall, x *rxfer, err error) {
	now := time.Now()
	st := w.s.stats
	if w.kills.Load() != c.kills {
		st.workerKilled.Add(1)
		return
	}
	ks := st.kind(x.kind)
	ks.transfers.Add(1)
	localHit, wireHit := w.a.disturbedSince(c.mA), w.b.flappedSince(c.mW)
	if localHit || wireHit {
		st.chaosAffected.Add(1)
	}
	around := w.route() + "; " + w.a.name + " " + w.a.state(c.mA)
	if wireHit {
		around += ", link flapped"
	}
	o := overrun{kind: x.kind, start: c.start, end: now, due: c.due, localHit: localHit, peerHit: wireHit, err: err,
		ping: []*series{w.a.ping}, around: around}
	if x.viaRemote {
		// The remote daemon answers across the wire: not while it is down
		// (apart), but with the local daemon, its peer, killed it must.
		o.localHit, o.peerHit, o.answerWire, o.ping = wireHit, localHit, wireHit, []*series{w.b.ping}
	}
	if slack, _ := w.s.sched.slack(c.start, now, o.ping...); now.Sub(c.due) > slack {
		w.late = append(w.late, o)
	} else if !localHit && !wireHit {
		st.noteLate(now.Sub(c.due))
		if over := now.Sub(c.due); over > 100*time.Millisecond {
			st.withinMargin.Add(1)
			slack, _ := w.s.sched.slack(c.start, now, o.ping...)
			var ping time.Duration
			for _, p := range o.ping {
				ping = max(ping, p.worst(c.start, now))
			}
			st.violation("answer past 100 ms within the margin (not counted)", x.kind, w.id,
				"answered %v after its deadline of %v, allowed %v: this process's scheduling delay around it %v, the answering daemon's Ping %v (%s): %v",
				over.Round(time.Millisecond), c.due.Sub(c.start).Round(time.Millisecond), slack.Round(time.Millisecond),
				w.s.sched.worst(c.start, now).Round(time.Millisecond), ping.Round(time.Millisecond), around, err)
		}
	}
	if !c.cancelAt.IsZero() && !localHit && !wireHit {
		if slack, _ := w.s.sched.slack(c.start, now, o.ping...); now.Sub(c.cancelAt) > slack {
			st.cancelOverruns.Add(1)
			st.noteCancelLate(now.Sub(c.cancelAt))
		}
	}
	if err == nil {
		ks.done.Add(1)
		st.checks.Add(1)
		w.moved.Add(1)
		w.verify(x, around)
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
	if code == codes.NotFound {
		w.ready = false // the remote export is gone: set up afresh
	}
	q := rquar{kind: x.kind, remote: !x.read, slot: x.rslot, offs: x.roffs, n: x.n, answeredAt: now,
		until: now.Add(time.Duration(200+w.r.IntN(1800)) * time.Millisecond), giveUp: now.Add(verifyLimit), localChaos: localHit, around: around}
	if x.read {
		q.slot, q.offs, q.digests = x.lslot, x.loffs, localDigests(w.loc.Bytes, x.loffs, x.n)
	} else if d, err := w.remoteDigests(x.roffs, x.n, 0); err == nil {
		q.digests = d
	} else if status.Code(err) == codes.NotFound {
		st.recheckLost.Add(1)
		return
	}
	w.quar = append(w.quar, q)
}

// verify checks a DONE transfer's destination against its source.
func (w *rworker) verify(x *rxfer, around string) {
	st := w.s.stats
	var got []uint64
	if x.read {
		got = localDigests(w.loc.Bytes, x.loffs, x.n)
	} else {
		var err error
		if got, err = w.remoteDigests(x.roffs, x.n, verifyLimit); err != nil {
			st.unverified.Add(1)
			st.violation("unverified", x.kind, w.id, "answered OK, but the destination could not be read: %v (%s)", err, around)
			w.ready = false
			return
		}
	}
	if !slices.Equal(got, x.want) {
		st.falseSuccess.Add(1)
		st.violation("false_success", x.kind, w.id, "answered OK but the destination's CRC32Cs are %x, the source's %x (%d blocks of %d B, %s)",
			got, x.want, len(x.want), x.n, around)
	}
}

// checkQuarantine checks again the quarantined blocks whose time came; a
// remote snapshot the wire did not allow at the answer is taken now and
// checked later (counted: it cannot see bytes landed in between).
func (w *rworker) checkQuarantine() {
	now := time.Now()
	st := w.s.stats
	keep := w.quar[:0]
	for _, q := range w.quar {
		if now.Before(q.until) {
			keep = append(keep, q)
			continue
		}
		var got []uint64
		if q.remote {
			d, err := w.remoteDigests(q.offs, q.n, 0)
			if err != nil {
				if status.Code(err) == codes.NotFound || now.After(q.giveUp) {
					st.recheckLost.Add(1)
					continue
				}
				q.until = now.Add(200 * time.Millisecond)
				keep = append(keep, q)
				continue
			}
			got = d
		} else {
			got = localDigests(w.loc.Bytes, q.offs, q.n)
		}
		if q.digests == nil {
			st.snapshotLate.Add(1)
			q.digests, q.until = got, now.Add(500*time.Millisecond)
			keep = append(keep, q)
			continue
		}
		st.lateChecked.Add(1)
		if slices.Equal(got, q.digests) {
			continue
		}
		if q.localChaos {
			st.lateBytesChaos.Add(1)
			st.violation("late_bytes_own_daemon_chaos (not counted)", q.kind, w.id, "destination blocks changed %v after the answer (%s)",
				now.Sub(q.answeredAt).Round(time.Millisecond), q.around)
		} else {
			st.lateBytes.Add(1)
			st.violation("late_bytes", q.kind, w.id, "destination blocks changed %v after the answer (%d blocks of %d B, %s)",
				now.Sub(q.answeredAt).Round(time.Millisecond), len(q.offs), q.n, q.around)
		}
	}
	w.quar = keep
}

// judgeLate judges the overruns whose lookahead passed (all when all). An
// answer comes from the local daemon, so a link flap does not excuse it.
func (w *rworker) judgeLate(all bool) { w.late = w.s.judgeLate(w.late, w.id, all) }
