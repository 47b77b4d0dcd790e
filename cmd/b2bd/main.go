// Command b2bd is the per-host block transfer daemon (internal/cli.DaemonCommand).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/b2bd/b2bd/internal/cli"
	"github.com/b2bd/b2bd/internal/doctor"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := cli.RunDaemon(ctx, os.Args[1:], os.Stdout, os.Stderr, cli.Serve)
	stop()
	if err != nil {
		if !errors.Is(err, doctor.ErrFailed) {
			fmt.Fprintln(os.Stderr, "b2bd:", err)
		}
		os.Exit(1)
	}
}
