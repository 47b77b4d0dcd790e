// Package config loads a TOML file whose keys are a flag.FlagSet's flag
// names (b2bd's --config). Every flag is covered without a list to keep up
// to date: a key is valid exactly when the FlagSet has a flag of that name.
// Values are typed per flag (a bool flag takes true/false, an integer flag an
// integer, a duration flag a string such as "30s", a string flag a string),
// and flags given on the command line win over the file.
package config

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"regexp"
	"sort"
	"strconv"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/b2bd/b2bd/internal/errs"
)

// MaxSize bounds a config file; b2bd's has a few dozen lines.
const MaxSize = 1 << 20

// LoadFile reads path and applies it to fs (see Apply).
func LoadFile(fs *flag.FlagSet, path string, skip ...string) error {
	return LoadFileChanged(fs, path, nil, skip...)
}

// LoadFileChanged is LoadFile for a flag set that another parser filled
// (pflag, through AddGoFlagSet, sets the values without fs knowing):
// changed says which flags the command line gave, and they win over the
// file. A nil changed asks fs (fs.Visit).
func LoadFileChanged(fs *flag.FlagSet, path string, changed func(name string) bool, skip ...string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	return apply(fs, path, data, false, changed, skip)
}

// Apply sets, from the TOML document data (named name in errors), every flag
// of fs that was not already set on the command line (fs.Visit: call Apply
// after fs.Parse). Keys named in skip (the --config flag itself) are refused.
// An unknown key, a table, or a value of the wrong type or out of range is
// refused naming the key, the file and the line. Nothing is set unless the
// whole file is valid.
func Apply(fs *flag.FlagSet, name string, data []byte, skip ...string) error {
	return apply(fs, name, data, false, nil, skip)
}

// ApplyKnown is Apply for a program that reads the daemon's file but has
// only some of its flags (b2bd doctor): keys fs lacks are skipped, not
// refused; the keys it has are checked and applied as Apply does.
func ApplyKnown(fs *flag.FlagSet, name string, data []byte, skip ...string) error {
	return apply(fs, name, data, true, nil, skip)
}

func apply(fs *flag.FlagSet, name string, data []byte, ignoreUnknown bool, changed func(string) bool, skip []string) error {
	if len(data) > MaxSize {
		return fmt.Errorf("%w: config %s is %d bytes, over the limit of %d", errs.ErrInvalidArgument, name, len(data), MaxSize)
	}
	var doc map[string]any
	if _, err := toml.Decode(string(data), &doc); err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			return fmt.Errorf("%w: config %s line %d: %s", errs.ErrInvalidArgument, name, pe.Position.Line, pe.Message)
		}
		return fmt.Errorf("%w: config %s: %w", errs.ErrInvalidArgument, name, err)
	}
	if changed == nil {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		changed = func(name string) bool { return set[name] }
	}
	keys := make([]string, 0, len(doc))
	for k := range doc {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	type set struct{ key, val string }
	var sets []set
	for _, k := range keys {
		where := fmt.Sprintf("config %s line %d", name, keyLine(data, k))
		f := fs.Lookup(k)
		if _, ok := doc[k].(map[string]any); ok {
			return fmt.Errorf("%w: %s: key %q is a table; keys are flat flag names (no [sections] or dotted keys)", errs.ErrInvalidArgument, where, k)
		}
		if f == nil && ignoreUnknown {
			continue
		}
		if f == nil || contains(skip, k) {
			return fmt.Errorf("%w: %s: unknown key %q (a key is a flag name without its leading dashes, e.g. tcp-streams; see -help)", errs.ErrInvalidArgument, where, k)
		}
		s, err := valueString(f, doc[k])
		if err != nil {
			return fmt.Errorf("%w: %s: key %q: %v", errs.ErrInvalidArgument, where, k, err)
		}
		// Check the value now, on a scratch copy when the flag can be
		// copied, so a bad value later in the file leaves fs untouched.
		if err := check(f, s); err != nil {
			return fmt.Errorf("%w: %s: key %q: bad value %q: %v", errs.ErrInvalidArgument, where, k, s, err)
		}
		if !changed(k) {
			sets = append(sets, set{k, s})
		}
	}
	for _, s := range sets {
		if err := fs.Set(s.key, s.val); err != nil {
			return fmt.Errorf("%w: config %s line %d: key %q: bad value %q: %v", errs.ErrInvalidArgument, name, keyLine(data, s.key), s.key, s.val, err)
		}
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// kind names what a flag's value is, from its Getter.
func kind(f *flag.Flag) string {
	if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
		return "bool"
	}
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return "string"
	}
	switch g.Get().(type) {
	case bool:
		return "bool"
	case int, int64:
		return "int"
	case uint, uint64:
		return "uint"
	case float64:
		return "float"
	case time.Duration:
		return "duration"
	}
	return "string"
}

