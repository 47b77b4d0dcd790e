package batch

import (
	"context"
	"errors"
	"fmt"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memguard"
	"github.com/b2bd/b2bd/internal/transport"
)

// The retry policy of every transfer (Run, block transfers, submits of
// prepared plans), written once. An attempt gets a data path, resolves the
// destination, checks it and posts; the policy judges its failure:
//
//   - Nothing of it was sent (transport.ErrNotSent: the connection was
//     broken by another batch before this one's post): it runs again on a
//     fresh connection for free, at most maxNotSent times.
//   - A refusal that a stale cached resolution explains (the key refused
//     by the receiver, a size or layout geometry the destination no
//     longer has): the path's stale handler drops the cache entry and the
//     attempt runs once more, resolving afresh, unless a retry came first; or
//     the handler's error is the outcome (a prepared plan is then stale).
//   - Its connection broke (under the post, or the peer's connection under
//     the resolve): one retry on a fresh connection. Writes and reads are
//     idempotent (the same bytes to the same places), so success still
//     means every byte landed. A dead peer costs the retry one refused
//     dial. A fault on a region's memory would fault again: no retry.
//   - Anything else is the outcome, naming the failure a retry followed.
//
// Every attempt runs under the one ctx the caller's deadline bounds (else
// DefaultTimeout; a pull's less pullMargin: bounded, early), so the
// retries share it; nothing runs again once it is done: a caller that gave
// up wants no retry, and its deadline or cancel is then the outcome
// (errs.ForCaller, in the callers).

// maxNotSent bounds a transfer's runs again after it found its connection
// already broken (transport.ErrNotSent): each is on a fresh connection,
// so only a peer that breaks every one of them reaches it.
const maxNotSent = 32

// ran is what an attempt tells the policy beside its error.
type ran struct {
	// sess is the data path the attempt failed on: posted, or (not
	// posted) the one it had when its resolve failed; zero when it had
	// none, or its failure says nothing of a connection.
	sess transport.Session
	// posted: the attempt reached its post (or found its connection broken
	// there); a connection broken then is told to the peer manager.
	posted bool
	// cached: the resolution the attempt used may be stale (it came from
	// the peer manager's cache, or a plan bound it earlier).
	cached bool
	// suspect: the error is a refusal, before the post, of the resolution
	// itself (the remote bounds or geometry), which its staleness explains.
	suspect bool
}

// attempt runs a transfer once; rerun says an earlier attempt failed.
type attempt func(ctx context.Context, rerun bool) (ran, error)

// retryPolicy is the policy applied to one transfer.
type retryPolicy struct {
	peer string
	// fresh names a retry on a fresh connection in the outcome's message.
	fresh string
}

// retry runs try under pol until it succeeds or pol gives up. stale
// handles a failure that a stale resolution explains: nil when it dropped
// the resolution (a run again resolves afresh), else the transfer's
// outcome, returned as is. (A parameter, not a field of pol: pol's strings
// leak into errors, and a func beside them would be allocated with every
// transfer.)
func (s *Service) retry(ctx context.Context, pol retryPolicy, stale func(err error) error, try attempt) error {
	var (
		first   error // the failure that a counted retry followed
		retried bool  // a stale or fresh retry was spent
		fresh   bool  // the one retry on a fresh connection was spent
		notSent int
	)
	for n := 0; ; n++ {
		r, err := try(ctx, n > 0)
		if err == nil {
			return nil
		}
		broke := r.posted && r.sess.Conn != nil && r.sess.Conn.Err() != nil
		if broke {
			s.paths.peers.Broken(pol.peer, r.sess)
		}
		fault := memguard.IsFault(err)
		if errors.Is(err, transport.ErrNotSent) && notSent < maxNotSent && ctx.Err() == nil {
			notSent++
			continue
		}
		// A refused key leaves the connection usable: one that broke is
		// retried fresh below (which resolves afresh too).
		refused := r.posted && !broke && !fault && errors.Is(err, errs.ErrNotFound)
		if r.cached && (r.suspect || refused) {
			if serr := stale(err); serr != nil {
				return serr
			}
			if !retried && ctx.Err() == nil {
				retried = true
				continue
			}
			return pol.outcome(err, first)
		}
		if !r.posted && r.sess.Conn != nil && errs.Class(err) == errs.ErrUnavailable {
			// The peer's connection closed under the resolve (another
			// transfer, cut off, broke it): the resolve told the manager.
			broke = true
		}
		if broke && !fresh && !fault && ctx.Err() == nil {
			s.cfg.Log.Info("transfer's connection broke; retrying once on a fresh one", "peer", pol.peer, "posted", r.posted, "reused", r.sess.Reused, "error", err)
			fresh, retried, first = true, true, err
			continue
		}
		return pol.outcome(err, first)
	}
}

// outcome is err, the last attempt's, naming first, the failure that the
// retry on a fresh connection followed.
func (pol retryPolicy) outcome(err, first error) error {
	if first == nil {
		return err
	}
	return fmt.Errorf("%w (after %s; the first attempt failed: %v)", err, pol.fresh, first)
}
