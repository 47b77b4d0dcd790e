// Command b2b-bench measures b2bd: batches of discrete blocks between two
// daemons, swept over block sizes, every block verified; or, with
// --workload kv, a KV-cache request as descriptors and as block ids. See
// package bench.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/b2bd/b2bd/bench"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "b2b-bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	cfg, err := bench.ParseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	if cfg.ProjectCX7 != "" {
		return bench.ProjectCX7File(cfg.ProjectCX7, os.Stdout)
	}
	return bench.Run(ctx, cfg, os.Stdout, os.Stderr)
}
