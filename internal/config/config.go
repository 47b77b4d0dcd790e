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
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

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
		return decodeError(fs, name, data, err, ignoreUnknown, skip)
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
			return fmt.Errorf("%w: %s: key %q: %w", errs.ErrInvalidArgument, where, k, err)
		}
		// Check the value now, on a scratch copy when the flag can be
		// copied, so a bad value later in the file leaves fs untouched.
		if err := check(f, s); err != nil {
			return fmt.Errorf("%w: %s: key %q: bad value %q: %w", errs.ErrInvalidArgument, where, k, s, err)
		}
		if !changed(k) {
			sets = append(sets, set{k, s})
		}
	}
	for _, s := range sets {
		if err := fs.Set(s.key, s.val); err != nil {
			return fmt.Errorf("%w: config %s line %d: key %q: bad value %q: %w", errs.ErrInvalidArgument, name, keyLine(data, s.key), s.key, s.val, err)
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

// decodeError turns a TOML decoder failure into the form of the checks
// above. One that concerns a key (an integer beyond int64, a bad escape, a
// key given twice...) names the file, the line, the key, the value as
// written and the flag's range, as a value out of range does; any other
// keeps the decoder's message. Both wrap the decoder's error.
func decodeError(fs *flag.FlagSet, name string, data []byte, err error, ignoreUnknown bool, skip []string) error {
	var pe toml.ParseError
	if !errors.As(err, &pe) {
		return fmt.Errorf("%w: config %s: %w", errs.ErrInvalidArgument, name, err)
	}
	line := pe.Position.Line
	generic := withCause(fmt.Errorf("%w: config %s line %d: %s", errs.ErrInvalidArgument, name, line, pe.Message), err)
	key := pe.LastKey
	dup := dupRE.FindStringSubmatch(pe.Message)
	if dup != nil {
		key = dup[1]
	}
	if key == "" {
		return generic
	}
	where := fmt.Sprintf("config %s line %d", name, line)
	top, _, dotted := strings.Cut(key, ".")
	if !bareKeyRE.MatchString(top) {
		return withCause(fmt.Errorf("%w: %s: key %q: %s", errs.ErrInvalidArgument, where, key, pe.Message), err)
	}
	// The line that sets the key: the nearest at or above the error (a
	// multi-line value, or the second of two).
	lines := strings.Split(string(data), "\n")
	lineOf := func(n int) string {
		if n < 1 || n > len(lines) {
			return ""
		}
		return strings.TrimSuffix(lines[n-1], "\r")
	}
	keyAt, header := 0, false
	for n := min(line, len(lines)); n >= 1 && keyAt == 0; n-- {
		if m := keyRE.FindStringSubmatch(lineOf(n)); m != nil && m[1] == top {
			keyAt, header = n, strings.HasPrefix(strings.TrimSpace(m[0]), "[")
		}
	}
	if dotted || (header && dup == nil) {
		return withCause(fmt.Errorf("%w: %s: key %q is a table; keys are flat flag names (no [sections] or dotted keys)", errs.ErrInvalidArgument, where, top), err)
	}
	f := fs.Lookup(top)
	if (f == nil && !ignoreUnknown) || contains(skip, top) {
		return withCause(fmt.Errorf("%w: %s: unknown key %q (a key is a flag name without its leading dashes, e.g. tcp-streams; see -help)", errs.ErrInvalidArgument, where, top), err)
	}
	rule := "" // the flag's range, or what its type takes
	var r Rule
	if f != nil {
		rule = want(kind(f))
		if rv, ok := f.Value.(*Ranged); ok {
			r, rule = rv.rule, rv.rule.String()
		}
	}
	if dup != nil {
		first := keyLine(data, top)
		if v, ok := writtenValue(lineOf(line)); ok && !header && rule != "" {
			return withCause(fmt.Errorf("%w: %s: key %q: value %s: already set on line %d; give each key once (want %s)", errs.ErrInvalidArgument, where, top, shown(v), first, rule), err)
		}
		return withCause(fmt.Errorf("%w: %s: key %q: already set on line %d; give each key once", errs.ErrInvalidArgument, where, top, first), err)
	}
	// The value as written: the decoder's span when it covers a whole
	// value (a number, a date), else what follows the key's "=".
	v := ""
	if valueRE.MatchString(pe.Message) && pe.Position.Start+pe.Position.Len <= len(data) {
		v = string(data[pe.Position.Start : pe.Position.Start+pe.Position.Len])
	} else if keyAt > 0 {
		v, _ = writtenValue(lineOf(keyAt))
	}
	var why error
	switch {
	case f == nil:
		why = errors.New(pe.Message)
	case rangeRE.MatchString(pe.Message):
		limit := fmt.Sprintf("TOML integers are 64-bit, %d to %d", int64(math.MinInt64), int64(math.MaxInt64))
		if strings.HasSuffix(pe.Message, "float64") {
			limit = fmt.Sprintf("TOML floats are 64-bit, at most %g in size", math.MaxFloat64)
		}
		switch k := kind(f); {
		case k != "int" && k != "uint" && k != "float":
			why = fmt.Errorf("is a TOML number; want %s", rule)
		case r != nil && r.Check(v) != nil:
			why = outOfRange(r)
		default: // in the flag's range, or no range: TOML's limit
			why = fmt.Errorf("%w: %s; want %s", errRange, limit, rule)
		}
	default:
		why = fmt.Errorf("%s; want %s", pe.Message, rule)
	}
	return withCause(fmt.Errorf("%w: %s: key %q: bad value %s: %w", errs.ErrInvalidArgument, where, top, shown(v), why), err)
}

var (
	// dupRE is the decoder's message for a key given twice.
	dupRE = regexp.MustCompile(`^Key '(.*)' has already been defined\.$`)
	// rangeRE is its message for a number beyond int64 or float64.
	rangeRE = regexp.MustCompile(`^\S+ is out of range for (int64|float64)$`)
	// valueRE are its messages whose position spans the whole value.
	valueRE   = regexp.MustCompile(`^(\S+ is out of range for |Invalid (integer|float) "|invalid datetime: )`)
	bareKeyRE = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)
)

// causeError is err, with cause reachable by errors.Is and errors.As too.
type causeError struct{ err, cause error }

func withCause(err, cause error) error { return &causeError{err, cause} }
func (e *causeError) Error() string    { return e.err.Error() }
func (e *causeError) Unwrap() []error  { return []error{e.err, e.cause} }

// writtenValue is the value a key = value line sets, as written: a quoted
// string to its closing quote, anything else to a comment or the line's
// end. ok is false when the line sets no key.
func writtenValue(line string) (v string, ok bool) {
	m := keyRE.FindStringIndex(line)
	if m == nil || line[m[1]-1] != '=' {
		return "", false
	}
	v = strings.TrimSpace(line[m[1]:])
	switch {
	case strings.HasPrefix(v, `"""`), strings.HasPrefix(v, "'''"):
	case strings.HasPrefix(v, `"`):
		for i := 1; i < len(v); i++ {
			if v[i] == '\\' {
				i++
			} else if v[i] == '"' {
				return v[:i+1], true
			}
		}
	case strings.HasPrefix(v, "'"):
		if i := strings.IndexByte(v[1:], '\''); i >= 0 {
			return v[:i+2], true
		}
	default:
		v, _, _ = strings.Cut(v, "#")
		v = strings.TrimSpace(v)
	}
	return v, true
}

// shown is a value as written, for an error: a quoted TOML string as it is,
// anything else (or a string holding control bytes) quoted.
func shown(v string) string {
	if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') && v[len(v)-1] == v[0] && utf8.ValidString(v) && strings.IndexFunc(v, unicode.IsControl) < 0 {
		return v
	}
	return strconv.Quote(v)
}
