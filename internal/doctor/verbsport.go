package doctor

import (
	"fmt"

	"github.com/b2bd/b2bd/verbs"
)

// VerbsPortMTU asks libibverbs for a port's active MTU (Env.PortMTU). It
// fails, and the MTU check falls back to sysfs, without cgo or libibverbs.
func VerbsPortMTU(dev string, port int) (int, error) {
	ctx, err := verbs.Open(dev)
	if err != nil {
		return 0, fmt.Errorf("doctor: open %s: %w", dev, err)
	}
	defer ctx.Close()
	a, err := ctx.QueryPort(port)
	if err != nil {
		return 0, fmt.Errorf("doctor: query %s port %d: %w", dev, port, err)
	}
	return a.ActiveMTU.Bytes(), nil
}
