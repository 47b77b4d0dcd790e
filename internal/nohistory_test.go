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
			if m := historyRef.FindString(sc.Text()); m != "" {
				t.Errorf("%s:%d: %q: write the docs and comments as a product's (history lives in git)", rel, n, m)
			}
		}
		return sc.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
}
