package daemon

import (
	"flag"
	"strconv"
	"strings"
	"testing"

	"github.com/b2bd/b2bd/internal/config"
	"github.com/b2bd/b2bd/internal/transport"
)

// daemonFlagSet is b2bd's flag set as cmd/b2bd builds it (less --config).
func daemonFlagSet() (*flag.FlagSet, *Config) {
	cfg := &Config{}
	fs := NewFlagSet("b2bd", cfg)
	fs.SetOutput(nopWriter{})
	// The security flags must agree for CheckFlags to reach the ranges.
	cfg.Insecure, cfg.PeerListen = true, "127.0.0.1:0"
	if err := fs.Set("data-listen", "127.0.0.1:0"); err != nil {
		panic(err)
	}
	return fs, cfg
}

type nopWriter struct{}

func (nopWriter) Write(p []byte) (int, error) { return len(p), nil }

// rangeCases has, for every b2bd flag, values outside its documented range
// (bad) and the edges of the range (ok). want is a piece of the range as the
// refusal must name it.
var rangeCases = []struct {
	flag string
	bad  []string
	ok   []string
	want string
}{
	{"node-name", []string{"", strings.Repeat("n", 256)}, []string{"a", strings.Repeat("n", 255)}, "1 to 255 bytes"},
	{"socket", []string{"a\x00b", strings.Repeat("s", 4097)}, []string{"", "/tmp/x.sock"}, "no NUL"},
	{"socket-mode", []string{"0778", "1000", "rw", "-1"}, []string{"0000", "0777", "0660"}, "0000 to 0777"},
	{"group", []string{"a\x00b", strings.Repeat("g", 4097)}, []string{"", "b2bd", "1000"}, "no NUL"},
	{"api-listen", []string{"localhost", "127.0.0.1:65536", "127.0.0.1:x"}, []string{"", "127.0.0.1:0", "[::1]:65535"}, "host:port"},
	{"peer-listen", []string{"", "7470", "h:99999"}, []string{":7470", "127.0.0.1:1"}, "host:port"},
	{"data-listen", []string{"", ":-1"}, []string{":7471"}, "host:port"},
	{"peer-idle-timeout", []string{"100ms", "25h"}, []string{"1s", "24h0m0s"}, "1s to 24h"},
	{"max-peers", []string{"0", "-3", "65537"}, []string{"1", "65536"}, "1 to 65536"},
	{"conns-per-peer", []string{"0", "-1", "65"}, []string{"1", "64"}, "1 to 64"},
	{"tcp-streams", []string{"-3", "0", "65"}, []string{"1", "64"}, "1 to 64"},
	{"shm-dir", []string{"", "a\x00b"}, []string{"/dev/shm/b2bd"}, "non-empty"},
	{"local-streams", []string{"99", "0", "-1", "9"}, []string{"1", "8"}, "1 to 8"},
	{"transport", []string{"udp", "", "LOCAL"}, []string{"auto", "tcp", "verbs", "local"}, "auto, tcp, verbs, local"},
	{"calibrate", []string{"on", "", "START"}, []string{"start", "off"}, "start, off"},
	{"calibration-file", []string{"a\x00b"}, []string{"", "/var/cache/b2bd/c.json"}, "no NUL"},
	{"max-descriptors", []string{"0", "-1", "16777217"}, []string{"1", "16777216"}, "1 to 16777216"},
	{"max-plans", []string{"0", "-5", "1048577"}, []string{"1", "1048576"}, "1 to 1048576"},
	{"max-transfers-per-client", []string{"0", "-5", "1048577"}, []string{"1", "4096", "1048576"}, "1 to 1048576"},
	{"submit-socket", []string{"a\x00b"}, []string{"", "/tmp/s"}, "no NUL"},
	{"default-timeout", []string{"0s", "-1s", "25h"}, []string{"1ms", "24h0m0s"}, "1ms to 24h"},
	{"shutdown-grace", []string{"-1s", "2h"}, []string{"0s", "1h0m0s"}, "0s to 1h"},
	{"log-level", []string{"verbose", ""}, []string{"trace", "debug", "info", "warn", "error"}, "trace, debug, info, warn, error"},
	{"tls-cert", []string{"a\x00b"}, []string{"", "/etc/b2bd/cert.pem"}, "no NUL"},
	{"tls-key", []string{"a\x00b"}, []string{""}, "no NUL"},
	{"tls-ca", []string{"a\x00b"}, []string{""}, "no NUL"},
	{"insecure", []string{"maybe", "2"}, []string{"true", "false"}, ""},
	{"metrics-listen", []string{"9090", "h:"}, []string{"", "127.0.0.1:9090"}, "host:port"},
	{"health-listen", []string{"nope"}, []string{"", ":8080"}, "host:port"},
	{"rdma-device", []string{"a\x00b"}, []string{"", "mlx5_0", "mlx5_0,mlx5_1", "auto"}, "no NUL"},
	{"rdma-port", []string{"0", "256", "-1"}, []string{"1", "255"}, "1 to 255"},
	{"gid-index", []string{"-2", "256"}, []string{"-1", "0", "255"}, "-1 to 255"},
	{"rdma-netdev", []string{"a\x00b"}, []string{"", "eth0"}, "no NUL"},
	{"qps-per-peer", []string{"0", "65"}, []string{"1", "64"}, "1 to 64"},
	{"rdma-signal-every", []string{"0", "-1", "32769"}, []string{"1", "1024"}, "1 to 32768"},
	{"rdma-max-chain", []string{"0", "65537"}, []string{"1", "2048"}, "1 to 65536"},
	{"rdma-chain-bytes", []string{"0", "1073741825"}, []string{"1", "1073741824"}, "1 to 1073741824"},
	{"rdma-sq-depth", []string{"7", "0", "65537"}, []string{"512", "65536"}, "8 to 65536"},
	{"rdma-srq-depth", []string{"15", "0", "65537"}, []string{"16", "65536"}, "16 to 65536"},
	{"rdma-max-sge", []string{"0", "257"}, []string{"1", "256"}, "1 to 256"},
	{"rdma-max-wr-bytes", []string{"0", "1073741825"}, []string{"1", "1073741824"}, "1 to 1073741824"},
	{"rdma-read-depth", []string{"-1", "256"}, []string{"0", "1", "255"}, "0 to 255"},
	{"rdma-read-wr-bytes", []string{"0", "1073741825"}, []string{"1", "1073741824"}, "1 to 1073741824"},
	{"rdma-min-qp-bytes", []string{"0", "-1"}, []string{"1", "1099511627776"}, "1 to 1099511627776"},
	{"rdma-inline", []string{"-1", "1025"}, []string{"0", "1024"}, "0 to 1024"},
	{"rdma-post-threads", []string{"0", "65"}, []string{"1", "64"}, "1 to 64"},
	{"rdma-poll-spin", []string{"-1us", "2s"}, []string{"0s", "1s"}, "0s to 1s"},
	{"rdma-ack-timeout", []string{"0", "32"}, []string{"1", "31"}, "1 to 31"},
	{"rdma-retry-count", []string{"0", "8"}, []string{"1", "7"}, "1 to 7"},
	{"rdma-keepalive", []string{"0s", "999ms", "25h"}, []string{"1s", "24h0m0s"}, "1s to 24h"},
	{"rdma-stall-timeout", []string{"0s", "99ms", "2h"}, []string{"100ms", "1h0m0s"}, "100ms to 1h"},
	{"rdma-cancel-wait", []string{"0s", "9ms", "2m"}, []string{"10ms", "1m0s"}, "10ms to 1m"},
	{"rdma-rail-map", []string{"mlx5_0", "a=b,a=c"}, []string{"", "mlx5_0=mlx5_1"}, "local=peer"},
	{"rdma-stripe-rails", []string{"-1", "65"}, []string{"0", "64"}, "0 to 64"},
	{"rdma-stripe-min", []string{"-1", "1099511627777"}, []string{"0", "1099511627776"}, "0 to 1099511627776"},
}

