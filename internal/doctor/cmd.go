package doctor

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/b2bd/b2bd/internal/auth"
	"github.com/b2bd/b2bd/internal/config"
	"github.com/b2bd/b2bd/internal/daemon"
)

// daemonKeys are doctor's flags that mean the same as the daemon's.
var daemonKeys = map[string]bool{"socket": true, "shm-dir": true, "group": true, "rdma-device": true, "rdma-netdev": true,
	"tls-cert": true, "tls-key": true, "tls-ca": true, "insecure": true}

// ErrFailed is returned by Command when a check failed (exit status 1).
var ErrFailed = errors.New("doctor: a check failed")

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(s string) error { *m = append(*m, s); return nil }

// Command is `b2bd doctor` and `b2bctl doctor`: prog names the program in
// usage text. It returns ErrFailed when any check failed.
func Command(ctx context.Context, prog string, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet(prog+" doctor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var env Env
	var o PeerOptions
	var peers multi
	var asJSON bool
	var cert, key, ca string
	fs.BoolVar(&asJSON, "json", false, "print a JSON report")
	fs.StringVar(&env.Root, "root", "/", "read sysfs, procfs, /etc, /usr and the shm directory under this root (for testing)")
	fs.StringVar(&env.ShmDir, "shm-dir", "/dev/shm/b2bd", "the daemon's --shm-dir")
	fs.StringVar(&env.Group, "group", "b2bd", "the daemon's --group")
	fs.StringVar(&env.Device, "rdma-device", "", "check only this RDMA device (the daemon's --rdma-device)")
	fs.StringVar(&env.NetDev, "rdma-netdev", "", "check the RoCE GID and MTU of this netdev (the daemon's --rdma-netdev)")
	fs.Var(&peers, "peer", "also check this peer daemon (host:port of its --peer-listen); repeatable")
	fs.StringVar(&cert, "tls-cert", "", "peer checks: this host's certificate (the daemon's --tls-cert)")
	fs.StringVar(&key, "tls-key", "", "peer checks: its private key")
	fs.StringVar(&ca, "tls-ca", "", "peer checks: the CA bundle peers chain to")
	fs.BoolVar(&o.Insecure, "insecure", false, "peer checks: plaintext, loopback peers only")
	fs.StringVar(&o.Socket, "socket", "/run/b2bd/b2bd.sock", "peer round trip: the local daemon's API (socket path or host:port)")
	fs.StringVar(&o.PeerAPI, "peer-api", "", "peer round trip: the peer daemon's local API, to register a scratch region there and compare checksums")
	fs.StringVar(&o.PeerExport, "peer-export", "", "peer round trip: a region the peer exports that may be overwritten (first 64 KiB); contents are not compared")
	fs.DurationVar(&o.Timeout, "timeout", 5*time.Second, "peer checks: timeout per step")
	cfgFile := fs.String("config", "", "the daemon's TOML config: its socket, shm-dir, group, rdma-device, rdma-netdev, tls-* and insecure apply here (flags override it)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	var cfgCheck *Result
	if *cfgFile != "" {
		data, err := os.ReadFile(*cfgFile)
		if err != nil {
			return fmt.Errorf("doctor: %w", err)
		}
		// Only the daemon's own keys; doctor's other flags are not config.
		sub := flag.NewFlagSet("config", flag.ContinueOnError)
		fs.VisitAll(func(f *flag.Flag) {
			if daemonKeys[f.Name] {
				sub.Var(f.Value, f.Name, f.Usage)
			}
		})
		fs.Visit(func(f *flag.Flag) {
			if daemonKeys[f.Name] {
				_ = sub.Set(f.Name, f.Value.String()) // marks it set: the command line wins
			}
		})
		if err := config.ApplyKnown(sub, *cfgFile, data); err != nil {
			return fmt.Errorf("doctor: %w", err)
		}
		r := checkDaemonConfig(fs, *cfgFile, data)
		cfgCheck = &r
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("doctor: unexpected argument %q", fs.Arg(0))
	}
	if env.Root == "/" {
		// Only the real host has a libibverbs to ask for the active MTU.
		env.PortMTU = VerbsPortMTU
	}
	results := Run(env)
	if cfgCheck != nil {
		results = append([]Result{*cfgCheck}, results...)
	}
	if len(peers) > 0 {
		switch {
		case o.Insecure && (cert != "" || key != "" || ca != ""):
			return fmt.Errorf("doctor: --insecure and --tls-* are exclusive")
		case cert != "" || key != "" || ca != "":
			t, err := auth.LoadPeerTLS(cert, key, ca)
			if err != nil {
				return fmt.Errorf("doctor: %w", err)
			}
			o.TLS = t
		}
		for _, p := range peers {
			o.Addr = p
			results = append(results, Peer(ctx, o)...)
		}
	}
	var err error
	if asJSON {
		err = WriteJSON(stdout, env.Root, results)
	} else {
		err = WriteText(stdout, results)
	}
	if err != nil {
		return err
	}
	if cfgCheck != nil && cfgCheck.Status == Fail {
		return fmt.Errorf("%w: config: %s", ErrFailed, cfgCheck.Detail)
	}
	if n := Summarize(results).Fail; n > 0 {
		return fmt.Errorf("%w: %d of %d", ErrFailed, n, len(results))
	}
	return nil
}

// checkDaemonConfig runs on the daemon's config file the check b2bd runs at
// start (daemon.NewFlagSet, config.Apply, daemon.CheckFlags), with doctor's
// command-line flags that are the daemon's (--socket, --tls-*, ...) on the
// daemon's command line: a file b2bd refuses fails here, with its message.
func checkDaemonConfig(doctorFlags *flag.FlagSet, name string, data []byte) Result {
	var cfg daemon.Config
	dfs := daemon.NewFlagSet("b2bd", &cfg)
	dfs.SetOutput(io.Discard)
	var args []string
	doctorFlags.Visit(func(f *flag.Flag) {
		if daemonKeys[f.Name] && dfs.Lookup(f.Name) != nil {
			args = append(args, "--"+f.Name+"="+f.Value.String())
		}
	})
	err := dfs.Parse(args)
	if err == nil {
		err = config.Apply(dfs, name, data, "config")
	}
	if err == nil {
		err = daemon.CheckFlags(dfs, &cfg)
	}
	if err != nil {
		return res("config", Fail, "fix the file (b2bd --help gives each key's range)", "b2bd would refuse %s: %v", name, err)
	}
	return res("config", Pass, "", "%s: every key known and in its range; b2bd would start with it", name)
}
