package region

// Who may do what to a region: callers and ownership, exports, readers,
// and the look-ups that check them.

import (
	"fmt"
	"slices"
	"time"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/transport"
)

// Caller is who asks, as the local API's socket credentials tell: regions'
// files are handed to their caller, and imports must be the caller's own.
// A region belongs to the caller that registered it (see Owns).
type Caller struct {
	UID, GID uint32
	Known    bool // false for callers over TCP, whose uid the kernel cannot tell
	// Identity is a TCP caller's authenticated TLS identity (its
	// certificate's first DNS name); "" over the plaintext loopback API.
	Identity string
}

// Root is a caller with every right over every region.
var Root = Caller{Known: true}

func (c Caller) String() string {
	switch {
	case c.Known:
		return fmt.Sprintf("uid %d", c.UID)
	case c.Identity != "":
		return fmt.Sprintf("TLS identity %q", c.Identity)
	default:
		return "an unauthenticated TCP caller"
	}
}

// Owns reports whether who may act on a region that c registered: root on
// the Unix socket may act on every region; a socket caller on the regions
// registered with its uid; a TCP caller (uid unknown) on the regions
// registered over TCP with its TLS identity. Unauthenticated TCP callers
// (the plaintext loopback API) share one identity, "", and never reach a
// region registered on the socket or with a certificate.
func (c Caller) Owns(who Caller) bool {
	if who.Known && who.UID == 0 {
		return true
	}
	if c.Known || who.Known {
		return c.Known && who.Known && c.UID == who.UID
	}
	return c.Identity == who.Identity
}

// permit checks that who may act on r; g.mu held or r immutable.
func permit(r *Region, field string, who Caller) error {
	if r.Owner.Owns(who) {
		return nil
	}
	return fmt.Errorf("%w: %s %s belongs to %s, not to the caller (%s)", errs.ErrPermissionDenied, field, r.ID, r.Owner, who)
}

// SetExport sets (or, with an empty name, clears) a region's export, for
// its owner or root.
func (g *Registry) SetExport(id string, export Export, who Caller) (*Region, error) {
	r, err := g.setExport(id, export, who)
	if err == nil && export.Name == "" && g.cfg.Unwatchable != nil {
		g.cfg.Unwatchable(r.ID, fmt.Errorf("%w: region %s is no longer exported, so no peer can notify it", errs.ErrFailedPrecondition, r.ID))
	}
	return r, err
}

func (g *Registry) setExport(id string, export Export, who Caller) (*Region, error) {
	if err := export.check(); err != nil {
		return nil, err
	}
	name := export.Name
	g.mu.Lock()
	defer g.mu.Unlock()
	r, ok := g.byID[id]
	if !ok || r.closing {
		return nil, fmt.Errorf("%w: region_id %q is not registered", errs.ErrNotFound, id)
	}
	if err := permit(r, "region_id", who); err != nil {
		return nil, err
	}
	if name != "" {
		if o, taken := g.byName[name]; taken && o != r {
			return nil, nameTaken(name, o)
		}
	}
	if err := g.pins.revokeIfNarrowed(r, export); err != nil {
		return nil, err
	}
	if r.Export != "" {
		delete(g.byName, r.Export)
	}
	r.Export, r.ExportTo, r.Readers, r.ReadOnly = name, export.To, export.Readers, export.ReadOnly
	r.exported = time.Now()
	if name != "" {
		g.byName[name] = r
	} else {
		r.ExportTo, r.Readers, r.ReadOnly = nil, nil, false
	}
	if len(r.Readers) == 0 {
		g.pins.unindexReadKeys(r)
	} else {
		g.pins.indexReadKeys(r) // readers granted now: their keys are made here
	}
	return r, nil
}

// Acquire finds a region by ID for its owner (or root), and holds it for a
// batch until release.
func (g *Registry) Acquire(id, field string, who Caller) (*Region, func(), error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	r, ok := g.byID[id]
	if !ok || r.closing {
		return nil, nil, fmt.Errorf("%w: %s %q is not a registered region", errs.ErrNotFound, field, id)
	}
	if err := permit(r, field, who); err != nil {
		return nil, nil, err
	}
	if err := g.files.check(r); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", field, err)
	}
	r.active++
	return r, func() { g.pins.done(r) }, nil
}

// Hold is Acquire for a long-lived holder (a layout, named in holder as
// the refusal of a deregistration should name it, e.g. `layout "kv"`): the
// region stays registered until release.
func (g *Registry) Hold(id, field string, who Caller, holder string) (*Region, func(), error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	r, ok := g.byID[id]
	if !ok || r.closing {
		return nil, nil, fmt.Errorf("%w: %s %q is not a registered region", errs.ErrNotFound, field, id)
	}
	if err := permit(r, field, who); err != nil {
		return nil, nil, err
	}
	if err := g.files.check(r); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", field, err)
	}
	r.active++
	if r.heldBy == nil {
		r.heldBy = map[string]int{}
	}
	r.heldBy[holder]++
	return r, func() {
		g.mu.Lock()
		if r.heldBy[holder]--; r.heldBy[holder] <= 0 {
			delete(r.heldBy, holder)
		}
		g.mu.Unlock()
		g.pins.done(r)
	}, nil
}

// ExportName is the name region id is exported under, "" when it is not
// exported (or not registered), read under the registry's lock.
func (g *Registry) ExportName(id string) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	if r, ok := g.byID[id]; ok {
		return r.Export
	}
	return ""
}

