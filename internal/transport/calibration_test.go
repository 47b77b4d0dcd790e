package transport_test

import (
	"strings"
	"testing"
	"time"

	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/transport"
)

// TestDecideByRankWhenAKindFailed: a row where a ranked kind could not be
// measured (the daemon's batch to itself refused) shows the rank's first
// as auto's choice and says why; a complete row shows the fastest.
func TestDecideByRankWhenAKindFailed(t *testing.T) {
	ms := time.Millisecond
	gg := transport.Route{From: memory.CUDA, To: memory.CUDA}
	c := &transport.Calibration{Rows: []transport.CalibrationRow{
		{Route: gg, BlockBytes: 128, Median: map[transport.Kind]time.Duration{"tcp": 9 * ms}, Failed: map[transport.Kind]string{"local": "refused"}},
		{Route: gg, BlockBytes: 4096, Median: map[transport.Kind]time.Duration{"local": 20 * ms, "tcp": 9 * ms}},
	}}
	c.Decide([]transport.Kind{"local", "tcp"})
	if r := c.Rows[0]; r.Chosen != "local" || !strings.Contains(r.Why, "by rank") || !strings.Contains(r.Why, "local") {
		t.Errorf("row with local failed: chosen %q, why %q; want local by rank", r.Chosen, r.Why)
	}
	if r := c.Rows[1]; r.Chosen != "tcp" {
		t.Errorf("complete row: chosen %q, want tcp (fastest)", r.Chosen)
	}
	if k, ok := c.Choose(gg, 128, []transport.Kind{"local", "tcp"}); ok {
		t.Errorf("Choose on the incomplete row = %q: want no measured choice (rank)", k)
	}
}
