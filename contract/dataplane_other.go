//go:build !unix

package contract

import (
	"errors"
	"fmt"
	"net"
	"os"
)

// NewDataPlanePair makes a data plane to offer a transport plugin; only
// Unix systems have one, elsewhere the link runs over gRPC.
func NewDataPlanePair() (host net.Conn, plugin *os.File, err error) {
	return nil, nil, fmt.Errorf("data plane: %w", errors.ErrUnsupported)
}
