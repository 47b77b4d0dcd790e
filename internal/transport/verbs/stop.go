package verbs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/b2bd/b2bd/internal/errs"
	ibv "github.com/b2bd/b2bd/verbs"
)

// abandon ends a batch whose caller's deadline or cancel came with WRs in
// flight, stopping only that batch when it can (stopping the
// whole connection failed every batch queued behind it with Aborted):
//
//  1. nothing more of the batch is posted (the callers stop posting);
//  2. every WR already posted on the set (this batch's: writes are
//     serialised per set) is waited for, at most stopWait (the batch's
//     bytes at the port's rate plus CancelWait). A successful completion
//     of an RC WRITE or READ means its bytes are in place, so once all
//     completed nothing of the batch can land any more;
//  3. a write whose meta went out tells the receiver (msgCancel), which
//     drops the batch unaccounted and answers tag|refuseBit, or had acked
//     it as landed: the batch then succeeded and abandon returns nil (the
//     cancel lost the race; the bytes are all there).
//
// Only when a step runs out of time (a stuck or slow peer, a receiver that
// predates msgCancel) or a completion fails does the old rule apply: every
// QP of the set goes to ERROR (halt), so the NIC sends none of the WRITEs
// still queued, and the set stays broken; the peer manager replaces it.
//
// A read is fenced at once instead (fenceRead): its READs land only in the
// caller's own memory, which a local stop protects without the peer.
//
// A write cut by its deadline (rather than cancelled), or cancelled with a
// deadline less than cancelDrainMax away, has a deadline to keep: cutWrite
// bounds every step by what is left of cutBudget past it.
func (s *qpSet) abandon(ctx context.Context, tag uint32) error {
	cause := ctx.Err()
	if tag == s.readTag {
		return s.fenceRead(cause, tag)
	}
	if errors.Is(cause, context.DeadlineExceeded) {
		return s.cutWrite(ctx, cause, tag)
	}
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < cancelDrainMax {
		// Cancelled, but with a deadline the cancel path's drain could
		// overrun (an async transfer cancelled as its waiter's deadline
		// passed answered 559 ms past it in the soak): the deadline's
		// bounds apply.
		return s.cutWrite(ctx, cause, tag)
	}
	start := time.Now()
	until := start.Add(s.stopWait())
	p0 := s.progress()
	drained := s.drainPosted(until)
	// A cancel has no deadline to keep: while its WRs still complete (a
	// host too loaded to move even a small batch in stopWait), it waits
	// on, up to cancelDrainMax, rather than leave the receiver's
	// accounting open (the fallback below cannot say what it accounted).
	for !drained && s.Err() == nil && s.progress() != p0 && time.Since(start) < cancelDrainMax {
		p0 = s.progress()
		until = start.Add(cancelDrainMax)
		if u := time.Now().Add(s.t.cfg.CancelWait); u.Before(until) {
			until = u
		}
		drained = s.drainPosted(until)
	}
	if !drained && s.Err() == nil {
		s.t.log.Warn("verbs: a stopped batch's posted work requests did not complete in time; stopping the connection",
			"peer", s.peer, "conn", s.id, "bytes", s.batchBytes, "waited", time.Since(start))
	}
	if drained {
		if s.metaTag != tag { // a read, or a write stopped before its meta
			return fmt.Errorf("verbs: batch %d with %s stopped: %w (the work requests already posted completed; nothing more of it lands, the connection stays)", tag, s.peer, cause)
		}
		switch s.cancelAnnounced(tag, until.Add(s.t.cfg.CancelWait)) {
		case cancelLanded:
			return nil
		case cancelDropped:
			return fmt.Errorf("verbs: batch %d to %s stopped: %w (its posted work requests completed and the receiver dropped it unaccounted; the connection stays)", tag, s.peer, cause)
		}
	}
	// The caller's deadline or cancel is the outcome (outermost class); the
	// connection is gone too (Aborted, its Err).
	err := fmt.Errorf("verbs: batch %d to %s cut off by %w with work requests in flight (QPs stopped and connection dropped: %w; %s)", tag, s.peer, cause, errs.ErrAborted, MayHaveLanded)
	s.fail(err, true)
	s.halt()
	return err
}

// MayHaveLanded is said by a stopped batch whose last work requests had not
// completed when its QPs were stopped: the receiver may have received the
// whole batch just before, and then accounts it as landed. (Its NIC places
// no byte once the QPs stopped; whether the batch's last WRITE got there
// first, only the receiver knows.)
const MayHaveLanded = "the receiver may have received the whole batch before the stop and account it as landed"

// cancelDrainMax bounds how long a cancelled batch waits for its posted
// WRs while they keep completing (abandon).
const cancelDrainMax = time.Second