// valueString turns a decoded TOML value into the flag's text, refusing a
// value of the wrong TOML type for the flag.
func valueString(f *flag.Flag, v any) (string, error) {
	k := kind(f)
	switch x := v.(type) {
	case bool:
		if k == "bool" {
			return strconv.FormatBool(x), nil
		}
	case int64:
		switch k {
		case "int", "float":
			return strconv.FormatInt(x, 10), nil
		case "uint":
			if x < 0 {
				if r, ok := f.Value.(*Ranged); ok {
					return "", fmt.Errorf("%d is negative: %w", x, outOfRange(r.rule))
				}
				return "", fmt.Errorf("%d is negative; want an integer >= 0", x)
			}
			return strconv.FormatInt(x, 10), nil
		}
	case float64:
		if k == "float" {
			if math.IsNaN(x) || math.IsInf(x, 0) {
				return "", fmt.Errorf("%v is not a finite number", x)
			}
			return strconv.FormatFloat(x, 'g', -1, 64), nil
		}
	case string:
		switch k {
		case "string", "duration":
			return x, nil
		}
	case map[string]any:
		return "", errors.New("is a table; keys are flat flag names (no [sections])")
	}
	return "", fmt.Errorf("is a TOML %s; want %s", tomlType(v), want(k))
}

func want(k string) string {
	switch k {
	case "bool":
		return "true or false"
	case "int":
		return "an integer"
	case "uint":
		return "an integer >= 0"
	case "float":
		return "a number"
	case "duration":
		return `a duration string such as "30s" or "1m"`
	}
	return "a string"
}

func tomlType(v any) string {
	switch v.(type) {
	case bool:
		return "boolean"
	case int64:
		return "integer"
	case float64:
		return "float"
	case string:
		return "string"
	case []any, []map[string]any:
		return "array"
	case map[string]any:
		return "table"
	case time.Time:
		return "date/time"
	}
	return fmt.Sprintf("%T", v)
}

// check parses s as the flag would, without setting it: for the standard
// kinds by parsing, for others by setting a fresh value of the same kind when
// one can be made, else deferring to Set.
func check(f *flag.Flag, s string) error {
	// A flag with a documented range (Ranges.Bind) checks it here too.
	if v, ok := f.Value.(interface{ Validate(string) error }); ok {
		if err := v.Validate(s); err != nil {
			return err
		}
	}
	switch kind(f) {
	case "bool":
		_, err := strconv.ParseBool(s)
		return err
	case "int":
		_, err := strconv.ParseInt(s, 0, strconv.IntSize)
		return err
	case "uint":
		_, err := strconv.ParseUint(s, 0, strconv.IntSize)
		return err
	case "float":
		_, err := strconv.ParseFloat(s, 64)
		return err
	case "duration":
		_, err := time.ParseDuration(s)
		return err
	}
	return nil
}

var keyRE = regexp.MustCompile(`^\s*(?:\[\s*)?["']?([A-Za-z0-9_-]+)["']?\s*[=.\]]`)

// keyLine is the 1-based line where key is set at the top level, or 0.
func keyLine(data []byte, key string) int {
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), MaxSize)
	for n := 1; sc.Scan(); n++ {
		if m := keyRE.FindSubmatch(sc.Bytes()); m != nil && string(m[1]) == key {
			return n
		}
	}
	return 0
}
