package batch

import (
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/layout"
	"github.com/b2bd/b2bd/internal/region"
	"github.com/b2bd/b2bd/internal/transport"
)

// Layouts is the daemon's registry of block tables (docs/kv.md), next to
// the region registry. A layout holds each of its regions (region.Hold)
// from RegisterLayout to DeregisterLayout, so deregistering one is refused
// with FailedPrecondition naming the layout. A region whose client went
// away is unpublished but, held, stays mapped until the layout goes; a
// transfer then finds it gone (Acquire) and fails with FailedPrecondition.
type Layouts struct {
	reg      *region.Registry
	mu       sync.Mutex
	byName   map[string]*Entry
	byExport map[string]*Entry
}

// Entry is one registered layout. Its fields do not change after
// registration, except pairs.
type Entry struct {
	Name      string
	Export    string
	ExportTo  []string
	Readers   []string // peers allowed to read it (region.AnyPeer: every one)
	ReadOnly  bool     // no peer may write it
	Owner     region.Caller
	Lease     region.Lease // Client 0: persists until DeregisterLayout
	NumBlocks uint64
	Created   time.Time        // when it was registered (its name bound)
	Segments  []layout.Segment // Region: the region's ID
	Layout    *layout.Layout
	regions   []*region.Region // by Layout.Regions() index
	release   []func()

	pairMu sync.Mutex
	pairs  map[*layout.Layout]*layout.Pair // by remote layout (peer.ResolveLayout's cache)
	rpairs map[*layout.Layout]*layout.Pair // pulls: (remote, e), by remote layout
}

// maxPairs bounds an entry's cache of pairs: a remote layout resolved
// afresh (re-registered, a new handshake) is a new key, so old ones drop out.
const maxPairs = 64

// pair returns the pair (e, dst), built once per resolved remote layout.
func (e *Entry) pair(dst *layout.Layout) (*layout.Pair, error) {
	e.pairMu.Lock()
	defer e.pairMu.Unlock()
	if p, ok := e.pairs[dst]; ok {
		return p, nil
	}
	p, err := layout.NewPair(e.Layout, dst, layout.Limits{})
	if err != nil {
		return nil, err
	}
	if e.pairs == nil || len(e.pairs) >= maxPairs {
		e.pairs = map[*layout.Layout]*layout.Pair{}
	}
	e.pairs[dst] = p
	return p, nil
}

// readPair returns the pair (src, e) of a pull from the peer's layout src,
// built once per resolved remote layout.
func (e *Entry) readPair(src *layout.Layout) (*layout.Pair, error) {
	e.pairMu.Lock()
	defer e.pairMu.Unlock()
	if p, ok := e.rpairs[src]; ok {
		return p, nil
	}
	p, err := layout.NewPair(src, e.Layout, layout.Limits{})
	if err != nil {
		return nil, err
	}
	if e.rpairs == nil || len(e.rpairs) >= maxPairs {
		e.rpairs = map[*layout.Layout]*layout.Pair{}
	}
	e.rpairs[src] = p
	return p, nil
}

// Regions are the layout's regions, by Layout.Regions() index.
func (e *Entry) Regions() []*region.Region { return e.regions }

// NewLayouts returns an empty registry over reg.
func NewLayouts(reg *region.Registry) *Layouts {
	return &Layouts{reg: reg, byName: map[string]*Entry{}, byExport: map[string]*Entry{}}
}

