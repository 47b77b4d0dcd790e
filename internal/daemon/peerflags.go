package daemon

import (
	"fmt"
	"time"

	"github.com/b2bd/b2bd/internal/errs"
)

// The ranges of --peer-idle-timeout, --max-peers and --conns-per-peer.
const (
	minPeerIdleTimeout = time.Second
	maxPeerIdleTimeout = 24 * time.Hour
	maxMaxPeers        = 1 << 16
	maxConnsPerPeer    = 64
)

// checkPeerLimits refuses a Config whose peer limits are out of range (the
// flags refuse them at parsing; a Config built in code meets this). Zero
// takes the default; an idle timeout under the flag's minimum is allowed
// in code, for tests.
func (c *Config) checkPeerLimits() error {
	if c.PeerIdleTimeout < 0 || c.PeerIdleTimeout > maxPeerIdleTimeout {
		return fmt.Errorf("%w: --peer-idle-timeout %s is out of range: %s to %s", errs.ErrInvalidArgument, c.PeerIdleTimeout, minPeerIdleTimeout, maxPeerIdleTimeout)
	}
	if c.MaxPeers < 0 || c.MaxPeers > maxMaxPeers {
		return fmt.Errorf("%w: --max-peers %d is out of range: 1 to %d", errs.ErrInvalidArgument, c.MaxPeers, maxMaxPeers)
	}
	if c.ConnsPerPeer < 0 || c.ConnsPerPeer > maxConnsPerPeer {
		return fmt.Errorf("%w: --conns-per-peer %d is out of range: 1 to %d", errs.ErrInvalidArgument, c.ConnsPerPeer, maxConnsPerPeer)
	}
	return nil
}
