//go:build unix

package contract

import (
	"fmt"
	"net"
	"os"
	"syscall"
)

// NewDataPlanePair makes a data plane to offer a transport plugin the
// host starts: a connected pair of Unix stream sockets. The host keeps
// host (TransportGRPCClient.OfferDataPlane); the child inherits plugin
// (exec.Cmd.ExtraFiles), and the caller closes its copy of plugin once
// the child has started. Both are close-on-exec in this process, so no
// other child inherits either.
func NewDataPlanePair() (host net.Conn, plugin *os.File, err error) {
	syscall.ForkLock.RLock() // no exec between the socketpair and CloseOnExec
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err == nil {
		syscall.CloseOnExec(fds[0])
		syscall.CloseOnExec(fds[1])
	}
	syscall.ForkLock.RUnlock()
	if err != nil {
		return nil, nil, fmt.Errorf("data plane: socketpair: %w", err)
	}
	hf := os.NewFile(uintptr(fds[0]), "tether-data-plane-host")
	defer hf.Close() // FileConn holds a duplicate
	host, err = net.FileConn(hf)
	if err != nil {
		syscall.Close(fds[1])
		return nil, nil, fmt.Errorf("data plane: %w", err)
	}
	return host, os.NewFile(uintptr(fds[1]), "tether-data-plane"), nil
}
