package daemon

// The transports this daemon is built with: each package registers its
// driver from init (transport.Register). This list is the one place that
// names the kinds; the daemon builds whatever registered.
import (
	_ "github.com/b2bd/b2bd/internal/transport/local"
	_ "github.com/b2bd/b2bd/internal/transport/tcp"
	_ "github.com/b2bd/b2bd/internal/transport/verbs/rails" // verbs: one RDMA device, or several (rails)
)
