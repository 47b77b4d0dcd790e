package cli

import (
	"context"
	"fmt"
	"io"
	"runtime"

	"github.com/hashicorp/go-hclog"
	"github.com/spf13/cobra"

	"github.com/b2bd/b2bd/gpudirect"
	"github.com/b2bd/b2bd/internal/config"
	"github.com/b2bd/b2bd/internal/daemon"
	"github.com/b2bd/b2bd/internal/doctor"
)

// StartFunc runs the daemon with its checked configuration until ctx ends.
type StartFunc func(ctx context.Context, cfg daemon.Config, stderr io.Writer) error

// Serve is b2bd's StartFunc: build the daemon and serve.
func Serve(ctx context.Context, cfg daemon.Config, stderr io.Writer) error {
	log := hclog.New(&hclog.LoggerOptions{Name: "b2bd", Level: hclog.LevelFromString(cfg.LogLevel), Output: stderr})
	daemon.InstallGRPCLogger(log)
	d, err := daemon.New(cfg, log)
	if err != nil {
		return err
	}
	return d.Serve(ctx)
}

// DaemonCommand is b2bd's command tree (cobra): the daemon itself, whose
// flags are daemon.NewFlagSet's plus --config and --version, and doctor.
// start runs the daemon once the flags and the file passed
// daemon.CheckFlags (Serve; tests pass their own).
func DaemonCommand(stdout, stderr io.Writer, start StartFunc) *cobra.Command {
	var cfg daemon.Config
	fs := daemon.NewFlagSet("b2bd", &cfg)
	var cfgFile string
	var version bool
	root := &cobra.Command{
		Use:   "b2bd",
		Short: "batch-to-batch block transfer daemon",
		Long: `b2bd is the per-host daemon that moves batches of memory blocks between hosts
(RDMA verbs, TCP, or the same-host path) for clients on its local API socket.

Every flag can also be set in a TOML file given with --config (keys are the
flag names, e.g. tcp-streams = 4; /etc/b2bd/b2bd.toml when installed); flags
on the command line override the file. A flag or key outside the range its
help shows stops the start, naming it, its value and the range; b2bd doctor
--config runs the same check.

Files: /etc/b2bd/b2bd.toml (configuration), /run/b2bd/b2bd.sock (the local
API socket, group b2bd), /dev/shm/b2bd (shared-memory files of host regions).`,
		SilenceUsage:      true,
		SilenceErrors:     true,
		DisableAutoGenTag: true,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 {
				return fmt.Errorf("%w: unknown command or argument %q (b2bd takes flags only, or a command such as doctor; see b2bd --help)", ErrUsage, args[0])
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			if version {
				fmt.Fprintf(stdout, "b2bd %s %s %s/%s\n", daemon.Version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
				return nil
			}
			if cfgFile != "" {
				if err := config.LoadFileChanged(fs, cfgFile, cmd.Flags().Changed, "config"); err != nil {
					return err
				}
			}
			if err := daemon.CheckFlags(fs, &cfg); err != nil {
				return err
			}
			return start(cmd.Context(), cfg, stderr)
		},
	}
	root.Flags().SortFlags = true
	root.Flags().AddGoFlagSet(fs)
	root.Flags().StringVar(&cfgFile, "config", "", "TOML file whose keys are these flags' names (e.g. deploy/b2bd.toml); flags on the command line override it")
	root.Flags().BoolVar(&version, "version", false, "print the version and exit")
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return fmt.Errorf("%w: %v", ErrUsage, err) })
	root.AddCommand(doctor.NewCommand("b2bd"), appAllocCommand(stdout))
	return root
}

// appAllocCommand is daemon.AppAllocCommand: the helper a calibration
// starts to allocate GPU memory as an application would. Hidden: b2bd
// runs it, not people.
func appAllocCommand(stdout io.Writer) *cobra.Command {
	var dev int
	var size uint64
	cmd := &cobra.Command{
		Use:    daemon.AppAllocCommand,
		Short:  "allocate GPU memory and hold it until stdin ends (b2bd's calibration)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cu, err := gpudirect.Load()
			if err != nil {
				return err
			}
			defer cu.Close()
			return daemon.ServeAppAlloc(cu, dev, size, cmd.InOrStdin(), stdout)
		},
	}
	cmd.Flags().IntVar(&dev, "device", 0, "the GPU")
	cmd.Flags().Uint64Var(&size, "size", 0, "bytes")
	return cmd
}

// RunDaemon runs b2bd with args (without the program name).
func RunDaemon(ctx context.Context, args []string, stdout, stderr io.Writer, start StartFunc) error {
	root := DaemonCommand(stdout, stderr, start)
	root.SetArgs(LongFlags(root, args))
	return root.ExecuteContext(ctx)
}
