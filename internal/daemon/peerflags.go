package daemon

import (
	"fmt"
	"strconv"
	"time"

	"github.com/b2bd/b2bd/internal/errs"
)

// The ranges of --peer-idle-timeout and --max-peers.
const (
	minPeerIdleTimeout = time.Second
	maxPeerIdleTimeout = 24 * time.Hour
	maxMaxPeers        = 1 << 16
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
	return nil
}

// boundedDuration is a duration flag refusing values outside [min, max].
type boundedDuration struct {
	p        *time.Duration
	name     string
	min, max time.Duration
}

func (b *boundedDuration) String() string {
	if b.p == nil {
		return ""
	}
	return b.p.String()
}

func (b *boundedDuration) Get() any { return *b.p }

func (b *boundedDuration) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("--%s %q is not a duration (e.g. 5m, 30s)", b.name, s)
	}
	if d < b.min || d > b.max {
		return fmt.Errorf("--%s %s is out of range: %s to %s", b.name, d, b.min, b.max)
	}
	*b.p = d
	return nil
}

// boundedInt is an integer flag refusing values outside [min, max].
type boundedInt struct {
	p        *int
	name     string
	min, max int
}

func (b *boundedInt) String() string {
	if b.p == nil {
		return ""
	}
	return strconv.Itoa(*b.p)
}

func (b *boundedInt) Get() any { return *b.p }

func (b *boundedInt) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil {
		return fmt.Errorf("--%s %q is not an integer", b.name, s)
	}
	if n < b.min || n > b.max {
		return fmt.Errorf("--%s %d is out of range: %d to %d", b.name, n, b.min, b.max)
	}
	*b.p = n
	return nil
}