// stopWait bounds how long a stopped batch waits for the WRs it posted:
// the batch's bytes (an upper bound of what is in flight) at the port's
// nominal rate, plus CancelWait, the margin for completions and
// scheduling. A peer that is only slower than the link (an emulated one)
// may need longer: the batch then takes the fallback, as a stuck peer does.
func (s *qpSet) stopWait() time.Duration {
	bps := s.t.linkBps
	if bps == 0 {
		bps = 2_500_000_000 // unreported: the slowest IB lane
	}
	wire := time.Duration(float64(s.batchBytes) * 8 / float64(bps) * float64(time.Second))
	return wire + s.t.cfg.CancelWait
}

// drainPosted waits until every WR posted on the set has completed, at
// most until until. It reports false when that wait ran out or the set
// broke (a failed completion).
func (s *qpSet) drainPosted(until time.Time) bool {
	s.stallTimer.Reset(time.Until(until))
	defer s.stallTimer.Stop()
	for {
		if s.Err() != nil {
			return false
		}
		left := false
		for _, q := range s.qps {
			if int32(q.posted-q.done.Load()) > 0 {
				left = true
				break
			}
		}
		if !left {
			return s.Err() == nil
		}
		select {
		case <-s.credSig:
		case <-s.broken:
			return false
		case <-s.stallTimer.C:
			return false
		}
	}
}

type cancelOutcome int

const (
	cancelTimedOut cancelOutcome = iota
	cancelLanded                 // acked as landed before the cancel arrived
	cancelDropped                // the receiver dropped it unaccounted
)

// cancelAnnounced tells the receiver that batch tag (whose meta went out
// on QP metaQ and whose posted WRs all completed) ends here, and waits
// until until at most for its answer.
func (s *qpSet) cancelAnnounced(tag uint32, until time.Time) cancelOutcome {
	outcome := func() cancelOutcome {
		switch s.lastAck.Load() {
		case tag:
			return cancelLanded
		case tag | refuseBit:
			return cancelDropped
		}
		return cancelTimedOut
	}
	if o := outcome(); o != cancelTimedOut {
		s.metaTag = 0
		return o
	}
	q := s.qps[s.metaQ]
	if q.avail() < 1 { // drained: cannot happen, but never post without credit
		return cancelTimedOut
	}
	m := message{kind: msgCancel, tag: tag}
	m.encode(s.ctlMem.Bytes())
	if err := s.sendCtl(q, ibv.KindMeta, 0, msgLen, true); err != nil {
		return cancelTimedOut
	}
	sent := time.Now()
	s.stallTimer.Reset(time.Until(until))
	defer s.stallTimer.Stop()
	for {
		if o := outcome(); o != cancelTimedOut {
			s.metaTag = 0
			return o
		}
		select {
		case <-s.ackSig:
		case <-s.broken:
			return cancelTimedOut
		case <-s.stallTimer.C:
			s.t.log.Warn("verbs: the receiver did not answer a batch's cancel in time (a peer without msgCancel, or stuck); stopping the connection",
				"peer", s.peer, "conn", s.id, "tag", tag, "waited", time.Since(sent))
			return cancelTimedOut
		}
	}
}

// haltWait bounds how long halt waits for the flushed completions.
const haltWait = time.Second

// halt moves every QP of a sending set to ERROR (ibv_modify_qp IBV_QPS_ERR)
// and waits, at most haltWait, until the poller has seen a completion for
// every WR posted: each WR the NIC had not finished completes with
// IBV_WC_WR_FLUSH_ERR (flushed WRs complete even when unsignaled), which
// returns its credit. Once the requester flushed, it transmits nothing more.
// What it can no longer take back are packets it already put on the wire
// before the transition: those still reach the receiver (whose QP is in
// RTS) within one network delay; in the test VMs that is far under the
// flush wait, on a real fabric microseconds.
// It reports whether every flushed completion came in time.
func (s *qpSet) halt() bool {
	s.toError()
	deadline := time.Now().Add(haltWait)
	for _, q := range s.qps {
		for int32(q.posted-q.done.Load()) > 0 {
			if time.Now().After(deadline) {
				s.t.log.Warn("verbs: flushed completions still missing after a deadline", "peer", s.peer, "conn", s.id, "qp", q.qp.Num(),
					"in_flight", int32(q.posted-q.done.Load()))
				return false
			}
			time.Sleep(time.Millisecond)
		}
	}
	return true
}

// toError moves every QP of the set to ERROR: the NIC posts nothing more
// and flushes what is queued.
func (s *qpSet) toError() {
	for _, q := range s.qps {
		if err := q.qp.ToError(); err != nil {
			s.t.log.Warn("verbs: moving a QP to ERROR after a deadline failed", "peer", s.peer, "conn", s.id, "qp", q.qp.Num(), "error", err)
		}
	}
}
