// Command b2b-soak is b2bd's chaos soak: real daemons on loopback, clients
// moving small verified batches of every kind, and a chaos loop killing,
// freezing and restarting daemons and clients, while the invariants are
// checked (package internal/soak; docs/soak.md). It exits non-zero when an
// invariant broke.
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

	"github.com/b2bd/b2bd/internal/soak"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "b2b-soak:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	cfg, err := soak.ParseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	log := hclog.New(&hclog.LoggerOptions{Name: "b2b-soak", Level: hclog.Info, Output: os.Stderr})
	rep, err := soak.Run(ctx, cfg, log.Named("soak"))
	if rep != nil {
		log.Named("report").Info(rep.Summary())
		if cfg.JSON != "" {
			if jerr := rep.WriteJSON(cfg.JSON); jerr != nil {
				return errors.Join(err, jerr)
			}
		}
	}
	return err
}
