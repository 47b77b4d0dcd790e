// Command b2bd is the per-host block transfer daemon.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"syscall"

	"github.com/hashicorp/go-hclog"

	"github.com/b2bd/b2bd/internal/config"
	"github.com/b2bd/b2bd/internal/daemon"
	"github.com/b2bd/b2bd/internal/doctor"
)

func main() {
	if err := run(context.Background(), os.Args[1:]); err != nil {
		if !errors.Is(err, doctor.ErrFailed) {
			fmt.Fprintln(os.Stderr, "b2bd:", err)
		}
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) > 0 && args[0] == "doctor" {
		return doctor.Command(ctx, "b2bd", args[1:], os.Stdout, os.Stderr)
	}
	var cfg daemon.Config
	var cfgFile string
	fs := daemon.NewFlagSet("b2bd", &cfg)
	fs.StringVar(&cfgFile, "config", "", "TOML file whose keys are these flags' names (e.g. deploy/b2bd.toml); flags on the command line override it")
	version := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unknown command or argument %q (b2bd takes flags only, or the subcommand doctor; see b2bd --help)", fs.Arg(0))
	}
	if *version {
		fmt.Printf("b2bd %s %s %s/%s\n", daemon.Version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
		return nil
	}
	if cfgFile != "" {
		if err := config.LoadFile(fs, cfgFile, "config"); err != nil {
			return err
		}
	}
	if err := daemon.CheckFlags(fs, &cfg); err != nil {
		return err
	}
	log := hclog.New(&hclog.LoggerOptions{Name: "b2bd", Level: hclog.LevelFromString(cfg.LogLevel), Output: os.Stderr})
	daemon.InstallGRPCLogger(log)
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	d, err := daemon.New(cfg, log)
	if err != nil {
		return err
	}
	return d.Serve(ctx)
}
