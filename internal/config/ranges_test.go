package config

import (
	"flag"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestRules(t *testing.T) {
	for _, tc := range []struct {
		rule     Rule
		ok, bad  []string
		describe string
	}{
		{Int{1, 8}, []string{"1", "8", "0x8"}, []string{"0", "9", "-1", "x", "", "1.5"}, "1 to 8"},
		{Int{-1, 255}, []string{"-1", "255"}, []string{"-2", "256"}, "-1 to 255"},
		{Uint{0, 1 << 40}, []string{"0", "1099511627776"}, []string{"-1", "1099511627777"}, "0 to 1099511627776"},
		{Duration{time.Millisecond, 24 * time.Hour}, []string{"1ms", "24h", "1m"}, []string{"0s", "-1s", "25h", "5"}, "1ms to 24h"},
		{Duration{0, time.Hour}, []string{"0s"}, []string{"61m"}, "0s to 1h"},
		{OneOf{"a", "b"}, []string{"a", "b"}, []string{"", "A", "c"}, "one of a, b"},
		{Bool{}, []string{"true", "false", "1"}, []string{"yes", ""}, "true or false"},
		{Path(true), []string{"", "/x"}, []string{"a\x00", strings.Repeat("p", PathMax+1)}, "at most 4096 bytes"},
		{Path(false), []string{"/x"}, []string{""}, "non-empty"},
		{HostPort{}, []string{":1", "h:65535", "[::1]:0"}, []string{"", "h", "h:65536", "h:-1", "h:", "[::1"}, "host:port"},
		{HostPort{Optional: true}, []string{""}, []string{"x"}, "or empty: off"},
		{Octal{0o777}, []string{"0", "0660", "777"}, []string{"1000", "8", "-1", ""}, "0000 to 0777"},
	} {
		if got := tc.rule.String(); !strings.Contains(got, tc.describe) {
			t.Errorf("%#v: String %q lacks %q", tc.rule, got, tc.describe)
		}
		for _, s := range tc.ok {
			if err := tc.rule.Check(s); err != nil {
				t.Errorf("%#v: %q refused: %v", tc.rule, s, err)
			}
		}
		for _, s := range tc.bad {
			err := tc.rule.Check(s)
			if err == nil || !strings.Contains(err.Error(), tc.describe) {
				t.Errorf("%#v: %q: err %v, want a refusal naming %q", tc.rule, s, err, tc.describe)
			}
		}
	}
}

// rangedSet is a flag set with one flag of every kind, each bound to a rule.
func rangedSet() *flag.FlagSet {
	fs := flag.NewFlagSet("f", flag.ContinueOnError)
	fs.Int("n", 4, "")
	fs.Uint64("u", 1, "")
	fs.Duration("d", time.Second, "")
	fs.String("s", "tcp", "")
	fs.String("a", ":1", "")
	fs.Bool("b", false, "")
	_ = Ranges{"n": Int{1, 8}, "u": Uint{1, 1 << 20}, "d": Duration{time.Millisecond, time.Hour},
		"s": OneOf{"tcp", "verbs"}, "a": HostPort{}, "b": Bool{}}.Bind(fs)
	return fs
}

// TestRangedFlag: a bound flag keeps its kind for config (TOML types) and
// help, and the command line and the file both refuse what the rule does.
func TestRangedFlag(t *testing.T) {
	fs := rangedSet()
	if err := fs.Parse([]string{"-b", "-n", "8"}); err != nil {
		t.Fatal(err)
	}
	if err := Check(fs); err != nil {
		t.Fatal(err)
	}
	if err := fs.Set("n", "9"); err == nil || !strings.Contains(err.Error(), "1 to 8") {
		t.Fatalf("set n 9: %v", err)
	}
	if err := Apply(rangedSet(), "f", []byte("n = \"3\"\n")); err == nil || !strings.Contains(err.Error(), "want an integer") {
		t.Fatalf("typed: %v", err)
	}
	// Nothing is set when a later key is out of range.
	fs = rangedSet()
	err := Apply(fs, "f", []byte("d = \"5s\"\nn = 0\n"))
	if err == nil || !strings.Contains(err.Error(), `key "n": bad value "0": out of range: want 1 to 8`) {
		t.Fatalf("apply: %v", err)
	}
	if fs.Lookup("d").Value.String() != "1s" {
		t.Fatalf("d was set to %s by a refused file", fs.Lookup("d").Value)
	}
	if err := Apply(rangedSet(), "f", []byte("u = -1\n")); err == nil || !strings.Contains(err.Error(), "1 to 1048576") {
		t.Fatalf("negative uint: %v", err)
	}
	fs = rangedSet()
	fs.Int("loose", 0, "")
	if err := Check(fs); err == nil || !strings.Contains(err.Error(), "loose") {
		t.Fatalf("unbound flag: %v", err)
	}
	if err := (Ranges{"nope": Int{}}).Bind(rangedSet()); err == nil || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("row without flag: %v", err)
	}
}

// FuzzRanges: whatever the command line or a config file says, a value
// that is set is inside its rule, and nothing panics.
func FuzzRanges(f *testing.F) {
	for _, s := range []string{"4", "0", "-3", "99", "0x8", "1s", "-1ms", "tcp", "h:1", "", "true", "1e3", "9223372036854775807"} {
		f.Add("n", s)
		f.Add("d", s)
	}
	f.Fuzz(func(t *testing.T, name, val string) {
		fs := rangedSet()
		_ = fs.Set(name, val)
		if err := Check(fs); err != nil {
			t.Fatalf("set %s=%q left %v", name, val, err)
		}
		file := name + " = " + val + "\n"
		if _, err := strconv.ParseFloat(val, 64); err != nil && val != "true" && val != "false" {
			file = name + " = " + strconv.Quote(val) + "\n"
		}
		fs = rangedSet()
		if err := Apply(fs, "fuzz", []byte(file)); err == nil {
			if err := Check(fs); err != nil {
				t.Fatalf("file %q applied but %v", file, err)
			}
		}
		for _, r := range []Rule{Int{1, 8}, Uint{0, 9}, Duration{0, time.Second}, OneOf{"a"}, Bool{}, Path(false), HostPort{}, Octal{0o777}} {
			if err := r.Check(val); err == nil {
				if r2, ok := r.(Int); ok {
					v, perr := strconv.ParseInt(val, 0, 64)
					if perr != nil || v < r2.Min || v > r2.Max {
						t.Fatalf("Int accepted %q", val)
					}
				}
			}
		}
	})
}
