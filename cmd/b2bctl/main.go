// Command b2bctl talks to the local b2bd: status, regions, transfers,
// checksums, notifications, and the host doctor.
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
	err := cli.Main(ctx, os.Args[1:], cli.IO{Stdout: os.Stdout, Stderr: os.Stderr})
	stop()
	switch {
	case err == nil:
	case errors.Is(err, doctor.ErrFailed):
		os.Exit(1)
	case errors.Is(err, cli.ErrUsage):
		fmt.Fprintln(os.Stderr, "b2bctl:", err)
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "b2bctl:", err)
		os.Exit(1)
	}
}
