package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The README's code blocks that follow a "<!-- from PATH -->" marker are
// copied from files the quick start runs. TestREADMESnippets fails when one
// of them no longer appears in its file, so the README cannot rot.

var fromMarker = regexp.MustCompile(`<!-- from ([^ ]+) -->`)

// elision lines in a snippet stand for lines of the file left out.
func elision(line string) bool {
	switch strings.TrimSpace(line) {
	case "...", "// ...", "# ...":
		return true
	}
	return false
}

// snippet is one marked code block of a markdown file.
type snippet struct {
	file string // the repository path the marker names
	line int    // 1-based line of the marker
	body []string
}

// snippets returns the marked blocks of a markdown text.
func snippets(md string) ([]snippet, error) {
	lines := strings.Split(md, "\n")
	var out []snippet
	for i := 0; i < len(lines); i++ {
		m := fromMarker.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		if i+1 >= len(lines) || !strings.HasPrefix(lines[i+1], "```") {
			return nil, fmt.Errorf("line %d: the marker for %s is not followed by a ``` code block", i+1, m[1])
		}
		s := snippet{file: m[1], line: i + 1}
		j := i + 2
		for ; j < len(lines) && !strings.HasPrefix(lines[j], "```"); j++ {
			s.body = append(s.body, lines[j])
		}
		if j == len(lines) {
			return nil, fmt.Errorf("line %d: the code block for %s is not closed", i+1, m[1])
		}
		out = append(out, s)
		i = j
	}
	return out, nil
}

// contains reports whether body's chunks (split at elision lines) appear in
// file in order, each as consecutive lines; lines compare without their
// leading and trailing blanks, so a snippet may be dedented.
func contains(file, body []string) error {
	norm := func(ls []string) []string {
		out := make([]string, len(ls))
		for i, l := range ls {
			out[i] = strings.TrimSpace(l)
		}
		return out
	}
	f := norm(file)
	var chunks [][]string
	var cur []string
	for _, l := range norm(body) {
		if elision(l) {
			if len(cur) > 0 {
				chunks = append(chunks, cur)
			}
			cur = nil
			continue
		}
		cur = append(cur, l)
	}
	if len(cur) > 0 {
		chunks = append(chunks, cur)
	}
	if len(chunks) == 0 {
		return fmt.Errorf("the snippet is empty")
	}
	at := 0
	for _, c := range chunks {
		found := -1
		for k := at; k+len(c) <= len(f); k++ {
			if equal(f[k:k+len(c)], c) {
				found = k
				break
			}
		}
		if found < 0 {
			return fmt.Errorf("these lines are not in the file (in this order, after line %d):\n%s", at, strings.Join(c, "\n"))
		}
		at = found + len(c)
	}
	return nil
}

func equal(a, b []string) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestREADMESnippets(t *testing.T) {
	root := filepath.Join("..", "..")
	md, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := snippets(string(md))
	if err != nil {
		t.Fatalf("README.md: %v", err)
	}
	// The quick start's three files must each be shown.
	want := map[string]bool{"examples/quickstart/quickstart.sh": false, "examples/quickstart/main.go": false, "examples/quickstart/quickstart.py": false}
	for _, s := range got {
		b, err := os.ReadFile(filepath.Join(root, s.file))
		if err != nil {
			t.Errorf("README.md line %d: %v", s.line, err)
			continue
		}
		if err := contains(strings.Split(string(b), "\n"), s.body); err != nil {
			t.Errorf("README.md line %d, from %s: %v", s.line, s.file, err)
		}
		if _, ok := want[s.file]; ok {
			want[s.file] = true
		}
	}
	for f, shown := range want {
		if !shown {
			t.Errorf("README.md shows no snippet <!-- from %s -->", f)
		}
	}
}

func TestContains(t *testing.T) {
	file := []string{"a", "  b", "c", "d", "e"}
	for _, tc := range []struct {
		name string
		body []string
		ok   bool
	}{
		{"consecutive, dedented", []string{"b", "c"}, true},
		{"with an elision", []string{"a", "...", "d", "e"}, true},
		{"a changed line", []string{"b", "x"}, false},
		{"lines not consecutive", []string{"a", "c"}, false},
		{"chunks out of order", []string{"d", "# ...", "a"}, false},
		{"empty", []string{"..."}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := contains(file, tc.body); (err == nil) != tc.ok {
				t.Errorf("contains(%q) = %v, want ok=%v", tc.body, err, tc.ok)
			}
		})
	}
}

func TestSnippetsMarkers(t *testing.T) {
	for _, tc := range []struct {
		name, md string
		n        int
		bad      bool
	}{
		{"one", "x\n<!-- from f.go -->\n```go\nA\n```\n", 1, false},
		{"no block", "<!-- from f.go -->\ntext\n", 0, true},
		{"unclosed", "<!-- from f.go -->\n```go\nA\n", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := snippets(tc.md)
			if (err != nil) != tc.bad || len(s) != tc.n {
				t.Errorf("snippets = %d, %v; want %d, error %v", len(s), err, tc.n, tc.bad)
			}
		})
	}
}
