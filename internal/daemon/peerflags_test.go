package daemon

import (
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/b2bd/b2bd/internal/peer"
)

// TestPeerLimitFlags: --peer-idle-timeout and --max-peers default to the
// peer manager's defaults and refuse values out of range, naming the flag,
// the value and the range.
func TestPeerLimitFlags(t *testing.T) {
	for _, tc := range []struct {
		args     []string
		idle     time.Duration
		maxPeers int
		err      []string
	}{
		{nil, peer.DefaultIdleTimeout, peer.DefaultMaxPeers, nil},
		{[]string{"--peer-idle-timeout", "30s", "--max-peers", "8"}, 30 * time.Second, 8, nil},
		{[]string{"--peer-idle-timeout", "1s", "--max-peers", "65536"}, time.Second, 1 << 16, nil},
		{[]string{"--peer-idle-timeout", "100ms"}, 0, 0, []string{"-peer-idle-timeout: out of range: want 1s to 24h"}},
		{[]string{"--peer-idle-timeout", "25h"}, 0, 0, []string{"-peer-idle-timeout: out of range"}},
		{[]string{"--peer-idle-timeout", "soon"}, 0, 0, []string{"-peer-idle-timeout: not a duration"}},
		{[]string{"--max-peers", "0"}, 0, 0, []string{"-max-peers: out of range: want 1 to 65536"}},
		{[]string{"--max-peers", "-3"}, 0, 0, []string{"-max-peers: out of range"}},
		{[]string{"--max-peers", "many"}, 0, 0, []string{"-max-peers: not an integer"}},
	} {
		var c Config
		fs := flag.NewFlagSet("b2bd", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		c.RegisterFlags(fs)
		err := fs.Parse(tc.args)
		if tc.err == nil {
			if err != nil || c.PeerIdleTimeout != tc.idle || c.MaxPeers != tc.maxPeers {
				t.Errorf("%v: idle %s, max %d, err %v; want %s, %d", tc.args, c.PeerIdleTimeout, c.MaxPeers, err, tc.idle, tc.maxPeers)
			}
			continue
		}
		for _, w := range tc.err {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%v: %v, want an error saying %q", tc.args, err, w)
			}
		}
	}
	for _, c := range []Config{{MaxPeers: -1}, {MaxPeers: 1<<16 + 1}, {PeerIdleTimeout: -time.Second}, {PeerIdleTimeout: 25 * time.Hour}} {
		if err := c.checkPeerLimits(); err == nil {
			t.Errorf("Config %+v accepted", c)
		}
	}
}
