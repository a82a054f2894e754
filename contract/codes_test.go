package contract_test

import (
	"testing"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/wire"
)

// TestCodesMatchWire: the close codes and replay reasons plugins use are
// the ones clients see (contract imports nothing of ours, so they are
// written twice; this keeps them one).
func TestCodesMatchWire(t *testing.T) {
	pairs := map[string][2]int{
		"GoingAway":      {contract.CloseGoingAway, wire.CloseGoingAway},
		"ProtocolError":  {contract.CloseProtocolError, wire.CloseProtocolError},
		"InvalidPayload": {contract.CloseInvalidPayload, wire.CloseInvalidPayload},
		"TooBig":         {contract.CloseTooBig, wire.CloseTooBig},
		"InternalError":  {contract.CloseInternalError, wire.CloseInternalError},
		"ServiceRestart": {contract.CloseServiceRestart, wire.CloseServiceRestart},
		"TryAgainLater":  {contract.CloseTryAgainLater, wire.CloseTryAgainLater},
		"BadRequest":     {contract.CloseBadRequest, wire.CloseBadRequest},
		"Unauthorized":   {contract.CloseUnauthorized, wire.CloseUnauthorized},
		"Forbidden":      {contract.CloseForbidden, wire.CloseForbidden},
		"NotFound":       {contract.CloseNotFound, wire.CloseNotFound},
		"NotLoopback":    {contract.CloseNotLoopback, wire.CloseNotLoopback},
		"Superseded":     {contract.CloseSuperseded, wire.CloseSuperseded},
		"ProcessExited":  {contract.CloseProcessExited, wire.CloseProcessExited},
		"NoSuchTerminal": {contract.CloseNoSuchTerminal, wire.CloseNoSuchTerminal},
	}
	for name, p := range pairs {
		if p[0] != p[1] {
			t.Errorf("Close%s: contract %d, wire %d", name, p[0], p[1])
		}
	}
	reasons := [][2]string{
		{contract.ReasonResume, wire.ReasonResume},
		{contract.ReasonInitial, wire.ReasonInitial},
		{contract.ReasonEpochMismatch, wire.ReasonEpochMismatch},
		{contract.ReasonOffsetRolledOut, wire.ReasonOffsetRolledOut},
		{contract.ReasonOffsetAhead, wire.ReasonOffsetAhead},
		{contract.ReasonInvalidCursor, wire.ReasonInvalidCursor},
	}
	for _, r := range reasons {
		if r[0] != r[1] {
			t.Errorf("replay reason: contract %q, wire %q", r[0], r[1])
		}
	}
}
