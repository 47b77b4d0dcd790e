package tcp

import (
	"flag"
	"fmt"

	"github.com/b2bd/b2bd/internal/config"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/transport"
)

// The TCP transport as a driver: every daemon runs it (Required), so it is
// the kind any two daemons have in common.
func init() {
	_ = transport.Register(transport.Driver{
		Kind:     transport.TCP,
		Flags:    flags,
		Ranges:   ranges,
		Listens:  []string{"data-listen"},
		Required: true,
		New:      newDriver,
		Caps: transport.Caps{Rank: 10, Memory: []memory.Kind{memory.Host, memory.CUDA}, Ops: transport.OpWrite | transport.OpRead, Blocks: true, Prepared: true,
			Keys: transport.KeyCaps{PerAccess: true, Rekey: true, RekeyRead: true}},
	})
}

// flags binds the kind's flags to a Config with its defaults.
func flags(fs *flag.FlagSet) any {
	c := &Config{}
	fs.StringVar(&c.Listen, "data-listen", ":7471", "TCP data-plane address (host:port)")
	fs.IntVar(&c.Streams, "tcp-streams", DefaultStreams, "TCP data connections per peer")
	return c
}

// ranges is the documented range of every flag of flags.
var ranges = config.Ranges{
	"data-listen": config.HostPort{},
	"tcp-streams": config.Int{Min: 1, Max: 64},
}

func newDriver(env transport.Env) (transport.Transport, error) {
	c, ok := env.Settings.(*Config)
	if !ok {
		return nil, fmt.Errorf("tcp: settings %T are not the tcp driver's", env.Settings)
	}
	cfg := *c
	cfg.Staging, cfg.TLS = env.Staging, env.TLS
	t, err := New(cfg, env.Inbound, env.Log)
	if err != nil {
		return nil, err
	}
	t.SetPeerAddr(env.PeerAddr) // named to a gRPC client that dials the data port
	return t, nil
}
