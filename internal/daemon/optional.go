package daemon

import (
	"flag"
	"fmt"

	"github.com/hashicorp/go-hclog"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/region"
	"github.com/b2bd/b2bd/internal/transport"
)

// buildVerbs constructs the RDMA transport when this build and host have one.
func (d *Daemon) buildVerbs(in transport.Inbound) (transport.Transport, error) {
	if d.cfg.Extra == nil {
		return nil, fmt.Errorf("%w: verbs transport not built in", errs.ErrUnavailable)
	}
	return d.cfg.Extra(transport.Verbs, in, d.log.Named("verbs"))
}

// loadCUDA returns the GPU hook, or why there is none.
func loadCUDA(log hclog.Logger) (region.CUDA, string) {
	return nil, "CUDA support is not built in yet"
}

// RegisterOptionalFlags adds the flags of optional transports built in.
func RegisterOptionalFlags(fs *flag.FlagSet, cfg *Config) {}
