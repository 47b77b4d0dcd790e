package config_test

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/b2bd/b2bd/internal/config"
	"github.com/b2bd/b2bd/internal/daemon"
)

var update = flag.Bool("update", false, "rewrite deploy/b2bd.toml from b2bd's flags")

const deployFile = "../../deploy/b2bd.toml"

// daemonFlags is b2bd's flag set, as cmd/b2bd builds it (less --config).
func daemonFlags() *flag.FlagSet {
	var cfg daemon.Config
	fs := flag.NewFlagSet("b2bd", flag.ContinueOnError)
	cfg.RegisterFlags(fs)
	daemon.RegisterKindFlags(fs, &cfg)
	return fs
}

// hostDependent defaults differ between machines; the file shows them as a
// comment instead.
var hostDependent = map[string]string{"node-name": "this host's name"}

// render writes the default config: every flag, commented out, with its
// usage and its default.
func render(fs *flag.FlagSet) []byte {
	var b bytes.Buffer
	b.WriteString(`# b2bd configuration (TOML): b2bd --config /etc/b2bd/b2bd.toml
#
# Every key is a b2bd flag name (b2bd --help lists them) and takes the flag's
# type: true/false, an integer, or a string ("30s" for durations), within the
# range shown. A flag given on the command line overrides the file. An unknown
# key or a value outside its range is refused at start (and by b2bd doctor
# --config), naming the key, the value, the range and the line. Every line below is commented
# out and shows the default; uncomment and change what you need.
#
# Generated from the flags: go test ./internal/config -run TestDeployConfig -update
`)
	fs.VisitAll(func(f *flag.Flag) {
		fmt.Fprintf(&b, "\n# %s\n", f.Usage)
		if why, ok := hostDependent[f.Name]; ok {
			fmt.Fprintf(&b, "# %s = \"\"  (default: %s)\n", f.Name, why)
			return
		}
		fmt.Fprintf(&b, "# %s = %s\n", f.Name, tomlValue(f))
	})
	return b.Bytes()
}

func tomlValue(f *flag.Flag) string {
	if bf, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && bf.IsBoolFlag() {
		return f.DefValue
	}
	if g, ok := f.Value.(flag.Getter); ok {
		switch g.Get().(type) {
		case int, int64, uint, uint64, float64:
			return f.DefValue
		}
	}
	return strconv.Quote(f.DefValue)
}

// TestDeployConfig checks that deploy/b2bd.toml names every flag, loads as
// shipped, and that uncommenting every line loads and leaves every flag at
// its default (so the defaults shown are the real ones, typed right).
func TestDeployConfig(t *testing.T) {
	fs := daemonFlags()
	if *update {
		if err := os.WriteFile(deployFile, render(fs), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(deployFile)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(data, render(fs)) {
		t.Errorf("%s is out of date with b2bd's flags: go test ./internal/config -run TestDeployConfig -update", filepath.Base(deployFile))
	}
	fs.VisitAll(func(f *flag.Flag) {
		if !regexp.MustCompile(`(?m)^# ` + regexp.QuoteMeta(f.Name) + ` = `).Match(data) {
			t.Errorf("flag %s is missing from %s", f.Name, deployFile)
		}
	})
	if err := config.LoadFile(fs, deployFile, "config"); err != nil {
		t.Fatalf("shipped file: %v", err)
	}
	// Uncommented: every default, typed as the flag wants it.
	var on []string
	for _, l := range strings.Split(string(data), "\n") {
		if m := regexp.MustCompile(`^# ([a-z0-9-]+ = .*)$`).FindStringSubmatch(l); m != nil {
			if _, host := hostDependent[strings.Fields(m[1])[0]]; !host {
				on = append(on, m[1])
			}
		}
	}
	if len(on) < 20 {
		t.Fatalf("only %d settings found", len(on))
	}
	fs2 := daemonFlags()
	if err := config.Apply(fs2, "uncommented", []byte(strings.Join(on, "\n")), "config"); err != nil {
		t.Fatalf("uncommented file: %v", err)
	}
	fs2.VisitAll(func(f *flag.Flag) {
		if f.Value.String() != f.DefValue {
			t.Errorf("%s: %q after loading its shown default, want %q", f.Name, f.Value.String(), f.DefValue)
		}
	})
}

// TestOverrideOrder is the daemon's order: defaults, then the file, then the
// command line.
func TestOverrideOrder(t *testing.T) {
	fs := daemonFlags()
	if err := fs.Parse([]string{"--tcp-streams", "3"}); err != nil {
		t.Fatal(err)
	}
	file := "tcp-streams = 7\nshutdown-grace = \"2s\"\ntransport = \"tcp\"\n"
	if err := config.Apply(fs, "f", []byte(file), "config"); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"tcp-streams": "3", "shutdown-grace": "2s", "transport": "tcp", "max-descriptors": "1048576"} {
		if got := fs.Lookup(name).Value.String(); got != want {
			t.Errorf("%s = %s, want %s", name, got, want)
		}
	}
	err := config.Apply(daemonFlags(), "/etc/b2bd/b2bd.toml", []byte("tcp-streams = 2\nrdma-stall-timeout = 5\n"), "config")
	if err == nil || !strings.Contains(err.Error(), `/etc/b2bd/b2bd.toml line 2: key "rdma-stall-timeout"`) {
		t.Fatalf("err = %v", err)
	}
}
