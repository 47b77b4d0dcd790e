package rails

import (
	"flag"
	"fmt"
	"time"

	"github.com/b2bd/b2bd/internal/config"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/topology"
	"github.com/b2bd/b2bd/internal/transport"
	"github.com/b2bd/b2bd/internal/transport/verbs"
)

// The RDMA transport as a driver, kind verbs: the plain verbs transport
// over one device, this package's over several (--rdma-device a,b or auto
// with more than one active port). Without cgo, libibverbs or a device, New
// fails with the reason and the daemon carries on without it (or refuses,
// under --transport verbs).
func init() {
	_ = transport.Register(transport.Driver{
		Kind:   transport.Verbs,
		Flags:  flags,
		Ranges: ranges,
		Check:  check,
		New:    newDriver,
		Caps:   verbs.Caps,
		CapsOf: capsOf,
	})
}

// Caps is what the kind can do over several devices: it writes (striped,
// failing over between rails) and moves block-id requests in one go, but
// neither reads nor prepares, so a pull or a prepared plan goes to another
// kind (or runs unprepared).
var Caps = transport.Caps{
	Rank:   verbs.Caps.Rank,
	Memory: []memory.Kind{memory.Host, memory.CUDA},
	Ops:    transport.OpWrite,
	Blocks: true,
	Keys:   transport.KeyCaps{Rekey: true, Withdraw: true, Rails: true},
}

// capsOf is the kind's capabilities as New configured it: one device is
// the plain verbs transport, several are rails.
func capsOf(t transport.Transport) transport.Caps {
	if _, ok := t.(*Transport); ok {
		return Caps
	}
	return verbs.Caps
}

// settings are the kind's flags: the verbs transport's and the rails'
// (docs/topology.md).
type settings struct {
	Verbs       verbs.Config
	Map         string // --rdma-rail-map
	StripeRails int    // --rdma-stripe-rails
	StripeMin   uint64 // --rdma-stripe-min
}

func flags(fs *flag.FlagSet) any {
	s := &settings{Verbs: verbs.DefaultConfig()}
	s.Verbs.RegisterFlags(fs)
	// --rdma-device is the verbs package's flag; it also takes a list or
	// auto here (newDriver), which the usage line says.
	if f := fs.Lookup("rdma-device"); f != nil {
		f.Usage = "RDMA device(s): one name (e.g. mlx5_0), a comma list (one rail each, batches striped over them), or auto (every device with an active port); empty: the device of --rdma-netdev, else the first with an active port"
	}
	fs.StringVar(&s.Map, "rdma-rail-map", "", "pair rails with the peer's by device name: local=peer,... (default: by subnet / GID prefix)")
	fs.IntVar(&s.StripeRails, "rdma-stripe-rails", 0, "stripe a batch over at most this many rails (0: every rail of the region's best affinity tier)")
	fs.Uint64Var(&s.StripeMin, "rdma-stripe-min", DefaultStripeMin, "a batch of fewer bytes goes whole on one rail (of the region's best tier)")
	return s
}

// ranges is the documented range of every flag of flags (the verbs
// package's and the rails'). The limits between flags (--rdma-max-chain
// and --rdma-signal-every against --rdma-sq-depth) are check's.
var ranges = config.Ranges{
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
	"rdma-read-depth":    config.Int{Min: 0, Max: 255},
	"rdma-read-wr-bytes": config.Int{Min: 1, Max: 1 << 30},
	"rdma-min-qp-bytes":  config.Int{Min: 1, Max: 1 << 40},
	"rdma-inline":        config.Int{Min: 0, Max: 1024},
	"rdma-post-threads":  config.Int{Min: 1, Max: 64},
	"rdma-poll-spin":     config.Duration{Min: 0, Max: time.Second},
	"rdma-ack-timeout":   config.Int{Min: 1, Max: 31},
	"rdma-retry-count":   config.Int{Min: 1, Max: 7},
	"rdma-keepalive":     config.Duration{Min: time.Second, Max: 24 * time.Hour},
	"rdma-stall-timeout": config.Duration{Min: 100 * time.Millisecond, Max: time.Hour},
	"rdma-cancel-wait":   config.Duration{Min: 10 * time.Millisecond, Max: time.Minute},
	"rdma-rail-map": config.Func{Desc: "pairs local=peer,... of device names, or empty", Parse: func(s string) error {
		_, err := ParseMap(s)
		return err
	}},
	"rdma-stripe-rails": config.Int{Min: 0, Max: 64},
	"rdma-stripe-min":   config.Uint{Min: 0, Max: 1 << 40},
}

// check is the limits between the kind's flags.
func check(a any) error {
	s, ok := a.(*settings)
	if !ok {
		return fmt.Errorf("rails: settings %T are not the verbs driver's", a)
	}
	v := s.Verbs
	switch {
	case v.MaxChain > v.SQDepth:
		return fmt.Errorf("%w: --rdma-max-chain %d is out of range: want 1 to --rdma-sq-depth (%d)", errs.ErrInvalidArgument, v.MaxChain, v.SQDepth)
	case v.SignalEvery > v.SQDepth/2:
		return fmt.Errorf("%w: --rdma-signal-every %d is out of range: want 1 to --rdma-sq-depth/2 (%d)", errs.ErrInvalidArgument, v.SignalEvery, v.SQDepth/2)
	}
	return nil
}

func newDriver(env transport.Env) (transport.Transport, error) {
	s, ok := env.Settings.(*settings)
	if !ok {
		return nil, fmt.Errorf("rails: settings %T are not the verbs driver's", env.Settings)
	}
	vc := s.Verbs
	port := vc.Port
	if port == 0 {
		port = verbs.DefaultPort
	}
	devs, err := Devices(vc.Device, port, topology.Sysfs{})
	if err != nil {
		return nil, err
	}
	if len(devs) <= 1 {
		if len(devs) == 1 {
			vc.Device = devs[0]
		}
		return verbs.New(vc, env.Inbound, env.Log)
	}
	m, err := ParseMap(s.Map)
	if err != nil {
		return nil, err
	}
	vc.NetDev = "" // each rail's GID comes from its own netdev
	rc := Config{Devices: devs, Port: port, Map: m, MaxRails: s.StripeRails, StripeMin: s.StripeMin,
		GPUBusID: func(dev int) (string, error) {
			if env.CUDA == nil {
				return "", fmt.Errorf("no CUDA driver: %w", errs.ErrFailedPrecondition)
			}
			info, err := env.CUDA.DeviceInfo(dev)
			return info.PCIBusID, err
		}}
	return New(rc, env.Inbound, env.Log, func(dev string, rin transport.Inbound) (Rail, error) {
		c := vc
		c.Device = dev
		return verbs.New(c, rin, env.Log.Named(dev))
	})
}
