package batch

import (
	"testing"
	"time"
)

// TestGateBind: after the gate opened, a run again may post to the
// registration bound before (whatever the peer said of its age, even
// nothing), or to another bound before the arm; not to one bound after it.
func TestGateBind(t *testing.T) {
	armed := time.Now()
	for _, c := range []struct {
		name string
		fp   uint64
		at   time.Time
		want bool
	}{
		{"the same registration, its age unknown", 0x10, time.Time{}, true},
		{"the same registration, bound after the arm", 0x10, armed.Add(time.Second), true},
		{"another, bound before the arm", 0x22, armed.Add(-time.Second), true},
		{"another, bound after the arm", 0x22, armed.Add(time.Second), false},
		{"another, its age unknown", 0x22, time.Time{}, false},
	} {
		g := &gate{since: armed}
		if !g.bind(0x10, time.Time{}) {
			t.Fatalf("%s: the first binding refused", c.name)
		}
		g.opened = true
		if got := g.bind(c.fp, c.at); got != c.want {
			t.Errorf("%s: bind = %v, want %v", c.name, got, c.want)
		}
	}
}
