package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestMain lets a test run this binary as b2bctl: with B2BCTL_RUN_MAIN set,
// the test binary is b2bctl and its arguments are b2bctl's.
func TestMain(m *testing.M) {
	if os.Getenv("B2BCTL_RUN_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestUsageExitStatus runs b2bctl with counts and durations that make no
// sense and wants exit status 2 and a message naming the flag and its value,
// before any daemon is asked (the socket does not exist).
func TestUsageExitStatus(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "none.sock")
	xfer := []string{"transfer", "--src", "r", "--peer", "127.0.0.1:1", "--dst", "d", "--blocks", "1", "--size", "8"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"watch", "--region", "r", "--count", "-1"}, "--count -1 must be >= 0"},
		{append(xfer, "--timeout", "0s"), "--timeout 0s must be > 0"},
		{append(xfer, "--timeout", "-1s"), "--timeout -1s must be > 0"},
		{append(xfer, "--repeat", "-1"), "--repeat -1 must be >= 1"},
		{[]string{"checksum", "--region", "r", "--size", "8"}, "--blocks 0 must be >= 1"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			cmd := exec.Command(os.Args[0], append([]string{"--socket", sock}, tc.args...)...)
			cmd.Env = append(os.Environ(), "B2BCTL_RUN_MAIN=1")
			var stdout, stderr strings.Builder
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 {
				t.Fatalf("exit %v, want status 2; stderr %q", err, stderr.String())
			}
			if !strings.Contains(stderr.String(), tc.want) || stdout.Len() != 0 {
				t.Fatalf("stdout %q, stderr %q: want only %q on stderr", stdout.String(), stderr.String(), tc.want)
			}
		})
	}
}
