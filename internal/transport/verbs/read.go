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
func (s *qpSet) Read(ctx context.Context, dst transport.Registration, src transport.RemoteRegion, b *desc.Batch) (transport.Stats, error) {
	var st transport.Stats
	if err := s.Err(); err != nil {
		return st, fmt.Errorf("%w: %w", transport.ErrNotSent, err)
	}
	reg, total, err := s.checkArgs("read", dst, src, b, true)
	if err != nil {
		return st, err
	}
	if err := s.acquireWrite(ctx, "read"); err != nil {
		return st, err
	}
	defer s.releaseWrite()
	// The destination MR (its lkey) is held for the batch, as a Write holds
	// its source's: a Rekey retires it only once this batch is done.
	ref := reg.use()
	if ref == nil {
		return st, fmt.Errorf("verbs: read: destination registration %s: %w", reg.unusable(), errs.ErrFailedPrecondition)
	}
	defer reg.done(ref)
	return s.read(ctx, ref.mr, reg.mem, src, b, total)
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
	for k := 0; k < nq; k++ {
		q := s.qps[(first+k)%len(s.qps)]
		q.chain.Setup(&params)
		q.chain.Start(s.cuts[k], s.cuts[k+1], false, 0)
		q.chain.SetSeq(q.posted)
		s.rangeOn[k] = true
	}
	minPost := max(1, cfg.MaxChain/4)
	for pending := nq; pending > 0; {
		progressed := false
		for k := 0; k < nq; k++ {
			if !s.rangeOn[k] {
				continue
			}
			q := s.qps[(first+k)%len(s.qps)]
			a := q.avail()
			if a < minPost {
				continue
			}
			q.chain.SetMaxWR(min(cfg.MaxChain, a))
			res, err := q.qp.PostChain(q.chain, b.Src, b.Dst, b.Len)
			q.posted = res.Seq
			st.Plan += time.Duration(res.PlanNs)
			st.Post += time.Duration(res.PostNs)
			if err != nil {
				err = fmt.Errorf("verbs: read batch %d from %s: %w", tag, s.peer, err)
				s.fail(err, true)
				s.halt()
				return st, err
			}
			st.WorkRequests += uint64(res.WRs)
			st.Segments += uint64(res.SGEs)
			if res.WRs > 0 {
				progressed = true
			}
			if res.Done {
				s.rangeOn[k] = false
				pending--
			}
		}
		if pending > 0 && ctx.Err() != nil {
			return st, s.abandon(ctx, tag)
		}
		if !progressed && pending > 0 {
			if err := s.waitCredit(ctx, tag); err != nil {
				return st, s.stopRead(err)
			}
		}
	}
	// Every READ posted: the batch is in dst once each QP completed all it
	// posted (its last WR is signaled, and completions come in order).
	for k := 0; k < nq; k++ {
		q := s.qps[(first+k)%len(s.qps)]
		for int32(q.posted-q.done.Load()) > 0 {
			if err := s.waitCredit(ctx, tag); err != nil {
				return st, s.stopRead(err)
			}
		}
	}
	// A failed completion breaks the set; the completions of the others
	// may still have come in: never report success then.
	if err := s.Err(); err != nil {
		return st, s.stopRead(err)
	}
	return st, nil
}

// stopRead ends a read that failed with READs possibly in flight on QPs
// still in RTS (one QP's error completion stops only that QP): every QP
// goes to ERROR and is drained first. abandon and the stall path halted
// already; halting twice only waits for what is already drained.
//
// A read its caller's deadline or cancel stopped cleanly (abandon: every
// posted READ completed, so nothing more lands) keeps the connection.
func (s *qpSet) stopRead(err error) error {
	if s.Err() == nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		return err
	}
	s.fail(err, true)
	s.halt()
	return err
}
