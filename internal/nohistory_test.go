package internal_test

import (
	"bufio"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// historyRef is a tracker issue number or a commit hash: the tree reads as
// a product's, and its history lives in git. Another project's issue is
// cited as owner/repo#N, which this does not match.
var historyRef = regexp.MustCompile(`\b[Ii]ssues? #?[0-9]+\b|\bcommit [0-9a-f]{7,12}\b`)

// bareHash is an abbreviated commit hash alone, looked for in prose (Markdown)
// only: code holds hex constants. It must mix letters and digits, so that a
// number (2097152) or a word (deadbee, faced) is not one.
var bareHash = regexp.MustCompile(`\b[0-9a-f]{7,12}\b`)

func isHash(w string) bool {
	return strings.ContainsAny(w, "0123456789") && strings.ContainsAny(w, "abcdef")
}

// historyIn returns the history reference in line, "" when there is none.
func historyIn(path, line string) string {
	if m := historyRef.FindString(line); m != "" {
		return m
	}
	if filepath.Ext(path) != ".md" {
		return ""
	}
	for _, ix := range bareHash.FindAllStringIndex(line, -1) {
		w := line[ix[0]:ix[1]]
		inNumber := ix[0] > 0 && line[ix[0]-1] == '.' // 6.316032e+08
		if isHash(w) && !inNumber {
			return w
		}
	}
	return ""
}

// historyChecked: the files read by people, code and docs alike.
func historyChecked(path string) bool {
	switch {
	case strings.HasPrefix(path, "docs/results/"), strings.HasSuffix(path, ".pb.go"),
		strings.Contains(path, "_pb2"), strings.HasPrefix(path, ".") && path != ".ci/run":
		return false
	}
	switch filepath.Ext(path) {
	case ".go", ".py", ".sh", ".md", ".proto", ".cu", ".toml", ".yaml":
		return true
	}
	return filepath.Base(path) == "Makefile"
}

// TestNoHistoryReferences fails on a tracker number or a commit hash in the
// docs and in code comments.
func TestNoHistoryReferences(t *testing.T) {
	root := ".."
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "bin" || d.Name() == "__pycache__") {
				return filepath.SkipDir
			}
			return nil
		}
		if !historyChecked(rel) {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for n := 1; sc.Scan(); n++ {
			if m := historyIn(rel, sc.Text()); m != "" {
				t.Errorf("%s:%d: %q: write the docs and comments as a product's (history lives in git)", rel, n, m)
			}
		}
		return sc.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestHistoryIn(t *testing.T) {
	for _, tc := range []struct {
		path, line, want string
	}{
		{"docs/a.md", "measured at a2e9391 on a quiet machine", "a2e9391"},
		{"docs/a.md", "see iss" + "ue 31", "issue" + " 31"}, // split: this file is scanned too
		{"x.go", "// fixed in com" + "mit 43b942c", "commit" + " 43b942c"},
		{"x.go", "const mask = 0x7ffd1000 // a2e9391", ""},
		{"docs/a.md", "2097152 bytes, 6.316032e+08 total, a deadbee", ""},
		{"docs/a.md", "owner/repo#51919", ""},
	} {
		if got := historyIn(tc.path, tc.line); got != tc.want {
			t.Errorf("historyIn(%q, %q) = %q, want %q", tc.path, tc.line, got, tc.want)
		}
	}
}
