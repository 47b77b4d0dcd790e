package region

import (
	"errors"
	"fmt"
	"slices"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/transport"
)

// narrows reports whether changing a region's export from (oldName, oldTo)
// to e takes write access away from some peer: the export is removed, or
// the new set of peers is not a superset of the old one (an empty set is
// every authenticated peer). A region that was not exported has no peer to
// revoke; a rename alone keeps the same peers.
func narrows(oldName string, oldTo []string, e Export) bool {
	if oldName == "" {
		return false
	}
	if e.Name == "" {
		return true
	}
	if len(e.To) == 0 {
		return false
	}
	if len(oldTo) == 0 {
		return true
	}
	for _, p := range oldTo {
		if !slices.Contains(e.To, p) {
			return true
		}
	}
	return false
}

// revokeIfNarrowed rekeys r's registrations (those whose transport can,
// Registration.Rekey) when export e narrows r's current export, and moves the
// key index to the new keys: a peer that resolved the region before keeps a
// key that no longer pins (its batches are refused) and, once the batches
// using the old key drained, no longer works at the NIC. p.mu held; runs
// before the export changes, so a failure leaves the export as it was (keys
// already replaced stay replaced: peers allowed to write resolve afresh).
func (p *Pins) revokeIfNarrowed(r *Region, e Export) error {
	if narrowsReaders(r.Export, r.Readers, e) {
		// SetExport indexes the new read keys once e is in place (none
		// when e grants no readers).
		if err := p.rekeyReads(r, false); err != nil {
			return err
		}
	}
	if !narrows(r.Export, r.ExportTo, e) && !(r.Export != "" && !r.ReadOnly && e.ReadOnly) {
		return nil
	}
	return p.rekey(r, "export narrowed")
}

// Rekey gives every registration of region id that can take one a new key
// (Registration.Rekey), revoking the keys peers resolved before: a
// deregistered exported layout rekeys its regions, so that peers' cached
// resolutions of it are refused at the receiver (and resolved afresh)
// instead of writing by a geometry that no longer holds.
// With reads, its read keys are replaced too (the layout had readers).
// A region already unpublished (its client gone, held by a layout) is
// rekeyed too, but its new keys are not indexed: it takes no more writes.
func (p *Pins) Rekey(r *Region, why string, reads bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if reads {
		if err := p.rekeyReads(r, true); err != nil {
			return err
		}
	}
	return p.rekey(r, why)
}

// rekey replaces r's keys and moves the key index to them; p.mu held. A
// Rekey may replace the read keys too (verbs retires every access set's
// MR), so the read index is rebuilt (when r grants readers).
func (p *Pins) rekey(r *Region, why string) error {
	if r.truncated != nil {
		return nil // its keys were withdrawn: nothing is left to revoke
	}
	p.unindexReadKeys(r)
	defer p.indexReadKeys(r)
	for k, reg := range r.regs {
		old, err := reg.Rekey()
		if errors.Is(err, errs.ErrUnimplemented) {
			continue // the kind's keys are fixed
		}
		if err != nil {
			return fmt.Errorf("region %s: %s: a new %s key failed: %w", r.ID, why, k, err)
		}
		if p.byKey[keyRef{k, old.Key}] == r {
			delete(p.byKey, keyRef{k, old.Key})
		}
		if !r.closing {
			p.byKey[keyRef{k, reg.Key().Key}] = r
		}
		p.log.Info("key revoked", "why", why, "id", r.ID, "transport", k, "old_key", old.Key, "new_key", reg.Key().Key)
	}
	return nil
}

// narrowsReaders reports whether changing a region's export from (oldName,
// oldReaders) to e takes read access away from some peer: the export is
// removed, or a reader (or AnyPeer) of the old set is missing from the new
// one, which AnyPeer covers.
func narrowsReaders(oldName string, oldReaders []string, e Export) bool {
	if oldName == "" || len(oldReaders) == 0 {
		return false
	}
	if e.Name == "" {
		return true
	}
	if slices.Contains(e.Readers, AnyPeer) {
		return false
	}
	for _, p := range oldReaders {
		if !slices.Contains(e.Readers, p) {
			return true
		}
	}
	return false
}

// rekeyReads gives r's registrations that key reads apart
// (RekeyFor) new read keys; a kind whose read key is its write key (or an
// MR of its own, verbs) is rekeyed whole (Rekey), as narrowing the writers
// does. The old read keys
// leave the index; with reindex the new ones are indexed (when r grants
// readers), else the caller does that once the new export is in place.
// p.mu held.
func (p *Pins) rekeyReads(r *Region, reindex bool) error {
	if r.truncated != nil {
		return nil // its keys were withdrawn: nothing is left to revoke
	}
	p.unindexReadKeys(r)
	if reindex {
		defer p.indexReadKeys(r)
	}
	for k, reg := range r.regs {
		old, err := reg.RekeyFor(transport.AccessRead)
		if err == nil {
			p.log.Info("readers narrowed: read key revoked", "id", r.ID, "transport", k, "old_key", old.Key)
			continue
		}
		if !errors.Is(err, errs.ErrUnimplemented) {
			return fmt.Errorf("region %s: narrowing its readers needs a new %s read key, which failed: %w", r.ID, k, err)
		}
		old, err = reg.Rekey()
		if errors.Is(err, errs.ErrUnimplemented) {
			continue // the kind's keys are fixed
		}
		if err != nil {
			return fmt.Errorf("region %s: narrowing its readers needs a new %s key, which failed: %w", r.ID, k, err)
		}
		if p.byKey[keyRef{k, old.Key}] == r {
			delete(p.byKey, keyRef{k, old.Key})
		}
		p.byKey[keyRef{k, reg.Key().Key}] = r
		p.log.Info("readers narrowed: key revoked", "id", r.ID, "transport", k, "old_key", old.Key)
	}
	return nil
}
