package config

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/b2bd/b2bd/internal/errs"
)

type vals struct {
	name    string
	streams int
	size    uint64
	grace   time.Duration
	insec   bool
	ratio   float64
	cfgPath string
}

func newFS(v *vals) *flag.FlagSet {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(new(strings.Builder))
	fs.StringVar(&v.name, "node-name", "host", "")
	fs.IntVar(&v.streams, "tcp-streams", 4, "")
	fs.Uint64Var(&v.size, "max-bytes", 10, "")
	fs.DurationVar(&v.grace, "shutdown-grace", 30*time.Second, "")
	fs.BoolVar(&v.insec, "insecure", false, "")
	fs.Float64Var(&v.ratio, "ratio", 0.5, "")
	fs.StringVar(&v.cfgPath, "config", "", "")
	return fs
}

func TestApply(t *testing.T) {
	cases := []struct {
		name    string
		args    []string
		file    string
		wantErr []string // substrings; nil: success
		want    vals
	}{
		{name: "every type", file: "node-name = \"a\"\ntcp-streams = 8\nmax-bytes = 99\nshutdown-grace = \"5s\"\ninsecure = true\nratio = 0.25\n",
			want: vals{name: "a", streams: 8, size: 99, grace: 5 * time.Second, insec: true, ratio: 0.25}},
		{name: "empty file keeps defaults", file: "# nothing\n",
			want: vals{name: "host", streams: 4, size: 10, grace: 30 * time.Second, ratio: 0.5}},
		{name: "command line wins", args: []string{"-tcp-streams", "2", "-insecure=false"}, file: "tcp-streams = 8\ninsecure = true\nnode-name = \"b\"\n",
			want: vals{name: "b", streams: 2, size: 10, grace: 30 * time.Second, ratio: 0.5}},
		{name: "integer for float", file: "ratio = 2\n", want: vals{name: "host", streams: 4, size: 10, grace: 30 * time.Second, ratio: 2}},
		{name: "unknown key", file: "node-name = \"a\"\n\nno-such-flag = 1\n", wantErr: []string{`unknown key "no-such-flag"`, "line 3", "cfg.toml"}},
		{name: "config key refused", file: "config = \"x\"\n", wantErr: []string{`unknown key "config"`}},
		{name: "string for int", file: "tcp-streams = \"8\"\n", wantErr: []string{`key "tcp-streams"`, "TOML string", "want an integer", "line 1"}},
		{name: "int for bool", file: "insecure = 1\n", wantErr: []string{`key "insecure"`, "true or false"}},
		{name: "int for duration", file: "\nshutdown-grace = 30\n", wantErr: []string{`key "shutdown-grace"`, "duration string", "line 2"}},
		{name: "bad duration", file: "shutdown-grace = \"soon\"\n", wantErr: []string{`key "shutdown-grace"`, `bad value "soon"`}},
		{name: "negative uint", file: "max-bytes = -1\n", wantErr: []string{`key "max-bytes"`, "negative"}},
		{name: "int overflow", file: "tcp-streams = 9223372036854775807\n", wantErr: nil, want: vals{name: "host", streams: 9223372036854775807, size: 10, grace: 30 * time.Second, ratio: 0.5}},
		{name: "table", file: "[tcp]\nstreams = 3\n", wantErr: []string{`key "tcp"`, "table"}},
		{name: "dotted key", file: "tcp.streams = 3\n", wantErr: []string{`key "tcp"`}},
		{name: "array", file: "node-name = [\"a\"]\n", wantErr: []string{`key "node-name"`, "TOML array"}},
		{name: "syntax", file: "node-name = \"a\nx = 1\n", wantErr: []string{"line 1"}},
		{name: "duplicate key", file: "tcp-streams = 1\ntcp-streams = 2\n", wantErr: []string{"tcp-streams"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var v vals
			fs := newFS(&v)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			err := Apply(fs, "cfg.toml", []byte(tc.file), "config")
			if tc.wantErr != nil {
				if err == nil {
					t.Fatalf("no error; want one with %q", tc.wantErr)
				}
				if !errors.Is(err, errs.ErrInvalidArgument) {
					t.Errorf("error %v is not ErrInvalidArgument", err)
				}
				for _, s := range tc.wantErr {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q lacks %q", err, s)
					}
				}
				// A refused file changes nothing.
				if v.name != "host" || v.streams != 4 || v.insec {
					t.Errorf("refused file changed flags: %+v", v)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if v != tc.want {
				t.Errorf("got %+v, want %+v", v, tc.want)
			}
		})
	}
}

// A failure inside the TOML decoder that concerns one key reads as a range
// check does: file, line, key, the value as written and the flag's range,
// wrapping the decoder's error.
func TestApplyDecoderErrors(t *testing.T) {
	cases := []struct {
		name, file string
		want       string // the whole message; "": the file loads
		isRange    bool   // errors.Is(err, errRange)
		decoder    bool   // errors.As(err, *toml.ParseError)
	}{
		{name: "int beyond int64", file: "tcp-streams = 99999999999999999999\n",
			want:    `invalid argument: config cfg.toml line 1: key "tcp-streams": bad value "99999999999999999999": out of range: want 1 to 64`,
			isRange: true, decoder: true},
		{name: "negative beyond int64", file: "# streams\ntcp-streams = -99999999999999999999 # too few\n",
			want:    `invalid argument: config cfg.toml line 2: key "tcp-streams": bad value "-99999999999999999999": out of range: want 1 to 64`,
			isRange: true, decoder: true},
		{name: "uint beyond int64", file: "max-bytes = 18446744073709551615\n",
			want:    `invalid argument: config cfg.toml line 1: key "max-bytes": bad value "18446744073709551615": out of range: want 0 to 1099511627776`,
			isRange: true, decoder: true},
		{name: "duplicated key", file: "tcp-streams = 2\n\n\"tcp-streams\" = 3 # again\n",
			want:    `invalid argument: config cfg.toml line 3: key "tcp-streams": value "3": already set on line 1; give each key once (want 1 to 64)`,
			decoder: true},
		{name: "key then table of the same name", file: "tcp-streams = 2\n[tcp-streams]\n",
			want:    `invalid argument: config cfg.toml line 2: key "tcp-streams": already set on line 1; give each key once`,
			decoder: true},
		{name: "leading zero", file: "tcp-streams = 012\n",
			want:    `invalid argument: config cfg.toml line 1: key "tcp-streams": bad value "012": Invalid integer "012": cannot have leading zeroes; want 1 to 64`,
			decoder: true},
		{name: "bad escape", file: "node-name = \"a\\qb\" # x\n",
			want:    `invalid argument: config cfg.toml line 1: key "node-name": bad value "a\qb": invalid escape in string '\q'; want non-empty text of 1 to 64 bytes, no NUL`,
			decoder: true},
		{name: "float beyond float64, no range", file: "ratio = 1e999\n",
			want:    `invalid argument: config cfg.toml line 1: key "ratio": bad value "1e999": out of range: TOML floats are 64-bit, at most 1.7976931348623157e+308 in size; want a number`,
			isRange: true, decoder: true},
		{name: "unknown key beyond int64", file: "no-such-flag = 99999999999999999999\n",
			want:    `invalid argument: config cfg.toml line 1: unknown key "no-such-flag" (a key is a flag name without its leading dashes, e.g. tcp-streams; see -help)`,
			decoder: true},
		{name: "table key beyond int64", file: "[tcp]\nstreams = 99999999999999999999\n",
			want:    `invalid argument: config cfg.toml line 2: key "tcp" is a table; keys are flat flag names (no [sections] or dotted keys)`,
			decoder: true},
		{name: "syntax, no key", file: "tcp-streams = 5 6\n",
			want:    `invalid argument: config cfg.toml line 1: expected a top-level item to end with a newline, comment, or EOF, but got '6' instead`,
			decoder: true},
		// Unchanged: a value the decoder takes, out of the flag's range.
		{name: "in int64, out of range", file: "tcp-streams = 99\n",
			want:    `invalid argument: config cfg.toml line 1: key "tcp-streams": bad value "99": out of range: want 1 to 64`,
			isRange: true},
		{name: "good", file: "tcp-streams = 64\nmax-bytes = 1099511627776\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var v vals
			fs := newFS(&v)
			if err := (Ranges{"tcp-streams": Int{1, 64}, "max-bytes": Uint{0, 1 << 40}, "node-name": Text{1, 64}}).Bind(fs); err != nil {
				t.Fatal(err)
			}
			err := Apply(fs, "cfg.toml", []byte(tc.file), "config")
			if tc.want == "" {
				if err != nil || v.streams != 64 || v.size != 1<<40 {
					t.Fatalf("err = %v, flags %+v", err, v)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error; want %s", tc.want)
			}
			if err.Error() != tc.want {
				t.Errorf("error\n %s\nwant\n %s", err, tc.want)
			}
			if !errors.Is(err, errs.ErrInvalidArgument) {
				t.Errorf("error %v is not ErrInvalidArgument", err)
			}
			if got := errors.Is(err, errRange); got != tc.isRange {
				t.Errorf("errors.Is(err, errRange) = %v, want %v", got, tc.isRange)
			}
			var pe toml.ParseError
			if got := errors.As(err, &pe); got != tc.decoder {
				t.Errorf("errors.As(err, toml.ParseError) = %v, want %v", got, tc.decoder)
			}
			if v.streams != 4 || v.size != 10 || v.name != "host" {
				t.Errorf("refused file changed flags: %+v", v)
			}
		})
	}
}

func TestIntOutOfRange(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.Func("small", "", func(s string) error { return errors.New("always bad") })
	err := Apply(fs, "f", []byte("small = \"x\"\n"))
	if err == nil || !strings.Contains(err.Error(), `key "small"`) || !strings.Contains(err.Error(), "always bad") {
		t.Fatalf("err = %v", err)
	}
}

func TestLoadFileMissing(t *testing.T) {
	var v vals
	err := LoadFile(newFS(&v), filepath.Join(t.TempDir(), "none.toml"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("err = %v, want not exist", err)
	}
}

func FuzzApply(f *testing.F) {
	for _, s := range []string{"node-name = \"a\"\n", "tcp-streams = 8\n", "shutdown-grace = \"5s\"", "[x]\ny=1", "insecure = true\nratio = 1e3", "a.b.c = 1", "max-bytes = -3",
		"tcp-streams = 99999999999999999999", "tcp-streams = -99999999999999999999", "tcp-streams = 1\ntcp-streams = 2"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var v vals
		fs := newFS(&v)
		err := Apply(fs, "fuzz.toml", data, "config")
		if err != nil {
			if !errors.Is(err, errs.ErrInvalidArgument) {
				t.Fatalf("error %v is not ErrInvalidArgument", err)
			}
			if v.name != "host" || v.streams != 4 || v.size != 10 || v.grace != 30*time.Second || v.insec || v.ratio != 0.5 {
				t.Fatalf("refused file changed flags: %+v", v)
			}
		}
		if v.cfgPath != "" {
			t.Fatalf("config key was applied: %q", v.cfgPath)
		}
	})
}

func TestApplyKnown(t *testing.T) {
	var v vals
	fs := newFS(&v)
	if err := fs.Parse([]string{"-node-name", "cli"}); err != nil {
		t.Fatal(err)
	}
	if err := ApplyKnown(fs, "f", []byte("tcp-streams = 9\nother-daemon-flag = \"x\"\nnode-name = \"file\"\n"), "config"); err != nil {
		t.Fatal(err)
	}
	if v.streams != 9 || v.name != "cli" {
		t.Fatalf("%+v", v)
	}
	err := ApplyKnown(newFS(&v), "f", []byte("other = 1\ninsecure = \"yes\"\n"))
	if err == nil || !strings.Contains(err.Error(), `f line 2: key "insecure"`) {
		t.Fatalf("err = %v", err)
	}
}
