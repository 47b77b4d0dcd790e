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

	"github.com/b2bd/b2bd/internal/daemon"
)

func main() {
	if err := run(context.Background(), os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "b2bd:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	var cfg daemon.Config
	fs := flag.NewFlagSet("b2bd", flag.ContinueOnError)
	cfg.RegisterFlags(fs)
	daemon.RegisterOptionalFlags(fs, &cfg)
	version := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unknown command or argument %q (b2bd takes flags only; see b2bd --help)", fs.Arg(0))
	}
	if *version {
		fmt.Printf("b2bd %s %s %s/%s\n", daemon.Version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
		return nil
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
