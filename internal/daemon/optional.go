package daemon

import (
	"flag"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/b2bd/b2bd/gpudirect"
	"github.com/b2bd/b2bd/internal/config"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/topology"
	"github.com/b2bd/b2bd/internal/transport"
	"github.com/b2bd/b2bd/internal/transport/rails"
	"github.com/b2bd/b2bd/internal/transport/verbs"
)

// RailsConfig is the multi-device (rails) part of the command line; see
// docs/topology.md.
type RailsConfig struct {
	Map         string // --rdma-rail-map
	StripeRails int    // --rdma-stripe-rails
	StripeMin   uint64 // --rdma-stripe-min
}

// buildVerbs constructs the RDMA transport when this build and host have
// one: the plain verbs transport for one device, the rails transport over
// several (--rdma-device a,b or auto with more than one active port).
func (d *Daemon) buildVerbs(in transport.Inbound) (transport.Transport, error) {
	if d.cfg.Verbs == nil {
		return nil, fmt.Errorf("%w: verbs transport not built in", errs.ErrUnavailable)
	}
	vc := *d.cfg.Verbs
	port := vc.Port
	if port == 0 {
		port = verbs.DefaultPort
	}
	devs, err := rails.Devices(vc.Device, port, topology.Sysfs{})
	if err != nil {
		return nil, err
	}
	if len(devs) <= 1 {
		if len(devs) == 1 {
			vc.Device = devs[0]
		}
		return verbs.New(vc, in, d.log.Named("verbs"))
	}
	m, err := rails.ParseMap(d.cfg.Rails.Map)
	if err != nil {
		return nil, err
	}
	vc.NetDev = "" // each rail's GID comes from its own netdev
	rc := rails.Config{Devices: devs, Port: port, Map: m, MaxRails: d.cfg.Rails.StripeRails, StripeMin: d.cfg.Rails.StripeMin,
		GPUBusID: func(dev int) (string, error) {
			if d.cuda == nil {
				return "", fmt.Errorf("no CUDA driver: %w", errs.ErrFailedPrecondition)
			}
			info, err := d.cuda.DeviceInfo(dev)
			return info.PCIBusID, err
		}}
	log := d.log.Named("verbs")
	return rails.New(rc, in, log, func(dev string, rin transport.Inbound) (rails.Rail, error) {
		c := vc
		c.Device = dev
		return verbs.New(c, rin, log.Named(dev))
	})
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
	// --rdma-device is the verbs package's flag; it also takes a list or
	// auto here (buildVerbs), which the usage line says.
	if f := fs.Lookup("rdma-device"); f != nil {
		f.Usage = "RDMA device(s): one name (e.g. mlx5_0), a comma list (one rail each, batches striped over them), or auto (every device with an active port); empty: the device of --rdma-netdev, else the first with an active port"
	}
	fs.StringVar(&cfg.Rails.Map, "rdma-rail-map", "", "pair rails with the peer's by device name: local=peer,... (default: by subnet / GID prefix)")
	fs.IntVar(&cfg.Rails.StripeRails, "rdma-stripe-rails", 0, "stripe a batch over at most this many rails (0: every rail of the region's best affinity tier)")
	fs.Uint64Var(&cfg.Rails.StripeMin, "rdma-stripe-min", rails.DefaultStripeMin, "a batch of fewer bytes goes whole on one rail (of the region's best tier)")
	bindRanges(fs, verbsRanges)
}

// verbsRanges is the documented range of every flag RegisterOptionalFlags
// defines (the verbs package's and the rails'); see flagRanges. The limits
// between flags (--rdma-max-chain and --rdma-signal-every against
// --rdma-sq-depth) are CheckFlags'.
var verbsRanges = config.Ranges{
	"rdma-device":        config.Text{Min: 0, Max: 1024},
	"rdma-port":          config.Int{Min: 1, Max: 255},
	"gid-index":          config.Int{Min: -1, Max: 255}, // ibv_ah_attr's sgid_index is 8 bits
	"rdma-netdev":        config.Text{Min: 0, Max: 15},  // IFNAMSIZ less the NUL
	"qps-per-peer":       config.Int{Min: 1, Max: 64},
	"rdma-signal-every":  config.Int{Min: 1, Max: 1 << 15},
	"rdma-max-chain":     config.Int{Min: 1, Max: 1 << 16},
	"rdma-chain-bytes":   config.Int{Min: 1, Max: 1 << 30},
	"rdma-sq-depth":      config.Int{Min: 8, Max: 1 << 16},
	"rdma-srq-depth":     config.Int{Min: 16, Max: 1 << 16},
	"rdma-max-sge":       config.Int{Min: 1, Max: 256},
	"rdma-max-wr-bytes":  config.Int{Min: 1, Max: 1 << 30},
	"rdma-min-qp-bytes":  config.Int{Min: 1, Max: 1 << 40},
	"rdma-inline":        config.Int{Min: 0, Max: 1024},
	"rdma-post-threads":  config.Int{Min: 1, Max: 64},
	"rdma-poll-spin":     config.Duration{Min: 0, Max: time.Second},
	"rdma-ack-timeout":   config.Int{Min: 1, Max: 31},
	"rdma-retry-count":   config.Int{Min: 1, Max: 7},
	"rdma-keepalive":     config.Duration{Min: time.Second, Max: 24 * time.Hour},
	"rdma-stall-timeout": config.Duration{Min: 100 * time.Millisecond, Max: time.Hour},
	"rdma-rail-map": config.Func{Desc: "pairs local=peer,... of device names, or empty", Parse: func(s string) error {
		_, err := rails.ParseMap(s)
		return err
	}},
	"rdma-stripe-rails": config.Int{Min: 0, Max: 64},
	"rdma-stripe-min":   config.Uint{Min: 0, Max: 1 << 40},
}
