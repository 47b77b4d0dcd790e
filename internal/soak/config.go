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
}

// Chaos actions.
const (
	ChaosKill     = "kill"     // kill -9 a daemon, restart it
	ChaosStop     = "stop"     // SIGSTOP a daemon, SIGCONT it 0.1-1 s later
	ChaosWorker   = "worker"   // kill a client worker mid-transfer, restart it
	ChaosTruncate = "truncate" // truncate a worker's source region file
	ChaosLayout   = "layout"   // re-register a worker's layouts with another shape
	ChaosNarrow   = "narrow"   // narrow an export's grants, transfer, widen again
)

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
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *chaos != "" {
		c.Chaos = strings.Split(*chaos, ",")
	}
	return c, c.validate()
}

func (c Config) validate() error {
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
