package verbs

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/b2bd/b2bd/internal/errs"
)

// cutBudget is how long after its deadline a write cut by it answers at
// most, from this transport's side: the contract allows the caller 100 ms
// past its deadline, and the rest is the answer's own trip and the
// scheduling delays of a loaded host. Every step of the cut (the drain of
// the posted WRs, the receiver's answer to the cancel, the flushed
// completions) gets only what is left of it.
const cutBudget = 60 * time.Millisecond

// cutStopReserve is the part of cutBudget kept for stopping the QPs (four
// ibv_modify_qp calls: usually under 25 ms in the loaded 1-vCPU VMs, now
// and then far more) and the flushed completions: the drain and the
// cancel's answer get what is left before it.
const cutStopReserve = 20 * time.Millisecond

// cutDrainWait bounds the drain of a cut write: WRs still in flight that
// long after the cut seldom complete before the budget ends (a 16 MiB push
// cut mid-batch in the VMs never did), and the QPs' stop comes sooner.
const cutDrainWait = 15 * time.Millisecond

// cutFloor is the least a cut noticed late (its deadline passed more than
// cutBudget ago, by a host that did not run this goroutine) still gives the
// drain: enough to see WRs that have completed meanwhile, not to wait.
const cutFloor = 2 * time.Millisecond

// cutWrite ends write batch tag, cut by its deadline (cause) while WRs may
// be in flight, within cutBudget of the deadline. Unlike an explicit
// cancel (abandon), which has no deadline to keep and may wait for the
// receiver, a cut answers on time whatever the receiver does, saying what
// may still land and where:
//
//  1. the WRs already posted are waited for, at most cutDrainWait and
//     until cutStopReserve before the budget ends. Once all completed (an RC WRITE completes once its
//     bytes are placed), nothing more of the batch can land, whatever the
//     receiver does.
//     A batch whose meta went out is then cancelled (msgCancel): the
//     receiver drops it unaccounted (the connection stays) or had acked it
//     as landed (the batch succeeded). A receiver that does not answer in
//     the budget (stopped, overloaded) is left undecided: the answer says
//     every byte sent is in place, nothing more lands, and the receiver
//     did not confirm whether it accounts the batch; the connection goes.
//  2. WRs still in flight by then: the set's QPs go to ERROR
//     (this NIC transmits nothing more) and the flushed completions are
//     waited for only within the budget (rxe delivers them 0.2-0.5 s late).
//     Packets already on the wire may still be placed by the receiver's NIC
//     within one network delay, which the answer says; the receiver is
//     asked, without waiting, to drop its half of the connection.
//
// Either way a set that cannot carry on is torn down in the background
// (Close), so the teardown's waits are not the caller's either.
func (s *qpSet) cutWrite(ctx context.Context, cause error, tag uint32) error {
	now := time.Now()
	end := now.Add(cutBudget)
	if dl, ok := ctx.Deadline(); ok {
		end = dl.Add(cutBudget)
	}
	wait := end.Add(-cutStopReserve) // the drain's and the cancel's
	if floor := now.Add(cutFloor); wait.Before(floor) {
		wait = floor
	}
	tr := cutTrace{seen: now, end: end}
	defer s.logCut(ctx, tag, &tr)
	drainUntil := wait
	if d := now.Add(cutDrainWait); d.Before(drainUntil) {
		drainUntil = d
	}
	early := s.cutEarly.Load() // its QPs were stopped while it posted
	drained := !early && s.drainPosted(drainUntil)
	tr.drained = time.Now()
	if drained {
		if s.metaTag != tag { // stopped before its meta: the receiver knows nothing of it
			return fmt.Errorf("verbs: batch %d to %s stopped: %w (the work requests already posted completed; nothing more of it lands, the connection stays)", tag, s.peer, cause)
		}
		o := s.cancelAnnounced(tag, wait)
		tr.outcome = fmt.Sprintf("cancel %d", o)
		switch o {
		case cancelLanded:
			return nil
		case cancelDropped:
			return fmt.Errorf("verbs: batch %d to %s stopped: %w (its posted work requests completed and the receiver dropped it unaccounted; the connection stays)", tag, s.peer, cause)
		}
		err := fmt.Errorf("verbs: batch %d to %s cut off by %w: every work request it posted completed, so each byte it sent is in place and nothing more of it lands; the receiver did not answer its cancel by %v past the deadline (stopped or overloaded), so it may still account the batch as landed (connection dropped: %w)",
			tag, s.peer, cause, cutBudget-cutStopReserve, errs.ErrAborted)
		s.cutOff(err, false) // nothing of it in flight: its QPs stop with the set's teardown
		return err
	}
	err := fmt.Errorf("verbs: batch %d to %s cut off by %w with work requests in flight: its QPs are stopped, so this side's NIC sends nothing more of it, but packets already on the wire may still be placed in the destination by %s's NIC within one network delay (connection dropped: %w)",
		tag, s.peer, cause, s.peer, errs.ErrAborted)
	if !early && s.Err() != nil {
		// A failed completion broke the set during the drain: its error
		// says what failed; the cut stays the outermost class.
		err = fmt.Errorf("verbs: batch %d to %s cut off by %w after the connection failed (%w); its QPs are stopped, so this side's NIC sends nothing more of it, but packets already on the wire may still be placed in the destination by %s's NIC within one network delay",
			tag, s.peer, cause, s.Err(), s.peer)
	}
	s.cutOff(err, true)
	tr.stopped = time.Now()
	tr.outcome = "in flight, flushed"
	if early {
		tr.outcome = "stopped while posting, flushed"
	}
	if !s.flushedBy(end) {
		tr.outcome = strings.Replace(tr.outcome, "flushed", "not flushed", 1)
	}
	return err
}

