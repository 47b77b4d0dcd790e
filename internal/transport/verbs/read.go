package verbs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/transport"
	ibv "github.com/b2bd/b2bd/verbs"
)

// Read pulls b from the peer's region src into dst; see transport.Reader.
// It is serialised with Writes on the connection and allocates nothing on
// success. READs need nothing from the remote daemon: the peer's NIC
// answers them, and a READ's local completion means its bytes are in dst,
// so no meta message goes out and no acknowledgement is awaited.
func (s *qpSet) readBatch(ctx context.Context, dst transport.Registration, src transport.RemoteRegion, b *desc.Batch) (transport.Stats, error) {
	return s.transfer(ctx, dst, src, b, true)
}

// read posts b's READs in chains over up to every QP of the set (cut as a
// write's batch is), then waits until each QP has completed every WR it
// posted. Any failure after the first post stops the set (halt: QPs to
// ERROR, flushed completions drained) before it returns, so no READ
// response lands in dst after Read returned.
func (s *qpSet) read(ctx context.Context, dst *ibv.MR, mem memory.Memory, src transport.RemoteRegion, b *desc.Batch, total uint64) (transport.Stats, error) {
	var st transport.Stats
	t := s.t
	cfg := &t.cfg
	s.tag = nextTag(s.tag) // names the batch in errors; nothing carries it on the wire
	tag := s.tag
	s.batchBytes = total
	if total == 0 {
		return st, nil
	}
	s.readTag = tag
	defer func() { s.readTag = 0 }()
	want := int((total + uint64(cfg.MinQPBytes) - 1) / uint64(cfg.MinQPBytes))
	nq := splitBatch(b.Len, total, min(len(s.qps), want), s.cuts)
	first := s.rot % len(s.qps)
	s.rot++

	params := ibv.ChainParams{
		Op:      ibv.WRRead,
		SrcBase: src.Key.Addr, DstBase: dst.Addr(), SrcLimit: src.Size, DstLimit: mem.Len,
		LKey: dst.LKey(), RKey: uint32(src.Key.Key), MaxWR: cfg.MaxChain, MaxSGE: t.maxSGERd,
		MaxWRBytes: min(t.wrBytes, uint64(cfg.ReadWRBytes)), MaxChainBytes: uint64(cfg.ChainBytes), SignalEvery: cfg.SignalEvery,
	}
	if err := s.postChains(ctx, &st, tag, first, nq, &params, &chainSource{b: b}); err != nil {
		return st, err
	}
	return st, s.awaitReads(ctx, tag, first, nq)
}

// stopRead ends a read that failed with READs possibly in flight on QPs
// still in RTS (one QP's error completion stops only that QP): every QP
// goes to ERROR and is drained first. abandon and the stall path halted
// already; halting twice only waits for what is already drained.
//
// A read its caller's deadline or cancel stopped was fenced already
// (fenceRead); only a read whose READs had all completed keeps the
// connection.
func (s *qpSet) stopRead(err error) error {
	if s.Err() == nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		return err
	}
	if s.readRef != nil && s.readRef.fenced {
		// Fenced already (fenceRead): waiting for the flushes here held
		// the answer up to haltWait for nothing.
		s.fail(err, true)
		return err
	}
	s.fail(err, true)
	s.halt()
	return err
}

// fenceRead stops read batch tag, cut by its caller's deadline or cancel
// (cause) with READs in flight, without waiting for them. They target the
// caller's own memory, so a local fence is enough: every QP goes to ERROR
// (nothing more is requested) and the MR the READs land through is
// deregistered (registration.fence), after which the NIC lands no READ
// response: it fails them with a local protection error. Waiting for the
// READs instead (abandon's drain, or halt's wait for the flushed
// completions, which rxe delivers only once the responses already on the
// wire were processed) held the answer 0.2-0.5 s past the cut in the
// Soft-RoCE VMs. The set is then broken: batches queued behind this one
// fail with ErrNotSent and the peer manager connects afresh. A block read
// (no read MR of its own) waits for the flushed completions (halt).
func (s *qpSet) fenceRead(cause error, tag uint32) error {
	err := fmt.Errorf("verbs: read batch %d from %s cut off by %w with READs in flight (QPs stopped and the destination's read MR withdrawn: nothing more lands; the connection is rebuilt: %w)",
		tag, s.peer, cause, errs.ErrAborted)
	s.fenced = true
	s.fail(err, true)
	t0 := time.Now()
	s.toError()
	t1 := time.Now()
	if s.readRef != nil && s.readReg.fence(s.readRef) {
		if took := time.Since(t0); took > 50*time.Millisecond {
			s.t.log.Warn("verbs: fencing a cut read took long", "peer", s.peer, "conn", s.id, "tag", tag, "to_error", t1.Sub(t0), "deregister", time.Since(t1))
		}
		return err
	}
	start := time.Now()
	flushed := s.halt()
	if took := time.Since(start); took > 100*time.Millisecond {
		s.t.log.Warn("verbs: fencing a cut read took long", "peer", s.peer, "conn", s.id, "tag", tag, "took", took)
	}
	if !flushed {
		// Flushes still missing: the NIC may still be writing. Say so
		// rather than claim a clean stop.
		return fmt.Errorf("verbs: read batch %d from %s cut off by %w, but its READs were not all flushed within %v: %w",
			tag, s.peer, cause, haltWait, errs.ErrAborted)
	}
	return err
}
