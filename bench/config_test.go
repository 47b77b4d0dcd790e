package bench

import (
	"errors"
	"flag"
	"io"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseSizes(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []uint64
		err  string
	}{
		{"128,4096", []uint64{128, 4096}, ""},
		{"2M, 64K ,128", []uint64{128, 64 << 10, 2 << 20}, ""},
		{"4KiB,1MiB,1g", []uint64{4 << 10, 1 << 20, 1 << 30}, ""},
		{"128B,128", []uint64{128}, ""},
		{"4096,4K", []uint64{4096}, ""},
		{"", nil, "no sizes"},
		{"0", nil, "at least one byte"},
		{"12x", nil, "not a whole number"},
		{"-5", nil, "not a whole number"},
		{"2048G", nil, "over 1 TiB"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseSizes(tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("ParseSizes(%q) error = %v, want %q", tc.in, err, tc.err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("ParseSizes(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
			}
		})
	}
}

func TestDefaultSizes(t *testing.T) {
	s := DefaultSizes()
	if len(s) != 15 || s[0] != 128 || s[14] != 2<<20 {
		t.Fatalf("DefaultSizes() = %v, want 15 sizes from 128 B to 2 MiB", s)
	}
	for i := 1; i < len(s); i++ {
		if s[i] != 2*s[i-1] {
			t.Fatalf("sizes %d and %d do not double", s[i-1], s[i])
		}
	}
}

func TestParseFlags(t *testing.T) {
	for _, tc := range []struct {
		name  string
		args  []string
		check func(Config) bool
		err   string
	}{
		{"defaults", nil, func(c Config) bool {
			return c.Blocks == 10000 && c.Iters == 5 && len(c.Sizes) == 15 && c.Transport == "auto" && !c.TwoHost() && c.Timeout == 2*time.Minute
		}, ""},
		{"overrides", []string{"--sizes", "4K,128", "--blocks", "500", "--iters", "2", "--transport", "tcp", "--seed", "9", "--full", "--daemon-arg=--tcp-streams=8"}, func(c Config) bool {
			return reflect.DeepEqual(c.Sizes, []uint64{128, 4096}) && c.Blocks == 500 && c.Iters == 2 && c.Transport == "tcp" && c.Seed == 9 && c.Full &&
				reflect.DeepEqual(c.DaemonArgs, []string{"--tcp-streams=8"})
		}, ""},
		{"two-host", []string{"--src-api", "/run/b2bd/b2bd.sock", "--dst-api", "10.0.0.2:7472", "--dst-peer", "10.0.0.2:7470"}, func(c Config) bool { return c.TwoHost() }, ""},
		{"two-host incomplete", []string{"--src-api", "/run/b2bd/b2bd.sock"}, nil, "needs all of"},
		{"bad transport", []string{"--transport", "udp"}, nil, "want auto, tcp, verbs or local"},
		{"zero iters", []string{"--iters", "0"}, nil, "at least 1"},
		{"zero blocks", []string{"--blocks", "0"}, nil, "at least 1"},
		{"bad sizes", []string{"--sizes", "x"}, nil, "--sizes"},
		{"stray argument", []string{"extra"}, nil, "unexpected arguments"},
		{"default modes", nil, func(c Config) bool {
			return c.AdHoc && c.PreparedUpTo == DefaultPreparedUpTo && reflect.DeepEqual(c.Yardsticks, []string{YardstickStream, YardstickCached}) && c.PingCalls == DefaultPingCalls
		}, ""},
		{"both modes everywhere", []string{"--mode", "adhoc,prepared"}, func(c Config) bool { return c.AdHoc && c.PreparedUpTo == math.MaxUint64 }, ""},
		{"ad hoc only", []string{"--mode", "adhoc", "--yardstick", "none", "--breakdown"}, func(c Config) bool {
			return c.AdHoc && c.PreparedUpTo == 0 && c.Yardsticks == nil && c.Breakdown
		}, ""},
		{"prepared only", []string{"--mode", "prepared"}, func(c Config) bool { return !c.AdHoc && c.PreparedUpTo == math.MaxUint64 }, ""},
		{"bad mode", []string{"--mode", "fast"}, nil, `--mode "fast": want adhoc, prepared`},
		{"empty mode list", []string{"--mode", ","}, nil, "names no mode"},
		{"bad yardstick", []string{"--yardstick", "udp"}, nil, `--yardstick "udp": want stream, cached, raw`},
		{"raw yardstick on host memory", []string{"--yardstick", "raw"}, nil, "--yardstick raw: GPU memory only"},
		{"raw yardstick", []string{"--yardstick", "raw", "--memory", "cuda"}, func(c Config) bool { return slices.Equal(c.Yardsticks, []string{YardstickRaw}) }, ""},
		{"none combined", []string{"--yardstick", "none,stream"}, nil, "none cannot be combined"},
		{"cold", []string{"--cold"}, func(c Config) bool { return c.Cold }, ""},
		{"ring path", []string{"--path", "ring"}, func(c Config) bool { return c.Path == PathRing }, ""},
		{"bad path", []string{"--path", "pigeon"}, nil, `--path "pigeon": want grpc or ring`},
		{"ring path two-host", []string{"--path", "ring", "--src-api", "/run/b2bd/b2bd.sock", "--dst-api", "10.0.0.2:7472", "--dst-peer", "10.0.0.2:7470"}, nil, "--path ring: embedded mode only"},
		{"negative ping calls", []string{"--ping-calls", "-1"}, nil, "--ping-calls -1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseFlags(tc.args, io.Discard)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(c) {
				t.Fatalf("config %+v", c)
			}
		})
	}
}

