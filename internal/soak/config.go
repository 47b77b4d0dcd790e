// Package soak is b2bd's chaos soak (cmd/b2b-soak): real daemons on
// loopback, many clients moving small verified batches of every kind, and a
// chaos loop that kills, freezes and restarts daemons, kills client workers,
// truncates region files, reshapes layouts and narrows export grants, while
// the invariants (no false success, no byte after an answer, answers within
// their deadline, no unbidden crash, no leak) are checked throughout.
package soak

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"
)

// Config is one soak run.
type Config struct {
	B2BD     string        // daemon binary
	Duration time.Duration // traffic time (set-up and settling come on top)
	JSON     string        // report file; "" none
	Daemons  int           // real daemons; the first half forced to --transport tcp
	Stable   int           // the first Stable daemons are never killed (their leaks are checked)
	Workers  int           // concurrent client workers
	Chaos    []string      // chaos actions in the mix
	Every    time.Duration // mean time between chaos actions
	Seed     uint64
	// Settle bounds the wait for the never-restarted daemons to come back
	// to their baseline after the clients closed.
	Settle time.Duration
	// NewPorts restarts killed daemons on fresh ports (a peer that moved)
	// rather than their own.
	NewPorts bool
	// Keep leaves the state directory (logs) in place.
	Keep bool

	// The two-host form (RemoteAPI set; remote.go): the local daemons run
	// the given transport over RDMADevice and push to and pull from the
	// remote daemon, driven over its API with mutual TLS.
	Remote
}

// Remote is the two-host form's settings.
type Remote struct {
	RemoteAPI  string // the remote daemon's API (host:port); "" runs the loopback form
	TLSCert    string // this host's identity, for the remote API and the local daemons' peers
	TLSKey     string
	TLSCA      string
	Self       string // this host's wire address: the local daemons' peer and data listeners
	RDMADevice string // the local daemons' --rdma-device
	Transport  string // the local daemons' --transport and the transfers' (verbs or tcp)
	Netdev     string // this host's wire, taken down and up by the link chaos
	// Neigh re-pins the peer's neighbour entry after each link flap
	// ("IP=MAC"; an admin down flushes even permanent entries).
	Neigh string
}

// Chaos actions.
const (
	ChaosKill     = "kill"     // kill -9 a daemon, restart it
	ChaosStop     = "stop"     // SIGSTOP a daemon, SIGCONT it 0.1-1 s later
	ChaosWorker   = "worker"   // kill a client worker mid-transfer, restart it
	ChaosTruncate = "truncate" // truncate a worker's source region file
	ChaosLayout   = "layout"   // re-register a worker's layouts with another shape
	ChaosNarrow   = "narrow"   // narrow an export's grants, transfer, widen again
	ChaosLink     = "link"     // the two-host form: take this host's wire down 0.2-1.5 s, then up
)

// remoteChaos is what the two-host form can do: its peer daemon is not
// this host's to kill, freeze or truncate under.
var remoteChaos = []string{ChaosKill, ChaosWorker, ChaosLink}

var allChaos = []string{ChaosKill, ChaosStop, ChaosWorker, ChaosTruncate, ChaosLayout, ChaosNarrow}

