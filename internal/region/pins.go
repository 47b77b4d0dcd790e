package region

// The pin table: the transport keys peers name a region by, and pinning
// a region by key for the length of one access.

import (
	"fmt"
	"sync"

	"github.com/hashicorp/go-hclog"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/transport"
)

// Pins is the index of live registrations by transport key: the receiving
// side of every transport pins its destination through it
// (transport.Inbound's Pin). The daemon makes it first and hands it to the
// transports and then to the registry (Config.Pins), which fills it in as
// regions are registered, so neither needs the other to exist first and
// nothing is bound after construction. It shares the registry's lock.
type Pins struct {
	mu    sync.Mutex
	byKey map[keyRef]*Region
	// byReadKey indexes the registrations' read keys (KeyFor):
	// a read pins only through it, a write only through byKey.
	byReadKey map[keyRef]*Region
	g         *Registry    // set by New: checks a region's file, releases a drained region
	log       hclog.Logger // set by New: key revocations are logged
}

// NewPins returns an empty key index.
func NewPins() *Pins {
	return &Pins{byKey: map[keyRef]*Region{}, byReadKey: map[keyRef]*Region{}, log: hclog.NewNullLogger()}
}

// Pins is the registry's key index, which the receiving sides pin through
// and which layouts rekey.
func (g *Registry) Pins() *Pins { return g.pins }

type keyRef struct {
	k   transport.Kind
	key uint64
}

// readKeyOf is reg's read key where it has one of its own (KeyFor),
// distinct from its write key.
func readKeyOf(reg transport.Registration) (transport.RemoteKey, bool) {
	k, err := reg.KeyFor(transport.AccessRead)
	if err != nil || k.Key == reg.Key().Key {
		return transport.RemoteKey{}, false
	}
	return k, true
}

// ReadKey is r's key for reads with transport k: its own read key where the
// registration has one (KeyFor), else its key.
func (r *Region) ReadKey(k transport.Kind) (transport.RemoteKey, bool) {
	reg, ok := r.regs[k]
	if !ok {
		return transport.RemoteKey{}, false
	}
	if rk, err := reg.KeyFor(transport.AccessRead); err == nil {
		return rk, true
	}
	return reg.Key(), true
}

// KeysFor is the region's key with each transport it is registered
// with, for a peer granted access a: that access's key only (a read key
// where the registration has one, else its one key), never the other's.
// A kind over several devices (rails) gives its write key on each, device
// 0 first; a read gets device 0's alone, since per-device keys are write
// keys. This is what a peer's resolve of the region hands out.
func (r *Region) KeysFor(a transport.Access) map[transport.Kind]transport.RegionKey {
	out := make(map[transport.Kind]transport.RegionKey, len(r.regs))
	for k, g := range r.regs {
		key := transport.RegionKey{Key: g.Key()}
		if a == transport.AccessRead {
			key.Key, _ = r.ReadKey(k)
		}
		if rails := g.Rails(); rails != nil && a != transport.AccessRead {
			for _, x := range rails {
				if x.Rail >= transport.MaxDevices {
					continue
				}
				for len(key.Devices) <= x.Rail {
					key.Devices = append(key.Devices, transport.RemoteKey{})
				}
				key.Devices[x.Rail] = x.Key
			}
			if len(key.Devices) <= 1 {
				key.Devices = nil
			} else {
				key.Devices[0] = key.Key // device 0's key is the registration's
			}
		}
		out[k] = key
	}
	return out
}

// Pin implements transport.Inbound's Pin: the receiving side of a transport
// holds the destination while it places bytes.
func (p *Pins) Pin(k transport.Kind, key uint64) (memory.Memory, func(), error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.byKey[keyRef{k, key}]
	if !ok || r.closing {
		return memory.Memory{}, nil, fmt.Errorf("%w: no live %s registration has key %#x (deregistered?)", errs.ErrNotFound, k, key)
	}
	if r.Export == "" {
		// Peers may only write exported regions; un-exporting revokes a
		// key a peer still holds.
		return memory.Memory{}, nil, fmt.Errorf("%w: region %s is no longer exported", errs.ErrNotFound, r.ID)
	}
	if r.ReadOnly {
		return memory.Memory{}, nil, fmt.Errorf("%w: region %q is exported read-only", errs.ErrNotFound, r.Export)
	}
	if err := p.g.files.check(r); err != nil {
		return memory.Memory{}, nil, err
	}
	r.active++
	return r.Mem, func() { p.done(r) }, nil
}

// PinRead implements transport.Inbound.PinRead: the serving side of a pull holds
// the source while it sends. Only a read key pins, and only while the
// region is exported with readers.
func (p *Pins) PinRead(k transport.Kind, key uint64) (memory.Memory, func(), error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.byReadKey[keyRef{k, key}]
	if !ok || r.closing {
		return memory.Memory{}, nil, fmt.Errorf("%w: no live %s registration has read key %#x (deregistered, or its readers narrowed?)", errs.ErrNotFound, k, key)
	}
	if r.Export == "" {
		return memory.Memory{}, nil, fmt.Errorf("%w: region %s is no longer exported", errs.ErrNotFound, r.ID)
	}
	if len(r.Readers) == 0 {
		return memory.Memory{}, nil, fmt.Errorf("%w: region %q no longer grants reads", errs.ErrNotFound, r.Export)
	}
	if err := p.g.files.check(r); err != nil {
		return memory.Memory{}, nil, err
	}
	r.active++
	return r.Mem, func() { p.done(r) }, nil
}

// done ends one use of r; the last use of a region whose lease ended
// releases it (in its own goroutine: the caller may hold a transport's
// locks, which releasing the registrations takes).
func (p *Pins) done(r *Region) {
	p.mu.Lock()
	r.active--
	last := r.active == 0 && r.drain
	if last {
		r.drain = false
		delete(p.g.draining, r)
	}
	if last {
		p.g.drained.Add(1) // under the lock: Close waits for it
	}
	p.mu.Unlock()
	if last {
		go func() {
			defer p.g.drained.Done()
			p.g.cfg.Log.Info("region of a gone client released after its last batch", "id", r.ID, "owner", r.Owner.String(), "pid", r.PID)
			p.g.close(r)
		}()
	}
}

// indexReadKeys indexes r's read keys (readKeyOf, which makes them where
// they are made lazily) when r grants readers and is not closing; p.mu
// held. A region without readers gets none: its registrations never make
// a key that can read.
func (p *Pins) indexReadKeys(r *Region) {
	if len(r.Readers) == 0 || r.Export == "" || r.closing {
		return
	}
	for k, reg := range r.regs {
		if _, done := r.readKeys[k]; done {
			continue
		}
		if rk, ok := readKeyOf(reg); ok {
			if r.readKeys == nil {
				r.readKeys = map[transport.Kind]uint64{}
			}
			r.readKeys[k] = rk.Key
			p.byReadKey[keyRef{k, rk.Key}] = r
		}
	}
}

// unindexReadKeys drops r's read keys from the index; p.mu held.
func (p *Pins) unindexReadKeys(r *Region) {
	for k, key := range r.readKeys {
		if p.byReadKey[keyRef{k, key}] == r {
			delete(p.byReadKey, keyRef{k, key})
		}
	}
	clear(r.readKeys)
}
