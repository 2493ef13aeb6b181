//go:build !unix

package worker

import "net"

// sparesWork: without a non-blocking peek a spare the upstream closed cannot be told from an
// open one, so the Pool's client keeps none.
const sparesWork = false

func open(net.Conn) bool { return false }