// tomlLiteral is s as a TOML value of the flag's type.
func tomlLiteral(f *flag.Flag, s string) string {
	if g, ok := f.Value.(flag.Getter); ok {
		switch g.Get().(type) {
		case bool, int, int64, uint, uint64:
			if _, err := strconv.ParseFloat(s, 64); err == nil || s == "true" || s == "false" {
				return s
			}
		}
	}
	return strconv.Quote(s)
}

// TestFlagRanges: every flag, on the command line and as a --config key,
// refuses a value outside its documented range, naming the flag, the value
// and the range; the range's edges are accepted.
func TestFlagRanges(t *testing.T) {
	fs, _ := daemonFlagSet()
	covered := map[string]bool{}
	for _, tc := range rangeCases {
		covered[tc.flag] = true
	}
	fs.VisitAll(func(f *flag.Flag) {
		if !covered[f.Name] {
			t.Errorf("flag --%s has no row in rangeCases", f.Name)
		}
	})
	for _, tc := range rangeCases {
		if fs.Lookup(tc.flag) == nil {
			t.Errorf("rangeCases row %s names no flag", tc.flag)
			continue
		}
		for _, bad := range tc.bad {
			cl, cfg := daemonFlagSet()
			err := cl.Parse([]string{"--" + tc.flag + "=" + bad})
			if err == nil {
				err = CheckFlags(cl, cfg)
			}
			if err == nil || !strings.Contains(err.Error(), tc.flag) || !strings.Contains(err.Error(), strconv.Quote(bad)) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("--%s=%q: err = %v; want a refusal naming the flag, the value and %q", tc.flag, bad, err, tc.want)
			}
			file, fcfg := daemonFlagSet()
			err = config.Apply(file, "b2bd.toml", []byte(tc.flag+" = "+tomlLiteral(file.Lookup(tc.flag), bad)+"\n"), "config")
			if err == nil {
				err = CheckFlags(file, fcfg)
			}
			if err == nil || !strings.Contains(err.Error(), `"`+tc.flag+`"`) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("config key %s = %q: err = %v; want a refusal naming the key, the value and %q", tc.flag, bad, err, tc.want)
			}
		}
		for _, ok := range tc.ok {
			cl, cfg := daemonFlagSet()
			if err := cl.Parse([]string{"--" + tc.flag + "=" + ok}); err != nil {
				t.Errorf("--%s=%q: %v", tc.flag, ok, err)
			} else if err := CheckFlags(cl, cfg); err != nil && !strings.Contains(err.Error(), "tls") {
				t.Errorf("--%s=%q: check: %v", tc.flag, ok, err)
			}
		}
	}
}