// cutTrace is when a cut's steps ended, for logCut.
type cutTrace struct {
	seen, end, drained, stopped time.Time
	outcome                     string
}

// cutOff breaks the set for a cut write: with stop, its QPs go to ERROR
// (nothing more is transmitted; ibv_modify_qp, no wait), the receiver is
// asked at once to drop its half (in the background, retried:
// disconnect), and Close tears the set down in the background.
func (s *qpSet) cutOff(err error, stop bool) {
	s.fenced = true
	s.fail(err, true)
	if stop {
		s.toError()
	}
	if s.ctl != nil && !s.peerTold {
		s.peerTold = true
		s.t.disconnect(s.ctl, s.peer, s.id)
	}
}

// flushedBy waits, at most until end, until every WR posted on the set has
// completed (flushed, after toError); it reports whether all did.
func (s *qpSet) flushedBy(end time.Time) bool {
	for _, q := range s.qps {
		for int32(q.posted-q.done.Load()) > 0 {
			if !time.Now().Before(end) {
				return false
			}
			time.Sleep(time.Millisecond)
		}
	}
	return true
}

// logCut reports a cut's steps, and warns when it answered past its
// budget: a cut seen late (the posting goroutine held up in a post call,
// or the host not running it) is a different cause from a step that ran
// long.
func (s *qpSet) logCut(ctx context.Context, tag uint32, tr *cutTrace) {
	dl, ok := ctx.Deadline()
	if !ok {
		return
	}
	now := time.Now()
	args := []any{"peer", s.peer, "conn", s.id, "tag", tag, "bytes", s.batchBytes, "outcome", tr.outcome,
		"seen_after_deadline", tr.seen.Sub(dl), "drain", tr.drained.Sub(tr.seen), "answered_after_deadline", now.Sub(dl)}
	if !tr.stopped.IsZero() {
		args = append(args, "stop", tr.stopped.Sub(tr.drained))
	}
	if now.After(tr.end.Add(5 * time.Millisecond)) {
		s.t.log.Warn("verbs: a cut write answered past its budget", append(args, "budget", cutBudget)...)
		return
	}
	s.t.log.Info("verbs: a write cut by its deadline", args...)
}

// postCutGrace is how long past its deadline a write still inside a post
// call is stopped from outside it (onPostCut); what is left of cutBudget
// then answers.
const postCutGrace = 20 * time.Millisecond

// armPostCut arms the set's post watch for a write under ctx, when ctx has
// a deadline: onPostCut fires postCutGrace after it. The caller stops it
// (postCut.Stop) once it posted everything, and brackets each post call
// with enterPost and leavePost. A provider that does the send work inside
// ibv_post_send (rxe runs its requester there, and acks arriving meanwhile
// keep it going) can hold a post call for the whole batch: its caller
// would see the deadline only after the batch went out.
func (s *qpSet) armPostCut(ctx context.Context) bool {
	s.cutEarly.Store(false)
	dl, ok := ctx.Deadline()
	if !ok || s.postCut == nil {
		return false
	}
	s.postCut.Reset(time.Until(dl) + postCutGrace)
	return true
}

func (s *qpSet) enterPost() {
	s.postMu.Lock()
	s.posting++
	s.postMu.Unlock()
}

// leavePost waits for an onPostCut under way: once it returns, none
// touches the QPs any more (the set may be destroyed once the write ends).
func (s *qpSet) leavePost() {
	s.postMu.Lock()
	s.posting--
	s.postMu.Unlock()
}

// onPostCut stops the set's QPs (ERROR: the provider's requester stops
// at its next packet and the post call returns) when the write is still
// inside a post call past its deadline. The write, back from it, sees its
// deadline and answers (cutWrite, which then skips the drain).
func (s *qpSet) onPostCut() {
	s.postMu.Lock()
	defer s.postMu.Unlock()
	if s.posting == 0 {
		return
	}
	s.cutEarly.Store(true)
	s.toError()
	s.t.log.Warn("verbs: a write was still inside a post call past its deadline; its QPs are stopped", "peer", s.peer, "conn", s.id, "grace", postCutGrace)
}
