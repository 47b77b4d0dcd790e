package peer

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/transport"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// chooser picks the data path to a peer. It owns the kinds this daemon
// runs, ranked, and what each can do, so that the choice reads one
// statement of them; a peer's state brings what the peer offers.
type chooser struct {
	transports map[transport.Kind]transport.Transport
	// ranked are the kinds of transports, highest rank first: the order
	// in which an automatic choice tries them.
	ranked []transport.Kind
	// caps are what each kind can do (its driver's CapsFor its transport),
	// the only statement of it the choice and the batch layer read.
	caps map[transport.Kind]transport.Caps
	// driver finds a kind's capabilities (transport.Lookup).
	driver func(transport.Kind) (transport.Driver, bool)
	// measured is the daemon's calibration (nil: none), read by every
	// auto choice for a peer on this host.
	measured atomic.Pointer[transport.Calibration]
	log      hclog.Logger
}

// setDrivers ranks the kinds and reads their Caps from lookup (see
// Manager.SetDrivers).
func (c *chooser) setDrivers(lookup func(transport.Kind) (transport.Driver, bool)) {
	c.driver = lookup
	c.ranked = c.ranked[:0]
	c.caps = make(map[transport.Kind]transport.Caps, len(c.transports))
	for k, t := range c.transports {
		c.ranked = append(c.ranked, k)
		if d, ok := lookup(k); ok {
			c.caps[k] = d.CapsFor(t)
		}
	}
	rank := func(k transport.Kind) int { return c.caps[k].Rank }
	slices.SortFunc(c.ranked, func(a, b transport.Kind) int {
		if r := cmp.Compare(rank(b), rank(a)); r != 0 {
			return r
		}
		return cmp.Compare(a, b)
	})
}

// usable runs, once per handshake, the Usable check of every kind both
// sides offer (the same-host proof, say) and returns why each that failed
// cannot reach the peer.
func (c *chooser) usable(st *state) map[transport.Kind]error {
	out := map[transport.Kind]error{}
	for _, k := range c.ranked {
		adv, offered := st.hs.GetAdverts()[string(k)]
		d, ok := c.driver(k)
		if !offered || !ok || d.Usable == nil {
			continue
		}
		if err := d.Usable(c.transports[k], adv); err != nil {
			out[k] = err
			c.log.Debug("transport cannot reach the peer", "peer", st.addr, "transport", k, "reason", err)
		} else if d.Caps.SameHostOnly {
			c.log.Info("peer is on this host: its same-host transport is usable", "peer", st.addr, "transport", k)
		}
	}
	return out
}

// choose picks the data path to st's peer for a request needing need:
// want when it names one (refused when its Caps lack need), else, of the
// kinds both sides offer that can reach the peer and whose Caps meet
// need, the one measured fastest for need's route and block size when the
// peer is on this host and the daemon calibrated (transport.Calibration),
// else the highest-ranked. recheck: it chose by rank only because need
// has no route, and one would let it choose by measurement. Why each kind
// was passed over is in the error when none is left, and in a debug log
// otherwise.
func (c *chooser) choose(st *state, want transport.Kind, need transport.Need) (_ transport.Kind, recheck bool, _ error) {
	if want != "" {
		if _, ok := c.transports[want]; !ok {
			if _, known := c.driver(want); !known && transport.CheckName(string(want)) != nil {
				return "", false, fmt.Errorf("%w: transport %q is unknown", errs.ErrInvalidArgument, want)
			}
			return "", false, fmt.Errorf("%w: transport %s was requested but is not available on this daemon", errs.ErrFailedPrecondition, want)
		}
		if err := c.reaches(st, want); err != nil {
			return "", false, fmt.Errorf("transport %s was requested but peer %s cannot use it: %w", want, st.addr, err)
		}
		if err := c.caps[want].Lacks(want, need); err != nil {
			return "", false, fmt.Errorf("transport %s was requested for peer %s: %w", want, st.addr, err)
		}
		return want, false, nil
	}
	var why []string
	var fit [8]transport.Kind // the kinds that can carry it, ranked; no allocation
	cands := fit[:0]
	sameHost := false
	for _, k := range c.ranked {
		err := c.reaches(st, k)
		if err == nil {
			sameHost = sameHost || c.caps[k].SameHostOnly
			err = c.caps[k].Lacks(k, need)
		}
		if err == nil {
			cands = append(cands, k)
			continue
		}
		if c.log.IsDebug() {
			why = append(why, fmt.Sprintf("%s: %v", k, err))
		}
	}
	if len(cands) > 0 {
		k := cands[0]
		if m := c.measured.Load(); m != nil && sameHost && len(cands) > 1 {
			if !need.Route.Known() {
				recheck = true
			} else if fast, ok := m.Choose(need.Route, need.BlockBytes, cands); ok {
				k = fast
			}
		}
		if len(why) > 0 {
			c.log.Debug("transport chosen", "peer", st.addr, "transport", k, "passed_over", strings.Join(why, "; "))
		}
		return k, recheck, nil
	}
	for _, k := range c.ranked {
		err := c.reaches(st, k)
		if err == nil {
			err = c.caps[k].Lacks(k, need)
		}
		if err != nil && !c.log.IsDebug() {
			why = append(why, fmt.Sprintf("%s: %v", k, err))
		}
	}
	return "", false, fmt.Errorf("%w: no transport in common with peer %s for a %s (it offers %v; %s)", errs.ErrFailedPrecondition, st.addr, need.Op, offered(st.hs), strings.Join(why, "; "))
}

// reaches says why kind k (one this daemon runs) cannot carry batches to
// st's peer, or nil: the peer must offer it, and its Usable check passed.
func (c *chooser) reaches(st *state, k transport.Kind) error {
	if _, ok := st.hs.GetAdverts()[string(k)]; !ok {
		return fmt.Errorf("%w: peer %s does not offer it", errs.ErrFailedPrecondition, st.addr)
	}
	if err := st.unusable[k]; err != nil {
		return err
	}
	return nil
}

// offered lists the kinds the peer's handshake offers, sorted.
func offered(hs *b2bv1.HandshakeResponse) []string {
	out := make([]string, 0, len(hs.GetAdverts()))
	for k := range hs.GetAdverts() {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
