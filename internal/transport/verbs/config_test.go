package verbs

import (
	"errors"
	"flag"
	"testing"
	"time"

	"github.com/b2bd/b2bd/internal/errs"
)

func TestConfigFlags(t *testing.T) {
	c := DefaultConfig()
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	c.RegisterFlags(fs)
	err := fs.Parse([]string{"--rdma-device", "rxe0", "--rdma-port", "2", "--gid-index", "3", "--rdma-netdev", "eth0",
		"--qps-per-peer", "4", "--rdma-signal-every", "8", "--rdma-max-chain", "32", "--rdma-poll-spin", "1us", "--rdma-post-threads", "3"})
	if err != nil {
		t.Fatal(err)
	}
	if c.Device != "rxe0" || c.Port != 2 || c.GIDIndex != 3 || c.NetDev != "eth0" || c.QPsPerPeer != 4 ||
		c.SignalEvery != 8 || c.MaxChain != 32 || c.PollSpin != time.Microsecond || c.PostThreads != 3 {
		t.Fatalf("parsed %+v", c)
	}
	if err := c.normalize(); err != nil {
		t.Fatal(err)
	}
}

func TestConfigNormalize(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*Config)
		ok   bool
	}{
		{"zero value takes defaults", func(c *Config) { *c = Config{GIDIndex: -1} }, true},
		{"defaults", func(c *Config) {}, true},
		{"too many QPs", func(c *Config) { c.QPsPerPeer = 65 }, false},
		{"chain longer than SQ", func(c *Config) { c.MaxChain = c.SQDepth + 1 }, false},
		{"signal interval over half the SQ", func(c *Config) { c.SignalEvery = c.SQDepth }, false},
		{"bad gid index", func(c *Config) { c.GIDIndex = -2 }, false},
		{"bad retry", func(c *Config) { c.RetryCount = 8 }, false},
		{"inline too big", func(c *Config) { c.InlineBytes = 4096 }, false},
		{"post threads", func(c *Config) { c.PostThreads = 4 }, true},
		{"too many post threads", func(c *Config) { c.PostThreads = 65 }, false},
		{"negative post threads", func(c *Config) { c.PostThreads = -1 }, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.mod(&c)
			err := c.normalize()
			if tc.ok != (err == nil) || (err != nil && !errors.Is(err, errs.ErrInvalidArgument)) {
				t.Fatalf("err = %v", err)
			}
			if err == nil && (c.QPsPerPeer == 0 || c.SQDepth == 0 || c.Port == 0) {
				t.Fatalf("defaults not filled: %+v", c)
			}
		})
	}
}

func TestFitSendQueue(t *testing.T) {
	tests := []struct {
		name              string
		sq, maxQPWR       int
		wantFitted, isErr bool
		wantSQ, wantChain int
		wantSignal        int
	}{
		{"device unknown", DefaultSQDepth, 0, false, false, DefaultSQDepth, DefaultMaxChain, DefaultSignalEvery},
		{"device deep enough", DefaultSQDepth, 32768, false, false, DefaultSQDepth, DefaultMaxChain, DefaultSignalEvery},
		{"default too deep: fitted", DefaultSQDepth, 1024, true, false, 1024, min(DefaultMaxChain, 1024), min(DefaultSignalEvery, 512)},
		{"default far too deep: chain and signal shrink", DefaultSQDepth, 128, true, false, 128, 128, 64},
		{"asked-for depth too deep: refused", 4096, 1024, false, true, 4096, DefaultMaxChain, DefaultSignalEvery},
		{"device queue below the floor: refused", DefaultSQDepth, 4, false, true, DefaultSQDepth, DefaultMaxChain, DefaultSignalEvery},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			c.SQDepth = tc.sq
			fitted, err := fitSendQueue(&c, tc.maxQPWR)
			if fitted != tc.wantFitted || (err != nil) != tc.isErr || (err != nil && !errors.Is(err, errs.ErrInvalidArgument)) {
				t.Fatalf("fitted %v, err %v; want fitted %v, error %v", fitted, err, tc.wantFitted, tc.isErr)
			}
			if c.SQDepth != tc.wantSQ || c.MaxChain != tc.wantChain || c.SignalEvery != tc.wantSignal {
				t.Fatalf("sq %d chain %d signal %d; want %d %d %d", c.SQDepth, c.MaxChain, c.SignalEvery, tc.wantSQ, tc.wantChain, tc.wantSignal)
			}
			if err == nil {
				if err := c.normalize(); err != nil {
					t.Fatalf("fitted config does not validate: %v", err)
				}
			}
		})
	}
}
