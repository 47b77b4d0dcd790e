package daemon

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"

	"github.com/hashicorp/go-hclog"

	"github.com/b2bd/b2bd/gpudirect"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/peer"
	"github.com/b2bd/b2bd/internal/transport"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// The daemon builds whatever transports registered (builtins.go imports
// them) and names none: each driver brings its flags, their ranges and the
// checks between them, and its New.

// KindSettings are the registered transports' settings, each bound to its
// driver's flags in fs.
type KindSettings struct {
	fs     *flag.FlagSet
	byKind map[transport.Kind]any
	// err is a refused driver registration: New refuses to start with it.
	err error
}

// RegisterKindFlags adds every registered transport's flags to fs, each
// bound to its documented range, and keeps their settings in cfg.Kinds
// for New.
func RegisterKindFlags(fs *flag.FlagSet, cfg *Config) {
	drivers, err := transport.Registered()
	k := &KindSettings{fs: fs, byKind: map[transport.Kind]any{}, err: err}
	for _, d := range drivers {
		if d.Flags == nil {
			continue
		}
		k.byKind[d.Kind] = d.Flags(fs)
		bindRanges(fs, d.Ranges)
	}
	cfg.Kinds = k
}

// ensureKinds gives a Config built without the flag set (cfg.Kinds nil)
// every kind's defaults, then applies cfg.KindFlags.
func (c *Config) ensureKinds() error {
	if c.Kinds == nil {
		fs := flag.NewFlagSet("b2bd", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		RegisterKindFlags(fs, c)
	}
	names := make([]string, 0, len(c.KindFlags))
	for name := range c.KindFlags {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if c.Kinds.fs.Lookup(name) == nil {
			return fmt.Errorf("%w: KindFlags: no registered transport has the flag --%s", errs.ErrInvalidArgument, name)
		}
		if err := c.Kinds.fs.Set(name, c.KindFlags[name]); err != nil {
			return fmt.Errorf("%w: --%s %q: %w", errs.ErrInvalidArgument, name, c.KindFlags[name], err)
		}
	}
	c.KindFlags = nil // applied once
	return c.Kinds.err
}

// check runs every driver's limits between its flags.
func (k *KindSettings) check() error {
	if k == nil {
		return nil
	}
	drivers, err := transport.Registered()
	if err != nil {
		return err
	}
	var all []error
	for _, d := range drivers {
		if d.Check != nil {
			all = append(all, d.Check(k.byKind[d.Kind]))
		}
	}
	return errors.Join(all...)
}

// listens are the flags naming addresses the transports listen on.
func (k *KindSettings) listens() []string {
	drivers, _ := transport.Registered()
	var out []string
	for _, d := range drivers {
		out = append(out, d.Listens...)
	}
	return out
}

// value is flag name's value, "" when there is none.
func (k *KindSettings) value(name string) string {
	if k == nil || k.fs == nil {
		return ""
	}
	if f := k.fs.Lookup(name); f != nil {
		return f.Value.String()
	}
	return ""
}

// Value is the transport flag name's value as New sees it ("" when no
// registered transport has it), for programs and tests that read one.
func (c *Config) KindFlag(name string) string {
	if v, ok := c.KindFlags[name]; ok {
		return v
	}
	return c.Kinds.value(name)
}

// buildTransports starts every registered transport --transport enables,
// highest rank first, and says in Status why a kind is missing. A kind
// fails the daemon when it was asked for by name, or is Required.
func (d *Daemon) buildTransports(in *inbound, env transport.Env) ([]*b2bv1.TransportStatus, error) {
	drivers, err := transport.Registered()
	if err != nil {
		return nil, err
	}
	var statuses []*b2bv1.TransportStatus
	for _, drv := range drivers {
		k := drv.Kind
		if d.cfg.Transport != transport.Auto && d.cfg.Transport != string(k) {
			continue
		}
		e := env
		e.Inbound, e.Log, e.Settings = in, d.log.Named(string(k)), d.cfg.Kinds.byKind[k]
		st := &b2bv1.TransportStatus{Kind: peer.KindToProto(k), KindName: string(k)}
		t, err := drv.New(e)
		if err != nil {
			if d.cfg.Transport == string(k) {
				return nil, fmt.Errorf("--transport %s: %w", k, err)
			}
			if drv.Required {
				return nil, fmt.Errorf("transport %s: %w", k, err)
			}
			d.log.Warn("transport unavailable; carrying on without it", "transport", k, "reason", err)
			st.Detail = err.Error()
			statuses = append(statuses, st)
			continue
		}
		d.transports = append(d.transports, t)
		st.Available = true
		st.Detail = t.Advertise().Detail
		statuses = append(statuses, st)
	}
	return statuses, nil
}

// loadCUDA loads libcuda.so.1 at run time. Without it the daemon serves host
// memory and says why GPU regions are refused.
func loadCUDA(log hclog.Logger) (gpudirect.Interface, string) {
	drv, err := gpudirect.Load()
	if err != nil {
		log.Info("no usable GPU; serving host memory only", "reason", err)
		return nil, err.Error()
	}
	var names []string
	for i := 0; i < drv.DeviceCount(); i++ {
		if info, err := drv.DeviceInfo(i); err == nil {
			names = append(names, fmt.Sprintf("%d:%s", i, info.Name))
		}
	}
	detail := fmt.Sprintf("CUDA driver %d, devices %v", drv.DriverVersion(), names)
	log.Info("GPU support ready", "detail", detail)
	return drv, detail
}