// TestFlagDefaultsInRange: the defaults are inside their own ranges.
func TestFlagDefaultsInRange(t *testing.T) {
	fs, cfg := daemonFlagSet()
	if err := CheckFlags(fs, cfg); err != nil {
		t.Fatal(err)
	}
}

// TestFlagCrossChecks: limits that depend on another flag.
func TestFlagCrossChecks(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--rdma-sq-depth", "64", "--rdma-max-chain", "65"}, `--rdma-max-chain 65 is out of range: want 1 to --rdma-sq-depth (64)`},
		{[]string{"--rdma-sq-depth", "64", "--rdma-max-chain", "64", "--rdma-signal-every", "33"}, `--rdma-signal-every 33 is out of range: want 1 to --rdma-sq-depth/2 (32)`},
		{[]string{"--insecure", "--tls-cert", "c"}, "--insecure and --tls-* are exclusive"},
		{[]string{"--tls-cert", "c"}, "give all three"},
	} {
		fs, cfg := daemonFlagSet()
		cfg.Insecure = false
		if err := fs.Parse(tc.args); err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if !cfg.Insecure && cfg.TLSCert == "" {
			cfg.TLSCert, cfg.TLSKey, cfg.TLSCA = "c", "k", "a"
		}
		if err := CheckFlags(fs, cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v, want %q", tc.args, err, tc.want)
		}
	}
}

// TestRangeTables: every row of the range tables names a flag, and a flag
// added without a row is refused by CheckFlags.
func TestRangeTables(t *testing.T) {
	fs, cfg := daemonFlagSet()
	tables := []config.Ranges{flagRanges}
	drivers, err := transport.Registered()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range drivers {
		tables = append(tables, d.Ranges)
	}
	for _, table := range tables {
		if err := table.Bind(fs); err != nil {
			t.Error(err)
		}
	}
	fs.Int("new-flag", 1, "a flag someone forgot to give a range")
	if err := CheckFlags(fs, cfg); err == nil || !strings.Contains(err.Error(), "new-flag") || !strings.Contains(err.Error(), "without a documented range") {
		t.Fatalf("err = %v", err)
	}
}
