package region

import (
	"errors"
	"time"

	"github.com/b2bd/b2bd/internal/memory"
)

var errNoFile = errors.New("region: no open file")

// Span places a region in the memory behind it, so that two regions can be
// found to share bytes: offset o of the region is byte Base+o of Space.
// Host regions live in their file (two registrations of one file share
// its bytes), GPU regions in their device's address space of this
// process.
type Span struct {
	Space SpaceID
	Base  uint64
	Len   uint64
}

// SpaceID names the memory a Span is in.
type SpaceID struct {
	kind     memory.Kind
	dev, ino uint64 // host: the file's inode; CUDA: dev is the device
}

// Overlaps says whether a and b share a byte.
func (a Span) Overlaps(b Span) bool {
	return a.Space == b.Space && a.Len > 0 && b.Len > 0 && a.Base < b.Base+b.Len && b.Base < a.Base+a.Len
}

// SpanOf is r's Span; false when it cannot be told (a host region whose
// file is gone, say: it then shares bytes with no other).
func (g *Registry) SpanOf(r *Region) (Span, bool) {
	switch r.Mem.Kind {
	case memory.Host:
		g.mu.Lock() // the file closes under it (truncate.go)
		f := r.file
		var id fileID
		err := errNoFile
		if f != nil {
			id, err = fileIDOf(f)
		}
		g.mu.Unlock()
		if err != nil {
			return Span{}, false
		}
		return Span{Space: SpaceID{kind: memory.Host, dev: id.dev, ino: id.ino}, Base: r.ShmOff, Len: r.Mem.Len}, true
	case memory.CUDA:
		return Span{Space: SpaceID{kind: memory.CUDA, dev: uint64(r.Mem.Device)}, Base: uint64(r.Mem.Addr), Len: r.Mem.Len}, true
	}
	return Span{}, false
}

// ExportedAt is when r's export name was last set (zero: never).
func (g *Registry) ExportedAt(r *Region) time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	return r.exported
}

// Exported is the region exported as name, or nil; it holds nothing (to
// compare it with another, not to use its memory).
func (g *Registry) Exported(name string) *Region {
	g.mu.Lock()
	defer g.mu.Unlock()
	r, ok := g.byName[name]
	if !ok || r.closing {
		return nil
	}
	return r
}
