package cli

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/b2bd/b2bd/internal/daemon"
)

// b2bd runs the b2bd command line with a start that records the
// configuration instead of serving; started is nil when it did not start.
func b2bd(t *testing.T, args ...string) (started *daemon.Config, stdout string, err error) {
	t.Helper()
	var out, errb bytes.Buffer
	err = RunDaemon(context.Background(), args, &out, &errb, func(_ context.Context, cfg daemon.Config, _ io.Writer) error {
		started = &cfg
		return nil
	})
	return started, out.String(), err
}

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "b2bd.toml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestDaemonRefusesOutOfRange is the out-of-range defect at b2bd's own command
// line: a value outside its range, as a flag or as a --config key, stops
// the start, naming the key, the value and the range.
func TestDaemonRefusesOutOfRange(t *testing.T) {
	loop := []string{"--insecure", "--peer-listen", "127.0.0.1:0", "--data-listen", "127.0.0.1:0"}
	for _, tc := range []struct {
		name string
		args []string
		file string
		want []string
	}{
		{"local-streams key", nil, "local-streams = 99\n", []string{`"local-streams"`, `"99"`, "1 to 8"}},
		{"tcp-streams key", nil, "tcp-streams = -3\n", []string{`"tcp-streams"`, `"-3"`, "1 to 64"}},
		{"max-descriptors flag", []string{"--max-descriptors", "0"}, "", []string{"--max-descriptors", `"0"`, "1 to 16777216"}},
		{"one-dash flag", []string{"-local-streams=9"}, "", []string{"--local-streams", `"9"`, "1 to 8"}},
		{"transport", []string{"--transport", "rdma"}, "", []string{`"rdma"`, "auto, tcp, verbs, local"}},
	} {
		args := append(append([]string{}, loop...), tc.args...)
		if tc.file != "" {
			args = append(args, "--config", writeFile(t, tc.file))
		}
		started, _, err := b2bd(t, args...)
		if started != nil || err == nil {
			t.Errorf("%s: started (err %v)", tc.name, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: err %v lacks %q", tc.name, err, w)
			}
		}
	}
}

// TestDaemonConfigOrder: defaults, then the file, then the command line,
// as before cobra; and --version, --help and a stray argument.
func TestDaemonConfigOrder(t *testing.T) {
	file := writeFile(t, "tcp-streams = 7\nshutdown-grace = \"2s\"\ninsecure = true\npeer-listen = \"127.0.0.1:0\"\ndata-listen = \"127.0.0.1:0\"\n")
	cfg, _, err := b2bd(t, "--config", file, "--tcp-streams", "3")
	if err != nil || cfg == nil {
		t.Fatalf("start: %v", err)
	}
	if cfg.KindFlag("tcp-streams") != "3" || cfg.ShutdownGrace != 2*time.Second || !cfg.Insecure || cfg.KindFlag("local-streams") != "4" || cfg.KindFlag("rdma-sq-depth") == "" {
		t.Fatalf("config %+v", cfg)
	}
	if cfg, out, err := b2bd(t, "--version"); err != nil || cfg != nil || !strings.HasPrefix(out, "b2bd ") {
		t.Fatalf("--version: %q %v", out, err)
	}
	if _, out, err := b2bd(t, "--help"); err != nil || !strings.Contains(out, "doctor") || !strings.Contains(out, "--local-streams") || !strings.Contains(out, "1 to 8") {
		t.Fatalf("--help: %v\n%s", err, out)
	}
	if _, _, err := b2bd(t, "frob"); !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), `"frob"`) {
		t.Fatalf("stray argument: %v", err)
	}
}