// Register validates and registers a layout of segs (Region: region IDs,
// NumBlocks ignored: numBlocks applies to all), holding its regions.
func (ls *Layouts) Register(name string, segs []layout.Segment, numBlocks uint64, export region.Export, who region.Caller, lease region.Lease) (*Entry, error) {
	if err := layout.CheckExportName("export_name", export.Name); err != nil {
		return nil, err
	}
	if export.Name == "" && len(export.To) > 0 {
		return nil, fmt.Errorf("%w: export_to is set but export_name is empty", errs.ErrInvalidArgument)
	}
	if err := export.CheckGrants(); err != nil {
		return nil, err
	}
	// num_blocks and region_id are the request's fields (layout.New, which
	// also checks a peer's resolutions, names them per segment).
	switch {
	case numBlocks == 0:
		return nil, fmt.Errorf("%w: layout %q: num_blocks is 0: a layout needs at least one block per segment", errs.ErrInvalidArgument, name)
	case numBlocks > layout.DefaultMaxBlocks:
		return nil, fmt.Errorf("%w: layout %q: num_blocks = %d, over the limit of %d", errs.ErrResourceExhausted, name, numBlocks, uint64(layout.DefaultMaxBlocks))
	}
	for i, s := range segs {
		if s.Region == "" {
			return nil, fmt.Errorf("%w: layout %q: segments[%d].region_id is empty", errs.ErrInvalidArgument, name, i)
		}
	}
	ls.mu.Lock()
	_, taken := ls.byName[name]
	_, etaken := ls.byExport[export.Name]
	ls.mu.Unlock()
	if taken {
		return nil, fmt.Errorf("%w: name: a layout named %q is registered", errs.ErrAlreadyExists, name)
	}
	if export.Name != "" && etaken {
		return nil, fmt.Errorf("%w: export_name: a layout is exported as %q", errs.ErrAlreadyExists, export.Name)
	}
	e := &Entry{Name: name, Export: export.Name, ExportTo: slices.Clone(export.To), Readers: slices.Clone(export.Readers), ReadOnly: export.ReadOnly, Owner: who, Lease: lease, NumBlocks: numBlocks, Created: time.Now()}
	e.Segments = make([]layout.Segment, len(segs))
	held := map[string]*region.Region{}
	fail := func(err error) (*Entry, error) {
		for _, rel := range e.release {
			rel()
		}
		return nil, err
	}
	for i, s := range segs {
		s.NumBlocks = numBlocks
		e.Segments[i] = s
		if held[s.Region] != nil {
			continue
		}
		r, rel, err := ls.reg.Hold(s.Region, fmt.Sprintf("segments[%d].region_id", i), who, fmt.Sprintf("layout %q", name))
		if err != nil {
			return fail(err)
		}
		held[s.Region] = r
		e.release = append(e.release, rel)
	}
	l, err := layout.New(name, e.Segments, func(id string) (uint64, error) {
		if r := held[id]; r != nil {
			return r.Mem.Len, nil
		}
		return 0, fmt.Errorf("%w: region %q is not registered", errs.ErrNotFound, id)
	}, layout.Limits{})
	if err != nil {
		return fail(err)
	}
	e.Layout = l
	for _, r := range l.Regions() {
		e.regions = append(e.regions, held[r.Name])
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if _, taken := ls.byName[name]; taken {
		return fail(fmt.Errorf("%w: name: a layout named %q is registered", errs.ErrAlreadyExists, name))
	}
	if _, taken := ls.byExport[export.Name]; export.Name != "" && taken {
		return fail(fmt.Errorf("%w: export_name: a layout is exported as %q", errs.ErrAlreadyExists, export.Name))
	}
	ls.byName[name] = e
	if e.Export != "" {
		ls.byExport[e.Export] = e
	}
	return e, nil
}

// Deregister removes a layout (for its owner or root) and releases its
// regions' hold. Transfers under way keep their own hold on the regions.
func (ls *Layouts) Deregister(name string, who region.Caller) error {
	ls.mu.Lock()
	e, ok := ls.byName[name]
	if !ok {
		ls.mu.Unlock()
		return fmt.Errorf("%w: name %q is not a registered layout", errs.ErrNotFound, name)
	}
	if !e.Owner.Owns(who) {
		ls.mu.Unlock()
		return fmt.Errorf("%w: layout %q belongs to %s, not %s", errs.ErrPermissionDenied, name, e.Owner, who)
	}
	return ls.remove(e) // unlocks
}

// Expire deregisters the layouts leased to client (region.Lease.Client),
// whose last connection closed, and returns how many went. The server calls
// it before the region registry's Expire, so that the layouts' holds no
// longer keep the client's regions mapped.
func (ls *Layouts) Expire(client uint64) (n int, err error) {
	if client == 0 {
		return 0, nil
	}
	ls.mu.Lock()
	var gone []*Entry
	for _, e := range ls.byName {
		if e.Lease.Client == client {
			gone = append(gone, e)
		}
	}
	ls.mu.Unlock()
	for _, e := range gone {
		ls.mu.Lock()
		if ls.byName[e.Name] != e {
			ls.mu.Unlock()
			continue
		}
		if rerr := ls.remove(e); rerr != nil {
			err = rerr
			continue
		}
		n++
	}
	return n, err
}

// remove drops e, which is registered, and releases its holds; ls.mu is
// held on entry and released.
func (ls *Layouts) remove(e *Entry) error {
	name := e.Name
	if e.Export != "" {
		// Peers cache a resolved layout until a key is refused: revoke
		// its regions' keys, so that no peer goes on writing by this
		// layout's geometry once it is gone. On failure the layout stays.
		for _, r := range e.regions {
			if err := ls.reg.Pins().Rekey(r, fmt.Sprintf("exported layout %q deregistered", name), len(e.Readers) > 0); err != nil {
				ls.mu.Unlock()
				return fmt.Errorf("deregister layout %q: revoking the keys peers resolved: %w", name, err)
			}
		}
	}
	delete(ls.byName, name)
	if e.Export != "" {
		delete(ls.byExport, e.Export)
	}
	ls.mu.Unlock()
	for _, rel := range e.release {
		rel()
	}
	return nil
}

// Get finds a layout by name for its owner (or root).
func (ls *Layouts) Get(name, field string, who region.Caller) (*Entry, error) {
	ls.mu.Lock()
	e, ok := ls.byName[name]
	ls.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("%w: %s %q is not a registered layout", errs.ErrNotFound, field, name)
	}
	if !e.Owner.Owns(who) {
		return nil, fmt.Errorf("%w: %s %q belongs to %s, not %s", errs.ErrPermissionDenied, field, name, e.Owner, who)
	}
	return e, nil
}