// ParseFlags reads the command line; flag.ErrHelp for -h.
func ParseFlags(args []string, stderr io.Writer) (Config, error) {
	var c Config
	fs := flag.NewFlagSet("b2b-soak", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.B2BD, "b2bd", "bin/b2bd", "b2bd binary")
	fs.DurationVar(&c.Duration, "duration", 20*time.Minute, "traffic time")
	fs.StringVar(&c.JSON, "json", "", "write the report as JSON to this file")
	fs.IntVar(&c.Daemons, "daemons", 4, "daemons on loopback (at least 4; the first half forced to --transport tcp, the rest auto/local)")
	fs.IntVar(&c.Stable, "stable", 2, "daemons never killed (frozen at most); their goroutines, fds, regions, transfers and memory are checked at the end")
	fs.IntVar(&c.Workers, "workers", 48, "concurrent client workers")
	chaos := fs.String("chaos", strings.Join(allChaos, ","), "chaos actions: "+strings.Join(allChaos, ",")+" (empty: none)")
	fs.DurationVar(&c.Every, "chaos-every", 2*time.Second, "mean time between chaos actions")
	fs.Uint64Var(&c.Seed, "seed", uint64(time.Now().UnixNano()), "random seed (reported)")
	fs.DurationVar(&c.Settle, "settle", 20*time.Second, "how long the stable daemons may take to return to baseline")
	fs.BoolVar(&c.NewPorts, "new-ports", false, "restart killed daemons on fresh ports (a peer that moved) instead of their own")
	fs.BoolVar(&c.Keep, "keep", false, "keep the state directory (daemon logs)")
	fs.StringVar(&c.RemoteAPI, "remote-api", "", "two-host form: the remote daemon's API (host:port, mutual TLS); the local daemons move blocks to and from it (docs/soak.md)")
	fs.StringVar(&c.TLSCert, "tls-cert", "", "two-host form: this host's certificate (PEM)")
	fs.StringVar(&c.TLSKey, "tls-key", "", "two-host form: its key (PEM)")
	fs.StringVar(&c.TLSCA, "tls-ca", "", "two-host form: the CA both hosts trust (PEM)")
	fs.StringVar(&c.Self, "self", "", "two-host form: this host's wire address, for the local daemons' listeners")
	fs.StringVar(&c.RDMADevice, "rdma-device", "", "two-host form: the local daemons' RDMA device (verbs)")
	fs.StringVar(&c.Transport, "transport", "verbs", "two-host form: the transport of the local daemons and transfers (verbs or tcp)")
	fs.StringVar(&c.Netdev, "netdev", "", "two-host form: this host's wire, taken down and up by the link chaos")
	fs.StringVar(&c.Neigh, "neigh", "", "two-host form: IP=MAC, the peer's neighbour entry pinned again after each link flap")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if c.RemoteAPI != "" {
		remoteDefaults(fs, &c, chaos)
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *chaos != "" {
		c.Chaos = strings.Split(*chaos, ",")
	}
	return c, c.validate()
}

// remoteDefaults sets the two-host form's defaults for the flags not
// given: two local daemons, four workers, its own chaos mix (an emulated
// pair of hosts moves a few dozen transfers a second).
func remoteDefaults(fs *flag.FlagSet, c *Config, chaos *string) {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if !set["daemons"] {
		c.Daemons = 2
	}
	if !set["stable"] {
		c.Stable = 1
	}
	if !set["workers"] {
		c.Workers = 4
	}
	if !set["chaos"] {
		*chaos = strings.Join(remoteChaos, ",")
	}
	if !set["chaos-every"] {
		c.Every = 2 * time.Second
	}
	if !set["settle"] {
		c.Settle = 30 * time.Second
	}
}

func (c Config) validate() error {
	if c.RemoteAPI != "" {
		return c.validateRemote()
	}
	var errs []error
	if c.Duration <= 0 {
		errs = append(errs, fmt.Errorf("--duration %v: must be > 0", c.Duration))
	}
	if c.Daemons < 4 || c.Daemons > 16 {
		errs = append(errs, fmt.Errorf("--daemons %d: must be 4..16", c.Daemons))
	}
	if c.Stable < 1 || c.Stable >= c.Daemons {
		errs = append(errs, fmt.Errorf("--stable %d: must be 1..%d (--daemons - 1)", c.Stable, c.Daemons-1))
	}
	if c.Workers < 1 || c.Workers > 1024 {
		errs = append(errs, fmt.Errorf("--workers %d: must be 1..1024", c.Workers))
	}
	if c.Every < 10*time.Millisecond {
		errs = append(errs, fmt.Errorf("--chaos-every %v: must be >= 10ms", c.Every))
	}
	for _, a := range c.Chaos {
		ok := false
		for _, k := range allChaos {
			ok = ok || a == k
		}
		if !ok {
			errs = append(errs, fmt.Errorf("--chaos %q: unknown action (known: %s)", a, strings.Join(allChaos, ",")))
		}
	}
	return errors.Join(errs...)
}

func (c Config) validateRemote() error {
	var errs []error
	if c.Duration <= 0 {
		errs = append(errs, fmt.Errorf("--duration %v: must be > 0", c.Duration))
	}
	if c.Daemons < 2 || c.Daemons > 8 {
		errs = append(errs, fmt.Errorf("--daemons %d: must be 2..8 with --remote-api", c.Daemons))
	}
	if c.Stable < 1 || c.Stable >= c.Daemons {
		errs = append(errs, fmt.Errorf("--stable %d: must be 1..%d (--daemons - 1)", c.Stable, c.Daemons-1))
	}
	if c.Workers < 1 || c.Workers > 64 {
		errs = append(errs, fmt.Errorf("--workers %d: must be 1..64 with --remote-api", c.Workers))
	}
	if c.Every < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("--chaos-every %v: must be >= 100ms with --remote-api", c.Every))
	}
	for name, v := range map[string]string{"--tls-cert": c.TLSCert, "--tls-key": c.TLSKey, "--tls-ca": c.TLSCA, "--self": c.Self} {
		if v == "" {
			errs = append(errs, fmt.Errorf("%s: required with --remote-api", name))
		}
	}
	switch c.Transport {
	case "verbs":
		if c.RDMADevice == "" {
			errs = append(errs, errors.New("--rdma-device: required with --transport verbs"))
		}
	case "tcp":
	default:
		errs = append(errs, fmt.Errorf("--transport %q: must be verbs or tcp", c.Transport))
	}
	for _, a := range c.Chaos {
		ok := false
		for _, k := range remoteChaos {
			ok = ok || a == k
		}
		if !ok {
			errs = append(errs, fmt.Errorf("--chaos %q: not an action of the two-host form (known: %s)", a, strings.Join(remoteChaos, ",")))
		}
		if a == ChaosLink && c.Netdev == "" {
			errs = append(errs, errors.New("--chaos link: needs --netdev"))
		}
	}
	if c.Neigh != "" && !strings.Contains(c.Neigh, "=") {
		errs = append(errs, fmt.Errorf("--neigh %q: want IP=MAC", c.Neigh))
	}
	return errors.Join(errs...)
}
