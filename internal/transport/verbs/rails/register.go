package rails

import (
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/topology"
	"github.com/b2bd/b2bd/internal/transport"
)

// registration is memory registered with every rail: one MR each.
type registration struct {
	t    *Transport
	mem  memory.Memory
	regs []transport.Registration // by rail
	loc  topology.Location
	tier []topology.Tier // by rail
	// order is every rail by preference (affinity, then rail order); the
	// first npref are the preferred ones, a batch's stripe.
	order []int
	npref int

	mu     sync.Mutex
	keys   []transport.RemoteKey // by rail; keys[0] is the registration's Key
	closed bool
	err    error
}

var _ transport.Registration = (*registration)(nil)

// Register registers m with every rail and ranks the rails for it.
func (t *Transport) Register(m memory.Memory) (transport.Registration, error) {
	r := &registration{t: t, mem: m}
	for _, rl := range t.rails {
		g, err := rl.t.Register(m)
		if err != nil {
			for _, g := range r.regs {
				_ = g.Close()
			}
			return nil, fmt.Errorf("rails: register %d bytes on rail %d (%s): %w", m.Len, rl.idx, rl.name, err)
		}
		r.regs = append(r.regs, g)
	}
	r.rank()
	t.mu.Lock()
	r.keys = r.buildKeys()
	t.mapKeys(r.keys, true)
	t.mu.Unlock()
	return r, nil
}

// rank places the memory (its GPU's PCI function, or the NUMA node of its
// first page, which registration has faulted in) and orders the rails.
func (r *registration) rank() {
	t := r.t
	r.loc = topology.Location{Node: -1}
	var why string
	switch r.mem.Kind {
	case memory.CUDA:
		if t.cfg.GPUBusID == nil {
			why = "no CUDA bus id"
			break
		}
		bus, err := t.cfg.GPUBusID(r.mem.Device)
		if err != nil {
			why = err.Error()
			break
		}
		d, err := t.cfg.Sysfs.PCIDevice(fmt.Sprintf("GPU %d", r.mem.Device), bus)
		if err != nil {
			why = err.Error()
			break
		}
		r.loc.GPU = &d
	case memory.Host:
		if n, err := topology.MemoryNode(r.mem.Addr); err == nil {
			r.loc.Node = n
		} else {
			why = err.Error()
		}
	}
	nics := make([]topology.Device, len(t.rails))
	for i, rl := range t.rails {
		nics[i] = rl.topo
	}
	ranked := topology.Rank(r.loc, nics)
	best := len(topology.Best(ranked))
	if t.cfg.MaxRails > 0 {
		best = min(best, t.cfg.MaxRails)
	}
	r.tier = make([]topology.Tier, len(t.rails))
	var desc []string
	for k, c := range ranked {
		i := k
		for j, rl := range t.rails { // names are unique (New checks)
			if rl.name == c.NIC {
				i = j
			}
		}
		r.order = append(r.order, i)
		r.tier[i] = c.Tier
		mark := ""
		if k < best {
			mark = "*"
		}
		desc = append(desc, fmt.Sprintf("%s%s (%s)", mark, c.NIC, c.Tier))
	}
	r.npref = best
	args := []any{"bytes", r.mem.Len, "memory", r.loc.String(), "rails", strings.Join(desc, ", ")}
	if why != "" {
		args = append(args, "location_unknown", why)
	}
	t.log.Info("rails chosen for a region (* = striped over)", args...)
}

func (r *registration) buildKeys() []transport.RemoteKey {
	k := make([]transport.RemoteKey, len(r.regs))
	for i, g := range r.regs {
		k[i] = g.Key()
	}
	return k
}

// mapKeys adds (or removes) the translation of each rail's key to the rail-0
// key for the receiving side. t.mu held.
func (t *Transport) mapKeys(k []transport.RemoteKey, add bool) {
	for i := 1; i < len(k); i++ {
		if add {
			t.keys[i][uint32(k[i].Key)] = k[0].Key
		} else if t.keys[i][uint32(k[i].Key)] == k[0].Key {
			delete(t.keys[i], uint32(k[i].Key))
		}
	}
}

func (r *registration) Memory() memory.Memory { return r.mem }

// Key is rail 0's key (the registry's); Rails has every rail's.
func (r *registration) Key() transport.RemoteKey {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.keys[0]
}

// Rekey gives every rail a new MR (see transport.Registration) and returns the
// old key; the old rail keys stop translating at once, so a batch that
// arrives with one is refused like one with the old rail-0 key.
func (r *registration) Rekey() (transport.RemoteKey, error) {
	var el []error
	for i, g := range r.regs {
		if _, err := g.Rekey(); err != nil {
			el = append(el, fmt.Errorf("rail %d (%s): %w", i, r.t.rails[i].name, err))
		}
	}
	t := r.t
	r.mu.Lock()
	old := r.keys
	r.keys = r.buildKeys()
	t.mu.Lock()
	t.mapKeys(old, false)
	t.mapKeys(r.keys, true)
	t.mu.Unlock()
	r.mu.Unlock()
	if len(el) > 0 {
		return old[0], fmt.Errorf("rails: rekey: %w", errors.Join(el...))
	}
	return old[0], nil
}

// Withdraw withdraws every rail's registration: no rail key works any
// more.
func (r *registration) Withdraw() error {
	var el []error
	for i, g := range r.regs {
		if err := g.Withdraw(); err != nil && !errors.Is(err, errs.ErrUnimplemented) {
			el = append(el, fmt.Errorf("rail %d (%s): %w", i, r.t.rails[i].name, err))
		}
	}
	if len(el) > 0 {
		return fmt.Errorf("rails: withdraw: %w", errors.Join(el...))
	}
	return nil
}

// Close deregisters the memory on every rail; safe twice.
func (r *registration) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return r.err
	}
	r.closed = true
	t := r.t
	t.mu.Lock()
	t.mapKeys(r.keys, false)
	t.mu.Unlock()
	r.mu.Unlock()
	var el []error
	for _, g := range r.regs {
		el = append(el, g.Close())
	}
	err := errors.Join(el...)
	r.mu.Lock()
	r.err = err
	r.mu.Unlock()
	return err
}

// KeyFor: a rail's MRs are its write MRs (rails neither reads nor
// serves reads, Caps.Ops).
func (r *registration) KeyFor(transport.Access) (transport.RemoteKey, error) {
	return transport.RemoteKey{}, fmt.Errorf("%w: rails has one key per rail for every access", errs.ErrUnimplemented)
}

// RekeyFor: Rekey replaces every rail's MR.
func (r *registration) RekeyFor(transport.Access) (transport.RemoteKey, error) {
	return transport.RemoteKey{}, fmt.Errorf("%w: rails rekeys every rail's MR at once (Rekey)", errs.ErrUnimplemented)
}

// Rails lists the MR on each rail.
func (r *registration) Rails() []transport.RailRegistration {
	r.mu.Lock()
	keys := r.keys
	r.mu.Unlock()
	out := make([]transport.RailRegistration, len(r.regs))
	for i, g := range r.regs {
		x := transport.RailRegistration{Rail: i, Device: r.t.rails[i].name, Key: keys[i], Affinity: r.tier[i].String()}
		if p, ok := g.(interface{ Path() string }); ok {
			x.Path = p.Path()
		}
		x.Preferred = r.preferred(i)
		out[i] = x
	}
	return out
}

func (r *registration) preferred(rail int) bool {
	for _, i := range r.order[:r.npref] {
		if i == rail {
			return true
		}
	}
	return false
}
