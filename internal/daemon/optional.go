package daemon

import (
	"flag"
	"fmt"

	"github.com/hashicorp/go-hclog"

	"github.com/b2bd/b2bd/gpudirect"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/transport"
	"github.com/b2bd/b2bd/internal/transport/verbs"
)

// buildVerbs constructs the RDMA transport when this build and host have one.
func (d *Daemon) buildVerbs(in transport.Inbound) (transport.Transport, error) {
	if d.cfg.Extra == nil {
		return nil, fmt.Errorf("%w: verbs transport not built in", errs.ErrUnavailable)
	}
	return d.cfg.Extra(transport.Verbs, in, d.log.Named("verbs"))
}

// loadCUDA loads libcuda.so.1 at run time. Without it the daemon serves host
// memory and says why GPU regions are refused.
func loadCUDA(log hclog.Logger) (gpudirect.Interface, string) {
	drv, err := gpudirect.Load()
	if err != nil {
		log.Info("no usable GPU; serving host memory only", "reason", err)
		return nil, err.Error()
	}
	var names []string
	for i := 0; i < drv.DeviceCount(); i++ {
		if info, err := drv.DeviceInfo(i); err == nil {
			names = append(names, fmt.Sprintf("%d:%s", i, info.Name))
		}
	}
	detail := fmt.Sprintf("CUDA driver %d, devices %v", drv.DriverVersion(), names)
	log.Info("GPU support ready", "detail", detail)
	return drv, detail
}

// RegisterOptionalFlags adds the RDMA transport's flags and sets cfg to build
// it. Without cgo, libibverbs or a device, building it fails with a reason
// and the daemon carries on with TCP (or refuses, under --transport verbs).
func RegisterOptionalFlags(fs *flag.FlagSet, cfg *Config) {
	vc := verbs.DefaultConfig()
	vc.RegisterFlags(fs)
	cfg.Extra = func(k transport.Kind, in transport.Inbound, log hclog.Logger) (transport.Transport, error) {
		if k != transport.Verbs {
			return nil, fmt.Errorf("%w: no optional transport %q", errs.ErrUnavailable, k)
		}
		return verbs.New(vc, in, log)
	}
}
