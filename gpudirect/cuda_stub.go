//go:build !cgo || !linux

package gpudirect

import (
	"fmt"

	"github.com/b2bd/b2bd/internal/errs"
)

// Load reports the CUDA driver as unavailable: this build has no cgo (or is
// not for linux), so libcuda cannot be loaded. The daemon serves host memory.
func Load(opts ...Option) (Interface, error) {
	o := buildOptions(opts)
	return nil, fmt.Errorf("gpudirect: CUDA support is not built in (needs cgo on linux), so %s is not loaded; GPU memory is disabled, host memory is still served: %w", o.library, errs.ErrUnavailable)
}