// Lookup finds an exported layout by its export name for the peer whose
// authenticated identity is peer ("" when peers are not authenticated).
func (ls *Layouts) Lookup(name, peer string) (*Entry, error) {
	return ls.LookupFor(name, peer, transport.AccessWrite)
}

// LookupFor is Lookup for access a (the layout's writers or its readers).
func (ls *Layouts) LookupFor(name, peer string, a transport.Access) (*Entry, error) {
	ls.mu.Lock()
	e, ok := ls.byExport[name]
	ls.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("%w: no layout is exported as %q", errs.ErrNotFound, name)
	}
	ex := region.Export{Name: e.Export, To: e.ExportTo, Readers: e.Readers, ReadOnly: e.ReadOnly}
	if err := region.Grants(ex, peer, a, "layout", name); err != nil {
		return nil, err
	}
	return e, nil
}

// List returns the layouts who may act on, by name.
func (ls *Layouts) List(who region.Caller) []*Entry {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	var out []*Entry
	for _, e := range ls.byName {
		if e.Owner.Owns(who) {
			out = append(out, e)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Close releases every layout's hold (daemon shutdown, before the region
// registry closes); safe to call twice.
func (ls *Layouts) Close() {
	ls.mu.Lock()
	es := ls.byName
	ls.byName, ls.byExport = map[string]*Entry{}, map[string]*Entry{}
	ls.mu.Unlock()
	for _, e := range es {
		for _, rel := range e.release {
			rel()
		}
	}
}
