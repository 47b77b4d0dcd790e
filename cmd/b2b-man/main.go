// Command b2b-man writes the man pages of b2bd (section 8) and b2bctl
// (section 1), one per command, from their cobra command trees (cobra/doc):
// b2b-man DIR. deploy/deb/build.sh packs them. SOURCE_DATE_EPOCH, when set,
// dates the pages (reproducible builds).
package main

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/spf13/cobra/doc"

	"github.com/b2bd/b2bd/internal/cli"
	"github.com/b2bd/b2bd/internal/daemon"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: b2b-man DIR")
		os.Exit(2)
	}
	if err := run(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "b2b-man:", err)
		os.Exit(1)
	}
}

func run(dir string) error {
	date := time.Now().UTC()
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		sec, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return fmt.Errorf("SOURCE_DATE_EPOCH %q: %w", s, err)
		}
		date = time.Unix(sec, 0).UTC()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	source := "b2bd " + daemon.Version
	b2bd := cli.DaemonCommand(io.Discard, io.Discard, cli.Serve)
	if err := doc.GenManTree(b2bd, &doc.GenManHeader{Section: "8", Date: &date, Source: source, Manual: "b2bd"}, dir); err != nil {
		return fmt.Errorf("b2bd pages: %w", err)
	}
	b2bctl := cli.NewCommand(cli.IO{Stdout: io.Discard, Stderr: io.Discard})
	if err := doc.GenManTree(b2bctl, &doc.GenManHeader{Section: "1", Date: &date, Source: source, Manual: "b2bd"}, dir); err != nil {
		return fmt.Errorf("b2bctl pages: %w", err)
	}
	return nil
}
