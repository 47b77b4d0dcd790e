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

	"github.com/spf13/cobra"

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

// Type names --peer's value in pflag's help (cobra).
func (m *multi) Type() string { return "host:port" }

// cmdline is doctor's command line: its flags (register), then run.
type cmdline struct {
	fs            *flag.FlagSet
	env           Env
	o             PeerOptions
	peers         multi
	asJSON        bool
	cert, key, ca string
	cfgFile       string
}

func newCmdline(prog string) *cmdline {
	c := &cmdline{fs: flag.NewFlagSet(prog+" doctor", flag.ContinueOnError)}
	fs := c.fs
	fs.BoolVar(&c.asJSON, "json", false, "print a JSON report")
	fs.StringVar(&c.env.Root, "root", "/", "read sysfs, procfs, /etc, /usr and the shm directory under this root (for testing)")
	fs.StringVar(&c.env.ShmDir, "shm-dir", "/dev/shm/b2bd", "the daemon's --shm-dir")
	fs.StringVar(&c.env.Group, "group", "b2bd", "the daemon's --group")
	fs.StringVar(&c.env.Device, "rdma-device", "", "check only this RDMA device (the daemon's --rdma-device)")
	fs.StringVar(&c.env.NetDev, "rdma-netdev", "", "check the RoCE GID and MTU of this netdev (the daemon's --rdma-netdev)")
	fs.Var(&c.peers, "peer", "also check this peer daemon (host:port of its --peer-listen); repeatable")
	fs.StringVar(&c.cert, "tls-cert", "", "peer checks: this host's certificate (the daemon's --tls-cert)")
	fs.StringVar(&c.key, "tls-key", "", "peer checks: its private key")
	fs.StringVar(&c.ca, "tls-ca", "", "peer checks: the CA bundle peers chain to")
	fs.BoolVar(&c.o.Insecure, "insecure", false, "peer checks: plaintext, loopback peers only")
	fs.StringVar(&c.o.Socket, "socket", "/run/b2bd/b2bd.sock", "peer round trip: the local daemon's API (socket path or host:port)")
	fs.StringVar(&c.o.PeerAPI, "peer-api", "", "peer round trip: the peer daemon's local API, to register a scratch region there and compare checksums")
	fs.StringVar(&c.o.PeerExport, "peer-export", "", "peer round trip: a region the peer exports that may be overwritten (first 64 KiB); contents are not compared")
	fs.DurationVar(&c.o.Timeout, "timeout", 5*time.Second, "peer checks: timeout per step")
	fs.StringVar(&c.cfgFile, "config", "", "the daemon's TOML config: it must pass the daemon's own check (every key known and in its range); its socket, shm-dir, group, rdma-device, rdma-netdev, tls-* and insecure apply here (flags override it)")
	return c
}

// Command is `b2bd doctor` and `b2bctl doctor` over package flag: prog
// names the program in usage text. It returns ErrFailed when any check
// failed. NewCommand is the same as a cobra command.
func Command(ctx context.Context, prog string, args []string, stdout, stderr io.Writer) error {
	c := newCmdline(prog)
	c.fs.SetOutput(stderr)
	if err := c.fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	set := map[string]bool{}
	c.fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return c.run(ctx, func(name string) bool { return set[name] }, c.fs.Args(), stdout)
}

// NewCommand is doctor as a cobra command of prog (b2bd or b2bctl).
func NewCommand(prog string) *cobra.Command {
	c := newCmdline(prog)
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "check this host (and peers) for b2bd",
		Long: `doctor checks what b2bd needs from this host (kernel, shared memory, group, RDMA
devices and their RoCE GIDs and MTU, CUDA) and prints one line per check, or a
JSON report with --json. With --peer it also checks peer daemons; with --config
it runs the daemon's own check of its config file. Exit status 1 when a check
failed.`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.run(cmd.Context(), cmd.Flags().Changed, args, cmd.OutOrStdout())
		},
	}
	cmd.Flags().AddGoFlagSet(c.fs)
	return cmd
}

// run runs the checks; changed says which flags the command line gave.
func (c *cmdline) run(ctx context.Context, changed func(string) bool, args []string, stdout io.Writer) error {
	fs, env, o, cfgFile := c.fs, &c.env, &c.o, &c.cfgFile
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
		fs.VisitAll(func(f *flag.Flag) {
			if daemonKeys[f.Name] && changed(f.Name) {
				_ = sub.Set(f.Name, f.Value.String()) // marks it set: the command line wins
			}
		})
		if err := config.ApplyKnown(sub, *cfgFile, data); err != nil {
			return fmt.Errorf("doctor: %w", err)
		}
		r := checkDaemonConfig(fs, changed, *cfgFile, data)
		cfgCheck = &r
	}
	if len(args) > 0 {
		return fmt.Errorf("doctor: unexpected argument %q", args[0])
	}
	if o.Timeout <= 0 {
		return fmt.Errorf("doctor: --timeout %v must be > 0 (each peer check step's deadline)", o.Timeout)
	}
	if env.Root == "/" {
		// Only the real host has a libibverbs to ask for the active MTU.
		env.PortMTU = VerbsPortMTU
	}
	results := Run(*env)
	if cfgCheck != nil {
		results = append([]Result{*cfgCheck}, results...)
	}
	if len(c.peers) > 0 {
		switch {
		case o.Insecure && (c.cert != "" || c.key != "" || c.ca != ""):
			return fmt.Errorf("doctor: --insecure and --tls-* are exclusive")
		case c.cert != "" || c.key != "" || c.ca != "":
			t, err := auth.LoadPeerTLS(c.cert, c.key, c.ca)
			if err != nil {
				return fmt.Errorf("doctor: %w", err)
			}
			o.TLS = t
		}
		for _, p := range c.peers {
			o.Addr = p
			results = append(results, Peer(ctx, *o)...)
		}
	}
	var err error
	if c.asJSON {
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
func checkDaemonConfig(doctorFlags *flag.FlagSet, changed func(string) bool, name string, data []byte) Result {
	var cfg daemon.Config
	dfs := daemon.NewFlagSet("b2bd", &cfg)
	dfs.SetOutput(io.Discard)
	var args []string
	doctorFlags.VisitAll(func(f *flag.Flag) {
		if daemonKeys[f.Name] && changed(f.Name) && dfs.Lookup(f.Name) != nil {
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
