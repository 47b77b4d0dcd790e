package verbs

import (
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/transport"
)

// Caps is what the verbs transport over one device can do: WRITE and READ,
// block-id requests in one go, prepared chains, host and GPU memory. The
// kind's driver (internal/transport/verbs/rails) declares it for one device, and
// the conformance suite checks the Conns against it.
var Caps = transport.Caps{
	Rank:     20,
	Memory:   []memory.Kind{memory.Host, memory.CUDA},
	Ops:      transport.OpWrite | transport.OpRead,
	Blocks:   true,
	Prepared: true,
	Keys:     transport.KeyCaps{PerAccess: true, Rekey: true, Withdraw: true},
}