func TestParseFlagsHelp(t *testing.T) {
	var b strings.Builder
	_, err := ParseFlags([]string{"-h"}, &b)
	if !errors.Is(err, flag.ErrHelp) || !strings.Contains(b.String(), "--sizes") && !strings.Contains(b.String(), "-sizes") {
		t.Fatalf("err %v, usage %q", err, b.String())
	}
}

func TestFormatBytes(t *testing.T) {
	for _, tc := range []struct {
		n    uint64
		want string
	}{{128, "128 B"}, {1000, "1000 B"}, {4096, "4 KiB"}, {1536, "1536 B"}, {2 << 20, "2 MiB"}, {3 << 30, "3 GiB"}} {
		if got := FormatBytes(tc.n); got != tc.want {
			t.Errorf("FormatBytes(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
}

// FuzzParseModes: any input either parses to at least one mode or fails with
// an error naming what it got.
func FuzzParseModes(f *testing.F) {
	for _, s := range []string{"", "adhoc", "prepared", "adhoc,prepared", ",", "x", "adhoc,,x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		adHoc, upTo, err := ParseModes(s)
		if err != nil {
			if adHoc || upTo != 0 {
				t.Fatalf("%q: error %v with a result", s, err)
			}
			return
		}
		if !adHoc && upTo == 0 {
			t.Fatalf("%q: no mode and no error", s)
		}
	})
}

// FuzzParseYardsticks: any input parses to known kinds (each once) or fails.
func FuzzParseYardsticks(f *testing.F) {
	for _, s := range []string{"stream", "cached", "stream,cached", "none", "none,stream", "", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParseYardsticks(s)
		if err != nil {
			return
		}
		seen := map[string]bool{}
		for _, k := range got {
			if (k != YardstickStream && k != YardstickCached) || seen[k] {
				t.Fatalf("%q: parsed to %q", s, got)
			}
			seen[k] = true
		}
	})
}

func TestParseOps(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    []string
		wantErr string
	}{
		{in: "write", want: []string{OpWrite}},
		{in: "", want: []string{OpWrite}},
		{in: "read", want: []string{OpRead}},
		{in: " READ ", want: []string{OpRead}},
		{in: "both", want: []string{OpWrite, OpRead}},
		{in: "pull", wantErr: `"pull": want write, read or both`},
		{in: "write,read", wantErr: "want write, read or both"},
	} {
		got, err := ParseOps(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseOps(%q) = %v, %v; want error %q", tc.in, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("ParseOps(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	// The flag: default write; a bad value names the flag.
	for _, tc := range []struct {
		args    []string
		want    []string
		wantErr string
	}{
		{args: nil, want: []string{OpWrite}},
		{args: []string{"--op", "both"}, want: []string{OpWrite, OpRead}},
		{args: []string{"--op=read", "--workload", "kv"}, want: []string{OpRead}},
		{args: []string{"--op", "sideways"}, wantErr: `--op "sideways"`},
	} {
		cfg, err := ParseFlags(tc.args, io.Discard)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseFlags(%q): %v; want error %q", tc.args, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !slices.Equal(cfg.ops(), tc.want) {
			t.Errorf("ParseFlags(%q): ops %v, %v; want %v", tc.args, cfg.ops(), err, tc.want)
		}
	}
}