// Lookup finds an exported region by name for the peer whose authenticated
// identity is peer ("" when peers are not authenticated) to write into,
// holding it until release. A region exported to named peers refuses every
// other peer.
func (g *Registry) Lookup(name, peer string) (*Region, func(), error) {
	return g.LookupFor(name, peer, transport.AccessWrite)
}

// LookupFor is Lookup for access a: AccessRead needs the peer among the
// export's readers ("*": every peer), AccessWrite among its writers
// (export_to; empty: every peer) and the export not read-only.
func (g *Registry) LookupFor(name, peer string, a transport.Access) (*Region, func(), error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	r, ok := g.byName[name]
	if !ok || r.closing {
		return nil, nil, fmt.Errorf("%w: no region is exported as %q", errs.ErrNotFound, name)
	}
	if err := Grants(ExportOf(r), peer, a, "region", name); err != nil {
		return nil, nil, err
	}
	if err := g.files.check(r); err != nil {
		return nil, nil, err
	}
	r.active++
	return r, func() { g.pins.done(r) }, nil
}

// ExportOf is r's export as set; g.mu held by the caller where it matters.
func ExportOf(r *Region) Export {
	return Export{Name: r.Export, To: r.ExportTo, Readers: r.Readers, ReadOnly: r.ReadOnly}
}

// Grants says whether export e lets peer (its authenticated identity, ""
// when peers are not authenticated) have access a to the thing named
// name (what: "region", "layout"); the refusal wraps ErrPermissionDenied.
func Grants(e Export, peer string, a transport.Access, what, name string) error {
	who := peer
	if who == "" {
		who = "an unauthenticated peer"
	}
	if a&transport.AccessWrite != 0 {
		if e.ReadOnly {
			return fmt.Errorf("%w: %s may not write %s %q (exported read-only)", errs.ErrPermissionDenied, who, what, name)
		}
		if len(e.To) > 0 && !slices.Contains(e.To, peer) {
			return fmt.Errorf("%w: %s may not write %s %q (exported to %v)", errs.ErrPermissionDenied, who, what, name, e.To)
		}
	}
	if a&transport.AccessRead != 0 && !readable(e.Readers, peer) {
		if len(e.Readers) == 0 {
			return fmt.Errorf("%w: %s may not read %s %q (its export grants no readers; set readers)", errs.ErrPermissionDenied, who, what, name)
		}
		return fmt.Errorf("%w: %s may not read %s %q (readers %v)", errs.ErrPermissionDenied, who, what, name, e.Readers)
	}
	return nil
}

// readable: readers grants peer.
func readable(readers []string, peer string) bool {
	return slices.Contains(readers, AnyPeer) || (len(readers) > 0 && slices.Contains(readers, peer))
}

// AnyPeer in an export's readers grants every authenticated peer.
const AnyPeer = "*"

// Export is a region's export: its name, the peers allowed to write it and
// those allowed to read it.
type Export struct {
	Name     string
	To       []string // writers: peer identities; empty: every authenticated peer
	Readers  []string // readers: peer identities, or AnyPeer; empty: none
	ReadOnly bool     // no writers at all (To must be empty)
}

func (e Export) check() error {
	if err := checkName(e.Name); err != nil {
		return err
	}
	if e.Name == "" && len(e.To) > 0 {
		return fmt.Errorf("%w: export_to is set but export_name is empty", errs.ErrInvalidArgument)
	}
	return e.checkGrants()
}

// checkGrants checks the export's writers and readers.
func (e Export) checkGrants() error {
	if e.Name == "" && len(e.Readers) > 0 {
		return fmt.Errorf("%w: readers is set but export_name is empty", errs.ErrInvalidArgument)
	}
	if e.Name == "" && e.ReadOnly {
		return fmt.Errorf("%w: read_only is set but export_name is empty", errs.ErrInvalidArgument)
	}
	if e.ReadOnly && len(e.To) > 0 {
		return fmt.Errorf("%w: read_only is set and export_to names %d writers: a read-only export has none", errs.ErrInvalidArgument, len(e.To))
	}
	for i, p := range e.To {
		if p == "" || len(p) > 253 || p == AnyPeer {
			return fmt.Errorf("%w: export_to[%d] %q is not a peer identity (1..253 bytes; empty export_to means every peer)", errs.ErrInvalidArgument, i, p)
		}
	}
	for i, p := range e.Readers {
		if p == "" || len(p) > 253 {
			return fmt.Errorf("%w: readers[%d] %q is not a peer identity (1..253 bytes, or \"*\" for every authenticated peer)", errs.ErrInvalidArgument, i, p)
		}
	}
	if len(e.Readers) > maxGrants || len(e.To) > maxGrants {
		return fmt.Errorf("%w: export_to has %d and readers %d peers, over the limit of %d", errs.ErrInvalidArgument, len(e.To), len(e.Readers), maxGrants)
	}
	return nil
}

// CheckGrants validates an export's grants (for layouts, whose names the
// layout registry checks).
func (e Export) CheckGrants() error { return e.checkGrants() }

// maxGrants bounds the peers an export names per access.
const maxGrants = 1024

func checkName(name string) error {
	if len(name) > MaxNameLen {
		return fmt.Errorf("%w: export_name is %d bytes, over the limit of %d", errs.ErrInvalidArgument, len(name), MaxNameLen)
	}
	for i, c := range name {
		if !(c == '-' || c == '_' || c == '.' || c == '/' || c == ':' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
			return fmt.Errorf("%w: export_name %q has %q at byte %d: use letters, digits and -_./:", errs.ErrInvalidArgument, name, c, i)
		}
	}
	return nil
}
