//go:build !cgo || !linux

package gpudirect

import "fmt"

// Load reports the CUDA driver as unavailable: this build has no cgo (or is
// not for linux), so libcuda cannot be loaded. The daemon serves host memory.
// (device.go's twin; mem.go, host.go, stream.go and copy.go need none, as
// nothing outside them names what they define.)
func Load(opts ...Option) (Interface, error) {
	o := buildOptions(opts)
	return nil, fmt.Errorf("gpudirect: CUDA support is not built in (needs cgo on linux), so %s is not loaded; GPU memory is disabled, host memory is still served: %w", o.library, ErrNoDriver)
}
