//go:build unix

package worker

import (
	"errors"
	"net"
	"syscall"
)

// sparesWork: open can tell a closed spare from an open one here.
const sparesWork = true

// open reports whether c can carry a request: the peer has neither closed it nor written to
// it (a server's 408 after its header timeout). It peeks without blocking.
func open(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return true
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var buf [1]byte
	var perr error
	if err := raw.Read(func(fd uintptr) bool {
		_, _, perr = syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return true // never wait for readiness
	}); err != nil {
		return false
	}
	// EAGAIN: nothing to read, and not closed. No error is the peer's FIN (0 bytes) or data
	// no request asked for.
	return errors.Is(perr, syscall.EAGAIN) || errors.Is(perr, syscall.EWOULDBLOCK)
}
