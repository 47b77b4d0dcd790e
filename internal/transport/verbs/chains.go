package verbs

import (
	"context"
	"fmt"
	"time"

	"github.com/b2bd/b2bd/internal/desc"
	kvlayout "github.com/b2bd/b2bd/internal/layout"
	"github.com/b2bd/b2bd/internal/transport"
	ibv "github.com/b2bd/b2bd/verbs"
)

// chainSource is what a batch's chains are planned from: a batch's block
// arrays cut at s.cuts (b), or a block request cut at s.blk.cuts and
// expanded in C (tab, curs, ids).
type chainSource struct {
	b    *desc.Batch
	tab  *ibv.BlockTable
	curs []*ibv.BlockCursor
	ids  kvlayout.IDs
}

// start points range k's chain (on QP qi) at its part of the source.
func (c *chainSource) start(s *qpSet, k, qi int, immLast bool, tag uint32) {
	ch := s.qps[qi].chain
	if c.tab == nil {
		ch.Start(s.cuts[k], s.cuts[k+1], immLast, tag)
		return
	}
	ch.Start(ibv.Pos{}, ibv.Pos{}, immLast, tag) // the cursor carries the range
	c.curs[qi].Start(s.blk.cuts[k], s.blk.cuts[k+1])
}

// post plans and posts QP qi's next chain, in one cgo call.
func (c *chainSource) post(q *qpState, qi int) (ibv.ChainResult, error) {
	if c.tab == nil {
		return q.qp.PostChain(q.chain, c.b.Src, c.b.Dst, c.b.Len)
	}
	return q.qp.PostBlocks(q.chain, c.tab, c.curs[qi], c.ids.Src, c.ids.Dst)
}

// postChains posts nq ranges of src, range k on QP first+k, in chains as
// the credits allow (a chain waits for a quarter of a chain of credits:
// small chains waste doorbells). params' op decides what a failure does:
//
//   - WRITE: a failed post fails the set (the meta and maybe other chains
//     are out, so the batch cannot be taken back); a failed wait is
//     returned as it is.
//   - READ: the set is stopped too (stopRead: QPs to ERROR, drained), so no
//     READ response lands after the caller has its answer; a read its
//     caller stopped cleanly keeps the connection.
//
// Between rounds ctx is checked (providers that do the send work inside
// ibv_post_send, rxe, may never run out of credits): once it ended, the
// batch posts nothing more and is abandoned (see abandon). A write still
// inside a post call postCutGrace past its deadline is stopped from
// outside it (armPostCut): rxe's requester, run inside ibv_post_send,
// went on sending the whole batch there, 2.4 s past a 150 ms deadline.
func (s *qpSet) postChains(ctx context.Context, st *transport.Stats, tag uint32, first, nq int, params *ibv.ChainParams, src *chainSource) error {
	read := params.Op == ibv.WRRead
	maxChain := s.t.cfg.MaxChain
	for k := 0; k < nq; k++ {
		qi := (first + k) % len(s.qps)
		q := s.qps[qi]
		q.chain.Setup(params)
		src.start(s, k, qi, !read, tag) // a WRITE's last WR carries the tag
		q.chain.SetSeq(q.posted)
		s.rangeOn[k] = true
	}
	watched := !read && s.armPostCut(ctx)
	if watched {
		defer s.postCut.Stop()
	}
	minPost := max(1, maxChain/4)
	for pending := nq; pending > 0; {
		progressed := false
		for k := 0; k < nq; k++ {
			if !s.rangeOn[k] {
				continue
			}
			qi := (first + k) % len(s.qps)
			q := s.qps[qi]
			a := q.avail()
			if a < minPost {
				continue
			}
			q.chain.SetMaxWR(min(maxChain, a))
			if watched {
				s.enterPost()
			}
			res, err := src.post(q, qi)
			if watched {
				s.leavePost()
			}
			q.posted = res.Seq
			st.Plan += time.Duration(res.PlanNs)
			st.Post += time.Duration(res.PostNs)
			if err != nil && s.cutEarly.Load() { // failed on the cut's stopped QPs, past ctx's deadline
				<-ctx.Done()
				return s.abandon(ctx, tag)
			}
			if err != nil {
				err = s.chainErr(tag, read, src.tab != nil, err)
				s.fail(err, true)
				if read {
					s.halt()
				}
				return err
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
			if watched && pending > 0 && ctx.Err() != nil {
				// rxe sends a chain's bytes inside its post call (1 MiB:
				// 60-200 ms in the loaded VMs): a round over every QP is
				// longer than a cut's whole budget, so look after each.
				return s.abandon(ctx, tag)
			}
		}
		if pending > 0 && ctx.Err() != nil {
			return s.abandon(ctx, tag)
		}
		if !progressed && pending > 0 {
			if err := s.waitCredit(ctx, tag); err != nil {
				if read {
					return s.stopRead(err)
				}
				return err
			}
		}
	}
	return nil
}

// chainErr names the batch whose chain failed to post.
func (s *qpSet) chainErr(tag uint32, read, blocks bool, err error) error {
	switch {
	case blocks:
		return fmt.Errorf("verbs: block batch %d with %s: %w", tag, s.peer, err)
	case read:
		return fmt.Errorf("verbs: read batch %d from %s: %w", tag, s.peer, err)
	}
	return fmt.Errorf("verbs: batch %d to %s: %w", tag, s.peer, err)
}

// awaitReads waits until the QPs of ranges first..first+nq-1 completed
// every READ they posted: a READ's completion means its bytes are in place
// (each QP's last WR is signaled, and completions come in order). Any
// failure stops the read (stopRead); a failed completion elsewhere on the
// set is never reported as success.
func (s *qpSet) awaitReads(ctx context.Context, tag uint32, first, nq int) error {
	for k := 0; k < nq; k++ {
		q := s.qps[(first+k)%len(s.qps)]
		for int32(q.posted-q.done.Load()) > 0 {
			if err := s.waitCredit(ctx, tag); err != nil {
				return s.stopRead(err)
			}
		}
	}
	if err := s.Err(); err != nil {
		return s.stopRead(err)
	}
	return nil
}
