// Command b2bd is the per-host block transfer daemon.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
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
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
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
