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
	if d.cfg.Verbs == nil {
		return nil, fmt.Errorf("%w: verbs transport not built in", errs.ErrUnavailable)
	}
	return verbs.New(*d.cfg.Verbs, in, d.log.Named("verbs"))
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

// RegisterOptionalFlags adds the RDMA transport's flags and sets cfg.Verbs,
// so the daemon builds it. Without cgo, libibverbs or a device, building it fails with a reason
// and the daemon carries on with TCP (or refuses, under --transport verbs).
func RegisterOptionalFlags(fs *flag.FlagSet, cfg *Config) {
	vc := verbs.DefaultConfig()
	vc.RegisterFlags(fs)
	cfg.Verbs = &vc
}
