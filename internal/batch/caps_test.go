package batch

import (
	"context"
	"strings"
	"testing"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/transport"
)

// TestRefusedOutsideCaps: a Session whose kind's Caps cannot carry the
// request (a pull over a write-only kind, host memory over a kind that
// moves none) is refused with FailedPrecondition naming the kind and the
// capability, before anything is resolved or the kind is called; one
// within them runs.
func TestRefusedOutsideCaps(t *testing.T) {
	writeOnly := transport.Caps{Ops: transport.OpWrite, Memory: []memory.Kind{memory.Host}}
	gpuOnly := transport.Caps{Ops: transport.OpWrite | transport.OpRead, Memory: []memory.Kind{memory.CUDA}}
	for _, c := range []struct {
		name string
		op   Op
		caps transport.Caps
		msg  string // "": it runs
	}{
		{"pull over a write-only kind", OpRead, writeOnly, "transport tcp cannot read (pull)"},
		{"push over a write-only kind", OpWrite, writeOnly, ""},
		{"host memory over a GPU-only kind", OpWrite, gpuOnly, "transport tcp cannot move host memory"},
	} {
		t.Run(c.name, func(t *testing.T) {
			caps := c.caps
			fp := &fakePeers{conns: []*fakeConn{{}}, answers: []answer{{size: regionSize}}, caps: &caps}
			s, req := rig(t, fp)
			req.Op = c.op
			_, err := s.Transfer(context.Background(), req)
			if c.msg == "" {
				if err != nil || fp.conns[0].writes != 1 {
					t.Fatalf("Transfer = %v after %d writes; want one write", err, fp.conns[0].writes)
				}
				return
			}
			if errs.Class(err) != errs.ErrFailedPrecondition || !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("Transfer = %v; want FailedPrecondition saying %q", err, c.msg)
			}
			if fp.resolves != 0 || fp.conns[0].writes != 0 {
				t.Fatalf("refused after %d resolves and %d writes; want neither", fp.resolves, fp.conns[0].writes)
			}
		})
	}
}
